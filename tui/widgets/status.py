"""The status bar, the activity line (long work with elapsed time and a cancel hint)
and the approval bar (a pending decision, guarded against type-ahead)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from tilewright.sessions.state import Rank
from tilewright.tui.format import compile_verdict, format_vmem, rank_at_length


@dataclass(frozen=True)
class StatusInfo:
    task: str = "tilewright"  # before a session opens: says so, not "no task"
    backend: str = "opening the session"
    chip: str | None = None
    mode: str = "step"
    iteration: int = 0
    best_version: int | None = None
    # What ranks the best version (``kernels.judge.rank.Rank``), said by ``Rank.words``: an
    # estimate says so, host simulation time is never called a speedup.
    best_rank: Rank | None = None
    # Said beside it when versions are ranked by compiler figures of two kinds
    # (``SessionState.mixed_ranks``), or when the tie rule crowned it
    # (``SessionState.best_tie``); in a few words on a narrow terminal.
    best_note: str | None = None
    best_note_short: str | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    cost_known: bool = True  # False: a model without a price answered ("$?", not $0)
    worker: str = "starting"
    confinement: str | None = None  # level of the latest evaluation's sandbox
    # The TPU compiler's verdict on the current version's latest evaluation.
    tpu_chip: str | None = None
    tpu_compile: str | None = None  # ok | error | unavailable
    vmem_bytes: int | None = None
    vmem_limit_bytes: int | None = None


def _tokens(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def _rank_medium(rank: Rank) -> str:
    """The rank's words without the chip the backend segment already names ("est. 0.90x
    at 4096x8192 (TPU compiler)"); other ranks (host simulation) in short. The words
    are ``Rank.words``'s, never a number formatted here."""
    if rank.compiler or rank.on_chip or rank.is_bound:
        return rank.words(chip=False)
    return rank.words(short=True)


# How much the status bar leaves out, least useful detail first, one step per level:
# 1 how far a compiler figure can be trusted (``Rank.trust_words``) and the chip's
# repetitions (the backend segment names it), 2 shorter words, 3 a sandbox level that
# is as it should be ("sandboxed"), 4 the VMEM figures, 5 short numbers ("est. 0.90x"),
# 6 the word "compile", 7 the token count (and the cost where nothing was spent: the
# offline agent), 8 a compile verdict of "ok" (a refusal stays), 9 the cost and the
# word "worker", 10 the end of a long task name, 11 the note beside "best" (a tie the
# least VMEM won, figures of two kinds). The backend ("CPU interp→v5e": where kernels run
# and the chip they are judged for) and the worker state stay at 80 columns.
LEVELS = 12

# The worker's state and the sandbox in plain words.
WORKER_WORDS = {"idle": "ready", "busy": "busy", "starting": "starting",
                "restarting": "restarting", "stopped": "stopped"}
SANDBOX_WORDS = {"strong": "sandboxed", "partial": "partly sandboxed",
                 "minimal": "not sandboxed"}


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $text; padding: 0 1; }
    """

    info: reactive[StatusInfo] = reactive(StatusInfo)

    def render(self) -> Text:
        width = self.content_size.width
        for level in range(LEVELS):
            text = self.compose_line(self.info, level)
            if not width or text.cell_len <= width:
                return text
        return text  # narrower than 80 columns: cut with an ellipsis

    @staticmethod
    def backend_text(i: StatusInfo, short: bool) -> str:
        """"CPU (TPU interpret) → v5e" or, short, "CPU interp→v5e"; never left out."""
        chip = (i.chip or i.tpu_chip or "").removeprefix("TPU ")
        if short:
            backend = i.backend.replace(" (TPU interpret)", " interp")
            return backend + (f"→{chip}" if chip and chip not in backend else "")
        return i.backend + (f" → {chip}" if chip and chip not in i.backend else "")

    @staticmethod
    def compose_line(i: StatusInfo, level: int = 0) -> Text:
        """The status line at a level of detail (0: everything, ``LEVELS - 1``: least)."""
        short_words = level >= 2  # "it", no "TPU " words
        text = Text(no_wrap=True, overflow="ellipsis")
        task = i.task if level < 10 or len(i.task) <= 12 else i.task[:11] + "…"
        text.append(task, style="bold")
        text.append(f" · {StatusBar.backend_text(i, short_words)} · ")
        if i.mode == "auto":
            text.append(" AUTO ", style="bold reverse yellow")
        else:
            text.append(" STEP ", style="bold reverse cyan")
        text.append(f" · {'it' if short_words else 'iter'} {i.iteration}")
        if i.tpu_compile and (level < 8 or i.tpu_compile != "ok"):
            _mark, verdict, _sentence, style = compile_verdict(i.tpu_compile)
            if level < 6:
                text.append(" · compile " if short_words else " · TPU compile ")
            else:
                text.append(" · ")
                verdict = "compiles" if i.tpu_compile == "ok" else verdict
            text.append(verdict, style=style)
            vmem = format_vmem(i.vmem_bytes, i.vmem_limit_bytes) if level < 4 else ""
            detail = [x for x in ((i.tpu_chip if level == 0 else None), vmem) if x]
            if detail:
                text.append(" (" + ", ".join(detail) + ")")
        rank = i.best_rank
        if i.best_version is not None and rank is not None and rank.ranked:
            if level == 0:
                what = rank_at_length(rank)
            elif level < 5:
                what = _rank_medium(rank)
            else:
                what = rank.words(short=True)
            text.append(f" · best v{i.best_version}{' ' if level >= 5 else ': '}{what}",
                        style="green")
            if i.best_note and level < 11:  # figures of two kinds, a tie: say so
                text.append(" (" + (i.best_note if level < 2 else i.best_note_short
                                    or "est. + roofline mixed") + ")", style="yellow")
        else:
            text.append(" · best —")
        spent = i.tokens > 0 or i.cost_usd > 0 or not i.cost_known
        cost = f"${i.cost_usd:.2f}" if i.cost_known else \
            ("$?" if i.cost_usd == 0 else f"${i.cost_usd:.2f}+?")
        if level < 7:
            text.append(f" · {_tokens(i.tokens)} tok {cost}")
        elif spent and level < 9:
            text.append(f" · {cost}")
        worker_style = {"idle": "green", "busy": "yellow", "restarting": "red",
                        "stopped": "red"}.get(i.worker, "")
        text.append(" · " if level >= 9 else " · worker ")
        text.append(WORKER_WORDS.get(i.worker, i.worker), style=worker_style)
        if i.confinement and (level < 3 or i.confinement != "strong"):
            words = SANDBOX_WORDS.get(i.confinement, f"sandbox {i.confinement}")
            text.append(f", {words}", style="green" if i.confinement == "strong"
                        else "red" if i.confinement == "minimal" else "yellow")
        return text


class ActivityLine(Static):
    """'⠙ evaluating v3 · 4.2s · F8 F8 cancels' while something long runs."""

    DEFAULT_CSS = """
    ActivityLine { height: 1; padding: 0 1; color: $text-muted; display: none; }
    ActivityLine.-busy { display: block; }
    """
    SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self, clock: Callable[[], float] = time.monotonic, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.clock = clock
        self.show_elapsed = True
        self.cancel_hint = "F8 twice cancels"
        self._label: str | None = None
        self._cancellable = True
        self._since = 0.0
        self._tick = 0

    def on_mount(self) -> None:
        self.set_interval(0.25, self._redraw)

    def start(self, label: str, cancellable: bool = True) -> None:
        self._label, self._since = label, self.clock()
        self._cancellable = cancellable
        self.add_class("-busy")
        self._redraw()

    def stop(self) -> None:
        self._label = None
        self.remove_class("-busy")

    @property
    def busy(self) -> str | None:
        return self._label

    def _redraw(self) -> None:
        if self._label is None:
            return
        self._tick += 1
        spin = self.SPINNER[self._tick % len(self.SPINNER)] if self.show_elapsed else \
            ("..." if self.SPINNER.isascii() else "…")
        elapsed = f" · {self.clock() - self._since:.1f}s" if self.show_elapsed else ""
        hint = f" · {self.cancel_hint}" if self._cancellable else ""
        # One fixed-height line: a repaint, not a relayout of the whole screen (a
        # layout pass costs tens of ms and this ticks four times a second).
        self.update(f"{spin} {self._label}{elapsed}{hint}", layout=False)


class ApprovalBar(Static):
    """The pending decision. Keys are ignored for ``GUARD_S`` after it appears so that
    type-ahead meant for something else cannot approve a proposal by accident."""

    GUARD_S = 0.5
    DEFAULT_CSS = """
    ApprovalBar { height: auto; max-height: 3; padding: 0 1;
                  background: $warning 30%; color: $text; display: none; }
    ApprovalBar.-pending { display: block; }
    ApprovalBar.-hint { background: $boost; color: $text-muted; }
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.clock = clock
        self.proposal: str | None = None
        self._shown_at = 0.0

    def ask(self, proposal: str, text: str, keys: str) -> bool:
        """Show a decision; True when it is new (the caller rings the bell)."""
        new = proposal != self.proposal
        if new:
            self._shown_at = self.clock()
        self.proposal = proposal
        self.update(Text.assemble(("decide ", "bold"), (text, ""), ("  ·  " + keys, "dim")))
        self.remove_class("-hint")
        self.add_class("-pending")
        return new

    def hint(self, text: str) -> None:
        """No decision is due: say what to press next (no key is taken by it)."""
        self.proposal = None
        self.update(Text.assemble(("next ", "bold"), (text, "")))
        self.add_class("-pending", "-hint")

    def clear(self) -> None:
        self.proposal = None
        self.remove_class("-pending", "-hint")

    def accepts_keys(self) -> bool:
        return self.proposal is not None and self.clock() - self._shown_at >= self.GUARD_S
