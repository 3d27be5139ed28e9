"""The live workbench: the five panes, the decision bar, long-work progress, status.

The screen turns keys into controller commands (through ``LiveLink``) and controller
events into pane updates (through ``Presenter``). The link posts each event as its
family's message (``tui.session.link``); all drawing happens in the ``@on`` handlers,
on the UI's own schedule.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

from textual import on
from textual.app import ComposeResult
from textual.reactive import Reactive, var
from textual.screen import Screen
from textual.widget import Widget
from textual.worker import Worker, WorkerState

from tilewright.sessions import events as ev
from tilewright.tui import keymap
from tilewright.tui.screens.diff import DiffScreen, SourceScreen
from tilewright.tui.screens.modals import ErrorModal, NotePrompt, PlanEditor
from tilewright.tui.screens.workbench_parts import KeyHints, VersionCommands
from tilewright.tui.session.link import (
    AgentSaid,
    AgentStarted,
    AgentStreamed,
    AutoStopped,
    ControllerBusy,
    ControllerIdle,
    DecisionMade,
    LiveLink,
    ProfileFinished,
    ProposalMade,
    RunChanged,
    RunFinished,
    RunStarted,
    SessionError,
    SessionStatus,
    VersionMade,
    WorkerStateChanged,
)
from tilewright.tui.session.presenter import Presenter, describe_result, describe_stop
from tilewright.tui.session.view import BlobCache, SessionView
from tilewright.tui.widgets.chat import ChatPane
from tilewright.tui.widgets.footer import KeyFooter
from tilewright.tui.widgets.history import HistoryPane
from tilewright.tui.widgets.panes import PaneGrid
from tilewright.tui.widgets.problems import ProblemsPane
from tilewright.tui.widgets.profile import ProfilePane
from tilewright.tui.widgets.source import SourcePane
from tilewright.tui.widgets.status import ActivityLine, ApprovalBar, StatusBar

CANCEL_WINDOW_S = 1.5


def slash_command(text: str) -> tuple[Any, ...] | None:
    """``/plan [wishes]`` -> ask the planner; ``/explain [vN] [question]`` -> ask the
    analyst; other text is a message (None); an unknown ``/word`` says what exists."""
    if not text.startswith("/"):
        return None
    word, _, rest = text[1:].partition(" ")
    rest = rest.strip()
    if word == "plan":
        return ("request_plan", rest or None)
    if word == "explain":
        head, _, question = rest.partition(" ")
        version = head.lstrip("v") if head.lstrip("v").isdigit() else None
        question = question if version is not None else rest
        return ("explain", int(version) if version else None, question.strip() or None)
    return ("unknown", f"unknown command /{word}: use /plan [what you want] or "
                       "/explain [vN] [question]")


class WorkbenchScreen(VersionCommands, KeyHints, Screen):
    CSS_PATH = "workbench.tcss"
    BINDINGS = keymap.global_bindings()
    # Textual repaints the whole screen when focus moves (``Screen.focused`` repaints);
    # the widgets whose look depends on focus restyle and repaint themselves anyway, so
    # a focus move here repaints those alone (about half the work of F6 on 2 cores).
    focused: Reactive[Widget | None] = Reactive(None, repaint=False)
    # The worker's state and the chip (its label, its VMEM bytes) the session is judged
    # for: set by the session's events and the app; their watchers redraw what shows them.
    worker_state: var[str] = var("starting", init=False, always_update=True)
    chip: var[tuple[str | None, float | None]] = var((None, None), init=False)

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 chip_label: str | None = None, vmem_capacity: float | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.link: LiveLink | None = None
        self.presenter: Presenter | None = None
        self.blobs: BlobCache | None = None
        self.set_reactive(WorkbenchScreen.chip, (chip_label, vmem_capacity))
        self._cancel_armed_at: float | None = None
        self._leave_armed_at: float | None = None  # Esc once over changes: armed
        self.kept_draft: Any = None  # a ``sessions.drafts.Draft`` offered back on resume
        self._draw_scheduled = False
        self._unsubscribe: Callable[[], None] | None = None

    def compose(self) -> ComposeResult:
        yield PaneGrid(id="grid")
        yield ApprovalBar(self.clock, id="approval")
        yield ActivityLine(self.clock, id="activity")
        yield StatusBar(id="status")
        yield KeyFooter()

    def on_mount(self) -> None:
        look = getattr(self.app, "look", None)
        if look is not None and look.ascii:
            self.add_class("-ascii")  # ASCII pane borders (PaneGrid's CSS)
            self.query_one(ActivityLine).SPINNER = look.spinner
        self.query_one(ActivityLine).cancel_hint = \
            f"{keymap.say(self.app, 'cancel', joiner='/')} twice cancels"
        self.presenter = Presenter(self.query_one(PaneGrid))
        self.query_one(ProfilePane).set_chip(*self.chip)
        self.query_one(PaneGrid).show("source")  # the keyboard starts in the editor
        if self.link is None:
            self.opening("opening the session (starting the JAX worker)")

    @property
    def chip_label(self) -> str | None:
        return self.chip[0]

    def watch_chip(self, chip: tuple[str | None, float | None]) -> None:
        self.query_one(ProfilePane).set_chip(*chip)
        self._draw_status()

    def watch_worker_state(self) -> None:
        self._draw_status()

    # -- what the app asks of the screen ----------------------------------------------
    def opening(self, what: str) -> None:
        """A session is being opened: say so on the activity line until it lands."""
        self.query_one(ActivityLine).start(what, cancellable=False)

    def open_failed(self) -> None:
        """Opening the session failed (the app says why in a modal)."""
        self.query_one(ActivityLine).stop()

    def add_notice(self, text: str, level: str = "info") -> None:
        """A line in the conversation from the app itself."""
        self.query_one(ChatPane).add_notice(text, level)

    @property
    def editing(self) -> bool:
        """The Source editor is in an edit (of a proposal or of the current version)."""
        return self.source.in_edit()

    def cancel_now(self) -> None:
        """Cancel the agent's reply or the run at once (the palette's command: no
        second press)."""
        self._command(lambda link: link.cancel())

    def revert(self, version: int) -> None:
        """Make ``version`` the current one again."""
        self._command(lambda link: link.revert(version))

    def unsaved_edit(self) -> tuple[str, int | None, str | None] | None:
        """The Source editor's unsaved text (the text, the version it edits, the
        proposal it edits), or None when nothing was typed."""
        source = self.source
        if not (source.in_edit() and source.is_modified()):
            return None
        return (source.edited_source(), source.version,
                source.proposal if source.editing else None)

    # -- attaching a live session -----------------------------------------------------
    def attach(self, link: LiveLink) -> None:
        self.link = link
        self.blobs = BlobCache(link.read_blob)
        assert self.presenter is not None
        self.presenter.agent_label = link.agent_label
        self.presenter.base_dir = link.path
        self.query_one(ChatPane).set_agent_label(link.agent_label)
        self.worker_state = link.worker_state
        self.query_one(ActivityLine).stop()
        # Anything already in the log (a resumed session) first, then live events.
        recorded: list[ev.Event] | None = None
        try:
            recorded = link.recorded_events()
            for event in recorded:
                self.presenter.chat_entry(event)
        except Exception as exc:  # the log is readable by the controller; say what broke
            self.notify(f"could not show the session's history: {exc}", severity="warning")
        self._unsubscribe = link.post_to(self)
        self._schedule_draw()
        self._say_what_a_stop_left(link, recorded)

    def _say_what_a_stop_left(self, link: LiveLink, recorded: list[ev.Event] | None) -> None:
        """On resume: what the last stop by a signal cut short, and the kept draft."""
        chat = self.query_one(ChatPane)
        try:
            stop = link.last_stop(recorded)
            draft = link.kept_draft()
        except Exception as exc:  # a session's history must not stop it from opening
            self.notify(f"could not read how the session last stopped: {exc}",
                        severity="warning")
            return
        if stop is not None:
            again = f"; {keymap.say(self.app, 'run', most=1)} runs the current version " \
                "again" if stop.runs else ""
            chat.add_notice(f"last time {stop.words()}{again}", "warning")
        if draft is not None:
            self.kept_draft = draft
            lines = draft.text.count("\n") + 1
            why = {"disconnect": "when the connection dropped",
                   "terminated": "when the app was stopped",
                   "quit": "when you quit"}.get(draft.why, "")
            text = (f"a draft was kept {why} ({draft.words()}, {lines} lines): "
                    f"{keymap.say(self.app, 'edit')} opens it in the editor (or \"Open the "
                    "kept draft\" in the command palette)")
            chat.add_notice(text, "warning")
            self.notify(text, title="draft kept", timeout=12)

    def open_draft(self) -> None:
        """The kept draft into the editor, as the edit it was; its file is then removed
        (a later stop keeps the editor's text again)."""
        draft, source = self.kept_draft, self.source
        if draft is None or self.link is None:
            self.notify("no draft is kept", timeout=3)
            return
        if source.proposal is not None and draft.proposal != source.proposal:
            self.notify(f"proposal {source.proposal} waits for a decision: decide it, then "
                        "open the draft (it stays kept)", severity="warning", timeout=6)
            return
        self.query_one(PaneGrid).show("source")
        source.load_draft(draft.text)
        self.kept_draft = None
        self.link.drop_draft()
        base = "" if draft.proposal or draft.version in (None, source.version) \
            else f" (it was an edit of v{draft.version}; the editor now edits " \
            f"v{source.version})"
        self.notify(f"the draft is in the editor{base}: {keymap.say(self.app, 'edit')} "
                    "submits it, Esc twice drops it", timeout=8)

    def view(self) -> SessionView | None:
        if self.link is None or self.blobs is None:
            return None
        return SessionView(self.link.state, self.blobs)

    # -- events from the controller: one handler per family (``tui.session.link``) ---
    # Notifications that may carry the candidate's words (an error line, a profile
    # failure) are plain text: markup=False, never console markup or links.
    @on(ProposalMade)
    def _proposal_made(self, message: ProposalMade) -> None:
        self._presenter.chat_entry(cast("ev.AgentProposal", message.event))
        if self.link and self.link.state.mode == "step":
            self.app.bell()  # a decision is awaited
        self._schedule_draw()

    @on(DecisionMade)
    @on(VersionMade)
    def _kernel_changed(self, message: DecisionMade | VersionMade) -> None:
        self._presenter.chat_entry(cast("ev.Event", message.event))
        self._schedule_draw()

    @on(RunStarted)
    def _run_started(self, message: RunStarted) -> None:
        what = {"profile": "profiling", "analysis": "analyzing"}.get(message.run_kind,
                                                                     "evaluating")
        self.query_one(ActivityLine).start(f"{what} v{message.version}")

    @on(RunFinished)
    def _run_finished(self, message: RunFinished) -> None:
        text, severity = describe_result(cast("ev.RunResult", message.event),
                                         narrow=bool(self.query_one(PaneGrid).narrow),
                                         judged=message.judgement)
        self.notify(text, severity=severity, timeout=5, markup=False)  # type: ignore[arg-type]

    @on(ProfileFinished)
    def _profile_finished(self, message: ProfileFinished) -> None:
        if message.failed:
            what = "static analysis" if message.static else "profile"
            self.notify(f"{what} failed: {message.failed}", severity="error", markup=False)
        elif not message.static:
            self.notify(f"profiled v{message.version}", timeout=4)

    @on(AgentStreamed)
    def _agent_streamed(self, message: AgentStreamed) -> None:
        # Joined already: a piece that came while this one waited replaced it.
        self._presenter.live(cast("ev.AgentDelta | ev.AgentToolDelta", message.event))

    @on(AgentStarted)
    def _agent_started(self, message: AgentStarted) -> None:
        self.query_one(ActivityLine).start(f"{message.agent} is replying ({message.role})")

    @on(RunChanged)
    @on(AgentSaid)
    @on(SessionStatus)
    def _into_chat(self, message: RunChanged | AgentSaid | SessionStatus) -> None:
        """A run's events, what the agent said (a reply, a message, its last word) and every
        other event: a line in the chat, or the live line (``run.progress``: the
        production verdict while trials go on)."""
        if message.live:
            self._presenter.live(cast("ev.LiveEvent", message.event))
            return
        self._presenter.chat_entry(cast("ev.Event", message.event))
        self._schedule_draw()

    @on(WorkerStateChanged)
    def _worker_state_changed(self, message: WorkerStateChanged) -> None:
        self.worker_state = message.state  # its watcher draws the status

    @on(ControllerIdle)
    def _controller_idle(self, message: ControllerIdle) -> None:
        self.query_one(ActivityLine).stop()
        self._schedule_draw()  # what to press next, now that nothing runs

    @on(ControllerBusy)
    def _controller_busy(self, message: ControllerBusy) -> None:
        self._schedule_draw()

    @on(AutoStopped)
    def _auto_stopped(self, message: AutoStopped) -> None:
        text, severity = describe_stop(cast("ev.AutoStop", message.event))
        self.notify(text, severity=severity, timeout=8)  # type: ignore[arg-type]

    @on(SessionError)
    def _session_error(self, message: SessionError) -> None:
        self.notify(message.text, title=f"error ({message.where})", severity="error",
                    timeout=10, markup=False)

    @property
    def _presenter(self) -> Presenter:
        assert self.presenter is not None
        return self.presenter

    def _schedule_draw(self) -> None:
        # Bursts of events draw once: the render runs after the current batch.
        if not self._draw_scheduled:
            self._draw_scheduled = True
            self.call_after_refresh(self._draw)

    def _draw(self) -> None:
        self._draw_scheduled = False
        view = self.view()
        if view is None or self.presenter is None:
            return
        try:
            with self.app.batch_update():
                self.presenter.render(view)
                self._draw_status()
                self._draw_approval(view)
        except Exception as exc:  # a drawing bug must not take the session down
            self._show_error("Could not draw the session", exc)

    def _show_error(self, title: str, error: BaseException) -> None:
        if isinstance(self.app.screen, ErrorModal):
            return  # one modal at a time; the next event draws again
        self.app.push_screen(ErrorModal(
            title, f"{type(error).__name__}: {error}",
            "The session log keeps everything so far; you can keep working, or quit "
            f"({keymap.say(self.app, 'quit')}) and resume it with --resume."))

    def _draw_status(self) -> None:
        view = self.view()
        if view is not None:
            self.query_one(StatusBar).info = view.status(self.worker_state, self.chip_label)

    def _draw_approval(self, view: SessionView) -> None:
        bar = self.query_one(ApprovalBar)
        pending = view.pending()
        if pending is None or view.state.mode == "auto":
            hint = self._next_hint(view) if view.state.mode != "auto" else None
            if hint:
                bar.hint(hint)
            else:
                bar.clear()
            return
        keys = self._keys("approve", "reject", "edit", "toggle_diff")
        what = {"plan": "plan", "tuning": "tuning", "kernel": "kernel"}.get(pending["kind"], "")
        bar.ask(pending["id"], f"{what} proposal {pending['id']}: {pending['summary']}", keys)

    # -- actions (routed here by the bindings) ----------------------------------------
    @property
    def source(self) -> SourcePane:
        return self.query_one(SourcePane)

    def _pending_id(self) -> str | None:
        return self.link.state.pending if self.link else None

    def _decision_allowed(self) -> bool:
        if self._pending_id() is None:
            self.notify("no proposal is waiting for a decision", timeout=3)
            return False
        # Type-ahead guard: keys right after the prompt appears are ignored.
        if not self.query_one(ApprovalBar).accepts_keys():
            self.notify("the proposal just appeared: read it, then press again", timeout=2)
            return False
        return True

    def action_approve(self) -> None:
        source = self.source
        if source.in_edit():
            if source.is_modified() or source.proposal is None:
                self._submit_edit()
                return
            source.end_edit()  # the proposal as it is: approved, not "edited"
        if self._decision_allowed():
            self._command(lambda link: link.approve())

    def action_reject(self) -> None:
        if not self._decision_allowed():
            return

        def done(note: str | None) -> None:
            if note is not None:
                self._command(lambda link: link.reject(note))

        self.app.push_screen(NotePrompt("Reject the proposal — a note for the agent "
                                        "(optional):", self._note_example()), done)

    def action_edit(self) -> None:
        source = self.source
        if self.kept_draft is not None and not source.in_edit():
            self.open_draft()
            return
        if self._pending_plan() is None:
            # The editor is where F2 works: on a narrow screen its tab comes forward.
            self.query_one(PaneGrid).show("source")
        if source.in_edit():
            self._submit_edit()
        elif self._pending_plan() is not None:
            if self._decision_allowed():
                self._edit_plan()
        elif source.proposal is not None:
            if self._decision_allowed():
                source.begin_edit()
                self.notify(f"editing the proposal: {keymap.say(self.app, 'edit')} or "
                            f"{keymap.say(self.app, 'approve', most=1)} submits it, it then "
                            "runs; Esc leaves it as it was", timeout=5)
        else:
            source.begin_edit()
            what = f"v{source.version}" if source.version is not None else "the source"
            self.notify(f"editing {what}: {keymap.say(self.app, 'edit')} "
                        "submits it as a new version, Esc leaves it as it was", timeout=5)

    def _pending_plan(self) -> dict[str, Any] | None:
        view = self.view()
        pending = view.pending() if view is not None else None
        return pending if pending is not None and pending["kind"] == "plan" else None

    def _edit_plan(self) -> None:
        """A plan is words, not source: it is edited in a dialog, and the edited plan
        is recorded as the approving decision (``Controller.edit_plan``)."""
        pending = self._pending_plan()
        assert pending is not None
        keys = ",".join(self._key_list("edit") + self._key_list("approve"))

        def done(text: str | None) -> None:
            # The plan may have been decided meanwhile (autonomous mode, another key).
            if text is not None and self._pending_id() == pending["id"]:
                self._command(lambda link: link.edit_plan(text))

        self.app.push_screen(PlanEditor(f"Edit plan {pending['id']}: {pending['summary']}",
                                        pending["plan"] or "", keys), done)

    def _submit_edit(self) -> None:
        source = self.source
        if not source.is_modified():
            # Nothing typed: no "edited by the user: no change" version or decision.
            what = f"proposal {source.proposal}" if source.proposal is not None \
                else f"v{source.version}"
            approve = f"; {keymap.say(self.app, 'approve', most=1)} approves it as it is" \
                if source.proposal is not None else ""
            source.end_edit()
            self.notify(f"nothing to submit: {what} is unchanged{approve}", timeout=4)
            return
        text = source.edited_source()
        self._command(lambda link: link.edit(text))

    @on(SourcePane.LeaveRequested)
    def _leave_edit(self, _message: SourcePane.LeaveRequested) -> None:
        """Esc in an edit leaves it and records nothing; changes are dropped on a second
        Esc only (one stray Esc must not throw away typing)."""
        source = self.source
        if source.is_modified():
            now = self.clock()
            armed = self._leave_armed_at
            if armed is None or now - armed > CANCEL_WINDOW_S:
                self._leave_armed_at = now
                self.notify("press Esc again to leave the editor and drop your changes "
                            "(nothing is recorded)", timeout=CANCEL_WINDOW_S + 1)
                return
        self._leave_armed_at = None
        what = f"proposal {source.proposal} still waits, unchanged" \
            if source.proposal is not None else f"v{source.version} is as it was"
        source.end_edit()
        self.notify(f"left the editor, nothing recorded: {what}", timeout=4)

    def action_toggle_diff(self) -> None:
        self.source.toggle_view()

    def action_run(self) -> None:
        self._command(lambda link: link.run())

    def action_profile(self) -> None:
        self._command(lambda link: link.profile())

    def action_toggle_auto(self) -> None:
        self._command(lambda link: link.toggle_auto())

    def action_cancel(self) -> None:
        busy = self.link.busy if self.link else None
        if busy is None:
            self.notify("nothing to cancel", timeout=2)
            return
        now = self.clock()
        if self._cancel_armed_at is not None and now - self._cancel_armed_at <= CANCEL_WINDOW_S:
            self._cancel_armed_at = None
            self._command(lambda link: link.cancel())
            return
        self._cancel_armed_at = now
        self.notify(f"press {keymap.say(self.app, 'cancel')} again to cancel the {busy}",
                    timeout=CANCEL_WINDOW_S)

    def action_cycle_pane(self, step: int) -> None:
        self.query_one(PaneGrid).cycle(step)

    def action_focus_chat(self) -> None:
        self.query_one(PaneGrid).show("chat")

    def action_maximize(self) -> None:
        grid = self.query_one(PaneGrid)
        if self.maximized is not None:
            self.minimize()
            return
        name = grid.focused_pane() or grid.active
        self.maximize(grid.pane(name), container=False)

    def action_help(self) -> None:
        self.app.action_help()  # type: ignore[attr-defined]

    # -- messages from panes ----------------------------------------------------------
    @on(ChatPane.Submitted)
    def _chat(self, message: ChatPane.Submitted) -> None:
        command = slash_command(message.text)
        if command is None:
            self._command(lambda link: link.send_message(message.text))
        elif command[0] == "unknown":
            self.notify(command[1], severity="warning", timeout=6)
        elif command[0] == "request_plan":
            self._command(lambda link: link.request_plan(command[1]))
        else:  # explain
            self._command(lambda link: link.explain(command[1], command[2]))

    @on(ProblemsPane.Jump)
    def _jump(self, message: ProblemsPane.Jump) -> None:
        self.query_one(PaneGrid).show("source", focus=False)
        self.source.goto_line(message.line)

    @on(HistoryPane.Picked)
    def _history(self, message: HistoryPane.Picked) -> None:
        view = self.view()
        if view is None or self.presenter is None:
            return
        if message.what == "revert":
            self.revert(message.version)
        elif message.what == "view":
            version = view.state.versions[message.version]
            self.app.push_screen(SourceScreen(
                f"v{message.version} ({version.origin}): {version.summary}",
                view.version_source(message.version) or ""))
        elif message.what == "diff":
            old = view.version_source(message.version) or ""
            self.app.push_screen(DiffScreen(f"v{message.version} → current "
                                            f"v{view.state.current}", old,
                                            view.current_source()))
        elif message.what == "export":
            self.ask_export(message.version)

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            self._show_error("Something went wrong", event.worker.error)

