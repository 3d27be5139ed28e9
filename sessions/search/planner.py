"""The search planner: a pure function from the folded search state to the next steps.

``plan(state, inflight)`` lists every action that may start now (evaluate a node,
profile a new best, decide or apply a proposal left half-way, expand a slot, select a
round's beam);
``select_beam`` picks a round's beam; ``budget_reason`` and ``finish_reason`` say why a
search stops. Nothing here has side effects: the driver (``sessions.search``) performs
the actions and folds the events they append, so a resumed search and a live one take
the same decisions from the same events.
"""

from __future__ import annotations

from tilewright.kernels.judge.rank import best_of, ranked_order
from tilewright.sessions.actions import (
    ApplyProposal,
    Decide,
    Evaluate,
    Expand,
    ProfileNode,
    SearchAction,
    Select,
    SlotKey,
)
from tilewright.sessions.search.graph import RoundInfo, SearchState


def budget_reason(s: SearchState, live_wall: float = 0.0, inflight_nodes: int = 0,
                  ) -> str | None:
    """The budget that is used up, if any (``budget:nodes`` counts proposals in flight)."""
    if s.config is None:
        return None
    b = s.config.budget
    if b.nodes is not None and s.created() + inflight_nodes >= b.nodes:
        return "budget:nodes"
    if b.tokens is not None and s.session.spent.tokens >= b.tokens:
        return "budget:tokens"
    if b.cost_usd is not None and s.session.spent.cost_usd >= b.cost_usd:
        return "budget:cost"
    if b.wall_s is not None and s.wall_spent(live_wall) >= b.wall_s:
        return "budget:wall"
    if task_failed(s):
        return "task_error"
    return None


def task_failed(s: SearchState) -> bool:
    """The latest evaluation failed because of the task itself (``error_kind`` "task":
    its reference or inputs, or its size under the worker's limits): every other
    candidate would fail the same way, so the search stops and says so."""
    latest = max((r for r in s.session.runs.values() if r.kind == "eval" and r.status),
                 key=lambda r: r.seq, default=None)
    version = s.session.versions.get(latest.version) if latest is not None else None
    return version is not None and version.run == latest.id and version.error_kind == "task"


def lineage_done(s: SearchState, lineage: int) -> str | None:
    """Why a lineage expands no further, or None while it still has work."""
    cfg = s.config
    assert cfg is not None
    rounds = s.rounds.get(lineage, [])
    if not rounds:
        return None
    last = rounds[-1]
    if last.round >= cfg.max_rounds:
        return "max_rounds"
    if not last.beam and not last.repair:
        return "no_correct_kernel" if not any(r.beam for r in rounds) else "beam_empty"
    repairs = 0
    for info in reversed(rounds):
        if info.beam:
            break
        repairs += 1
    if repairs > cfg.fix_rounds:
        return "no_correct_kernel"
    stale = 0
    for before, after in zip(reversed(rounds[:-1]), reversed(rounds), strict=False):
        if after.best_rank is not None and after.best_rank.ranked \
                and after.best_rank.better_than(before.best_rank):  # by Rank.key
            break
        stale += 1
    if stale >= cfg.patience:
        return "no_improvement"
    return None


def select_beam(s: SearchState, lineage: int, rnd: int) -> RoundInfo:
    """The next beam: the best correct unpruned nodes among this round's children and
    the previous beam; with none, the round's failed children to repair."""
    cfg = s.config
    assert cfg is not None
    width = cfg.width()
    prev = s.rounds.get(lineage, [])
    if rnd == 0:
        pool = list(s.roots)
        failed = pool
    else:
        children = [n.version for n in s.nodes.values()
                    if n.lineage == lineage and n.round == rnd and n.proposer != "root"]
        pool = children + (prev[-1].beam if prev else [])
        failed = children
    pool = [v for v in dict.fromkeys(pool) if v is not None and not s.nodes[v].pruned]
    # Best first by the judge's one rule (``best_of``: the earlier version on ties, the
    # least VMEM among estimates within a percent), so the beam holds the round's best.
    correct = ranked_order(sorted(v for v in pool if s.is_correct(v)), s.rank)
    beam = correct[:width]
    repair: list[int] = []
    if not beam:
        broken = [v for v in failed if v is not None and not s.nodes[v].pruned
                  and not s.is_correct(v)]
        repair = broken[:width]
    everything = [v for v in s.search_versions() if s.nodes[v].lineage == lineage
                  or v in s.roots]
    ok = [v for v in everything if s.is_correct(v) and not s.nodes[v].pruned]
    best = _top(s, ok)
    return RoundInfo(lineage=lineage, round=rnd, beam=beam, repair=repair, best_version=best,
                     best_rank=s.rank(best))


def _top(s: SearchState, versions: list[int]) -> int | None:
    """The version ``best_of`` crowns (the earliest on ties, the least VMEM among
    estimates within a percent)."""
    return best_of(sorted(versions), s.rank)


def _lineage_versions(s: SearchState, lineage: int) -> list[int]:
    """A lineage's nodes; the round-0 kernels belong to every lineage."""
    return [v for v in s.search_versions() if s.nodes[v].lineage == lineage or v in s.roots]


def profile_due(s: SearchState, number: int) -> bool:
    """Whether the search profiles ``number`` before its lineage asks the agent again,
    the way autonomous mode does (``sessions.autonomy.should_profile``): a correct
    version never profiled (a failed profile counts: it is not retried) that is its
    lineage's best, or the latest correct evaluation after ``profile_every`` evaluations
    without a profile. A node of the last round has no children to inform."""
    cfg = s.config
    node = s.nodes.get(number)
    if cfg is None or node is None or node.pruned or not s.is_correct(number):
        return False
    if node.round >= cfg.max_rounds and number not in s.roots:
        return False
    runs = list(s.session.runs.values())
    if any(r.kind == "profile" and r.version == number for r in runs):
        return False
    if cfg.profile_best:
        lineages = range(cfg.lineages()) if number in s.roots else [node.lineage]
        for lineage in lineages:
            ok = [v for v in _lineage_versions(s, lineage) if s.is_correct(v)
                  and not s.nodes[v].pruned]
            if _top(s, ok) == number:
                return True
    every = cfg.profile_every
    if not every or every <= 0:
        return False
    evals, latest = 0, None
    for run in reversed(runs):
        if run.kind == "profile":
            break
        if run.kind == "eval" and run.status not in (None, "error") and not run.cancelled:
            evals += 1
            if latest is None and s.is_correct(run.version):
                latest = run.version
    return evals >= every and latest == number


def _slot_closed(s: SearchState, key: SlotKey) -> bool:
    info = s.slots.get(key)
    if info is None:
        return False
    return info.version is not None or info.failures >= (s.config.max_attempts
                                                         if s.config else 2)


def _slot_open_proposal(s: SearchState, key: SlotKey) -> str | None:
    """A proposal of this slot still between proposal and version (undecided, or
    approved but never applied)."""
    info = s.slots.get(key)
    if info is None:
        return None
    for pid in info.proposals:
        prop = s.session.proposals.get(pid)
        if prop is None or prop.kind == "plan":
            continue
        if prop.decision is None or (prop.approved and prop.applied_version is None):
            return pid
    return None


def plan(s: SearchState, inflight: frozenset[str] | set[str] = frozenset(),
         live_wall: float = 0.0, has_tunables: dict[int, bool] | None = None,
         ) -> list[SearchAction]:
    """Every action that may start now, given what is already in flight.

    An empty list with nothing in flight means the search is over; the driver then
    asks ``finish_reason``. ``has_tunables[v]`` says whether version v's source declares
    TUNABLES (the driver reads sources; the planner stays pure).
    """
    cfg = s.config
    if cfg is None or s.ended:
        return []
    tunables = has_tunables or {}
    actions: list[SearchAction] = []
    expanding = sum(1 for k in inflight if k.startswith("expand:"))
    stop = budget_reason(s, live_wall, expanding)
    if stop == "budget:wall":
        return []
    # Evaluate every search node that has no result yet (interrupted runs included).
    for number in s.search_versions():
        node = s.nodes[number]
        if node.pruned or not s.pending_eval(number):
            continue
        if s.session.authorized(number):
            actions.append(Evaluate(number))
    # Profiles due (each new best of a lineage, every ``profile_every`` evaluations):
    # that lineage asks the agent again only once the diagnosis is recorded.
    due = [v for v in s.search_versions() if profile_due(s, v)]
    if stop is None:
        actions.extend(ProfileNode(v) for v in due)
    profiling = set(due) | {int(k.split(":")[1]) for k in inflight if k.startswith("profile:")}
    # Proposals left half-way (an interruption between proposal and version).
    for key in list(s.slots):
        pid = _slot_open_proposal(s, key)
        if pid is None or f"expand:{key}" in inflight:  # its expansion is finishing it
            continue
        prop = s.session.proposals[pid]
        if prop.decision is None:
            actions.append(Decide(pid, key))
        else:
            actions.append(ApplyProposal(pid, key))
    # Round 0: the task's kernel, or first kernels the agent writes, one after the other.
    writing = False
    if s.initial_root() is None and not s.rounds:
        for slot in range(cfg.root_candidates):
            key: SlotKey = (0, 0, None, slot)
            if _slot_closed(s, key):
                continue
            writing = True
            busy = _slot_open_proposal(s, key) is not None or f"expand:{key}" in inflight
            if not busy and stop is None:
                actions.append(Expand(key, role="implement"))
            break
        if writing and stop is not None and not any(k.startswith("expand:") for k in inflight):
            writing = False  # out of budget: what was written is round 0
    roots_done = not writing and bool(s.roots) and not any(
        s.pending_eval(v) and not s.nodes[v].pruned for v in s.roots)
    for lineage in range(cfg.lineages()):
        rounds = s.rounds.get(lineage, [])
        if not rounds:
            if roots_done:
                actions.append(Select(lineage, 0))
            continue
        if lineage_done(s, lineage):
            continue
        last = rounds[-1]
        rnd = last.round + 1
        if profiling and any(v in profiling for v in _lineage_versions(s, lineage)):
            continue  # its next request waits for the diagnosis
        parents = last.beam or last.repair
        role = "tune" if last.beam else "fix"
        complete = True
        for parent in parents:
            if s.nodes[parent].pruned:
                continue
            for slot in range(cfg.branching):
                key = (lineage, rnd, parent, slot)
                if _slot_closed(s, key):
                    continue
                complete = False
                busy = (_slot_open_proposal(s, key) is not None
                        or f"expand:{key}" in inflight)
                if not busy and stop is None:
                    tuning = (role == "tune" and tunables.get(parent, False)
                              and slot >= cfg.branching - cfg.tuning_children)
                    actions.append(Expand(key, role=role,
                                          proposer="tuning" if tuning else "agent"))
                    expanding += 1
                    stop = budget_reason(s, live_wall, expanding)
                break  # siblings one after the other: each knows the ones before it
        children = [n.version for n in s.nodes.values()
                    if n.lineage == lineage and n.round == rnd and n.proposer != "root"]
        waiting = any(s.pending_eval(v) and not s.nodes[v].pruned for v in children)
        if complete and not waiting:
            actions.append(Select(lineage, rnd))
    return _fresh(actions, inflight)


def _fresh(actions: list[SearchAction], inflight: frozenset[str] | set[str],
           ) -> list[SearchAction]:
    return [a for a in actions if a.key not in inflight]


def finish_reason(s: SearchState, live_wall: float = 0.0) -> str:
    """Why a search with nothing left to do ended."""
    stop = budget_reason(s, live_wall)
    if stop:
        return stop
    cfg = s.config
    if s.root is None:
        return "no_starting_kernel"
    reasons = {lineage_done(s, i) for i in range(cfg.lineages())} if cfg else set()
    reasons.discard(None)
    reasons.discard("max_rounds")  # every round it was allowed: the search is complete
    return ",".join(sorted(r for r in reasons if r)) or "complete"
