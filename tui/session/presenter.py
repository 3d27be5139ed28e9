"""From session events to what the panes show; shared by live work and replay.

``render(view)`` refreshes every pane from the folded state (idempotent, cheap when
nothing changed); ``chat_entry(event)`` adds the conversation line one persisted
event deserves; ``live(event)`` handles the live-only notifications (streamed text,
tool progress, worker state). Neither touches the controller.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tilewright.sessions import events as ev
from tilewright.sessions.autonomy import stop_words
from tilewright.sessions.state import Judgement
from tilewright.tui import keymap
from tilewright.tui.format import compile_verdict
from tilewright.tui.session.view import SessionView
from tilewright.tui.widgets.chat import ChatPane
from tilewright.tui.widgets.history import HistoryPane
from tilewright.tui.widgets.panes import PaneGrid
from tilewright.tui.widgets.problems import ProblemsPane
from tilewright.tui.widgets.profile import ProfilePane
from tilewright.tui.widgets.source import SourcePane

PAST = {"approve": "approved", "reject": "rejected", "edit": "edited"}


def describe_stop(event: ev.AutoStop) -> tuple[str, str]:
    """(text, severity) for an auto.stop event: a finished search is not a warning."""
    reason = str(event.get("reason"))
    text = f"autonomous mode stopped: {stop_words(reason)}"
    calm = reason in ("agent_finished", "target_reached", "user")
    return text, "information" if calm else "warning"


def describe_result(event: ev.RunResult, narrow: bool = False,
                    judged: Judgement | None = None) -> tuple[str, str]:
    """(toast text, severity) for a run.result event (``judged``: its judgement, when the
    caller has it already). ``narrow`` (panes as tabs, under 120 columns): the number in
    short words, one line that covers no pane; the whole wording is in the chat and the
    History pane."""
    v = event.get("version")
    if event.get("status") == "error":  # the evaluator failed, not the kernel
        return f"evaluation of v{v} failed (see the error below)", "error"
    if event.get("cancelled"):
        why = {"disconnect": "interrupted: the connection dropped",
               "terminated": "interrupted: the app was stopped (SIGTERM)"}.get(
            str(event.get("cause")), "interrupted: the app stopped" if event.get("interrupted")
            else "cancelled")
        return f"run {event.get('run')} on v{v} {why}", "warning"
    status = event.get("status", "?")
    if event.get("correct"):
        # The ranking number in words (``Rank.words``): an estimate says it is one, host
        # simulation time is not called a speedup (and its milliseconds are the CPU's).
        rank = (judged or Judgement.from_event(dict(event))).rank
        if rank is not None and rank.said:  # disqualified: says why
            # Beside a compiler figure, how far such figures hold for its chip and class
            # (and, in its words, when the memory floor decided it, both figures).
            if narrow:
                return f"v{v} correct · {rank.words(short=True)}", "information"
            trust = rank.trust_words()
            return f"v{v} correct · {rank.words()}" + (f" · trust: {trust}" if trust else ""), \
                "information"
        ms = event.get("median_ms")
        timing = f" · {ms:.3f} ms" if isinstance(ms, int | float) else ""
        return f"v{v} correct{timing}", "information"
    return f"v{v} {status.replace('_', ' ')}", "error"


def chip_line(chip: str, result: dict[str, Any]) -> str:
    """One chip of a chip check: "v5e accepted · VMEM 0.2/16.0 MiB · est. 0.61x on v5e
    (TPU compiler)", or "v5e refused: <the compiler's first line>"."""
    from tilewright.tui.problems import tpu_summary

    tpu = result.get("tpu") or {}
    verdict = compile_verdict(tpu.get("compile"))[2] if tpu.get("compile") else \
        f"not compiled ({result.get('status')})"
    summary = tpu_summary(result).partition(" · ")[2]
    line = f"{chip} {verdict}" + (f" · {summary}" if summary else "")
    if tpu.get("compile") != "ok":
        first = str(tpu.get("message") or (result.get("error") or {}).get("message") or "")
        line += f": {first.strip().splitlines()[0][:160]}" if first.strip() else ""
    return line


def clip_words(text: str, room: int) -> str:
    """``text`` in at most ``room`` characters, cut at a word's end with "…"."""
    text = " ".join(str(text).split())
    if len(text) <= room:
        return text
    cut = text[:room]
    cut = cut[:cut.rindex(" ")] if " " in cut else cut[:room - 1]
    return cut.rstrip(" ,;:(") + "…"


def _tool_body(call: dict[str, Any]) -> str:
    """A read-only tool call's entry: what was asked, then what came back."""
    import json

    asked = json.dumps(call.get("input") or {}) if "input" in call else ""
    return (f"{asked}\n\n" if asked else "") + str(call.get("output") or "")


class Presenter:
    def __init__(self, grid: PaneGrid) -> None:
        self.grid = grid
        self.agent_label = "agent"
        self.base_dir: Path | None = None  # the session directory (relative trace paths)
        # The chat entry of a proposing tool call seen live in this reply: the persisted
        # proposal then fills that entry in instead of adding a second one.
        self._live_proposal: str | None = None
        self._said: set[str] = set()  # agent notices already in the chat

    @property
    def source(self) -> SourcePane:
        return self.grid.query_one(SourcePane)

    @property
    def chat(self) -> ChatPane:
        return self.grid.query_one(ChatPane)

    # -- whole-state refresh ----------------------------------------------------------
    def render(self, view: SessionView) -> None:
        state = view.state
        source = self.source
        current = state.current
        source.show_version(current, view.version_source(current) or "" if current else "")
        pending = view.pending()
        if pending and pending["kind"] in ("kernel", "tuning") and pending["source"]:
            source.show_proposal(pending["id"], pending["source"], pending.get("base"),
                                 pending.get("base_source"))
        elif not pending or pending["kind"] == "plan":
            source.clear_proposal()
        self.grid.query_one(HistoryPane).show(view.history())
        self.grid.query_one(ProblemsPane).show(view.problems(), view.tpu_summary())
        profile_pane = self.grid.query_one(ProfilePane)
        number, profile = view.profile(state.current)
        profiled = state.versions.get(number) if number is not None else None
        profile_pane.set_compiler_vmem(
            (profiled.chip, profiled.vmem_bytes, profiled.vmem_limit_bytes)
            if profiled is not None and profiled.tpu_compile else None)
        if profile is not profile_pane.profile:
            profile_pane.show(profile, number, self.base_dir)

    # -- one persisted event ----------------------------------------------------------
    def chat_entry(self, event: ev.Event) -> None:
        """The conversation line a persisted event deserves (none for some kinds)."""
        entry = _CHAT.get(event["type"])
        if entry is not None:
            entry(self, event)

    def _user_message(self, e: ev.UserMessage) -> None:
        self.chat.add_user(e.get("text", ""))

    def _agent_message(self, e: ev.AgentMessage) -> None:
        chat = self.chat
        if not e.get("proposal"):
            self._live_proposal = None  # the reply ended without one
        for call in e.get("tools") or []:  # read-only tools: filled in, or replayed
            chat.tool_call(str(call.get("id") or call.get("name")), str(call.get("name")),
                           _tool_body(call), "error" if call.get("is_error") else "read-only")
        label = self._label(e.get("role")) + (" · answer" if e.get("answer") else "")
        text = e.get("text")
        if text:
            chat.add_agent(text, label)
        else:
            chat.end_stream()

    def _proposal(self, e: ev.AgentProposal) -> None:
        pid = e.get("proposal", "?")
        fields: dict[str, Any] = dict(e)
        body = {k: fields.get(k) for k in ("summary", "rationale", "plan", "tuning",
                                           "base_version", "role") if fields.get(k)}
        key, self._live_proposal = self._live_proposal or f"proposal:{pid}", None
        self.chat.tool_call(key, f"propose_{e.get('kind', 'kernel')}", body,
                            clip_words(f"{pid}: {e.get('summary', '')}", 70))
        plan = e.get("plan")
        if e.get("kind") == "plan" and plan:
            # A plan is read before it is approved: show it, not just a tool entry.
            self.chat.add_agent(f"**Plan {pid}: {e.get('summary', '')}**\n\n{plan}",
                                self._label(e.get("role")))

    def _decision(self, e: ev.UserDecision) -> None:
        note = f" — {e['note']}" if e.get("note") else ""
        by = " (auto)" if e.get("by") == "auto" else ""
        word = PAST.get(e.get("decision", ""), str(e.get("decision")))
        if not e.get("proposal"):  # the person's own edit, with nothing pending
            keys = keymap.say(self.grid.app, "edit")  # the keys in force, remaps included
            self.chat.add_notice(f"you edited the kernel ({keys}): it becomes a version of yours")
            return
        self.chat.add_notice(f"{word} {e.get('proposal')}{by}{note}")

    def _version(self, e: ev.KernelVersion) -> None:
        origin = "your edit" if e.get("origin") == "user-edit" else e.get("origin")
        parent = f" from v{e['parent']}" if e.get("parent") else ""
        self.chat.add_notice(f"→ v{e.get('version')} ({origin}{parent}): "
                             f"{e.get('summary', '')}")

    def _checkout(self, e: ev.KernelCheckout) -> None:
        reason = f" ({e['reason']})" if e.get("reason") else ""
        self.chat.add_notice(f"→ back to v{e.get('version')}{reason}"
                             if e.get("by") == "auto" else f"→ reverted to v{e.get('version')}")

    def _run_result(self, e: ev.RunResult) -> None:
        text, severity = describe_result(e)
        self.chat.add_notice(text, "error" if severity == "error" else "info")

    def _profile_result(self, e: ev.ProfileResult) -> None:
        what = "static analysis of" if e.get("static") else "profiled"
        if e.get("error"):
            self.chat.add_notice(f"{what} v{e.get('version')} failed: {e['error']}", "warning")
        else:
            self.chat.add_notice(f"{what} v{e.get('version')}")

    def _diagnosis(self, e: ev.Diagnosis) -> None:
        self.chat.add_notice(f"diagnosis of v{e.get('version')}: {e.get('summary')}")

    def _mode(self, e: ev.ModeChange) -> None:
        self.chat.add_notice(f"mode: {str(e.get('mode', '')).upper()} "
                             f"(by {e.get('by', 'user')})")

    def _agent_finished(self, e: ev.AgentFinished) -> None:
        self._once(str(e.get("message") or "the agent has nothing more to try"))

    def _once(self, text: str, level: str = "info") -> None:
        """An agent's notice said once: the same words again (the offline agent's
        "tuning converged", "does not read chat messages") add nothing but noise."""
        if text in self._said:
            return
        self._said.add(text)
        self.chat.add_notice(text, level)

    def _auto_stop(self, e: ev.AutoStop) -> None:
        text, severity = describe_stop(e)
        self.chat.add_notice(text, "info" if severity == "information" else severity)

    def _error(self, e: ev.Error) -> None:
        self.chat.add_notice(f"error ({e.get('where', '?')}): {e.get('message')}", "error")

    def _label(self, role: str | None) -> str:
        return f"{self.agent_label}" + (f" · {role}" if role else "")

    # -- live-only notifications ------------------------------------------------------
    def live(self, event: ev.LiveEvent) -> None:
        """What a live-only notification changes in the conversation (if anything)."""
        handler = _LIVE.get(event["type"])
        if handler is not None:
            handler(self, event)

    def _delta(self, e: ev.AgentDelta) -> None:
        self.chat.stream_delta(str(e.get("text", "")), self._label(None))

    def _tool_result(self, e: ev.AgentToolResult) -> None:
        self.chat.tool_call(str(e.get("id") or e.get("name")), str(e.get("name", "tool")),
                            _tool_body(dict(e)), "error" if e.get("is_error") else "read-only")

    def _tool_delta(self, e: ev.AgentToolDelta) -> None:  # a call still streaming in
        key = str(e.get("id") or e.get("name"))
        if str(e.get("name", "")).startswith("propose_"):
            self._live_proposal = key
        self.chat.tool_stream(key, str(e.get("name", "tool")), str(e.get("text", "")))

    def _tool(self, e: ev.AgentTool) -> None:
        key = str(e.get("id") or e.get("name"))
        if str(e.get("name", "")).startswith("propose_"):
            self._live_proposal = key
        # The whole call, not yet run: no status (its result comes as agent.tool_result).
        self.chat.tool_call(key, str(e.get("name", "tool")), e.get("input") or {}, "")

    def _agent_notice(self, e: ev.AgentNotice) -> None:
        """The agent's notices are said once a session (an error each time)."""
        text, level = str(e.get("text", "")), str(e.get("level", "info"))
        if level != "error":
            self._once(text, level)
        else:
            self.chat.add_notice(text, level)

    def _notice(self, e: ev.Notice) -> None:
        self.chat.add_notice(str(e.get("text", "")), str(e.get("level", "info")))

    def _run_progress(self, e: ev.RunProgress) -> None:
        """The production verdict (then its estimate) while the trials still run."""
        from tilewright.kernels.judge.rank import production_note

        if not e.get("final"):  # the verdict alone: the estimate follows in seconds
            return
        tpu = e.get("tpu") or {}
        level = "warning" if tpu.get("compile") == "error" else "info"
        self.chat.add_notice(f"v{e.get('version')} {production_note(tpu)} "
                             "(the check-shape trials go on)", level)


# Persisted and live events come as plain dicts; each method is filed under the kinds
# its annotation reads (``ev.by_kind``). A kind missing here adds no conversation line:
# the panes show it from the folded state.
_CHAT: dict[str, Callable[[Presenter, Any], None]] = ev.by_kind(
    Presenter._user_message, Presenter._agent_message, Presenter._proposal, Presenter._decision,
    Presenter._version, Presenter._checkout, Presenter._run_result, Presenter._profile_result,
    Presenter._diagnosis, Presenter._mode, Presenter._agent_finished, Presenter._auto_stop,
    Presenter._error)

_LIVE: dict[str, Callable[[Presenter, Any], None]] = ev.by_kind(
    Presenter._delta, Presenter._tool_result, Presenter._tool_delta, Presenter._tool,
    Presenter._agent_notice, Presenter._notice, Presenter._run_progress)
