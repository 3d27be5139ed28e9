"""``tilewright auto``: a headless autonomous run, one progress line per step.

The same controller the TUI drives, in autonomous mode from the start, until a budget
or stop rule ends it. SIGINT/SIGTERM (Ctrl-C) cancel whatever runs, write ``auto.stop``
(``user``) and ``session.end``, close the workers and still print the summary: the
session is saved and can be resumed with ``--resume``. A kill -9 loses at most the
event being written; ``--resume`` folds the session and carries on appending.

Exit codes: 0 when a correct version was found; 1 when none was, when the agent failed
(``agent_failed``) or when the session could not be written (a full disk, a read-only
directory: the error is printed and, where the disk still allows, recorded); 2 when the
task itself failed (``task_error``: its reference or inputs, or its size under the
worker's limits; no kernel can be judged); 130 when interrupted. A session another process is writing is refused (``SessionLockedError``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from tilewright.agents.config import Config
from tilewright.kernels.judge.judgement import Judgement
from tilewright.kernels.judge.rank import Rank
from tilewright.kernels.judge.result import is_interpret
from tilewright.kernels.source.printable import PrintableStream
from tilewright.sessions import events as ev
from tilewright.sessions.autonomy import ControllerSettings
from tilewright.sessions.errors import ControllerError
from tilewright.sessions.log import SessionWriteError
from tilewright.sessions.state import SessionState

AUTO_SCHEMA = "tilewright.auto/1"
# A headless run times each version briefly (the config's [eval] and the flags override).
AUTO_EVAL_DEFAULTS = {"time_budget_s": 1.0}


class Progress:
    """Prints one line per finished evaluation, plus stops and errors."""

    def __init__(self, state: SessionState, out: TextIO,
                 settings: ControllerSettings | None = None, width: int | None = None) -> None:
        self.state = state
        self.out = out
        self.settings = settings
        # The terminal's width (COLUMNS, else the terminal, else 100): every line fits it.
        # Written to a file or a pipe (a log, --json's progress) without COLUMNS: one
        # line per step, as long as it is (a reader greps it; nothing wraps it).
        piped = not getattr(out, "isatty", lambda: False)() and "COLUMNS" not in os.environ
        self.width = width or (10_000 if piped else shutil.get_terminal_size((100, 24)).columns)
        self._explained: set[str] = set()  # each kind of number is said once, at its first

    def __call__(self, event: ev.AnyEvent) -> None:
        prints = _PRINTS.get(event["type"])  # live events and the rest print nothing
        if prints is not None:
            prints(self, event)

    def _run_result(self, e: ev.RunResult) -> None:
        if not e.get("cancelled"):
            self._step(e)

    def _auto_stop(self, e: ev.AutoStop) -> None:
        from tilewright.sessions.autonomy import stop_words

        self._say(f"stop: {stop_words(e['reason'], self.settings)} ({e['reason']})")

    def _checkout(self, e: ev.KernelCheckout) -> None:
        if e.get("by") != "auto":
            return
        v = self.state.versions.get(e["version"])
        label = f" ({v.rank.words(short=True)})" if v is not None and v.rank else ""
        self._say(f"current: v{e['version']}, the best version{label}")

    def _error(self, e: ev.Error) -> None:
        self._say(f"error ({e.get('where')}): {e['message']}")

    def _agent_finished(self, e: ev.AgentFinished) -> None:
        self._say(f"agent finished: {e['message']}")

    def _say(self, text: str, indent: str = "") -> None:
        """A message wrapped at spaces to the terminal's width (continued indented)."""
        import textwrap

        lines = textwrap.wrap(text, max(40, self.width), initial_indent=indent,
                              subsequent_indent=indent + "    ", break_long_words=False,
                              break_on_hyphens=False) or [indent]
        for line in lines:
            print(line, file=self.out, flush=True)

    def _step(self, event: ev.RunResult) -> None:
        s = self.state
        rank = Judgement.from_event(event).rank
        explained = _what_numbers_are(rank)
        if explained and explained not in self._explained:
            self._explained.add(explained)  # each kind of number once, at its first
            self._say(f"({explained})", indent="  ")
        v = s.versions.get(event["version"])
        # Every number says what it is (Rank.words): "est. 1.34x" (the TPU compiler's
        # estimate), "≥0.87x roofline", "1.20x meas." (a TPU), "host sim 0.01" (the CPU
        # interpreter: not a speedup).
        speed = rank.words(short=True) if rank is not None else "-"
        best = f"{s.best_rank.words(short=True) if s.best_rank else '-'} (v{s.best})" \
            if s.best is not None else "none yet"
        for line in step_lines(self.width, s.auto_spent.iterations, event["version"],
                               v.summary if v else "", str(event["status"]), speed, best,
                               s.spent.tokens, float(event["t"])):
            print(line, file=self.out, flush=True)
        if event.get("status") not in ("correct", None) and event.get("error"):
            # why it failed, in one line (the report and the session have it whole)
            why = " ".join(str(event["error"]).split())
            print(f"      {abbreviate(why, max(20, self.width - 7))}", file=self.out,
                  flush=True)


# What a headless run prints, filed by the event each method reads (``ev.by_kind``).
_PRINTS: dict[str, Callable[[Progress, Any], None]] = ev.by_kind(
    Progress._run_result, Progress._auto_stop, Progress._checkout, Progress._error,
    Progress._agent_finished)


def abbreviate(text: str, room: int) -> str:
    """``text`` in at most ``room`` characters, cut at a word's end with "…" (a single
    word longer than the room is kept whole: never cut mid-word)."""
    text = " ".join(str(text).split())
    if len(text) <= room:
        return text
    # the words that end within room - 1 characters (the "…" takes the last one)
    cut = text[:max(1, room - 1) + 1]
    cut = cut[:cut.rindex(" ")] if " " in cut else text.split(" ", 1)[0]
    return cut.rstrip(" ,;:(") + "…"


def step_lines(width: int, iteration: int, version: int, summary: str, status: str,
               speed: str, best: str, tokens: int, t: float) -> list[str]:
    """One evaluation's progress, fitting ``width``: "[  3] v3   tune BLOCK_ROWS 32 -> 64…
    correct  est. 4.00x  best est. 4.00x (v3)  tok 0  t 2.1s"; the summary is
    abbreviated at a word's end, and on a terminal too narrow for one line the numbers
    go to a second, indented line."""
    head = f"[{iteration:>3}] v{version:<3} "
    tail = f"  {status} {speed}  best {best}  tok {tokens}  t {t:.1f}s"
    room = width - len(head) - len(tail)
    if room >= 16:
        return [head + abbreviate(summary, room).ljust(min(room, 40)) + tail]
    lines = [head + abbreviate(summary, max(10, width - len(head)))]
    line = ""
    for part in (f"{status} {speed}", f"best {best}", f"tok {tokens}", f"t {t:.1f}s"):
        if line and 6 + len(line) + 2 + len(part) > width:
            lines.append("      " + line)
            line = ""
        line = f"{line}  {part}" if line else part
    lines.append("      " + line)
    return lines


def _what_numbers_are(rank: Rank | None) -> str | None:
    """A kind of number in words, the first time a line shows it."""
    if rank is None or not rank.ranked:
        return None
    where = f"{rank.chip or 'the chip'}" + (f" at {rank.shape}" if rank.shape else "")
    if rank.is_estimate:
        return (f"est.: the TPU compiler's estimated speedup over the XLA reference on "
                f"{where}; a prediction, not a measurement")
    if rank.is_roofline:
        return (f"≥ roofline: the kernel's TPU compiler estimate against the XLA "
                f"reference's roofline on {where} (the reference has no estimate); a lower "
                "bound of the speedup, not a measurement")
    if rank.is_bound:
        return (f"≤ bound: the XLA reference's time over the least time the kernel can take "
                f"on {where} (its work at the chip's peak, its memory floor); its own "
                "estimate is not believed (a loop whose length is read at run time); an "
                "upper bound of the speedup, not a measurement")
    if rank.simulated:
        return "host sim: the CPU interpreter's time ratio; it predicts nothing about a TPU"
    return None


def summary(log_path: Path, state: SessionState, interrupted: bool) -> dict[str, Any]:
    best = state.versions.get(state.best) if state.best is not None else None
    current = state.versions.get(state.current) if state.current is not None else None
    return {
        "schema": AUTO_SCHEMA, "session": str(log_path), "session_id": log_path.name,
        "task": (state.header.get("task") or {}).get("name"),
        "backend": state.header.get("backend"),
        "iterations": state.spent.iterations, "evaluations": state.spent.runs,
        "best_version": best.number if best else None,
        "best_status": best.status if best else (current.status if current else None),
        # what ranks the best version (kernels.judge.rank.Rank as JSON) and in words
        "best_rank": best.rank.to_json() if best and best.rank else None,
        "best_words": best.rank.words() if best and best.rank else None,
        "best_trust": best.rank.trust_words() if best and best.rank else None,
        # why the best is not the highest estimate, when estimates within a percent tied
        "best_note": state.best_tie,
        "current_version": state.current,
        "stop_reason": state.auto_stops[-1]["reason"] if state.auto_stops else None,
        "interrupted": interrupted,
        "tokens": state.spent.tokens, "cost_usd": round(state.spent.cost_usd, 6),
        "cost_known": not state.spent.cost_unknown, "cost": state.spent.cost_text(),
        "versions": [{"version": v.number, "origin": v.origin, "status": v.status,
                      "rank": v.rank.to_json() if v.rank else None,
                      "rank_words": v.rank.words(short=True) if v.rank else None,
                      "summary": v.summary}
                     for v in state.versions.values()],
    }


def print_summary(data: dict[str, Any], out: TextIO,
                  settings: ControllerSettings | None = None) -> None:
    from tilewright.sessions.autonomy import stop_words

    speed = data.get("best_words") or "-"
    if data.get("best_trust"):
        speed += f"; trust: {data['best_trust']}"
    best = f"v{data['best_version']}" if data["best_version"] else "no correct version"
    print(f"\n{data['task']}: {data['iterations']} iterations, {data['evaluations']} "
          f"evaluations; best {best} ({data['best_status'] or '-'}, {speed})", file=out)
    if data.get("best_note"):
        print(f"  {data['best_note']}", file=out)
    reason = data["stop_reason"]
    words = f"{stop_words(reason, settings)} ({reason})" if reason else "-"
    print(f"stopped: {words}{' (interrupted)' if data['interrupted'] else ''}"
          f"; tokens {data['tokens']}, cost {data['cost']}", file=out)
    backend = data.get("backend") or {}
    if is_interpret(backend):
        print("timings: TPU interpret mode on the CPU (simulated, not TPU performance)",
              file=out)
    print(f"session: {data['session']}", file=out)
    sid = data.get("session_id") or data["session"]
    from tilewright.sessions.cli.invocation import invocation

    tw = invocation()
    if data["best_version"]:
        print(f"export:  {tw} export {sid} best -o {data['task']}_kernel.py --test",
              file=out)
    else:
        print("export:  no correct version yet (nothing to export)", file=out)
    print(f"resume:  {tw} --resume {sid}   (or {tw} auto --resume {sid})", file=out)


async def run_auto(args: Any, config: Config | dict[str, Any]) -> int:
    from tilewright.agents.config import coerce
    from tilewright.sessions.opening import SessionRequest, open_session

    out = PrintableStream(sys.stderr if args.json else sys.stdout)
    config = coerce(config)
    settings = ControllerSettings.from_config(config)
    if args.budget is not None:
        budgets = settings.budgets.model_copy(update={"iterations": args.budget})
        settings = settings.model_copy(update={"budgets": budgets})
    if args.target is not None:
        settings = settings.model_copy(update={"target_speedup": args.target})
    flags = {"trials": args.trials, "time_budget_s": args.time_budget,
             "timeout_s": getattr(args, "timeout", None), "chip": getattr(args, "chip", None)}
    request = SessionRequest(task=args.task, overrides=args.overrides, resume=args.resume,
                             sessions_dir=args.session_dir, agent=args.agent,
                             eval={k: v for k, v in flags.items() if v is not None})
    session = await open_session(request, config, settings=settings,
                                 eval_defaults=AUTO_EVAL_DEFAULTS)
    for warning in session.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    controller, log = session.controller, session.log
    backend = session.backend.label() if session.backend else "?"
    print(f"session {log.id} · {session.task.name} · {backend} · {session.agent.label}",
          file=out, flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        controller.subscribe(Progress(controller.state, out, settings))
        try:
            controller.set_mode("auto", by="user")
        except ControllerError as exc:  # e.g. a resumed session whose agent had finished
            print(f"tilewright auto: {exc}", file=sys.stderr)
            refused = True
        else:
            refused = False
        waiter = asyncio.ensure_future(controller.wait_idle())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        interrupted = stop.is_set()
        stopper.cancel()
        if interrupted:
            print("interrupted: stopping cleanly (the session is saved)", file=out, flush=True)
        try:
            await session.close("interrupted" if interrupted else "completed")
        except SessionWriteError:
            pass  # already in log.write_error; reported below
        waiter.cancel()
        if not waiter.cancelled() and waiter.done() and waiter.exception() is not None \
                and log.write_error is None:
            raise waiter.exception()  # type: ignore[misc]
    finally:
        await session.release()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    data = summary(log.path, controller.state, interrupted)
    if log.write_error is not None:
        data["stop_reason"] = "write_error"
        data["error"] = str(log.write_error)
    if args.json:
        print(json.dumps(data, indent=2))
    print_summary(data, out, settings)
    if refused:
        return 1
    if log.write_error is not None:
        print(f"tilewright auto: {log.write_error}", file=sys.stderr)
        return 1
    if interrupted:
        return 130
    if data["stop_reason"] == "task_error":  # a broken task, as `tilewright eval` says it
        history = controller.state.best_history
        print("tilewright auto: the task itself failed, not the kernel: "
              f"{(history[-1].judgement.error if history else None) or '(no message)'}\n"
              "  next: fix the task, or make it smaller with --set KEY=VALUE "
              "(`tilewright tasks DIR` shows its shapes)", file=sys.stderr)
        return 2
    if data["stop_reason"] == "agent_failed":
        return 1
    return 0 if data["best_version"] else 1
