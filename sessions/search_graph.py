"""The search graph: a fold over a session's events, and the planner that reads it.

There is no second store. The version tree is ``sessions.state``'s fold of
``kernel.version`` / ``run.result`` events; the search adds a few event types of its
own (``search.start``, ``search.resume``, ``search.round``, ``search.prune``,
``search.end``, see docs/INTERFACES.md) and a few fields on ``agent.proposal``
(``lineage``, ``round``, ``slot``, ``strategy``, ``proposer``) and ``error`` (the slot
an agent failed to fill). ``SearchState.apply`` folds one event; ``plan`` is a pure
function from that state to the next actions, so a resumed search and a live one take
the same decisions from the same events.

Shape of the search. A *lineage* is one beam: in ``beam`` mode there is one lineage of
width ``beam_width``; in ``runs`` mode there are ``runs`` independent lineages of width
one (parallel greedy chains). Round 0 is the root (the task's kernel, or the agent's
first one). Round r+1 gives each beam node ``branching`` children (slots), proposed
one after the other so each child can be asked for a strategy its siblings have not
tried; the last ``tuning_children`` slots of a kernel that declares TUNABLES are tuning
steps made by the search itself. When every child of a round has a result, the next
beam is the best *correct* nodes among the children and the previous beam; a round
that leaves no correct node repairs the failed children instead (role ``fix``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from sessions.state import SessionState

SlotKey = tuple[int, int, int | None, int]  # lineage, round, parent version, slot


@dataclass
class Budget:
    nodes: int | None = None  # kernel versions the search may create
    tokens: int | None = None
    cost_usd: float | None = None
    wall_s: float | None = None


@dataclass
class SearchConfig:
    mode: Literal["beam", "runs"] = "beam"
    beam_width: int = 2
    branching: int = 2
    runs: int = 2  # lineages in runs mode
    max_rounds: int = 3
    patience: int = 2  # rounds without a better best before a lineage stops
    tuning_children: int = 1  # trailing slots filled by the search's own tuning steps
    max_attempts: int = 2  # proposals per slot before it is given up
    fix_rounds: int = 2  # consecutive repair rounds before a lineage gives up
    root_candidates: int = 1  # first kernels to write when the task brings none
    approval: Literal["auto", "user"] = "auto"
    budget: Budget = field(default_factory=Budget)

    def lineages(self) -> int:
        return self.runs if self.mode == "runs" else 1

    def width(self) -> int:
        return 1 if self.mode == "runs" else self.beam_width

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchConfig:
        data = dict(data)
        budget = Budget(**(data.pop("budget", None) or {}))
        known = set(cls.__dataclass_fields__)
        return cls(budget=budget, **{k: v for k, v in data.items() if k in known})


@dataclass
class NodeInfo:
    """Search facts about one version (the rest is in ``SessionState.versions``)."""

    version: int
    lineage: int
    round: int
    parent: int | None
    slot: int
    strategy: str | None
    proposer: str  # agent | tuning | root
    pruned: str | None = None  # reason, when pruned


@dataclass
class RoundInfo:
    lineage: int
    round: int
    beam: list[int]
    repair: list[int]
    best_version: int | None
    best_speedup: float | None


@dataclass
class SlotInfo:
    proposals: list[str] = field(default_factory=list)
    failures: int = 0  # agent failures and rejected proposals
    version: int | None = None


@dataclass
class SearchState:
    """The session fold plus what the search recorded on top of it."""

    session: SessionState
    config: SearchConfig | None = None
    root: int | None = None  # the first root; ``roots`` has every round-0 kernel
    roots: list[int] = field(default_factory=list)
    nodes: dict[int, NodeInfo] = field(default_factory=dict)
    rounds: dict[int, list[RoundInfo]] = field(default_factory=dict)  # per lineage
    slots: dict[SlotKey, SlotInfo] = field(default_factory=dict)
    proposal_slots: dict[str, SlotKey] = field(default_factory=dict)
    segments: list[tuple[float, float]] = field(default_factory=list)  # active spans (t)
    strategies: dict[str, str | None] = field(default_factory=dict)  # per proposal id
    proposers: dict[str, str] = field(default_factory=dict)  # agent | tuning
    ended: str | None = None
    started_seq: int | None = None

    # -- folding ------------------------------------------------------------------------

    def apply(self, event: dict[str, Any]) -> None:
        self.session.apply(event)
        kind = event.get("type", "")
        t = float(event.get("t", 0.0) or 0.0)
        if self.segments and kind not in ("search.start", "search.resume"):
            start, _ = self.segments[-1]
            self.segments[-1] = (start, t)
        if kind in ("search.start", "search.resume"):
            self.config = SearchConfig.from_json(event.get("config") or {})
            self.segments.append((t, t))
            self.ended = None
            if kind == "search.start":
                self.root = event.get("root")
                self.started_seq = event.get("seq")
        elif kind == "agent.proposal" and "slot" in event:
            self.strategies[str(event["proposal"])] = event.get("strategy")
            self.proposers[str(event["proposal"])] = event.get("proposer", "agent")
            key = _slot_key(event)
            self.proposal_slots[str(event["proposal"])] = key
            self.slots.setdefault(key, SlotInfo()).proposals.append(str(event["proposal"]))
        elif kind == "user.decision":
            key = self.proposal_slots.get(str(event.get("proposal")))
            if key is not None and event.get("decision") == "reject":
                self.slots[key].failures += 1
        elif kind == "error" and "slot" in event:
            self.slots.setdefault(_slot_key(event), SlotInfo()).failures += 1
        elif kind == "kernel.version":
            self._version(event)
        elif kind == "search.round":
            info = RoundInfo(lineage=int(event["lineage"]), round=int(event["round"]),
                             beam=list(event.get("beam") or []),
                             repair=list(event.get("repair") or []),
                             best_version=event.get("best_version"),
                             best_speedup=event.get("best_speedup"))
            self.rounds.setdefault(info.lineage, []).append(info)
        elif kind == "search.prune":
            node = self.nodes.get(int(event.get("version", -1)))
            if node is not None:
                node.pruned = event.get("reason") or "pruned"
        elif kind == "search.end":
            self.ended = event.get("reason") or "end"

    def _version(self, event: dict[str, Any]) -> None:
        number = int(event["version"])
        pid = event.get("proposal")
        key = self.proposal_slots.get(str(pid)) if pid else None
        if key is not None:
            lineage, rnd, parent, slot = key
            self.nodes[number] = NodeInfo(
                version=number, lineage=lineage, round=rnd, parent=parent, slot=slot,
                strategy=self.strategies.get(str(pid)),
                proposer=self.proposers.get(str(pid), "agent"))
            self.slots[key].version = number
            if parent is None:
                self.roots.append(number)
                self.root = self.root if self.root is not None else number
        elif self.root is None and number == _first_version(self.session):
            self.root = number
            self.roots.append(number)
        if number == self.root and number not in self.nodes:
            self.nodes[number] = NodeInfo(version=number, lineage=0, round=0, parent=None,
                                          slot=0, strategy="starting kernel", proposer="root")

    # -- derived ------------------------------------------------------------------------

    def node_status(self, version: int) -> str | None:
        v = self.session.versions.get(version)
        return v.status if v else None

    def speedup(self, version: int) -> float:
        v = self.session.versions.get(version)
        return float(v.speedup or 0.0) if v and v.correct else -1.0

    def is_correct(self, version: int) -> bool:
        v = self.session.versions.get(version)
        return bool(v and v.correct)

    def search_versions(self) -> list[int]:
        return sorted(self.nodes)

    def created(self) -> int:
        """Versions the search made (the task's own starting kernel is not one)."""
        return sum(1 for n in self.nodes.values()
                   if n.proposer != "root" or self.session.versions[n.version].origin != "initial")

    def initial_root(self) -> int | None:
        """The task's own starting kernel, when it brought one."""
        if self.root is not None and self.session.versions[self.root].origin == "initial":
            return self.root
        return None

    def wall_spent(self, live_extra: float = 0.0) -> float:
        return sum(end - start for start, end in self.segments) + live_extra

    def best(self) -> int | None:
        best: int | None = None
        for number in self.search_versions():
            if not self.is_correct(number) or self.nodes[number].pruned:
                continue
            if best is None or self.speedup(number) > self.speedup(best):
                best = number
        return best

    def evaluations(self) -> int:
        return sum(1 for r in self.session.runs.values()
                   if r.kind == "eval" and r.status is not None and not r.cancelled)

    def children(self, parent: int | None, lineage: int | None = None) -> list[int]:
        return [n.version for n in self.nodes.values() if n.parent == parent
                and n.proposer != "root" and (lineage is None or n.lineage == lineage)]

    def pending_eval(self, version: int) -> bool:
        """Not yet evaluated: no finished, uncancelled eval run (a run.start without a
        run.result, left by an interruption, counts as not evaluated)."""
        v = self.session.versions.get(version)
        return v is not None and v.status is None


def _slot_key(event: dict[str, Any]) -> SlotKey:
    parent = event.get("base_version") if "base_version" in event else event.get("parent")
    return (int(event.get("lineage", 0)), int(event.get("round", 0)),
            None if parent is None else int(parent), int(event.get("slot", 0)))


def _first_version(session: SessionState) -> int | None:
    return min(session.versions) if session.versions else None


def fold_search(header: dict[str, Any], events: list[dict[str, Any]]) -> SearchState:
    state = SearchState(session=SessionState(header=header))
    for event in events:
        state.apply(event)
    return state


# -- the planner ----------------------------------------------------------------------

@dataclass(frozen=True)
class Action:
    """One step the driver may take now. ``key`` identifies it among those in flight."""

    kind: Literal["evaluate", "decide", "apply", "expand", "select", "finish"]
    key: str
    version: int | None = None
    proposal: str | None = None
    slot: SlotKey | None = None
    role: str = "tune"  # expand: implement (root), tune (improve), fix (repair)
    proposer: str = "agent"  # expand: agent | tuning
    reason: str | None = None  # finish


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
    return None


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
        if (after.best_speedup or 0.0) > (before.best_speedup or 0.0):
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
    correct = sorted((v for v in pool if s.is_correct(v)),
                     key=lambda v: (-s.speedup(v), v))
    beam = correct[:width]
    repair: list[int] = []
    if not beam:
        broken = [v for v in failed if v is not None and not s.nodes[v].pruned
                  and not s.is_correct(v)]
        repair = broken[:width]
    everything = [v for v in s.search_versions() if s.nodes[v].lineage == lineage
                  or v in s.roots]
    ok = [v for v in everything if s.is_correct(v) and not s.nodes[v].pruned]
    best = max(ok, key=lambda v: (s.speedup(v), -v)) if ok else None
    return RoundInfo(lineage=lineage, round=rnd, beam=beam, repair=repair, best_version=best,
                     best_speedup=s.speedup(best) if best is not None else None)


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
        if prop.decision is None or (prop.decision in ("approve", "edit")
                                     and prop.applied_version is None):
            return pid
    return None


def plan(s: SearchState, inflight: frozenset[str] | set[str] = frozenset(),
         live_wall: float = 0.0, has_tunables: dict[int, bool] | None = None) -> list[Action]:
    """Every action that may start now, given what is already in flight.

    An empty list with nothing in flight means the search is over; the driver then
    asks ``finish_reason``. ``has_tunables[v]`` says whether version v's source declares
    TUNABLES (the driver reads sources; the planner stays pure).
    """
    cfg = s.config
    if cfg is None or s.ended:
        return []
    tunables = has_tunables or {}
    actions: list[Action] = []
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
            actions.append(Action("evaluate", f"evaluate:{number}", version=number))
    # Proposals left half-way (an interruption between proposal and version).
    for key in list(s.slots):
        pid = _slot_open_proposal(s, key)
        if pid is None or f"expand:{key}" in inflight:  # its expansion is finishing it
            continue
        prop = s.session.proposals[pid]
        if prop.decision is None:
            actions.append(Action("decide", f"decide:{pid}", proposal=pid, slot=key))
        else:
            actions.append(Action("apply", f"apply:{pid}", proposal=pid, slot=key))
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
                actions.append(Action("expand", f"expand:{key}", slot=key, role="implement"))
            break
        if writing and stop is not None and not any(k.startswith("expand:") for k in inflight):
            writing = False  # out of budget: what was written is round 0
    roots_done = not writing and bool(s.roots) and not any(
        s.pending_eval(v) and not s.nodes[v].pruned for v in s.roots)
    for lineage in range(cfg.lineages()):
        rounds = s.rounds.get(lineage, [])
        if not rounds:
            if roots_done:
                actions.append(Action("select", f"select:{lineage}:0", slot=(lineage, 0, None, 0)))
            continue
        if lineage_done(s, lineage):
            continue
        last = rounds[-1]
        rnd = last.round + 1
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
                    actions.append(Action("expand", f"expand:{key}", slot=key, role=role,
                                          proposer="tuning" if tuning else "agent"))
                    expanding += 1
                    stop = budget_reason(s, live_wall, expanding)
                break  # siblings one after the other: each knows the ones before it
        children = [n.version for n in s.nodes.values()
                    if n.lineage == lineage and n.round == rnd and n.proposer != "root"]
        waiting = any(s.pending_eval(v) and not s.nodes[v].pruned for v in children)
        if complete and not waiting:
            actions.append(Action("select", f"select:{lineage}:{rnd}",
                                  slot=(lineage, rnd, None, 0)))
    return _fresh(actions, inflight)


def _fresh(actions: list[Action], inflight: frozenset[str] | set[str]) -> list[Action]:
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
    if reasons == {"max_rounds"}:
        return "complete"
    return ",".join(sorted(r for r in reasons if r)) or "complete"
