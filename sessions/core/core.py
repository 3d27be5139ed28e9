"""``SessionCore``: what every way of driving a session does, written once.

A session is driven by a scheduler: the ``Controller`` (step and autonomous mode, one
job at a time) or a ``Search`` (beam rounds and independent runs, several at once).
Both stand on one core that owns the session's writer, its folded state, its log and a
judge with the session's options bound, and offers the acts a scheduler combines:

- ``seed`` (the task's own kernel as v1) and ``settle_open_runs`` (what a crash left
  running is recorded as cancelled, interrupted);
- ``ask`` (stream one agent reply) and ``propose`` (record a proposal for a decision);
- ``decide`` (ask an ``ApprovalPolicy``, record its ``Decision``) and ``record``;
- ``apply`` (an approved proposal becomes a kernel version) and ``new_version``;
- ``evaluate``, ``analyze``, ``profile`` (a run each, numbered one way, its result
  event built here, finished, cancelled or failed), ``check_chips``;
- ``end`` and ``close``.

Approval is enforced here: ``apply`` needs an approving decision in the folded state,
and ``evaluate`` and ``profile`` refuse a version the state does not show as authorised.
The core never imports a front end (an import contract says so); schedulers import it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tilewright.agents.base import Agent, AgentRequest, Proposal, TaskBrief
from tilewright.kernels.judge.judgement import Judgement
from tilewright.kernels.judge.options import EvalOptions
from tilewright.kernels.judge.result import EvalResult
from tilewright.kernels.pool import Judge
from tilewright.kernels.tasks.task import Task
from tilewright.sessions import events as ev
from tilewright.sessions.agent_turn import AgentTurn, stream_turn
from tilewright.sessions.core.approval import ApprovalPolicy, Decision, Verdict
from tilewright.sessions.core.diagnosis import diagnose_version
from tilewright.sessions.core.same_program import SameProgram
from tilewright.sessions.errors import ApprovalRequired
from tilewright.sessions.evaluator import PoolEvaluator
from tilewright.sessions.log import SessionLog
from tilewright.sessions.state import (
    ProposalInfo,
    SessionState,
    proposal_base,
)

__all__ = ["JudgeFailed", "SessionCore", "cancelled_result", "failed_result",
           "finished_result"]


@dataclass(frozen=True)
class JudgeFailed:
    """An evaluation the judge itself could not finish (not the kernel's fault)."""

    message: str


# -- run.result, built here only ----------------------------------------------------------


def finished_result(run: str, version: int, result: EvalResult, blob: str) -> ev.RunResult:
    """The ``run.result`` of an evaluation the judge finished (whatever its verdict)."""
    return ev.RunResult(type="run.result", run=run, version=version,  # type: ignore[typeddict-item]
                        result_blob=blob, cancelled=False, **Judgement.of(result).event_fields())


def cancelled_result(run: str, version: int, *, interrupted: bool = False,
                     cause: str | None = None) -> ev.RunResult:
    """The ``run.result`` of a run stopped by the person, or (``interrupted``) by the
    app dying while it ran (settled when the session is reopened) or being stopped
    (``cause``: ``disconnect`` when the terminal went away, ``terminated`` on SIGTERM)."""
    event = ev.RunResult(type="run.result", run=run, version=version, status="cancelled",
                         correct=False, median_ms=None, result_blob=None,
                         cancelled=True)
    if interrupted or cause:
        event["interrupted"] = True
    if cause:
        event["cause"] = cause
    return event


def failed_result(run: str, version: int) -> ev.RunResult:
    """The ``run.result`` of a run the judge itself failed (not the kernel's fault; an
    ``error`` event says why)."""
    return ev.RunResult(type="run.result", run=run, version=version, status="error",
                        correct=False, median_ms=None, result_blob=None,
                        cancelled=False)


class SessionCore:
    """One session's writer, folded state, log and bound judge, and the acts on them.

    ``state`` is the fold the writer keeps: a ``SessionState``, or a ``SearchState``
    (which folds a ``SessionState`` of its own, ``session``). ``judge`` is any judge;
    unless it is already a ``PoolEvaluator`` it is bound to ``options`` and ``chip``
    here (the caller keeps its lifetime: ``close`` does not close it).
    """

    def __init__(self, log: SessionLog, state: ev.Folds, task: Task, brief: TaskBrief,
                 agent: Agent, judge: Judge, *, chip: str,
                 options: EvalOptions | None = None) -> None:
        self.log = log
        self.state = state
        self.task = task
        self.brief = brief
        self.agent = agent
        self.chip = chip
        self.judge: PoolEvaluator = judge if isinstance(judge, PoolEvaluator) else \
            PoolEvaluator(judge, options, chip=options.chip if options else None)
        self.writer = ev.EventWriter(log, state)
        # which correct version a proposal already is at the production shape (the rules
        # of autonomous mode and of the search reject it before it spends an evaluation)
        self.same_program = SameProgram(self.judge, task, log.get_blob,
                                        functools.partial(self.proposed_source, strict=True))
        # Why the session is being stopped under a run (``disconnect``, ``terminated``):
        # the run's result says it was interrupted, and by what.
        self.stopping: str | None = None

    @property
    def session(self) -> SessionState:
        """The folded session (versions, proposals, runs) whichever fold drives it."""
        inner = getattr(self.state, "session", None)
        return inner if isinstance(inner, SessionState) else self.state  # type: ignore[return-value]

    # -- events ---------------------------------------------------------------------------

    def emit(self, event: ev.Event) -> ev.Event:
        return self.writer.emit(event)

    def live(self, type_: ev.LiveType, **fields: Any) -> None:
        self.writer.live(ev.live(type_, **fields))

    def subscribe(self, callback: ev.Subscriber) -> Callable[[], None]:
        return self.writer.subscribe(callback)

    def source_of(self, number: int) -> str:
        return self.log.get_blob(self.session.versions[number].source_blob).decode()

    def next_run_id(self) -> str:
        runs = self.session.runs
        return f"r{max((int(r[1:]) for r in runs if r[1:].isdigit()), default=0) + 1}"

    def next_proposal_id(self) -> str:
        return f"p{len(self.session.proposals) + 1}"

    # -- opening --------------------------------------------------------------------------

    def seed(self) -> int | None:
        """The task's own starting kernel as v1, when the session has no version yet and
        nothing waits for a decision; its number, or None."""
        s = self.session
        source = self.task.starting_source()
        if s.versions or s.pending is not None or source is None:
            return None
        path = self.task.kernel_path
        self.emit(ev.KernelVersion(type="kernel.version", version=1, parent=None,
                                   origin="initial", proposal=None,
                                   source_blob=self.log.put_blob(source),
                                   summary=f"starting kernel ({path.name})" if path
                                   else "starting kernel", decision=None))
        return 1

    def settle_open_runs(self) -> list[str]:
        """Record every run a crash left without its result as cancelled (interrupted);
        the runs settled."""
        settled = []
        for run in list(self.session.runs.values()):
            if run.status is None:
                self.emit(cancelled_result(run.id, run.version, interrupted=True))
                settled.append(run.id)
        return settled

    # -- proposing ------------------------------------------------------------------------

    async def ask(self, request: AgentRequest, turn: AgentTurn, *, live: bool = True) -> None:
        """Stream the agent's reply to ``request`` into ``turn`` (its text, tool calls,
        usage, proposal or failure); ``live`` publishes the deltas to subscribers. The
        scheduler records what came of it (``propose``, an answer, an error)."""
        if live:
            await stream_turn(self.agent, request, turn, self.live)
        else:
            await stream_turn(self.agent, request, turn, lambda *_a, **_k: None)

    def propose(self, proposal: Proposal, *, role: str, base: int | None,
                source: str | None = None, pid: str | None = None, **fields: Any) -> str:
        """Record ``proposal`` (the agent's, or the search's own tuning step) as
        ``agent.proposal``, waiting for a decision; its id (``pid``: the one the
        scheduler already named in the reply's ``agent.message``). ``source`` replaces
        the proposal's own (a tuning already applied to ``base``); ``fields`` are the
        scheduler's (the search's slot and strategy, the notes the agent saw)."""
        number = self.next_proposal_id()
        if pid is not None and pid != number:
            raise ValueError(f"proposal {pid} is not the next one ({number})")
        text = proposal.source if source is None else source
        via = proposal.meta.get("via")
        if isinstance(via, str):  # what the version's origin is read from (a template)
            fields = {"via": via, **fields}
        self.emit(ev.AgentProposal(  # type: ignore[typeddict-item]
            type="agent.proposal", proposal=number, kind=proposal.kind,
            summary=proposal.summary, rationale=proposal.rationale, base_version=base,
            source_blob=self.log.put_blob(text) if text else None, plan=proposal.plan,
            tuning=proposal.tuning, role=role, **fields))
        return number

    # -- deciding and applying ------------------------------------------------------------

    async def decide(self, pid: str, policy: ApprovalPolicy) -> Verdict:
        """Ask ``policy`` about proposal ``pid`` and record its decision (a ``Halt`` or
        ``None`` is returned for the scheduler to act on; nothing is recorded)."""
        verdict = await policy.decide(self.session, self.session.proposals[pid])
        if isinstance(verdict, Decision):
            self.record(pid, verdict)
        return verdict

    def record(self, pid: str | None, decision: Decision) -> ev.Event:
        """The ``user.decision`` event (``pid`` None: the person's own edit with nothing
        pending, which becomes a version of its own)."""
        plan: dict[str, Any] = {"plan": decision.plan} if decision.plan is not None else {}
        if decision.same_as is not None:
            plan["same_as"] = decision.same_as
        return self.emit(ev.UserDecision(
            type="user.decision", proposal=pid, decision=decision.decision, by=decision.by,
            note=decision.note, source_blob=self.log.put_blob(decision.source)
            if decision.source is not None else None, **plan))  # type: ignore[typeddict-item]

    def new_version(self, source: str, *, origin: str, proposal: str | None, summary: str,
                    decision: int | None = None, parent: int | None = None) -> int:
        """Write ``kernel.version`` (numbered after the highest) and return its number;
        ``decision`` defaults to the latest decision, ``parent`` to the current version."""
        s = self.session
        if decision is None:
            decision = s.decisions[-1].seq if s.decisions else None
        number = max(s.versions, default=0) + 1
        self.emit(ev.KernelVersion(type="kernel.version", version=number,
                                   parent=s.current if parent is None else parent,
                                   origin=origin, proposal=proposal,
                                   source_blob=self.log.put_blob(source), summary=summary,
                                   decision=decision))
        return number

    def apply(self, pid: str, parent: int | None) -> int | None:
        """Make the kernel version an approved proposal asks for, grown from ``parent``:
        the person's edit, the tuning applied to ``parent``, or the proposal's kernel. Its
        number; None when it cannot be made (an ``error`` event says why)."""
        prop = self.session.proposals[pid]
        if not prop.approved:
            raise ApprovalRequired(f"{pid} has no approving decision")
        try:
            source, origin, summary = self._made_by(prop, parent)
        except ValueError as exc:
            self.emit(ev.Error(type="error", message=str(exc), where="apply", proposal=pid))
            return None
        return self.new_version(source, origin=origin, proposal=pid, summary=summary,
                                decision=prop.decision_seq, parent=parent)

    def _made_by(self, prop: ProposalInfo, parent: int | None) -> tuple[str, str, str]:
        """(source, origin, summary) of the version ``prop`` makes from ``parent``."""
        if prop.decision == "edit":
            from tilewright.sessions.edits import describe_edit

            source = self.log.get_blob(prop.edit_blob or "").decode()
            change = describe_edit(self.proposed_source(prop), source)
            return source, "user-edit", \
                f"edited by the user: {change} (proposal {prop.id}: {prop.summary})"
        if prop.kind == "tuning" and prop.tuning:
            if parent is None or parent not in self.session.versions:
                if not prop.source_blob:
                    raise ValueError("a tuning proposal needs a kernel to tune")
            else:
                from tilewright.kernels.source import tunables

                try:
                    return tunables.apply(self.source_of(parent), prop.tuning), "tuning", \
                        prop.summary
                except Exception as exc:
                    raise ValueError(f"could not apply the tuning: {exc}") from exc
        if not prop.source_blob:
            raise ValueError("the proposal carries no kernel source")
        return self.log.get_blob(prop.source_blob).decode(), prop.origin, prop.summary

    def proposed_source(self, prop: ProposalInfo, strict: bool = False) -> str:
        """What the proposal itself would have made (its kernel, or its tuning applied to
        the version it applies to, ``proposal_base``): an edit is described against it.
        A tuning that cannot apply is its base's source, or with ``strict`` the error."""
        if prop.source_blob:
            return self.log.get_blob(prop.source_blob).decode()
        base = proposal_base(self.session, prop)
        if base is None:
            return ""
        text = self.source_of(base)
        if prop.kind == "tuning" and prop.tuning:
            from tilewright.kernels.source import tunables

            try:
                return tunables.apply(text, prop.tuning)
            except Exception:  # a tuning that cannot apply: described against its base
                if strict:
                    raise
                return text
        return text

    # -- runs -----------------------------------------------------------------------------

    def _gate(self, number: int) -> None:
        if not self.session.authorized(number):  # the gate: no decision, no run
            raise ApprovalRequired(f"v{number} has no approving decision; not running it")

    async def evaluate(self, number: int, by: str, *, where: str = "evaluator"
                       ) -> EvalResult | JudgeFailed:
        """Evaluate version ``number`` as run ``r<N>``: ``run.start``, the production
        verdict streamed live (``run.progress``) while the trials run, then its
        ``run.result``. ``JudgeFailed`` when the judge itself failed (recorded as a
        ``run.result`` with status ``error`` and an ``error`` event at ``where``)."""
        self._gate(number)
        rid = self.next_run_id()
        self.emit(ev.RunStart(type="run.start", run=rid, version=number, kind="eval", by=by))

        def progress(data: dict[str, Any]) -> None:
            if data.get("kind") == "production" and isinstance(data.get("tpu"), dict):
                self.live("run.progress", run=rid, version=number, tpu=data["tpu"],
                          final=bool(data.get("final")))

        try:
            result = await self.judge.evaluate(self.task, self.source_of(number),
                                               on_progress=progress)
        except asyncio.CancelledError:
            self.emit(cancelled_result(rid, number, cause=self.stopping))
            raise
        except Exception as exc:  # the judge failed, not the kernel
            self.emit(failed_result(rid, number))
            self.emit(ev.Error(type="error", message=f"evaluation failed: {exc}", where=where))
            return JudgeFailed(str(exc))
        self.emit(finished_result(rid, number, result, self.log.put_json_blob(result.to_json())))
        return result

    async def analyze(self, number: int, by: str) -> None:
        """An ``analysis`` run: the static analysis alone (grid, blocks, VMEM, roofline;
        nothing executes), recorded as ``profile.result`` with ``static: true``, then its
        diagnosis, so every evaluated version has one of its own. A failure is recorded
        and the scheduler goes on without it."""
        rid = self.next_run_id()
        self.emit(ev.RunStart(type="run.start", run=rid, version=number, kind="analysis",
                              by=by))
        source = self.source_of(number)
        data = await self._profiled(rid, number, lambda: self.judge.analyze(self.task, source),
                                    None)
        if data is not None:
            self._diagnose(number, rid, data)

    async def profile(self, number: int, by: str) -> dict[str, Any] | None:
        """A ``profile`` run of version ``number`` (a trace in the session's profile
        directory), then its diagnosis; the profile, or None when it failed."""
        self._gate(number)
        rid = self.next_run_id()
        self.emit(ev.RunStart(type="run.start", run=rid, version=number, kind="profile", by=by))
        logdir = self.log.profile_dir(rid)
        source = self.source_of(number)
        data = await self._profiled(
            rid, number, lambda: self.judge.profile(self.task, source, logdir), logdir)
        if data is not None:
            self._diagnose(number, rid, data)
        return data

    async def _profiled(self, rid: str, number: int, call: Callable[[], Any],
                        logdir: Any) -> dict[str, Any] | None:
        static = {} if logdir is not None else {"static": True}
        try:
            data = await call()
        except asyncio.CancelledError:
            error = f"interrupted ({self.stopping})" if self.stopping else "cancelled"
            self.emit(ev.ProfileResult(type="profile.result", run=rid, version=number,
                                       profile_blob=None, logdir=None, error=error,
                                       **static))  # type: ignore[typeddict-item]
            raise
        except Exception as exc:  # a failed profile costs the version its diagnosis only
            self.emit(ev.ProfileResult(type="profile.result", run=rid, version=number,
                                       profile_blob=None, logdir=None, error=str(exc),
                                       **static))  # type: ignore[typeddict-item]
            return None
        self.emit(ev.ProfileResult(
            type="profile.result", run=rid, version=number,
            profile_blob=self.log.put_json_blob(data),
            logdir=str(logdir.relative_to(self.log.path)) if logdir is not None else None,
            error=None, **static))  # type: ignore[typeddict-item]
        return data

    def _diagnose(self, number: int, rid: str, data: dict[str, Any]) -> None:
        diagnose_version(self.log.path, self.session.versions[number].result_blob, data,
                         number, rid, self.emit)

    async def check_chips(self, number: int, chips: Sequence[str]) -> list[EvalResult]:
        """Evaluate ``number`` once per TPU generation (nothing is recorded: the
        verdicts answer a question, they do not rank the version)."""
        return await self.judge.evaluate_on_chips(self.task, self.source_of(number), chips)

    # -- closing --------------------------------------------------------------------------

    def end(self, reason: str) -> None:
        """``session.end``: the session stays resumable."""
        self.emit(ev.SessionEnd(type="session.end", reason=reason))

    def close(self) -> None:
        """Close the log and stop listening to the judge (which may outlive the
        session: its owner closes it)."""
        self.log.close()
        self.judge.set_state_listener(None)
