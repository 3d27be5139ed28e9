"""The approval-driven controller: one asyncio object that owns the propose → decide →
apply → run → feed back loop.

Commands (``user_message``, ``approve``, ``reject``, ``edit``, ``run``, ``profile``,
``set_mode``, ``cancel``, ``revert``, ``request_proposal``) append events; the
controller's ``state`` changes only by folding the events it appends, so live work,
resume and replay agree. Approval is enforced here, in code: a kernel version is only
made from a ``user.decision`` event (or is the task's own starting kernel), and
``_run_eval`` refuses any version the folded state does not show as authorised. In
autonomous mode an auto-approver writes those decisions with ``by: auto``.

All work (an agent streaming a reply, a run, a profile) happens in one job task at a
time; ``cancel`` cancels it, which closes the agent's stream or makes the worker pool
kill and replace the worker. Subscribers receive every persisted event and live-only
notifications (``"live": true``: text deltas, notices, tool calls, worker state, run
phases) that are never written down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from agents.base import Agent, AgentRequest, TaskBrief
from kernels.task import Task
from sessions import autonomy
from sessions.agent_turn import AgentTurn, stream_turn
from sessions.autonomy import ControllerSettings
from sessions.evaluator import Evaluator
from sessions.log import SessionLog
from sessions.state import FAILED_STATUSES, SessionState, fold

Subscriber = Callable[[dict[str, Any]], None]
Action = tuple[Any, ...]

__all__ = ["ApprovalRequired", "Controller", "ControllerBusy", "ControllerError",
           "ControllerSettings"]


class ControllerError(Exception):
    """A command that cannot be carried out now; the message says what to do instead."""


class ControllerBusy(ControllerError):
    pass


class ApprovalRequired(ControllerError):
    pass


class Controller:
    def __init__(self, log: SessionLog, task: Task, brief: TaskBrief, agent: Agent,
                 evaluator: Evaluator, settings: ControllerSettings | None = None,
                 state: SessionState | None = None, chip: str = "cpu") -> None:
        self.log = log
        self.task = task
        self.brief = brief
        self.agent = agent
        self.evaluator = evaluator
        self.settings = settings or ControllerSettings()
        self.state = state if state is not None else fold(log.header, [])
        self.chip = chip
        self._subscribers: list[Subscriber] = []
        self._job: asyncio.Task[None] | None = None
        self._job_kind: str | None = None
        self._closed = False
        listener = getattr(evaluator, "set_state_listener", None)
        if listener is not None:
            listener(lambda st: self._live("worker.state", state=st))

    # -- observing --------------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) \
            if callback in self._subscribers else None

    def _publish(self, event: dict[str, Any]) -> None:
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception as exc:  # a broken observer must not stop the loop
                self._subscribers.remove(callback)
                with contextlib.suppress(Exception):
                    self.log.append("error", message=f"subscriber removed: {exc!r}",
                                    where="subscriber")

    def _emit(self, type_: str, **fields: Any) -> dict[str, Any]:
        """Persist one event, fold it, tell the subscribers: the only way state changes."""
        event = self.log.append(type_, **fields)
        self.state.apply(event)
        self._publish(event)
        return event

    def _live(self, type_: str, **fields: Any) -> None:
        self._publish({"type": type_, "live": True, **fields})

    @property
    def busy(self) -> str | None:
        """What the job is doing (``agent``, ``run``, ``profile``), None when idle."""
        return self._job_kind if self._job is not None else None

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Begin or resume: settle what a crash left open, add the starting kernel, and
        carry on where the folded state says the loop stands."""
        s = self.state
        if s.last_seq:
            self._emit("marker", label="resumed")
            active = s.active_run
            if active is not None:
                self._emit("run.result", run=active.id, version=active.version,
                           status="cancelled", correct=False, speedup=None, median_ms=None,
                           result_blob=None, cancelled=True, interrupted=True)
            if s.mode == "auto":
                # The app died in autonomous mode: a reopened session waits for the user
                # to switch autonomy on again (with a fresh allowance).
                self._emit("auto.stop", reason="interrupted")
                self._emit("mode.change", mode="step", by="resume")
        if not s.versions and s.pending is None:
            source = self.task.starting_source()
            if source is not None:
                self._emit("kernel.version", version=1, parent=None, origin="initial",
                           proposal=None, source_blob=self.log.put_blob(source),
                           summary=f"starting kernel ({self.task.kernel_path.name})"
                           if self.task.kernel_path else "starting kernel", decision=None)
        action = self._idle_action()
        if action is None and not s.versions and s.pending is None:
            action = ("ask", "implement", None)
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

    async def close(self, reason: str = "closed") -> None:
        """Stop any job and write ``session.end``; the session stays resumable."""
        if self._closed:
            return
        await self._cancel_job()
        if self.state.mode == "auto":
            self._emit("auto.stop", reason="user")
            self._emit("mode.change", mode="step", by="user")
        self._emit("session.end", reason=reason)
        self._closed = True
        self.log.close()

    # -- commands ---------------------------------------------------------------------

    def user_message(self, text: str) -> None:
        """Record a message; the agent answers it now, or with its next request if busy."""
        self._check_open()
        self._emit("user.message", text=text)
        if self._job is None:
            self._spawn(("ask", self._role(), text))
        else:
            self._live("notice", text="the agent will see this with its next request",
                       level="info")

    def request_proposal(self, role: str | None = None) -> None:
        """Ask the agent now (e.g. send a failing version back to the fixer)."""
        self._check_idle("ask the agent")
        self._spawn(("ask", role or self._role(), None))

    def approve(self) -> None:
        prop = self._pending()
        self._emit("user.decision", proposal=prop.id, decision="approve", by="user",
                   note=None, source_blob=None)
        if self._job is None:
            self._spawn(("apply", prop.id))

    def reject(self, note: str | None = None) -> None:
        """Reject the pending proposal; with a note the agent is asked again (and sees it)."""
        prop = self._pending()
        self._emit("user.decision", proposal=prop.id, decision="reject", by="user",
                   note=note or None, source_blob=None)
        if note and self._job is None:
            self._spawn(("ask", self._role(), None))
        else:
            self._kick()

    def edit(self, source: str) -> None:
        """The user's own source: decides the pending proposal (``edit``) or, with none
        pending, becomes a new version of its own; either way it is then run."""
        self._check_open()
        prop = self.state.pending_proposal
        if prop is None:
            self._check_idle("apply an edit")
        self._emit("user.decision", proposal=prop.id if prop else None, decision="edit",
                   by="user", note=None, source_blob=self.log.put_blob(source))
        if prop is None:
            version = self._new_version(source, origin="user-edit", proposal=None,
                                        summary="edited by the user")
            self._spawn(("run", version, "user"))
        else:
            self._kick()

    def run(self, version: int | None = None) -> None:
        """Evaluate a version (default: the current one) at the user's request."""
        self._check_idle("start a run")
        number = self._version_arg(version)
        if not self.state.authorized(number):
            raise ApprovalRequired(f"v{number} was never approved; it cannot run")
        self._spawn(("run", number, "user"))

    def profile(self, version: int | None = None) -> None:
        self._check_idle("start a profile")
        number = self._version_arg(version)
        if not self.state.authorized(number):
            raise ApprovalRequired(f"v{number} was never approved; it cannot run")
        self._spawn(("profile", number))

    def revert(self, version: int) -> None:
        """Make an earlier version current again (the next proposal builds on it)."""
        self._check_idle("revert")
        number = self._version_arg(version)
        self._emit("kernel.checkout", version=number, by="user")

    def set_mode(self, mode: str, by: str = "user") -> None:
        """Switch between step and auto at any moment; a running job finishes its step
        and the next decision follows the new mode."""
        self._check_open()
        if mode not in ("step", "auto"):
            raise ControllerError(f"unknown mode {mode!r} (step or auto)")
        if mode == self.state.mode:
            return
        if mode == "step":
            self._emit("auto.stop", reason="user")
        self._emit("mode.change", mode=mode, by=by)
        if mode == "auto":
            self._kick()

    async def cancel(self) -> bool:
        """Stop the streaming answer or the run; autonomous mode stops too."""
        was_busy = self._job is not None
        await self._cancel_job()
        if self.state.mode == "auto" and not self._closed:
            self.set_mode("step")
        return was_busy

    # -- command helpers --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ControllerError("the session is closed")

    def _check_idle(self, what: str) -> None:
        self._check_open()
        if self._job is not None:
            raise ControllerBusy(f"cannot {what} while the {self._job_kind} is in progress; "
                                 "cancel it first or wait for it to finish")

    def _pending(self) -> Any:
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

    def _kick(self) -> None:
        if self._job is None and not self._closed:
            action = self._idle_action()
            if action is not None:
                self._spawn(action)

    def _spawn(self, action: Action) -> None:
        self._job_kind = {"ask": "agent", "run": "run", "profile": "profile"}.get(
            action[0], "step")
        self._job = asyncio.get_running_loop().create_task(self._drive(action))

    async def _cancel_job(self) -> None:
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
                    action = self._idle_action()
                if action is None:
                    break
                self._job_kind = {"ask": "agent", "run": "run", "profile": "profile"}.get(
                    action[0], "step")
                self._live("controller.busy", what=self._job_kind)
                action = await self._perform(action)
        except asyncio.CancelledError:
            self._live("notice", text="cancelled", level="info")
            raise
        except Exception as exc:  # a bug must be seen, recorded, and leave the app alive
            self._emit("error", message=f"{type(exc).__name__}: {exc}", where="controller")
        finally:
            self._job = None
            self._job_kind = None
            self._live("controller.idle")

    def _idle_action(self) -> Action | None:
        """What to do next when nothing is running, read from the folded state."""
        s = self.state
        if self._closed:
            return None
        prop = s.unapplied_approval()
        if prop is not None:
            return ("apply", prop.id)
        if s.mode != "auto":
            return None
        if s.pending is not None:
            return ("auto_decide", s.pending)
        if s.current is not None and self._needs_eval(s.current):
            return ("run", s.current, "auto")
        return self._auto_continue()

    def _needs_eval(self, number: int) -> bool:
        return not any(r.version == number and r.kind == "eval" and not r.interrupted
                       for r in self.state.runs.values())

    def _auto_continue(self) -> Action | None:
        """Autonomous mode between steps: stop on a budget or rule, else ask the agent."""
        s = self.state
        reason = autonomy.budget_exhausted(s, self.settings, self.log.now())
        if reason is None and s.agent_failures >= self.settings.max_agent_failures:
            reason = "agent_failed"
        if reason is not None:
            self._stop_auto(reason)
            return None
        current = s.versions.get(s.current) if s.current is not None else None
        if current is not None and current.status in FAILED_STATUSES \
                and s.fix_streak >= max(1, self.settings.auto_fix_attempts) \
                and s.best is not None and s.best != s.current:
            # Fixing is not converging: go back to the best kernel and improve that.
            self._emit("kernel.checkout", version=s.best, by="auto")
        return ("ask", self._role(), None)

    def _stop_auto(self, reason: str) -> None:
        self._emit("auto.stop", reason=reason)
        self._emit("mode.change", mode="step", by="auto")

    def _role(self) -> str:
        s = self.state
        if s.plan_to_implement is not None or s.current is None:
            return "implement"
        current = s.versions[s.current]
        if current.status in FAILED_STATUSES:
            return "fix"
        return "tune"

    async def _perform(self, action: Action) -> Action | None:
        kind = action[0]
        if kind == "ask":
            return await self._ask(action[1], action[2])
        if kind == "auto_decide":
            return self._auto_decide(action[1])
        if kind == "apply":
            return self._apply(action[1])
        if kind == "run":
            await self._run_eval(action[1], action[2])
            return self._after_eval(action[1])
        if kind == "profile":
            await self._run_profile(action[1])
            return None
        raise ControllerError(f"unknown action {kind!r}")

    # -- asking the agent -------------------------------------------------------------

    def _request(self, role: str, message: str | None) -> AgentRequest:
        s = self.state
        current = s.versions.get(s.current) if s.current is not None else None
        source = self.log.get_blob(current.source_blob).decode() if current else None
        last_eval = None
        if current is not None and current.result_blob:
            from sessions.log import read_json_blob

            last_eval = read_json_blob(self.log.path, current.result_blob)
        plan = s.proposals[s.plan_to_implement].plan if s.plan_to_implement else None
        notes = tuple(s.notes) + ((f"approved plan:\n{plan}",) if plan else ())
        profile = None
        if current is not None and current.profile_blob:
            from sessions.log import read_json_blob

            profile = read_json_blob(self.log.path, current.profile_blob)
        return AgentRequest(
            role=role, task=self.brief, current_source=source,  # type: ignore[arg-type]
            current_version=current.number if current else None, last_eval=last_eval,
            profile_summary=profile, user_message=message, notes=notes,
            history=self._history(), chip=self.chip)

    def _history(self) -> tuple[dict[str, Any], ...]:
        from kernels import tunables

        out = []
        for v in self.state.versions.values():
            entry: dict[str, Any] = {"version": v.number, "status": v.status,
                                     "speedup": v.speedup, "summary": v.summary,
                                     "median_ms": v.median_ms}
            with contextlib.suppress(Exception):  # a broken source simply has no tunables
                entry["tunables"] = tunables.config_of(self.log.get_blob(v.source_blob).decode())
            out.append(entry)
        return tuple(out)

    async def _ask(self, role: str, message: str | None) -> Action | None:
        request = self._request(role, message)
        turn = AgentTurn()
        self._live("agent.start", role=role, agent=self.agent.label)
        try:
            await stream_turn(self.agent, request, turn, self._live)
        except asyncio.CancelledError:
            self._emit("agent.message", text=turn.text(), role=role, proposal=None,
                       usage=turn.usage_json(), cancelled=True)
            raise
        problem = turn.problem()
        if problem is not None:
            self._emit("agent.message", text=turn.text(), role=role, proposal=None,
                       usage=turn.usage_json())
            self._emit("error", message=problem, where="agent")
            return None
        proposal = turn.proposal
        assert proposal is not None
        pid = f"p{len(self.state.proposals) + 1}"
        self._emit("agent.message", text=turn.text(), role=role, proposal=pid,
                   usage=turn.usage_json())
        self._emit("agent.proposal", proposal=pid, kind=proposal.kind,
                   summary=proposal.summary, rationale=proposal.rationale,
                   base_version=self.state.current,
                   source_blob=self.log.put_blob(proposal.source) if proposal.source else None,
                   plan=proposal.plan, tuning=proposal.tuning, role=role)
        return ("auto_decide", pid) if self.state.mode == "auto" else None

    def _auto_decide(self, pid: str) -> Action | None:
        s = self.state
        if s.mode != "auto" or s.pending != pid:
            return None
        reason = autonomy.budget_exhausted(s, self.settings, self.log.now())
        if reason is not None:
            self._stop_auto(reason)
            return None
        prop = s.proposals[pid]
        same = autonomy.duplicate_of(s, prop.source_blob)
        if same is not None:
            self._emit("user.decision", proposal=pid, decision="reject", by="auto",
                       note=f"identical to v{same}, which was already measured; "
                            "propose something different", source_blob=None)
            return None  # _idle_action asks again (or stops on a budget)
        self._emit("user.decision", proposal=pid, decision="approve", by="auto",
                   note=None, source_blob=None)
        return ("apply", pid)

    # -- applying decisions -----------------------------------------------------------

    def _apply(self, pid: str) -> Action | None:
        s = self.state
        prop = s.proposals[pid]
        if prop.decision not in ("approve", "edit"):
            raise ApprovalRequired(f"{pid} has no approving decision")
        by = "auto" if prop.decided_by == "auto" else "user"
        if prop.kind == "plan" and prop.decision == "approve":
            return ("ask", "implement", None)
        if prop.decision == "edit":
            source = self.log.get_blob(prop.edit_blob or "").decode()
            origin, summary = "user-edit", f"{prop.summary} (edited by the user)"
        elif prop.kind == "tuning":
            from kernels import tunables

            base = s.versions[s.current] if s.current is not None else None
            if base is None:
                self._emit("error", message="a tuning proposal needs a kernel to tune",
                           where="apply", proposal=pid)
                return None
            try:
                source = tunables.apply(self.log.get_blob(base.source_blob).decode(),
                                        prop.tuning or {})
            except Exception as exc:
                self._emit("error", message=f"could not apply the tuning: {exc}",
                           where="apply", proposal=pid)
                return ("ask", self._role(), None) if s.mode == "auto" else None
            origin, summary = "tuning", prop.summary
        else:
            if not prop.source_blob:
                self._emit("error", message="the proposal carries no kernel source",
                           where="apply", proposal=pid)
                return None
            source = self.log.get_blob(prop.source_blob).decode()
            origin, summary = ("template" if prop.role == "implement" and
                               self.agent.name == "offline" else "agent"), prop.summary
        version = self._new_version(source, origin=origin, proposal=pid, summary=summary,
                                    decision=prop.decision_seq)
        return ("run", version, by)

    def _new_version(self, source: str, *, origin: str, proposal: str | None, summary: str,
                     decision: int | None = None) -> int:
        s = self.state
        if decision is None:
            decision = s.decisions[-1].seq if s.decisions else None
        number = max(s.versions, default=0) + 1
        self._emit("kernel.version", version=number, parent=s.current, origin=origin,
                   proposal=proposal, source_blob=self.log.put_blob(source),
                   summary=summary, decision=decision)
        return number

    # -- runs -------------------------------------------------------------------------

    def _source_of(self, number: int) -> str:
        return self.log.get_blob(self.state.versions[number].source_blob).decode()

    async def _run_eval(self, number: int, by: str) -> None:
        if not self.state.authorized(number):  # the gate: no decision, no run
            raise ApprovalRequired(f"v{number} has no approving decision; not running it")
        rid = f"r{len(self.state.runs) + 1}"
        self._emit("run.start", run=rid, version=number, kind="eval", by=by)
        source = self._source_of(number)
        try:
            result = await self.evaluator.evaluate(self.task, source)
        except asyncio.CancelledError:
            self._emit("run.result", run=rid, version=number, status="cancelled",
                       correct=False, speedup=None, median_ms=None, result_blob=None,
                       cancelled=True)
            raise
        except Exception as exc:  # the evaluator itself failed: not the kernel's fault
            self._emit("run.result", run=rid, version=number, status="error", correct=False,
                       speedup=None, median_ms=None, result_blob=None, cancelled=True)
            self._emit("error", message=f"evaluation failed: {exc}", where="evaluator")
            return
        blob = self.log.put_json_blob(result.to_json())
        timing = result.timing or {}
        self._emit("run.result", run=rid, version=number, status=result.status,
                   correct=result.correct, speedup=result.speedup,
                   median_ms=timing.get("median_ms"), result_blob=blob, cancelled=False)

    def _after_eval(self, number: int) -> Action | None:
        s = self.state
        version = s.versions[number]
        if version.status in (None, "error", "cancelled"):
            return None
        if s.mode == "auto":
            reason = autonomy.stop_rule(s, self.settings) \
                or autonomy.budget_exhausted(s, self.settings, self.log.now())
            if reason is not None:
                self._stop_auto(reason)
                return None
            return self._auto_continue()
        if s.pending is not None or number != s.current:
            return None
        if version.status in FAILED_STATUSES:
            if s.fix_streak < self.settings.auto_fix_attempts:
                return ("ask", "fix", None)
            return None  # the user decides: request_proposal("fix"), an edit, a revert
        return ("ask", self._role(), None) if self.settings.propose_after_run else None

    async def _run_profile(self, number: int) -> None:
        rid = f"r{len(self.state.runs) + 1}"
        self._emit("run.start", run=rid, version=number, kind="profile", by="user")
        logdir = self.log.profile_dir(rid)
        try:
            data = await self.evaluator.profile(self.task, self._source_of(number), logdir)
        except asyncio.CancelledError:
            self._emit("profile.result", run=rid, version=number, profile_blob=None,
                       logdir=None, error="cancelled")
            raise
        except Exception as exc:
            self._emit("profile.result", run=rid, version=number, profile_blob=None,
                       logdir=None, error=str(exc))
            return
        self._emit("profile.result", run=rid, version=number,
                   profile_blob=self.log.put_json_blob(data),
                   logdir=str(logdir.relative_to(self.log.path)), error=None)
