"""Graph search over kernel versions: beam search and parallel independent runs.

``Search`` drives ``sessions.search.planner.plan`` against one session: it asks the
agent (or the search's own tuning steps) for children, decides, applies them as kernel
versions and has a ``Judge`` evaluate them, several at once. Everything it does is
an event in the session log, folded into the same ``SearchState`` it plans from, so
``Search.open`` on an interrupted session re-folds and carries on: finished nodes are
skipped, a ``run.start`` without its ``run.result`` is evaluated again, a proposal left
between decision and version is finished.

``Search`` is the beam/runs planner on the session's ``SessionCore`` (``sessions.core``),
which seeds, settles, decides, applies, evaluates and profiles as it does for the
controller. Approval is enforced the controller's way: a child becomes a kernel version
only through a ``user.decision`` event, which the core records from the search's
``SearchRules``: ``by: auto`` when ``approval`` is auto, or the person's through
``approve``/``reject`` (a ``PersonApproval`` Future) when it is ``user`` (the search
view calls these; ``prune`` takes a branch out of the beam). No textual, no jax.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tilewright.agents.base import Agent, TaskBrief
from tilewright.kernels.judge.options import EvalOptions
from tilewright.kernels.judge.protocol import Judge
from tilewright.kernels.judge.rank import Rank
from tilewright.kernels.judge.result import Backend
from tilewright.kernels.source import tunables
from tilewright.kernels.tasks.task import Task
from tilewright.sessions import actions as act
from tilewright.sessions import events as ev
from tilewright.sessions.core import Decision, JudgeFailed, PersonApproval, SearchRules, SessionCore
from tilewright.sessions.core.log_open import create_log, recorded_options, reopen_log
from tilewright.sessions.log import SessionLog
from tilewright.sessions.search.children import ROOT_FAMILY_CANDIDATES, ChildMaker
from tilewright.sessions.search.graph import Budget, SearchConfig, SearchState, fold_search
from tilewright.sessions.search.planner import finish_reason, plan, select_beam


@dataclass
class SearchSummary:
    session: str
    task: str
    reason: str
    best_version: int | None
    best_status: str | None
    # What ranks the best version and the first kernel (the task's, or the first
    # written): kernels.judge.rank.Rank as JSON (its source, value, chip, production shape).
    best_rank: dict[str, Any] | None
    evaluations: int
    nodes: int
    tokens: int
    cost_usd: float
    note: str | None = None  # why nothing correct came out, when it did not
    start_rank: dict[str, Any] | None = None
    flags: list[str] = field(default_factory=list)  # integrity flags of the best version
    chip: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(state: SearchState, session: Path | str, task: str) -> SearchSummary:
    """Per-task figures of a (finished or not) search session."""
    best = state.best()
    versions = state.session.versions
    if best is None and versions:  # nothing correct: report the root's status
        root = state.root if state.root in versions else min(versions)
        best_status = versions[root].status
    else:
        best_status = versions[best].status if best is not None else None
    return SearchSummary(
        session=str(session), task=task, reason=state.ended or "unfinished",
        best_version=best, best_status=best_status,
        best_rank=_rank_json(state.rank(best)),
        evaluations=state.evaluations(), nodes=len(state.nodes),
        tokens=state.session.spent.tokens, cost_usd=round(state.session.spent.cost_usd, 6),
        note=None if best is not None else _failure_note(state),
        flags=list(versions[best].flags) if best is not None else [],
        chip=versions[best].chip if best is not None else None,
        start_rank=_rank_json(state.rank(state.root)))


def _rank_json(rank: Rank | None) -> dict[str, Any] | None:
    return rank.to_json() if rank is not None else None


def _failure_note(state: SearchState) -> str | None:
    """Why nothing correct came out: every version's failure (each template family the
    offline agent tried, each fix) and every agent error, oldest first, once each."""
    versions = state.session.versions
    lines: list[str] = []
    for point in state.session.best_history:
        judged = point.judgement
        if judged.crownable:
            continue
        v = versions.get(point.version)
        what = f"v{point.version} ({v.summary})" if v is not None else f"v{point.version}"
        why = judged.error or ", ".join(judged.flags) or judged.status
        lines.append(f"{what}: {judged.status}: {why}")
    for error in state.session.errors:
        lines.append(str(error.get("message")))
    unique = list(dict.fromkeys(line for line in lines if line))
    return "\n".join(unique) or None


class Search:
    """One search over one task's session. ``await search.run()`` until it ends; a
    front end follows and steers it as a ``sessions.search.link.SearchLink``."""

    def __init__(self, log: SessionLog, state: SearchState, task: Task, brief: TaskBrief,
                 agent: Agent, executor: Judge, eval_options: EvalOptions | None = None,
                 agent_concurrency: int = 4) -> None:
        # agent replies (and human decisions) in flight at once: a big cluster's capacity
        # must not turn into dozens of simultaneous API calls
        self.agent_concurrency = max(1, agent_concurrency)
        self.state = state
        self.task = task
        self.agent = agent
        self.executor = executor  # its capacity paces the planner; the core judges on it
        chip = eval_options.chip if eval_options is not None else None
        self.core = SessionCore(log, state, task, brief, agent, executor, chip=chip or "",
                                options=eval_options)
        self.log = log
        # Every event (the search's, a child's, an error about a broken subscriber)
        # wakes the loop: the planner may have new work.
        self.core.subscribe(lambda _event: self._wake.set())
        self.children = ChildMaker(self.core, state)
        self.person = PersonApproval(on_wait=lambda _pid: self._wake.set())
        self.rules = SearchRules(state, self.person, same_as=self.core.same_program)
        self._tunable_cache: dict[int, bool] = {}
        self._wake = asyncio.Event()

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def create(cls, sessions_dir: Path | str, task: Task, brief: TaskBrief, agent: Agent,
               executor: Judge, config: SearchConfig,
               eval_options: EvalOptions | None = None, meta: dict[str, Any] | None = None,
               backend: Backend | dict[str, Any] | None = None) -> Search:
        """A new session for a new search (its header written by ``create_log``);
        ``meta`` goes into the header's ``search`` field (what the suite command matches
        sessions by when it resumes)."""
        log = create_log(sessions_dir, task=task, backend=backend,
                         agent=getattr(agent, "label", agent.name), eval_options=eval_options,
                         extra={"search": dict(meta or {})})
        search = cls(log, fold_search(log.header, []), task, brief, agent, executor,
                     eval_options)
        if task.starting_source() is None and brief.family is None and agent.name == "offline":
            # The offline agent writes first kernels from per-family templates; a task
            # that names no family (JAXBench, MaxKernel) gets one candidate per family.
            config = replace(config, root_candidates=max(config.root_candidates,
                                                         ROOT_FAMILY_CANDIDATES))
        root = search.core.seed()
        if config.approval == "auto":
            search._emit(ev.ModeChange(type="mode.change", mode="auto", by="search"))
        search._emit(ev.SearchStart(type="search.start", config=config.to_json(), root=root,
                                    executor=executor.name, agent=agent.name))
        return search

    @classmethod
    def open(cls, path: Path | str, task: Task, brief: TaskBrief, agent: Agent,
             executor: Judge, config: SearchConfig | None = None,
             eval_options: EvalOptions | None = None, reopen: bool = False,
             budget: Budget | None = None) -> Search:
        """Reopen an interrupted search; ``config`` (when given) replaces the recorded
        one from now on, or ``budget`` the recorded one's budget (a bigger one, say).
        ``reopen`` continues a search that had ended (on a budget that is now raised)."""
        log, loaded = reopen_log(path)
        state = fold_search(loaded.header, loaded.events)
        if config is None and budget is not None and state.config is not None:
            config = replace(state.config, budget=budget)
        if eval_options is None:
            eval_options = recorded_options(loaded.header)
        search = cls(log, state, task, brief, agent, executor, eval_options)
        if state.ended is None or reopen:
            if state.config is None:
                raise ValueError(f"{path}: not a search session (no search.start event)")
            new = config or state.config
            search._emit(ev.SearchResume(type="search.resume", config=new.to_json(),
                                         executor=executor.name))
            # Settle the runs a crash left open (they are evaluated again from here).
            search.core.settle_open_runs()
        return search

    # -- observing and commands ---------------------------------------------------------

    @property
    def path(self) -> Path:
        return self.log.path

    def subscribe(self, callback: ev.Subscriber) -> Callable[[], None]:
        """Every event the search writes; a subscriber that raises is removed and an
        ``error`` event (``where: subscriber``) records it."""
        return self.core.subscribe(callback)

    def _emit(self, event: ev.Event) -> ev.Event:
        return self.core.emit(event)

    def approve(self, proposal: str) -> None:
        self.person.resolve(proposal, Decision("approve", "user"))

    def reject(self, proposal: str, note: str | None = None) -> None:
        self.person.resolve(proposal, Decision("reject", "user", note))

    def awaiting(self) -> list[str]:
        """Proposals waiting for the person (human-in-the-loop search)."""
        return self.person.awaiting()

    def prune(self, version: int, reason: str = "pruned by the user", by: str = "user") -> None:
        if version not in self.state.nodes:
            raise ValueError(f"v{version} is not a node of this search")
        branch = [version]
        for number in sorted(self.state.nodes):  # parents come before their children
            if self.state.nodes[number].parent in branch:
                branch.append(number)
        for number in branch:
            if not self.state.nodes[number].pruned:
                why = reason if number == version else f"branch v{version} pruned"
                self._emit(ev.SearchPrune(type="search.prune", version=number, by=by,
                                          reason=why))
        for pid in self.person.awaiting():  # its pending children go with it
            prop = self.state.session.proposals.get(pid)
            if prop and prop.base_version in branch:
                self.person.withdraw(pid, f"branch v{version} pruned")

    # -- the loop -----------------------------------------------------------------------

    def _live_wall(self) -> float:
        segments = self.state.segments
        return max(0.0, self.log.now() - segments[-1][1]) if segments else 0.0

    async def run(self) -> SearchSummary:
        """Work until the planner has nothing left; then record ``search.end``."""
        if self.state.ended is not None:
            return self.summary()
        inflight: dict[str, asyncio.Task[None]] = {}
        capacity = max(1, int(self.executor.capacity))
        try:
            while True:
                actions = plan(self.state, set(inflight), self._live_wall(), self._tunables())
                # A profile takes a worker as an evaluation does.
                evaluating = sum(1 for k in inflight if k.startswith(("evaluate:", "profile:")))
                asking = len(inflight) - evaluating
                for action in actions:
                    if action.kind in ("evaluate", "profile"):
                        if evaluating >= capacity:
                            continue
                        evaluating += 1
                    elif action.kind in ("expand", "decide", "apply"):
                        if asking >= min(capacity, self.agent_concurrency):
                            continue
                        asking += 1
                    inflight[action.key] = asyncio.ensure_future(self._perform(action))
                if not inflight:
                    break
                self._wake.clear()
                waiter = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait([*inflight.values(), waiter],
                                   return_when=asyncio.FIRST_COMPLETED,
                                   timeout=self._wall_left())
                waiter.cancel()
                for key, job in list(inflight.items()):
                    if job.done():
                        del inflight[key]
                        job.result()  # a bug in the driver surfaces here
                if self._wall_left() == 0.0:
                    await self._cancel(inflight)
                    break
        except BaseException:
            await self._cancel(inflight)
            raise
        reason = finish_reason(self.state, self._live_wall())
        self._close_rounds()
        best = self.state.best()
        self._emit(ev.SearchEnd(type="search.end", reason=reason, best_version=best,
                                best_rank=_rank_json(self.state.rank(best)),
                                evaluations=self.state.evaluations()))
        self.core.end(f"search: {reason}")
        return self.summary()

    def _close_rounds(self) -> None:
        """A round a budget cut short still gets its beam (marked partial), so the
        recorded tree ends with the beam the search finished on."""
        for lineage, rounds in self.state.rounds.items():
            rnd = rounds[-1].round + 1
            measured = [n for n in self.state.nodes.values() if n.lineage == lineage
                        and n.round == rnd and not self.state.pending_eval(n.version)]
            if measured:
                info = select_beam(self.state, lineage, rnd)
                self._emit(ev.SearchRound(type="search.round", **info.event_fields(),
                                          partial=True))

    def _wall_left(self) -> float | None:
        cfg = self.state.config
        if cfg is None or cfg.budget.wall_s is None:
            return None
        return max(0.0, cfg.budget.wall_s - self.state.wall_spent(self._live_wall()))

    async def _cancel(self, inflight: dict[str, asyncio.Task[None]]) -> None:
        for job in inflight.values():
            job.cancel()
        for job in inflight.values():
            with contextlib.suppress(BaseException):
                await job
        inflight.clear()

    def summary(self) -> SearchSummary:
        return summarize(self.state, self.log.path, self.task.name)

    def close(self) -> None:
        self.core.close()

    def _tunables(self) -> dict[int, bool]:
        for number in self.state.nodes:
            if number not in self._tunable_cache:
                try:
                    self._tunable_cache[number] = bool(tunables.read(self._source(number)))
                except Exception:  # a kernel that does not parse has nothing to tune
                    self._tunable_cache[number] = False
        return self._tunable_cache

    def _source(self, version: int) -> str:
        return self.core.source_of(version)

    async def _perform(self, action: act.SearchAction) -> None:
        if isinstance(action, act.Evaluate):
            await self._evaluate(action.version)
        elif isinstance(action, act.ProfileNode):
            await self._profile(action.version)
        elif isinstance(action, act.Select):
            info = select_beam(self.state, action.lineage, action.round)
            self._emit(ev.SearchRound(type="search.round", **info.event_fields()))
        elif isinstance(action, act.Expand):
            pid = await self.children.expand(action)
            if pid is not None:
                await self._decide_and_apply(pid)
        elif isinstance(action, act.Decide | act.ApplyProposal):
            await self._decide_and_apply(action.proposal)

    # -- evaluating, profiling, deciding ---------------------------------------------

    async def _evaluate(self, number: int) -> None:
        result = await self.core.evaluate(number, "search", where="executor")
        if isinstance(result, JudgeFailed):  # the executor failed: take it out of play
            self._emit(ev.SearchPrune(type="search.prune", version=number,
                                      reason=f"executor error: {result.message}", by="auto"))
        elif result.correct:
            # Its own static analysis, so its children's requests carry its diagnosis.
            await self.core.analyze(number, "search")

    async def _profile(self, number: int) -> None:
        """Profile a version the planner found due (``plan.profile_due``) and record the
        diagnosis its lineage's next request carries, as autonomous mode does."""
        await self.core.profile(number, "search")

    async def _decide_and_apply(self, pid: str) -> None:
        s = self.state.session
        if s.proposals[pid].decision is None:
            verdict = await self.core.decide(pid, self.rules)
            if not isinstance(verdict, Decision) or verdict.decision != "approve":
                return
        prop = s.proposals[pid]
        if not prop.approved or prop.applied_version is not None:
            return
        self.core.apply(pid, self.state.proposal_slots[pid][2])
