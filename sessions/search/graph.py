"""The search graph: a fold over a session's events, and the planner that reads it.

There is no second store. The version tree is ``sessions.state``'s fold of
``kernel.version`` / ``run.result`` events; the search adds a few event types of its
own (``search.start``, ``search.resume``, ``search.round``, ``search.prune``,
``search.end``, see docs/INTERFACES.md) and a few fields on ``agent.proposal``
(``lineage``, ``round``, ``slot``, ``strategy``, ``proposer``) and ``error`` (the slot
an agent failed to fill). ``SearchState.apply`` folds one event; the planner
(``sessions.search.planner``) reads the state it folds.

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

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tilewright.kernels.judge.rank import Rank, best_of
from tilewright.sessions import events as ev
from tilewright.sessions.actions import SlotKey
from tilewright.sessions.state import SessionState


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
    # Profiles, as in autonomous mode ([controller] profile_best / profile_every): each
    # new best of a lineage, and the latest correct version after this many evaluations
    # without a profile (None or 0: never on a count).
    profile_best: bool = True
    profile_every: int | None = 5

    def lineages(self) -> int:
        return self.runs if self.mode == "runs" else 1

    def width(self) -> int:
        return 1 if self.mode == "runs" else self.beam_width

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SearchConfig:
        data = dict(data)
        # A search recorded before searches profiled resumes without profiling.
        data.setdefault("profile_best", False)
        data.setdefault("profile_every", None)
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
    best_rank: Rank | None  # the lineage's best's rank when the round was selected

    def event_fields(self) -> dict[str, Any]:
        """The ``search.round`` fields (the rank as JSON)."""
        return {"lineage": self.lineage, "round": self.round, "beam": list(self.beam),
                "repair": list(self.repair), "best_version": self.best_version,
                "best_rank": self.best_rank.to_json() if self.best_rank else None}


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

    def apply(self, event: ev.Event) -> None:
        self.session.apply(event)
        kind = event["type"]
        t = float(event.get("t", 0.0) or 0.0)
        if kind in ("search.start", "search.resume"):
            self.segments.append((t, t))  # a new active span opens
        elif self.segments:
            start, _ = self.segments[-1]
            self.segments[-1] = (start, t)
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, event)

    # -- derived ------------------------------------------------------------------------

    def rank(self, version: int | None) -> Rank | None:
        """What ranks a version (``kernels.judge.rank.Rank``): None when it is not crownable
        (incorrect, flagged, not evaluated) or has no rank."""
        v = self.session.versions.get(version) if version is not None else None
        return v.rank if v is not None and v.crownable else None

    def is_correct(self, version: int) -> bool:
        """Correct and not disqualified by an integrity flag: only such nodes enter the
        beam or become "best" (a flagged one is repaired like a failed one)."""
        v = self.session.versions.get(version)
        return bool(v and v.crownable)

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
        """The unpruned crownable node ranked highest (``best_of``: earliest on ties,
        the least VMEM among estimates within a percent)."""
        return best_of((n for n in self.search_versions()
                        if self.is_correct(n) and not self.nodes[n].pruned), self.rank)

    def evaluations(self) -> int:
        return sum(1 for r in self.session.runs.values()
                   if r.kind == "eval" and r.status not in (None, "error") and not r.cancelled)

    def children(self, parent: int | None, lineage: int | None = None) -> list[int]:
        return [n.version for n in self.nodes.values() if n.parent == parent
                and n.proposer != "root" and (lineage is None or n.lineage == lineage)]

    def pending_eval(self, version: int) -> bool:
        """Not yet evaluated: no finished, uncancelled eval run (a run.start without a
        run.result, left by an interruption, counts as not evaluated)."""
        v = self.session.versions.get(version)
        return v is not None and v.status is None


# -- handlers, one per event type the search adds to the session fold -----------------


def _search_start(s: SearchState, e: ev.SearchStart) -> None:
    _configure(s, e.get("config"))
    s.root = e.get("root")
    s.started_seq = e.get("seq")


def _search_resume(s: SearchState, e: ev.SearchResume) -> None:
    _configure(s, e.get("config"))


def _configure(s: SearchState, config: dict[str, Any] | None) -> None:
    s.config = SearchConfig.from_json(config or {})
    s.ended = None


def _proposal(s: SearchState, e: ev.AgentProposal) -> None:
    if "slot" not in e:  # a proposal the search did not ask for (no slot in the tree)
        return
    pid = str(e["proposal"])
    s.strategies[pid] = e.get("strategy")
    s.proposers[pid] = e.get("proposer", "agent")
    key = _slot_key(e)
    s.proposal_slots[pid] = key
    s.slots.setdefault(key, SlotInfo()).proposals.append(pid)


def _decision(s: SearchState, e: ev.UserDecision) -> None:
    key = s.proposal_slots.get(str(e.get("proposal")))
    if key is not None and e.get("decision") == "reject":
        s.slots[key].failures += 1


def _error(s: SearchState, e: ev.Error) -> None:
    if "slot" in e:  # the agent failed to fill a slot
        s.slots.setdefault(_slot_key(e), SlotInfo()).failures += 1


def _version(s: SearchState, e: ev.KernelVersion) -> None:
    number = int(e["version"])
    pid = e.get("proposal")
    key = s.proposal_slots.get(str(pid)) if pid else None
    if key is not None:
        lineage, rnd, parent, slot = key
        s.nodes[number] = NodeInfo(
            version=number, lineage=lineage, round=rnd, parent=parent, slot=slot,
            strategy=s.strategies.get(str(pid)), proposer=s.proposers.get(str(pid), "agent"))
        s.slots[key].version = number
        if parent is None:
            s.roots.append(number)
            s.root = s.root if s.root is not None else number
    elif s.root is None and number == _first_version(s.session):
        s.root = number
        s.roots.append(number)
    if number == s.root and number not in s.nodes:
        s.nodes[number] = NodeInfo(version=number, lineage=0, round=0, parent=None,
                                   slot=0, strategy="starting kernel", proposer="root")


def _round(s: SearchState, e: ev.SearchRound) -> None:
    best = e.get("best_version")
    # A log written before ranks were recorded has only ``best_speedup``: the best
    # version's rank as the fold has it at this point stands in for it.
    rank = Rank.from_json(e.get("best_rank")) if "best_rank" in e else s.rank(best)
    info = RoundInfo(lineage=int(e["lineage"]), round=int(e["round"]),
                     beam=list(e.get("beam") or []), repair=list(e.get("repair") or []),
                     best_version=best, best_rank=rank)
    s.rounds.setdefault(info.lineage, []).append(info)


def _prune(s: SearchState, e: ev.SearchPrune) -> None:
    node = s.nodes.get(int(e.get("version", -1)))
    if node is not None:
        node.pruned = e.get("reason") or "pruned"


def _search_end(s: SearchState, e: ev.SearchEnd) -> None:
    s.ended = e.get("reason") or "end"


# Events come off disk as plain dicts; each handler is filed under the kinds its
# annotation reads (``ev.by_kind``). Kinds not here change only the session fold.
_HANDLERS: dict[str, Callable[[SearchState, Any], None]] = ev.by_kind(
    _search_start, _search_resume, _proposal, _decision, _error, _version, _round, _prune,
    _search_end)


def _slot_key(event: ev.AgentProposal | ev.Error) -> SlotKey:
    # A proposal names its parent as the version it builds on; a failed slot as parent.
    parent = event.get("base_version") if event["type"] == "agent.proposal" \
        else event.get("parent")
    return (int(event.get("lineage", 0)), int(event.get("round", 0)),
            None if parent is None else int(parent), int(event.get("slot", 0)))


def _first_version(session: SessionState) -> int | None:
    return min(session.versions) if session.versions else None


def fold_search(header: dict[str, Any], events: list[ev.Event]) -> SearchState:
    state = SearchState(session=SessionState(header=header))
    for event in events:
        state.apply(event)
    return state
