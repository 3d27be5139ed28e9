"""From session events to what the panes show; shared by live work and replay.

``render(view)`` refreshes every pane from the folded state (idempotent, cheap when
nothing changed); ``chat_entry(event)`` adds the conversation line one persisted
event deserves; ``live(event)`` handles the live-only notifications (streamed text,
tool progress, worker state). Neither touches the controller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tui.format import format_speedup
from tui.view import SessionView
from tui.widgets.chat import ChatPane
from tui.widgets.history import HistoryPane
from tui.widgets.panes import PaneGrid
from tui.widgets.problems import ProblemsPane
from tui.widgets.profile import ProfilePane
from tui.widgets.source import SourcePane

PAST = {"approve": "approved", "reject": "rejected", "edit": "edited"}
STOP_REASONS = {  # auto.stop reasons in words (keyed by the part before any ':')
    "budget": "a budget is used up",
    "no_improvement": "no better kernel for a while",
    "target_reached": "the target speedup is reached",
    "agent_finished": "the agent has nothing more to try",
    "agent_failed": "the agent could not propose anything",
    "agent_repeating": "the agent kept proposing kernels already measured",
    "interrupted": "the app stopped while it ran",
    "user": "switched off",
}


def _speed(value: Any) -> str:
    return format_speedup(value)


def describe_stop(event: dict[str, Any]) -> tuple[str, str]:
    """(text, severity) for an auto.stop event: a finished search is not a warning."""
    reason = str(event.get("reason"))
    words = STOP_REASONS.get(reason.split(":")[0])
    text = f"autonomous mode stopped: {reason}" + (f" ({words})" if words else "")
    calm = reason in ("agent_finished", "target_reached", "user")
    return text, "information" if calm else "warning"


def describe_result(event: dict[str, Any]) -> tuple[str, str]:
    """(toast text, severity) for a run.result event."""
    v = event.get("version")
    if event.get("status") == "error":  # the evaluator failed, not the kernel
        return f"evaluation of v{v} failed (see the error below)", "error"
    if event.get("cancelled"):
        return f"run {event.get('run')} on v{v} cancelled", "warning"
    status = event.get("status", "?")
    if event.get("correct") and event.get("rank_label"):
        # The ranking number in words: an estimate says it is one, host simulation
        # time is not called a speedup (and its milliseconds are the CPU's).
        return f"v{v} correct · {event['rank_label']}", "information"
    if event.get("correct"):
        ms = event.get("median_ms")
        timing = f", {ms:.3f} ms" if isinstance(ms, int | float) else ""
        return f"v{v} correct · {_speed(event.get('speedup'))}{timing}", "information"
    return f"v{v} {status.replace('_', ' ')}", "error"


def chip_line(chip: str, result: dict[str, Any]) -> str:
    """One chip of a chip check: "v5e accepted · VMEM 0.2/16.0 MiB · est. 0.61x on v5e
    (TPU compiler)", or "v5e refused: <the compiler's first line>"."""
    from tui.problems import tpu_summary

    tpu = result.get("tpu") or {}
    verdict = {"ok": "accepted", "error": "refused", "unavailable": "not compiled"}.get(
        tpu.get("compile"), f"not compiled ({result.get('status')})")
    summary = tpu_summary(result).partition(" · ")[2]
    line = f"{chip} {verdict}" + (f" · {summary}" if summary else "")
    if tpu.get("compile") != "ok":
        first = str(tpu.get("message") or (result.get("error") or {}).get("message") or "")
        line += f": {first.strip().splitlines()[0][:160]}" if first.strip() else ""
    return line


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
            source.show_proposal(pending["id"], pending["source"])
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
    def chat_entry(self, event: dict[str, Any]) -> None:
        chat, kind = self.chat, event.get("type")
        if kind == "user.message":
            chat.add_user(event.get("text", ""))
        elif kind == "agent.message":
            if not event.get("proposal"):
                self._live_proposal = None  # the reply ended without one
            for call in event.get("tools") or []:  # read-only tools: filled in, or replayed
                chat.tool_call(str(call.get("id") or call.get("name")), str(call.get("name")),
                               _tool_body(call), "error" if call.get("is_error") else "read-only")
            label = self._label(event) + (" · answer" if event.get("answer") else "")
            if event.get("text"):
                chat.add_agent(event["text"], label)
            else:
                chat.end_stream()
        elif kind == "agent.proposal":
            pid = event.get("proposal", "?")
            body = {k: event.get(k) for k in ("summary", "rationale", "plan", "tuning",
                                               "base_version", "role") if event.get(k)}
            key, self._live_proposal = self._live_proposal or f"proposal:{pid}", None
            chat.tool_call(key, f"propose_{event.get('kind', 'kernel')}", body,
                           f"{pid}: {event.get('summary', '')}"[:70])
            if event.get("kind") == "plan" and event.get("plan"):
                # A plan is read before it is approved: show it, not just a tool entry.
                chat.add_agent(f"**Plan {pid}: {event.get('summary', '')}**\n\n{event['plan']}",
                               self._label(event))
        elif kind == "user.decision":
            note = f" — {event['note']}" if event.get("note") else ""
            by = " (auto)" if event.get("by") == "auto" else ""
            word = PAST.get(event.get("decision", ""), str(event.get("decision")))
            chat.add_notice(f"{word} {event.get('proposal')}{by}{note}")
        elif kind == "kernel.version":
            chat.add_notice(f"→ v{event.get('version')} ({event.get('origin')}): "
                            f"{event.get('summary', '')}")
        elif kind == "kernel.checkout":
            chat.add_notice(f"→ reverted to v{event.get('version')}")
        elif kind == "run.result":
            text, severity = describe_result(event)
            chat.add_notice(text, "error" if severity == "error" else "info")
        elif kind == "profile.result":
            chat.add_notice(f"profiled v{event.get('version')}")
        elif kind == "diagnosis":
            chat.add_notice(f"diagnosis of v{event.get('version')}: {event.get('summary')}")
        elif kind == "mode.change":
            chat.add_notice(f"mode: {str(event.get('mode', '')).upper()} "
                            f"(by {event.get('by', 'user')})")
        elif kind == "agent.finished":
            chat.add_notice(str(event.get("message") or "the agent has nothing more to try"))
        elif kind == "auto.stop":
            text, severity = describe_stop(event)
            chat.add_notice(text, "info" if severity == "information" else severity)
        elif kind == "error":
            chat.add_notice(f"error ({event.get('where', '?')}): {event.get('message')}",
                            "error")

    def _label(self, event: dict[str, Any]) -> str:
        role = event.get("role")
        return f"{self.agent_label}" + (f" · {role}" if role else "")

    # -- live-only notifications ------------------------------------------------------
    def live(self, event: dict[str, Any]) -> None:
        kind = str(event.get("type", ""))
        if kind == "agent.delta":
            self.chat.stream_delta(str(event.get("text", "")), self._label(event))
        elif kind == "agent.tool_result":
            self.chat.tool_call(str(event.get("id") or event.get("name")),
                                str(event.get("name", "tool")), _tool_body(event),
                                "error" if event.get("is_error") else "read-only")
        elif kind == "agent.tool_delta":  # a call still streaming in
            key = str(event.get("id") or event.get("name"))
            if str(event.get("name", "")).startswith("propose_"):
                self._live_proposal = key
            self.chat.tool_stream(key, str(event.get("name", "tool")), str(event.get("text", "")))
        elif kind == "agent.tool":
            key = str(event.get("id") or event.get("name"))
            if str(event.get("name", "")).startswith("propose_"):
                self._live_proposal = key
            self.chat.tool_call(key, str(event.get("name", "tool")),
                                event.get("input") or {}, str(event.get("status", "")))
        elif kind in ("agent.notice", "notice"):
            self.chat.add_notice(str(event.get("text", "")), str(event.get("level", "info")))
