"""The approval-driven controller: one asyncio object that owns the propose → decide →
apply → run → feed back loop.

Commands (``user_message``, ``approve``, ``reject``, ``edit``, ``run``, ``profile``,
``set_mode``, ``cancel``, ``revert``, ``request_proposal``) append events; the
controller's ``state`` changes only by folding the events it appends, so live work,
resume and replay agree. Approval is enforced in code: a kernel version is only made
from a ``user.decision`` event (or is the task's own starting kernel), and a run of
any version the folded state does not show as authorised is refused. In autonomous
mode an auto-approver writes those decisions with ``by: auto``.

All work (an agent streaming a reply, a run, a profile) happens in one job task at a
time (``sessions.engine``); ``cancel`` cancels it, which closes the agent's stream or
makes the worker pool kill and replace the worker. Subscribers receive every persisted
event and live-only notifications (``"live": true``: text deltas, notices, tool calls,
worker state, busy/idle) that are never written down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tilewright.agents.base import Agent, TaskBrief
from tilewright.kernels.executors import Judge as Evaluator
from tilewright.kernels.result import EvalResult
from tilewright.kernels.task import Task
from tilewright.sessions import events as ev
from tilewright.sessions.actions import Action, ask
from tilewright.sessions.autonomy import ControllerSettings
from tilewright.sessions.context import next_role
from tilewright.sessions.core import Decision, SessionCore
from tilewright.sessions.engine import Engine
from tilewright.sessions.errors import ApprovalRequired, ControllerBusy, ControllerError
from tilewright.sessions.log import SessionLog
from tilewright.sessions.state import ProposalInfo, SessionState, fold

__all__ = ["ApprovalRequired", "Controller", "ControllerBusy", "ControllerError",
           "ControllerSettings"]


class Controller:
    """The step/auto scheduler: one session's commands over its ``Engine`` (the job
    loop), both on the session's ``SessionCore``. The person's decisions arrive as
    commands (``approve``, ``reject``, ``edit``: a step-mode proposal waits in the log, so
    it survives a restart); autonomous mode's come from ``AutoApproval``."""

    def __init__(self, log: SessionLog, task: Task, brief: TaskBrief, agent: Agent,
                 evaluator: Evaluator, settings: ControllerSettings | None = None,
                 state: SessionState | None = None, chip: str = "cpu") -> None:
        from tilewright.sessions.tools import SessionTools

        self.task = task
        self.brief = brief
        self.agent = agent
        self.settings = settings or ControllerSettings()
        self.state = state if state is not None else fold(log.header, [])
        self.chip = chip
        self.core = SessionCore(log, self.state, task, brief, agent, evaluator, chip=chip)
        self.log = log
        self.tools = SessionTools(self.core)  # read-only tools the agent may call mid-reply
        self.engine = Engine(self.core, self.settings, self.tools, self.record_lesson)
        self.core.judge.set_state_listener(lambda st: self._live("worker.state", state=st))

    # -- observing --------------------------------------------------------------------

    def subscribe(self, callback: ev.Subscriber) -> Callable[[], None]:
        """Every persisted event and every live notification, as they happen."""
        return self.core.subscribe(callback)

    @property
    def judge_state(self) -> str:
        """The judge's state (starting, idle, busy, ...), for the status bar."""
        return self.core.judge.state

    @property
    def busy(self) -> str | None:
        """What the job is doing (``agent``, ``run``, ``profile``), None when idle."""
        return self.engine.busy

    def _emit(self, event: ev.Event) -> ev.Event:
        return self.core.emit(event)

    def _live(self, type_: ev.LiveType, **fields: Any) -> None:
        self.core.live(type_, **fields)

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Begin or resume: settle what a crash left open, add the starting kernel, and
        carry on where the folded state says the loop stands."""
        s = self.state
        fresh = not s.last_seq
        if s.last_seq:
            self._emit(ev.Marker(type="marker", label="resumed"))
            self.core.settle_open_runs()
            if s.mode == "auto":
                # The app died in autonomous mode: a reopened session waits for the user
                # to switch autonomy on again (with a fresh allowance).
                self._emit(ev.AutoStop(type="auto.stop", reason="interrupted"))
                self._emit(ev.ModeChange(type="mode.change", mode="step", by="resume"))
        self.core.seed()
        action: Action | None = self.engine.idle_action()
        if action is None and not s.versions and s.pending is None:
            action = ask("implement")
        if action is None and self.settings.open_with_plan and fresh and s.mode == "step":
            action = ask("plan")  # a new session opens with a plan to approve
        if action is not None:
            self.engine.spawn(action)

    async def wait_idle(self) -> None:
        """Return once no job runs (tests and the headless CLI wait on this)."""
        await self.engine.wait_idle()

    async def close(self, reason: str = "closed", cause: str | None = None) -> None:
        """Stop any job and write ``session.end``; the session stays resumable.
        ``cause`` (``disconnect``, ``terminated``): the app is stopped by its terminal
        or a signal, not by the person; a run cut short and autonomous mode's stop say
        so."""
        if self.engine.closed:
            return
        self.core.stopping = cause
        await self.engine.cancel_job()
        if self.state.mode == "auto":
            self._emit(ev.AutoStop(type="auto.stop", reason=cause or "user"))
            self._emit(ev.ModeChange(type="mode.change", mode="step", by=cause or "user"))
        self.record_lesson()
        self.core.end(reason)
        self.engine.closed = True
        self.core.close()  # the judge may outlive this controller

    # -- commands ---------------------------------------------------------------------

    def user_message(self, text: str) -> None:
        """Record a message; the agent answers it now, or with its next request if busy."""
        self._check_open()
        self._emit(ev.UserMessage(type="user.message", text=text))
        if not self.engine.running:
            self.engine.spawn(ask(next_role(self.state), text))
        else:
            self._live("notice", text="the agent will see this with its next request",
                       level="info")

    def request_plan(self, text: str | None = None) -> None:
        """``/plan``: ask the planner for a numbered plan (with the person's wishes)."""
        self._check_idle("ask for a plan")
        self._emit(ev.UserMessage(type="user.message", text=f"/plan {text}" if text else "/plan"))
        self.engine.spawn(ask("plan", text or None))

    def explain(self, version: int | None = None, question: str | None = None) -> None:
        """``/explain [vN]``: ask the analyst about a version, its profile or its error;
        the reply is an answer (nothing to approve)."""
        self._check_idle("ask for an explanation")
        number = self._version_arg(version)
        text = f"/explain v{number}" + (f" {question}" if question else "")
        self._emit(ev.UserMessage(type="user.message", text=text))
        self.engine.spawn(ask("analyze", question or f"Explain v{number}: what limits it, "
                              "or why it failed, and what to change next.", number))

    def edit_plan(self, plan: str) -> None:
        """Approve the pending plan with the person's own wording of its steps."""
        prop = self._pending()
        if prop.kind != "plan":
            raise ControllerError("the pending proposal is not a plan; edit its source instead")
        if not plan.strip():
            raise ControllerError("an edited plan needs at least one step")
        self.core.record(prop.id, Decision("approve", "user", "plan edited by the user",
                                           plan=plan.strip()))
        if not self.engine.running:
            self.engine.spawn(Action("apply", proposal=prop.id))

    def request_proposal(self, role: str | None = None) -> None:
        """Ask the agent now (e.g. send a failing version back to the fixer)."""
        self._check_idle("ask the agent")
        self.engine.spawn(ask(role or next_role(self.state)))

    def approve(self) -> None:
        prop = self._pending()
        self.core.record(prop.id, Decision("approve", "user"))
        if not self.engine.running:
            self.engine.spawn(Action("apply", proposal=prop.id))

    def reject(self, note: str | None = None) -> None:
        """Reject the pending proposal; with a note the agent is asked again (and sees it)."""
        prop = self._pending()
        self.core.record(prop.id, Decision("reject", "user", note or None))
        if note and not self.engine.running:
            # Changes asked for a plan go back to the planner, with the note.
            self.engine.spawn(ask("plan" if prop.kind == "plan" else next_role(self.state)))
        else:
            self.engine.kick()

    def edit(self, source: str) -> None:
        """The user's own source: decides the pending proposal (``edit``) or, with none
        pending, becomes a new version of its own; either way it is then run."""
        self._check_open()
        prop = self.state.pending_proposal
        if prop is None:
            self._check_idle("apply an edit")
            current = self.state.current
            if current is not None and source == self.core.source_of(current):
                # Not a version of its own: v2 "edited by the user: no change" would be
                # a run of v1 under another name.
                raise ControllerError(f"nothing to submit: the editor holds v{current} "
                                      "unchanged")
        self.core.record(prop.id if prop else None, Decision("edit", "user", source=source))
        if prop is None:
            version = self.core.new_version(source, origin="user-edit", proposal=None,
                                            summary="edited by the user")
            self.engine.spawn(Action("run", version=version, by="user"))
        else:
            self.engine.kick()

    def run(self, version: int | None = None) -> None:
        """Evaluate a version (default: the current one) at the user's request."""
        self._start("run", version)

    def profile(self, version: int | None = None) -> None:
        """Profile a version (default: the current one) at the user's request."""
        self._start("profile", version)

    def _start(self, kind: str, version: int | None) -> None:
        self._check_idle(f"start a {kind}")
        number = self._version_arg(version)
        if not self.state.authorized(number):
            raise ApprovalRequired(f"v{number} was never approved; it cannot run")
        self.engine.spawn(Action(kind, version=number, by="user"))

    async def check_chips(self, version: int, chips: list[str]) -> list[EvalResult]:
        """Evaluate ``version`` once per TPU generation (nothing is recorded in the
        session: the verdicts answer a question, they do not rank the version)."""
        return await self.core.check_chips(self._version_arg(version), chips)

    async def judge_source(self, source: str) -> EvalResult:
        """Judge a source that is no version of the session, with its options (nothing
        is recorded): the export's check of a simplified module."""
        return await self.core.judge.evaluate(self.task, source)

    def revert(self, version: int) -> None:
        """Make an earlier version current again (the next proposal builds on it)."""
        self._check_idle("revert")
        number = self._version_arg(version)
        self._emit(ev.KernelCheckout(type="kernel.checkout", version=number, by="user"))

    def set_mode(self, mode: str, by: str = "user") -> None:
        """Switch between step and auto at any moment; a running job finishes its step
        and the next decision follows the new mode."""
        self._check_open()
        if mode not in ("step", "auto"):
            raise ControllerError(f"unknown mode {mode!r} (step or auto)")
        if mode == self.state.mode:
            return
        s = self.state
        if mode == "auto" and s.agent_finished and s.pending is None:
            raise ControllerError(
                f"autonomous mode would stop at once: {s.agent_finished.removeprefix('offline agent: ')}"
                " Change something first (edit the kernel, revert to another version, or "
                "message the agent), then switch it on again.")
        if mode == "step":
            self._emit(ev.AutoStop(type="auto.stop", reason="user"))
        self._emit(ev.ModeChange(type="mode.change", mode=mode, by=by))
        if mode == "auto":
            self.engine.kick()
        elif not self.engine.running:
            self.engine.land_on_best()

    async def cancel(self) -> bool:
        """Stop the streaming answer or the run; autonomous mode stops too."""
        was_busy = self.engine.running
        await self.engine.cancel_job()
        if self.state.mode == "auto" and not self.engine.closed:
            self.set_mode("step")
        return was_busy

    def record_lesson(self) -> Any:
        """At the end of a session (quit, budget, stop rule): what worked or did not, as a
        lesson for this family and chip (``agents.memory``), unless switched off."""
        if not self.settings.record_lessons:
            return None
        from tilewright.agents import memory
        from tilewright.sessions.context import history

        state, log = self.state, self.log
        rows = history(state.versions, lambda n: log.get_blob(state.versions[n].source_blob)
                       .decode())
        lesson = memory.lesson_from_history(rows, task=self.brief.name,
                                            family=self.brief.family, chip=self.chip)
        if lesson is None:
            return None
        try:
            stored = memory.remember(lesson)
        except OSError as exc:
            self._live("notice", text=f"could not record a lesson: {exc}", level="warning")
            return None
        if stored is not None:  # None: the same lesson is already remembered
            self._emit(ev.Marker(type="marker", label="lesson", text=stored.text,
                                 outcome=stored.outcome))
        return stored

    # -- command helpers --------------------------------------------------------------

    def _check_open(self) -> None:
        if self.engine.closed:
            raise ControllerError("the session is closed")

    def _check_idle(self, what: str) -> None:
        self._check_open()
        if self.engine.running:
            raise ControllerBusy(f"cannot {what} while the {self.engine.busy} is in progress; "
                                 "cancel it first or wait for it to finish")

    def _pending(self) -> ProposalInfo:
        self._check_open()
        prop = self.state.pending_proposal
        if prop is None:
            raise ControllerError("there is no pending proposal to decide on")
        return prop

    def _version_arg(self, version: int | None) -> int:
        number = self.state.current if version is None else int(version)
        if number is None or number not in self.state.versions:
            known = ", ".join(f"v{n}" for n in self.state.versions) or "none yet"
            raise ControllerError(f"no version {number} (versions: {known})")
        return number

