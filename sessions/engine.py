"""The controller's engine: one job at a time that asks the agent, decides in autonomous
mode, applies decisions, runs and profiles, and chooses the next step.

``sessions.controller.Controller`` owns one ``Engine`` and adds the public commands.
Every change goes through the shared ``sessions.events.EventWriter``: append to the log,
fold into ``state``, publish to subscribers. Approval is enforced here: ``_apply`` needs
an approving ``user.decision`` in the folded state, and ``_run_eval`` refuses a version
the state does not show as authorised (the task's own kernel, or one a decision made).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tilewright.sessions import autonomy
from tilewright.sessions import events as ev
from tilewright.sessions.actions import Action, ask
from tilewright.sessions.agent_turn import AgentTurn
from tilewright.sessions.autonomy import ControllerSettings
from tilewright.sessions.context import build_request, next_role, regression_base
from tilewright.sessions.core import AutoApproval, Decision, Halt, JudgeFailed, SessionCore
from tilewright.sessions.errors import ApprovalRequired, ControllerError
from tilewright.sessions.state import FAILED_STATUSES, proposal_base

if TYPE_CHECKING:
    from tilewright.sessions.tools import SessionTools


class Engine:
    """The job loop of one controller, on the controller's ``SessionCore``."""

    def __init__(self, core: SessionCore, settings: ControllerSettings, tools: SessionTools,
                 record_lesson: Callable[[], object]) -> None:
        self.core = core
        self.state = core.session
        self.log = core.log
        self.settings = settings
        self.tools = tools  # read-only tools the agent may call mid-reply
        self.approver = AutoApproval(settings, core.log.now)  # autonomous mode's rules
        self._record_lesson = record_lesson
        self._job: asyncio.Task[None] | None = None
        self._job_kind: str | None = None
        self.closed = False

    def _emit(self, event: ev.Event) -> ev.Event:
        return self.core.emit(event)

    def _live(self, type_: ev.LiveType, **fields: Any) -> None:
        self.core.live(type_, **fields)

    @property
    def busy(self) -> str | None:
        """What the job is doing (``agent``, ``run``, ``profile``), None when idle."""
        return self._job_kind if self._job is not None else None

    def kick(self) -> None:
        """Start what the folded state says comes next, if nothing runs."""
        if self._job is None and not self.closed:
            action = self.idle_action()
            if action is not None:
                self.spawn(action)

    @property
    def running(self) -> bool:
        return self._job is not None

    def spawn(self, action: Action) -> None:
        """Start ``action`` as the one job (the caller checked nothing else runs)."""
        self._job_kind = action.job
        self._job = asyncio.get_running_loop().create_task(self._drive(action))

    async def wait_idle(self) -> None:
        while self._job is not None:
            job = self._job
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(job)
            if self._job is job:  # the job's finally has not run yet
                await asyncio.sleep(0)

    async def cancel_job(self) -> None:
        job = self._job
        if job is None:
            return
        job.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await job

    # -- the loop ---------------------------------------------------------------------

    async def _drive(self, action: Action | None) -> None:
        try:
            while True:
                if action is None:
                    action = self.idle_action()
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

    def idle_action(self) -> Action | None:
        """What to do next when nothing is running, read from the folded state."""
        s = self.state
        if self.closed:
            return None
        prop = s.unapplied_approval()
        if prop is not None:
            return Action("apply", proposal=prop.id)
        if s.mode != "auto":
            return None
        if s.pending is not None:
            return Action("auto_decide", proposal=s.pending)
        if s.current is not None and self._needs_eval(s.current):
            return Action("run", version=s.current, by="auto")
        return self._auto_continue()

    def _needs_eval(self, number: int) -> bool:
        return not any(r.version == number and r.kind == "eval" and not r.interrupted
                       for r in self.state.runs.values())

    def _auto_continue(self) -> Action | None:
        """Autonomous mode between steps: stop on a budget or rule, else ask the agent."""
        s = self.state
        reason = autonomy.budget_exhausted(s, self.settings, self.log.now())
        if reason is None and s.agent_finished:
            reason = "agent_finished"  # its search is complete: asking again repeats it
        if reason is None and s.agent_failures and (
                s.agent_failures >= self.settings.max_agent_failures
                or not s.agent_failure_retryable):
            reason = "agent_failed"  # asking again would get the same answer
        if reason is not None:
            self._stop_auto(reason)
            return None
        current = s.versions.get(s.current) if s.current is not None else None
        if current is not None and current.status in FAILED_STATUSES \
                and s.fix_streak >= max(1, self.settings.auto_fix_attempts) \
                and s.best is not None and s.best != s.current:
            # Fixing is not converging: go back to the best kernel and improve that.
            self._emit(ev.KernelCheckout(type="kernel.checkout", version=s.best, by="auto"))
        return ask(next_role(self.state))

    def _stop_auto(self, reason: str) -> None:
        if reason != "interrupted":  # a budget or a stop rule ends the autonomous run
            self._record_lesson()
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

    async def _perform(self, action: Action) -> Action | None:
        kind = action.kind
        if kind == "ask":
            return await self._ask(action.role, action.message, action.version)
        if kind == "auto_decide" and action.proposal is not None:
            return await self._auto_decide(action.proposal)
        if kind == "apply" and action.proposal is not None:
            return self._apply(action.proposal)
        if kind == "run" and action.version is not None:
            await self._run_eval(action.version, action.by)
            return self._after_eval(action.version)
        if kind == "profile" and action.version is not None:
            by = action.by
            await self._run_profile(action.version, by)
            if by == "auto" and self.state.mode == "auto":
                return self._auto_continue()  # the diagnosis goes into the next request
            return None
        raise ControllerError(f"cannot perform {action!r}")

    # -- asking the agent -------------------------------------------------------------

    async def _ask(self, role: str, message: str | None,
                   version: int | None = None) -> Action | None:
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
                                       **_tools_field(turn)))
            raise
        problem = turn.problem()
        if turn.finished is not None and turn.failure is None:
            self._emit(ev.AgentMessage(type="agent.message", text=turn.text(), role=role,
                                       proposal=None, usage=turn.usage_json(),
                                       **_tools_field(turn)))
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
                                       **_tools_field(turn)))
            return None
        if problem is not None:
            self._emit(ev.AgentMessage(type="agent.message", text=turn.text(), role=role,
                                       proposal=None, usage=turn.usage_json(),
                                       **_tools_field(turn)))
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
                                       **_tools_field(turn)))
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
                                   usage=turn.usage_json(), **_tools_field(turn)))
        core.propose(proposal, role=role, base=named if named is not None else self.state.current,
                     pid=pid, notes_seen=notes_seen, **chosen)
        return Action("auto_decide", proposal=pid) if self.state.mode == "auto" else None

    async def _auto_decide(self, pid: str) -> Action | None:
        """Autonomous mode's approver decides the pending proposal (``AutoApproval``)."""
        verdict = await self.core.decide(pid, self.approver)
        if isinstance(verdict, Halt):
            self._stop_auto(verdict.reason)
            return None
        if not isinstance(verdict, Decision):
            return None  # switched to step mode meanwhile: the person decides
        if verdict.decision == "reject":
            # An agent that keeps repeating itself would otherwise burn the whole
            # token budget on rejected proposals.
            if self.state.auto_rejections >= self.settings.max_agent_failures:
                self._stop_auto("agent_repeating")
            return None  # idle_action asks again (or stops on a budget)
        return Action("apply", proposal=pid)

    # -- applying decisions -----------------------------------------------------------

    def _apply(self, pid: str) -> Action | None:
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
        return Action("run", version=version, by=by)

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

    def _after_eval(self, number: int) -> Action | None:
        s = self.state
        version = s.versions[number]
        if version.status in (None, "error", "cancelled"):
            return None
        if version.error_kind == "task":
            # The task itself failed (its reference, its inputs, its size under the
            # worker's limits): no kernel can be judged until the task changes, so
            # neither the fixer nor another proposal is asked.
            if s.mode == "auto":
                self._stop_auto("task_error")
            return None
        if s.mode == "auto":
            reason = autonomy.stop_rule(s, self.settings) \
                or autonomy.budget_exhausted(s, self.settings, self.log.now())
            if reason is not None:
                self._stop_auto(reason)
                return None
            if autonomy.should_profile(s, number, self.settings):
                return Action("profile", version=number, by="auto")
            return self._auto_continue()
        if s.pending is not None or number != s.current:
            return None
        if s.agent_finished:
            return None  # it said it has nothing more to try: asking again repeats that
        if version.status in FAILED_STATUSES and version.origin == "user-edit":
            # The person's own edit: theirs to fix, said plainly with the way back (the
            # agent is not asked, and nothing of it is put down to the agent).
            self._live("notice", text=self._own_edit_failed(number), level="warning")
            return None
        if version.status in FAILED_STATUSES:
            if s.fix_streak < self.settings.auto_fix_attempts:
                return ask("fix")
            return None  # the user decides: request_proposal("fix"), an edit, a revert
        return ask(next_role(self.state)) if self.settings.propose_after_run else None

    def _own_edit_failed(self, number: int) -> str:
        """"v2 (your edit) does not compile: line 15: ... Edit it again (F2), go back to
        v1 (History: select it, enter), or ask the agent to fix it (a chat message)."""
        from tilewright.sessions.log import read_json_blob

        s = self.state
        version = s.versions[number]
        error: dict[str, Any] = {}
        if version.result_blob:
            try:
                error = (read_json_blob(self.log.path, version.result_blob) or {}).get(
                    "error") or {}
            except (OSError, ValueError):
                error = {}
        status = {"compile_error": "does not compile", "incorrect": "is not correct",
                  "runtime_error": "fails when it runs", "timeout": "timed out",
                  "crashed": "crashed", "rejected": "was rejected by the judge"}.get(
            str(version.status), str(version.status))
        where = f"line {error['line']}: " if error.get("line") else ""
        message = " ".join(str(error.get("message") or "").split())[:160]
        back = version.parent if version.parent in s.versions else s.best
        way_back = f", go back to v{back} (History: select it, enter)" if back else ""
        return (f"v{number} (your edit) {status}" + (f": {where}{message}" if message else "")
                + f". Edit it again (F2){way_back}, or ask the agent to fix it in the chat.")

    async def _run_profile(self, number: int, by: str = "user") -> None:
        await self.core.profile(number, by)


def _tools_field(turn: AgentTurn) -> dict[str, Any]:
    """The read-only tool calls of a turn, for its agent.message (absent when none)."""
    calls = [c for c in turn.tools if c.get("output") is not None]
    return {"tools": calls} if calls else {}
