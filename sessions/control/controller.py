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
time, the job loop; what it does next is the pure planner's answer
(``sessions.control.next_action.next_action``), as the search's is ``sessions.search.planner``.
``cancel`` cancels the job, which closes the agent's stream or makes the worker pool
kill and replace the worker. Subscribers receive every persisted event and live-only
notifications (``"live": true``: text deltas, notices, tool calls, worker state,
busy/idle) that are never written down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, Literal

from tilewright.agents.base import Agent, TaskBrief
from tilewright.kernels.judge.protocol import Judge
from tilewright.kernels.judge.result import EvalResult
from tilewright.kernels.tasks.task import Task
from tilewright.sessions import autonomy
from tilewright.sessions import events as ev
from tilewright.sessions.actions import DECISIONS, ControllerAction, ask
from tilewright.sessions.agent_turn import AgentTurn
from tilewright.sessions.autonomy import ControllerSettings
from tilewright.sessions.control.agent_request import (
    build_request,
    next_role,
    own_edit_failed,
    regression_base,
)
from tilewright.sessions.control.next_action import next_action
from tilewright.sessions.core import AutoApproval, Decision, Halt, JudgeFailed, SessionCore
from tilewright.sessions.errors import ApprovalRequired, ControllerBusy, ControllerError
from tilewright.sessions.log import SessionLog
from tilewright.sessions.state import ProposalInfo, SessionState, fold, proposal_base

__all__ = ["ApprovalRequired", "Controller", "ControllerBusy", "ControllerError",
           "ControllerSettings"]


class Controller:
    """The step/auto scheduler on the session's ``SessionCore``: the person's commands
    and the job loop that performs what they and the planner (``next_action``) ask for.
    The person's decisions arrive as commands (``approve``, ``reject``, ``edit``: a
    step-mode proposal waits in the log, so it survives a restart); autonomous mode's
    come from ``AutoApproval``."""

    def __init__(self, log: SessionLog, task: Task, brief: TaskBrief, agent: Agent,
                 evaluator: Judge, settings: ControllerSettings | None = None,
                 state: SessionState | None = None, chip: str = "cpu") -> None:
        from tilewright.sessions.control.tools import SessionTools

        self.task = task
        self.brief = brief
        self.agent = agent
        self.settings = settings or ControllerSettings()
        self.state = state if state is not None else fold(log.header, [])
        self.chip = chip
        self.core = SessionCore(log, self.state, task, brief, agent, evaluator, chip=chip)
        self.log = log
        self.tools = SessionTools(self.core)  # read-only tools the agent may call mid-reply
        self.approver = AutoApproval(self.settings, log.now, same_as=self.core.same_program)
        self._job: asyncio.Task[None] | None = None
        self._job_kind: str | None = None
        self.closed = False
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
        return self._job_kind if self._job is not None else None

    @property
    def running(self) -> bool:
        """Whether a job runs (an agent reply, a run, a profile, a step between)."""
        return self._job is not None

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
        action = self._settled(None)
        if action is None and not s.versions and s.pending is None:
            action = ask("implement")
        if action is None and self.settings.open_with_plan and fresh and s.mode == "step":
            action = ask("plan")  # a new session opens with a plan to approve
        if action is not None:
            self._spawn(action)

    async def wait_idle(self) -> None:
        """Return once no job runs (tests and the headless CLI wait on this)."""
        while self._job is not None:
            job = self._job
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(job)
            if self._job is job:  # the job's finally has not run yet
                await asyncio.sleep(0)

    async def close(self, reason: str = "closed", cause: str | None = None) -> None:
        """Stop any job and write ``session.end``; the session stays resumable.
        ``cause`` (``disconnect``, ``terminated``): the app is stopped by its terminal
        or a signal, not by the person; a run cut short and autonomous mode's stop say
        so."""
        if self.closed:
            return
        self.core.stopping = cause
        await self._cancel_job()
        if self.state.mode == "auto":
            self._emit(ev.AutoStop(type="auto.stop", reason=cause or "user"))
            self._emit(ev.ModeChange(type="mode.change", mode="step", by=cause or "user"))
        self.record_lesson()
        self.core.end(reason)
        self.closed = True
        self.core.close()  # the judge may outlive this controller

    # -- commands ---------------------------------------------------------------------

    def user_message(self, text: str) -> None:
        """Record a message; the agent answers it now, or with its next request if busy."""
        self._check_open()
        self._emit(ev.UserMessage(type="user.message", text=text))
        if not self.running:
            self._spawn(ask(next_role(self.state), text))
        else:
            self._live("notice", text="the agent will see this with its next request",
                       level="info")

    def request_plan(self, text: str | None = None) -> None:
        """``/plan``: ask the planner for a numbered plan (with the person's wishes)."""
        self._check_idle("ask for a plan")
        self._emit(ev.UserMessage(type="user.message", text=f"/plan {text}" if text else "/plan"))
        self._spawn(ask("plan", text or None))

    def explain(self, version: int | None = None, question: str | None = None) -> None:
        """``/explain [vN]``: ask the analyst about a version, its profile or its error;
        the reply is an answer (nothing to approve)."""
        self._check_idle("ask for an explanation")
        number = self._version_arg(version)
        text = f"/explain v{number}" + (f" {question}" if question else "")
        self._emit(ev.UserMessage(type="user.message", text=text))
        self._spawn(ask("analyze", question or f"Explain v{number}: what limits it, "
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
        if not self.running:
            self._spawn(ControllerAction("apply", proposal=prop.id))

    def request_proposal(self, role: str | None = None) -> None:
        """Ask the agent now (e.g. send a failing version back to the fixer)."""
        self._check_idle("ask the agent")
        self._spawn(ask(role or next_role(self.state)))

    def approve(self) -> None:
        prop = self._pending()
        self.core.record(prop.id, Decision("approve", "user"))
        if not self.running:
            self._spawn(ControllerAction("apply", proposal=prop.id))

    def reject(self, note: str | None = None) -> None:
        """Reject the pending proposal; with a note the agent is asked again (and sees it)."""
        prop = self._pending()
        self.core.record(prop.id, Decision("reject", "user", note or None))
        if note and not self.running:
            # Changes asked for a plan go back to the planner, with the note.
            self._spawn(ask("plan" if prop.kind == "plan" else next_role(self.state)))
        else:
            self._kick()

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
            self._spawn(ControllerAction("run", version=version, by="user"))
        else:
            self._kick()

    def run(self, version: int | None = None) -> None:
        """Evaluate a version (default: the current one) at the user's request."""
        self._start("run", version)

    def profile(self, version: int | None = None) -> None:
        """Profile a version (default: the current one) at the user's request."""
        self._start("profile", version)

    def _start(self, kind: Literal["run", "profile"], version: int | None) -> None:
        self._check_idle(f"start a {kind}")
        number = self._version_arg(version)
        if not self.state.authorized(number):
            raise ApprovalRequired(f"v{number} was never approved; it cannot run")
        self._spawn(ControllerAction(kind, version=number, by="user"))

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
            self._kick()
        elif not self.running:
            self.land_on_best()

    async def cancel(self) -> bool:
        """Stop the streaming answer or the run; autonomous mode stops too."""
        was_busy = self.running
        await self._cancel_job()
        if self.state.mode == "auto" and not self.closed:
            self.set_mode("step")
        return was_busy

    def record_lesson(self) -> Any:
        """At the end of a session (quit, budget, stop rule): what worked or did not, as a
        lesson for this family and chip (``agents.memory``), unless switched off."""
        if not self.settings.record_lessons:
            return None
        from tilewright.agents import memory
        from tilewright.sessions.control.agent_request import history

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
        if self.closed:
            raise ControllerError("the session is closed")

    def _check_idle(self, what: str) -> None:
        self._check_open()
        if self.running:
            raise ControllerBusy(f"cannot {what} while the {self.busy} is in progress; "
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

    # -- the job loop -------------------------------------------------------------------

    def _next(self, after: ControllerAction | None) -> ControllerAction | None:
        """The planner's next step after ``after`` (None: idle); none once closed."""
        if self.closed:
            return None
        return next_action(self.state, self.settings, after, now=self.log.now())

    def _settled(self, after: ControllerAction | None) -> ControllerAction | None:
        """The next job after ``after``: the planner's decisions on the way (a checkout,
        autonomous mode's stop, a notice) are carried out here, not announced as a job."""
        action = self._next(after)
        while action is not None and action.kind in DECISIONS:
            self._carry_out(action)
            action = self._next(action)
        return action

    def _carry_out(self, action: ControllerAction) -> None:
        if action.kind == "checkout" and action.version is not None:
            self._emit(ev.KernelCheckout(type="kernel.checkout", version=action.version,
                                         by="auto"))
        elif action.kind == "stop" and action.reason is not None:
            self._stop_auto(action.reason)
        elif action.kind == "own_edit_failed" and action.version is not None:
            self._live("notice", text=own_edit_failed(self.state, self.log.path, action.version),
                       level="warning")
        else:
            raise ControllerError(f"cannot carry out {action!r}")

    def _kick(self) -> None:
        """Start what the folded state says comes next, if nothing runs."""
        if self._job is None and not self.closed:
            action = self._settled(None)
            if action is not None:
                self._spawn(action)

    def _spawn(self, action: ControllerAction) -> None:
        """Start ``action`` as the one job (the caller checked nothing else runs)."""
        self._job_kind = action.job
        self._job = asyncio.get_running_loop().create_task(self._drive(action))

    async def _cancel_job(self) -> None:
        job = self._job
        if job is None:
            return
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job

    async def _drive(self, action: ControllerAction | None) -> None:
        try:
            while True:
                if action is None:
                    action = self._settled(None)
                elif action.kind in DECISIONS:  # a job's outcome: autonomous mode stops
                    self._carry_out(action)
                    action = self._settled(action)
                if action is None:
                    break
                self._job_kind = action.job
                self._live("controller.busy", what=self._job_kind)
                action = await self._perform(action)
        except asyncio.CancelledError:
            self._live("notice", text="cancelled", level="info")
            raise
        except Exception as exc:  # a bug must be seen, recorded, and leave the app alive
            self._emit(ev.Error(type="error", message=f"{type(exc).__name__}: {exc}",
                                where="controller"))
        finally:
            self._job = None
            self._job_kind = None
            self._live("controller.idle")

    async def _perform(self, action: ControllerAction) -> ControllerAction | None:
        """Do one job; what follows it (the planner's step when the job says none)."""
        kind = action.kind
        if kind == "ask":
            return await self._ask(action.role, action.message, action.version)
        if kind == "auto_decide" and action.proposal is not None:
            return await self._auto_decide(action.proposal)
        if kind == "apply" and action.proposal is not None:
            return self._apply(action.proposal)
        if kind == "run" and action.version is not None:
            await self._run_eval(action.version, action.by)
            return self._next(action)
        if kind == "profile" and action.version is not None:
            await self._run_profile(action.version, action.by)
            return self._next(action)
        raise ControllerError(f"cannot perform {action!r}")

    def _stop_auto(self, reason: str) -> None:
        if reason != "interrupted":  # a budget or a stop rule ends the autonomous run
            self.record_lesson()
        self._emit(ev.AutoStop(type="auto.stop", reason=reason))
        self._emit(ev.ModeChange(type="mode.change", mode="step", by="auto"))
        self.land_on_best()

    def land_on_best(self) -> None:
        """After autonomous mode the best version is current, not the last one tried
        (a ``kernel.checkout`` by auto); the next proposal then builds on the best. Not
        while a proposal waits: it was made for the current version."""
        s = self.state
        if s.best is not None and s.best != s.current and s.pending is None:
            self._emit(ev.KernelCheckout(type="kernel.checkout", version=s.best, by="auto"))

    # -- asking the agent -------------------------------------------------------------

    async def _ask(self, role: str, message: str | None,
                   version: int | None = None) -> ControllerAction | None:
        # In step mode the shown version never moves without the person: after a
        # regression the agent is asked about the best version, and its proposal applies
        # to it (its base, named in the chat) once the person approves. Autonomous mode
        # checks the best version out itself, said in the log.
        back_to: tuple[int, str] | None = None
        if version is None and role in ("tune", "implement") \
                and not self.state.plan_to_implement:
            back = regression_base(self.state)
            if back is not None and self.state.mode == "auto":
                self._emit(ev.KernelCheckout(type="kernel.checkout", version=back[0],
                                             by="auto", reason=back[1]))
            elif back is not None:
                back_to = back
        core = self.core
        request = build_request(self.state, self.log, core.brief, role, message, core.chip,
                                version=back_to[0] if back_to else version, tools=self.tools,
                                why=back_to[1] if back_to else None)
        # Notes that arrive while the agent answers are kept for its next request.
        notes_seen = len(self.state.notes)
        turn = AgentTurn()
        self._live("agent.start", role=role, agent=core.agent.label)
        try:
            await core.ask(request, turn)
        except asyncio.CancelledError:
            self._emit(ev.AgentMessage(type="agent.message", text=turn.text(), role=role,
                                       proposal=None, usage=turn.usage_json(), cancelled=True,
                                       **turn.tools_field()))
            raise
        problem = turn.problem()
        if turn.finished is not None and turn.failure is None:
            self._emit(ev.AgentMessage(type="agent.message", text=turn.text(), role=role,
                                       proposal=None, usage=turn.usage_json(),
                                       **turn.tools_field()))
            finished = turn.finished
            if back_to is not None:  # said about the best version; the shown one stays
                finished += (f" (The shown version stays v{self.state.current}; the best is "
                             f"v{back_to[0]}: select it in History and press enter to "
                             "continue from it.)")
            self._emit(ev.AgentFinished(type="agent.finished", message=finished, role=role))
            return None  # in autonomous mode the loop then stops: agent_finished
        if turn.answer is not None and problem is None and turn.proposal is None:
            # A text-only reply to a question or an explanation: an answer, not a failure.
            self._emit(ev.AgentMessage(type="agent.message", text=turn.text(), role=role,
                                       proposal=None, usage=turn.usage_json(), answer=True,
                                       notes_seen=notes_seen, about=request.current_version,
                                       **turn.tools_field()))
            return None
        if problem is not None:
            self._emit(ev.AgentMessage(type="agent.message", text=turn.text(), role=role,
                                       proposal=None, usage=turn.usage_json(),
                                       **turn.tools_field()))
            self._emit(ev.Error(type="error", message=problem, where="agent",
                                retryable=turn.failure is None or turn.retryable))
            return None
        proposal = turn.proposal
        assert proposal is not None
        waiting = self.state.pending_proposal
        if waiting is not None:
            # A question, /explain or a message answered with a proposal: the one that
            # waits for a decision is kept (it is the person's to decide), and the new
            # one is said in the chat, not recorded as a proposal.
            text = turn.text().rstrip()
            note = (f"(The agent also proposed “{proposal.summary}”; {waiting.id} is still "
                    "waiting for your decision, so it was not recorded as a proposal. To get "
                    f"a revised proposal, reject {waiting.id} with a note.)")
            self._emit(ev.AgentMessage(type="agent.message",
                                       text=f"{text}\n\n{note}" if text else note, role=role,
                                       proposal=None, usage=turn.usage_json(), answer=True,
                                       notes_seen=notes_seen, about=request.current_version,
                                       **turn.tools_field()))
            return None
        pid = core.next_proposal_id()
        named = proposal.meta.get("base") if isinstance(proposal.meta.get("base"), int) \
            and proposal.meta.get("base") in self.state.versions else None
        if named is None and back_to is not None:
            named = back_to[0]
        chosen = {"base_chosen": True} if named is not None else {}
        text = turn.text()
        if named is not None and named != self.state.current and self.state.mode != "auto":
            # A move back is the person's decision: said with the proposal it comes with.
            why = back_to[1] if back_to is not None and back_to[0] == named else \
                f"v{named} is the best version so far"
            note = (f"({pid} applies to v{named}, not the shown v{self.state.current}: {why}. "
                    f"Approve to build on v{named}; reject to stay on v{self.state.current}.)")
            text = f"{text.rstrip()}\n\n{note}" if text.strip() else note
        self._emit(ev.AgentMessage(type="agent.message", text=text, role=role, proposal=pid,
                                   usage=turn.usage_json(), **turn.tools_field()))
        core.propose(proposal, role=role, base=named if named is not None else self.state.current,
                     pid=pid, notes_seen=notes_seen, **chosen)
        return ControllerAction("auto_decide", proposal=pid) if self.state.mode == "auto" \
            else None

    async def _auto_decide(self, pid: str) -> ControllerAction | None:
        """Autonomous mode's approver decides the pending proposal (``AutoApproval``)."""
        verdict = await self.core.decide(pid, self.approver)
        if isinstance(verdict, Halt):
            return ControllerAction("stop", reason=verdict.reason)
        if not isinstance(verdict, Decision):
            return None  # switched to step mode meanwhile: the person decides
        if verdict.decision == "reject":
            # An agent that keeps repeating itself would otherwise burn the whole
            # token budget on rejected proposals.
            if autonomy.agent_repeating(self.state, self.settings):
                return ControllerAction("stop", reason="agent_repeating")
            return None  # the planner asks again (or stops on a budget)
        return ControllerAction("apply", proposal=pid)

    # -- applying decisions -----------------------------------------------------------

    def _apply(self, pid: str) -> ControllerAction | None:
        s = self.state
        prop = s.proposals[pid]
        if not prop.approved:
            raise ApprovalRequired(f"{pid} has no approving decision")
        by = "auto" if prop.decided_by == "auto" else "user"
        if prop.kind == "plan" and prop.decision == "approve":
            return ask("implement")
        parent = proposal_base(s, prop)
        version = self.core.apply(pid, parent)
        if version is None:  # an error event says why; autonomy asks for another tuning
            tuning = prop.kind == "tuning" and prop.decision != "edit" and parent is not None
            return ask(next_role(self.state)) if tuning and s.mode == "auto" else None
        return ControllerAction("run", version=version, by=by)

    # -- runs -------------------------------------------------------------------------

    async def _run_eval(self, number: int, by: str) -> None:
        result = await self.core.evaluate(number, by)
        if not isinstance(result, JudgeFailed) and self._wants_analysis(number):
            await self.core.analyze(number, "auto")

    def _wants_analysis(self, number: int) -> bool:
        """A correct version gets the static analysis, unless a profile follows anyway."""
        s, version = self.state, self.state.versions[number]
        if not self.settings.analyze_every_version or not version.correct:
            return False
        return not (s.mode == "auto" and autonomy.should_profile(s, number, self.settings))

    async def _run_profile(self, number: int, by: str = "user") -> None:
        await self.core.profile(number, by)

