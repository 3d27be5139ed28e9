"""Session state as a fold over events.

``fold(header, events)`` and ``SessionState.apply(event)`` are the only way state
changes: the live controller folds each event it appends, resume folds what is on
disk, replay folds what was recorded. The same events give the same state, whichever
path produced them. Unknown event types are counted and otherwise ignored, so an
older tilewright can still fold a session that a newer one wrote within the schema.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tilewright.kernels.judge.judgement import Judgement
from tilewright.kernels.judge.rank import (
    ESTIMATE_TIE,
    Rank,
    best_of,
    contends,
    rank_key,
    tie_note,
)
from tilewright.sessions import events as ev
from tilewright.sessions.agent_turn import plan_steps

# ``SessionState.best_tie`` in a few words (a narrow status bar)
TIE_WORDS = f"a tie within {ESTIMATE_TIE:.0%}: less VMEM"


def _judged(name: str, default: Any = None) -> Any:
    """A ``Version`` property: its judgement's ``name`` (``default`` before an evaluation)."""
    return property(lambda self: getattr(self.judgement, name) if self.judgement is not None
                    else default)


@dataclass(frozen=True)
class Milestone:
    """One finished evaluation in ``SessionState.best_history``: the version, what was
    judged, and the session's best (version and rank) right after it."""

    run: str
    version: int
    judgement: Judgement
    best: int | None
    best_rank: Rank | None
    t: float


@dataclass
class Version:
    number: int
    parent: int | None
    origin: str  # initial | template | agent | tuning | user-edit
    proposal: str | None
    source_blob: str
    summary: str
    decision_seq: int | None  # the user.decision that authorised it (None: initial)
    seq: int
    t: float
    # What the latest finished eval run decided (status, rank, flags, compile verdict);
    # None before any evaluation. The properties below read it.
    judgement: Judgement | None = None
    result_blob: str | None = None  # that run's eval JSON
    run: str | None = None  # that run's id
    profile_blob: str | None = None
    diagnosis: dict[str, Any] | None = None  # the latest ``diagnosis`` event's fields
    analysis_blob: str | None = None  # the static analysis of an ``analysis`` run

    # Its latest judgement's fields (before any evaluation: nothing, not correct).
    status = _judged("status")
    correct = _judged("correct", False)
    # Correct and free of the flags that forbid ranking it (compute outside the kernel,
    # nondeterminism, ...): only such a version can be "best".
    crownable = _judged("crownable", False)
    failed = _judged("failed", False)  # needs fixing rather than tuning
    rank = _judged("rank")  # what ranks it: one ordering, one wording
    flags = _judged("flags", ())
    median_ms = _judged("median_ms")
    error_kind = _judged("error_kind")
    chip = _judged("chip")
    tpu_compile = _judged("tpu_compile")
    vmem_bytes = _judged("vmem_bytes")
    vmem_limit_bytes = _judged("vmem_limit_bytes")
    production_shape = _judged("production_shape")


# The decisions that let a proposal become a kernel version: the agent's kernel
# approved, or the person's own source given in its place.
APPROVING = ("approve", "edit")


def approving(decision: str | None) -> bool:
    """Whether a ``user.decision`` word lets its proposal become a version (approve, or
    the person's edit): the one test the fold, the schedulers and replay's audit use."""
    return decision in APPROVING


@dataclass
class ProposalInfo:
    id: str
    kind: str  # plan | kernel | tuning
    summary: str
    rationale: str
    role: str
    base_version: int | None
    source_blob: str | None
    plan: str | None
    tuning: dict[str, Any] | None
    seq: int
    decision: str | None = None  # approve | reject | edit
    decided_by: str | None = None
    decision_seq: int | None = None
    applied_version: int | None = None
    edit_blob: str | None = None  # the user's source when the decision was an edit
    apply_failed: bool = False  # approved, but could not be applied (error event)
    base_chosen: bool = False  # the agent named its base version (else: the current one)
    via: str | None = None  # how the agent made it (template, rule, tuner, tool, words)

    @property
    def approved(self) -> bool:
        """Decided in a way that makes a version (``approving``)."""
        return approving(self.decision)

    @property
    def origin(self) -> str:
        """The ``origin`` of the version it makes (a person's edit is ``user-edit``): a
        tuning, the offline agent's template (as the proposal says), else the agent's."""
        if self.kind == "tuning":
            return "tuning"
        return "template" if self.via == "template" else "agent"


def proposal_base(state: SessionState, prop: ProposalInfo) -> int | None:
    """The version a controller proposal applies to: the one the agent named
    (``base_chosen``) while it exists, else the current one. The version is made from it,
    the preview's diff is drawn against it and an edit is described against it."""
    if prop.base_chosen and prop.base_version in state.versions:
        return prop.base_version
    return state.current


@dataclass
class Spent:
    iterations: int = 0  # agent/user versions made (the initial kernel is not one)
    runs: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    cost_unknown: bool = False  # a reply from a model without a known price (not $0)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def cost_text(self, digits: int = 4) -> str:
        """"$0.0123", or "unknown" / "$0.0123 + unknown" when a model had no price."""
        known = f"${self.cost_usd:.{digits}f}"
        if not self.cost_unknown:
            return known
        return "unknown" if self.cost_usd == 0 else f"{known} + unknown"


@dataclass
class RunInfo:
    id: str
    version: int
    kind: str  # eval | profile
    by: str
    seq: int
    t_start: float
    status: str | None = None  # None while it runs
    t_end: float | None = None
    cancelled: bool = False
    interrupted: bool = False  # the app stopped mid-run (settled on resume)


@dataclass
class DecisionInfo:
    seq: int
    t: float
    proposal: str | None
    decision: str
    by: str
    note: str | None
    same_as: int | None = None  # an auto rejection: that correct version's program


@dataclass
class SessionState:
    header: dict[str, Any]
    versions: dict[int, Version] = field(default_factory=dict)
    current: int | None = None
    proposals: dict[str, ProposalInfo] = field(default_factory=dict)
    pending: str | None = None  # id of the proposal awaiting a decision
    mode: str = "step"
    spent: Spent = field(default_factory=Spent)
    auto_spent: Spent = field(default_factory=Spent)  # since autonomous mode last began
    auto_since_t: float | None = None
    auto_stops: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[str, RunInfo] = field(default_factory=dict)
    decisions: list[DecisionInfo] = field(default_factory=list)
    # Rejection notes and user messages since the last proposal: the next request's notes.
    notes: list[str] = field(default_factory=list)
    approved_plans: list[str] = field(default_factory=list)  # proposal ids
    plan_to_implement: str | None = None
    plan_steps: list[str] = field(default_factory=list)  # of the plan being implemented
    plan_step: int = 0  # index of the step the implementer works on next
    answers: int = 0  # text-only replies (questions answered, explanations)
    diagnoses: list[dict[str, Any]] = field(default_factory=list)  # ``diagnosis`` events
    fix_streak: int = 0  # fix proposals since the last passing or user-made version
    # Evals in autonomous mode since the best speedup last improved.
    evals_without_improvement: int = 0
    best_history: list[Milestone] = field(default_factory=list)  # per eval run
    errors: list[dict[str, Any]] = field(default_factory=list)
    # The seq of the event that made the current version current (a new version, a
    # checkout): errors before it belong to what was current then.
    current_since: int = 0
    agent_failures: int = 0  # consecutive agent turns without a proposal
    auto_rejections: int = 0  # consecutive proposals the auto-approver turned down
    # consecutive ones it turned down as a measured version's program (``same_as``)
    same_program_rejections: int = 0
    agent_failure_retryable: bool = True  # whether the latest one may succeed if re-asked
    agent_finished: str | None = None  # the agent said it has nothing more to try
    best_version: int | None = None  # kept up to date by the fold (see ``best``)
    # The version the person checked out (``kernel.checkout`` by user), until a new
    # version is made: the next proposal starts from it even when it is not the best.
    chosen_base: int | None = None
    base_reason: str | None = None  # why the controller checked a version out (by auto)
    # Read-only tool answers of the session (``agent.message`` ``tools``), oldest first:
    # the next requests carry them, within a budget (``sessions.control.agent_request.lookups``).
    lookups: list[dict[str, Any]] = field(default_factory=list)
    unknown_types: dict[str, int] = field(default_factory=dict)
    last_seq: int = 0
    last_t: float = 0.0
    ended: str | None = None  # reason of the latest session.end, cleared by new events

    # -- derived ----------------------------------------------------------------------

    @property
    def best(self) -> int | None:
        """The crownable version ``best_of`` crowns: the highest rank (``Rank.key``), the
        earliest on ties, the least VMEM among estimates within ``ESTIMATE_TIE``."""
        return self.best_version

    def _recompute_best(self) -> None:
        best = best_of((v for v in self.versions.values() if v.crownable),
                       lambda v: v.rank)
        self.best_version = best.number if best else None

    def awaiting_result(self, number: int) -> bool:
        """Version ``number`` has no judgement and no evaluation of it has ended (not run
        yet, or running); a cancelled or failed run has ended."""
        return self.versions[number].judgement is None and not any(
            r.version == number and r.kind == "eval" and r.t_end is not None
            for r in self.runs.values())

    @property
    def best_rank(self) -> Rank | None:
        best = self.best
        return self.versions[best].rank if best is not None else None

    @property
    def mixed_ranks(self) -> str | None:
        """Said beside "best" when the crownable versions are ranked by compiler figures
        of two kinds (estimates against XLA's estimate, and lower bounds against XLA's
        roofline): one ordering holds them (the kernel's own time), but their numbers do
        not read alike. None when they are of one kind."""
        kinds = {v.rank.source for v in self.versions.values()
                 if v.crownable and v.rank is not None and v.rank.compiler}
        if kinds >= {"tpu_estimate", "roofline"}:
            return "ranked among est. and roofline figures, by each kernel's own time"
        return None

    @property
    def best_tie(self) -> str | None:
        """Why the best is not the version ranked highest, when estimates within
        ``ESTIMATE_TIE`` tied and the one asking less VMEM was crowned
        (``kernels.judge.rank.tie_note``); None otherwise."""
        return tie_note((v for v in self.versions.values() if v.crownable),
                        lambda v: v.rank, lambda v: f"v{v.number}")

    @property
    def active_run(self) -> RunInfo | None:
        for run in reversed(list(self.runs.values())):
            if run.status is None:
                return run
        return None

    @property
    def pending_proposal(self) -> ProposalInfo | None:
        return self.proposals.get(self.pending) if self.pending else None

    def unapplied_approval(self) -> ProposalInfo | None:
        """An approved kernel/tuning proposal whose version was never written (the app
        stopped between the decision and the version): resume finishes applying it."""
        for prop in reversed(list(self.proposals.values())):
            if prop.approved and prop.applied_version is None \
                    and not prop.apply_failed and (prop.kind != "plan" or prop.decision == "edit"):
                return prop
        return None

    def authorized(self, number: int) -> bool:
        """A version may run when it is the task's own kernel or a decision made it."""
        version = self.versions.get(number)
        if version is None:
            return False
        if version.origin == "initial":
            return True
        if version.decision_seq is None:
            return False
        # The decision must exist, approve (or edit), and be about this very proposal.
        return any(d.seq == version.decision_seq and approving(d.decision)
                   and d.proposal == version.proposal for d in self.decisions)

    def history(self) -> tuple[dict[str, Any], ...]:
        return tuple({"version": v.number, "status": v.status,
                      "rank": v.rank.to_json() if v.rank else None,
                      "summary": v.summary} for v in self.versions.values())

    def snapshot(self) -> dict[str, Any]:
        """Plain data for comparing two folds (live vs replayed)."""
        data = asdict(self)
        data.pop("header")
        return data

    # -- the fold ---------------------------------------------------------------------

    def apply(self, event: ev.Event) -> None:
        """Fold one event: its kind's handler in ``_HANDLERS`` (an unknown kind, from a
        newer version, is counted and otherwise skipped)."""
        kind: str = event.get("type", "")
        handler = _HANDLERS.get(kind)
        if handler is None:
            self.unknown_types[kind] = self.unknown_types.get(kind, 0) + 1
        else:
            handler(self, event)
        if isinstance(event.get("seq"), int):
            self.last_seq = event["seq"]
        if isinstance(event.get("t"), int | float):
            self.last_t = float(event["t"])
        if kind != "session.end":
            self.ended = None


def fold(header: dict[str, Any], events: list[ev.Event]) -> SessionState:
    state = SessionState(header=header)
    for event in events:
        state.apply(event)
    return state


# -- handlers, one per event type -----------------------------------------------------

def _agent_message(s: SessionState, e: ev.AgentMessage) -> None:
    if e.get("answer"):
        _agent_answer(s, e)
    for call in e.get("tools") or []:
        if isinstance(call, dict) and call.get("output") is not None:
            s.lookups.append({"name": call.get("name"), "input": call.get("input"),
                              "output": call.get("output"),
                              "is_error": bool(call.get("is_error")),
                              "seq": e.get("seq"), "role": e.get("role")})
    usage = e.get("usage") or {}
    for spent in _spent_targets(s):
        spent.input_tokens += int(usage.get("input_tokens", 0) or 0) \
            + int(usage.get("cache_read_tokens", 0) or 0) \
            + int(usage.get("cache_write_tokens", 0) or 0)
        spent.output_tokens += int(usage.get("output_tokens", 0) or 0)
        spent.cost_usd += float(usage.get("cost_usd", 0.0) or 0.0)
        if usage.get("cost_known") is False:
            spent.cost_unknown = True


def _agent_answer(s: SessionState, e: ev.AgentMessage) -> None:
    """A text-only reply that answered the person: what it answered is no longer news."""
    s.answers += 1
    seen = e.get("notes_seen")
    s.notes = s.notes[seen:] if isinstance(seen, int) else []
    s.agent_failures = 0


def _user_message(s: SessionState, e: ev.UserMessage) -> None:
    if e.get("text"):
        s.notes.append(f"user: {e['text']}")


def _proposal(s: SessionState, e: ev.AgentProposal) -> None:
    pid = str(e.get("proposal"))
    s.proposals[pid] = ProposalInfo(
        id=pid, kind=e.get("kind", "kernel"), summary=e.get("summary", ""),
        rationale=e.get("rationale", ""), role=e.get("role", ""),
        base_version=e.get("base_version"), source_blob=e.get("source_blob"),
        plan=e.get("plan"), tuning=e.get("tuning"), seq=e.get("seq", 0),
        base_chosen=bool(e.get("base_chosen")),
        via=e["via"] if isinstance(e.get("via"), str) else None)
    s.pending = pid
    seen = e.get("notes_seen")
    s.notes = s.notes[seen:] if isinstance(seen, int) else []
    s.agent_failures = 0
    s.agent_finished = None
    if e.get("role") == "fix":
        s.fix_streak += 1


def _decision(s: SessionState, e: ev.UserDecision) -> None:
    info = DecisionInfo(seq=e.get("seq", 0), t=float(e.get("t", 0.0)),
                        proposal=e.get("proposal"), decision=e.get("decision", ""),
                        by=e.get("by", "user"), note=e.get("note"),
                        same_as=e["same_as"] if isinstance(e.get("same_as"), int) else None)
    s.decisions.append(info)
    prop = s.proposals.get(info.proposal) if info.proposal else None
    if prop is not None:
        prop.decision, prop.decided_by, prop.decision_seq = info.decision, info.by, info.seq
        prop.edit_blob = e.get("source_blob") if info.decision == "edit" else None
        if s.pending == prop.id:
            s.pending = None
        if info.decision == "approve" and prop.kind == "plan":
            if e.get("plan"):  # the person edited the plan before approving it
                prop.plan = str(e["plan"])
            s.approved_plans.append(prop.id)
            s.plan_to_implement = prop.id
            s.plan_steps = plan_steps(prop.plan or "")
            s.plan_step = 0
    if info.decision == "reject" and info.note:
        s.notes.append(f"rejected {info.proposal}: {info.note}")
    if info.decision == "reject" and info.by == "auto" and info.same_as is not None:
        # a proposal its kernel's own limits turn into a measured program is not the
        # agent repeating itself: the tuner learns from it and moves on (within a limit)
        s.same_program_rejections += 1
    elif info.decision == "reject" and info.by == "auto":
        s.auto_rejections += 1
    elif approving(info.decision):
        s.auto_rejections = s.same_program_rejections = 0


def _version(s: SessionState, e: ev.KernelVersion) -> None:
    number = int(e["version"])
    origin = e.get("origin", "agent")
    s.versions[number] = Version(
        number=number, parent=e.get("parent"), origin=origin, proposal=e.get("proposal"),
        source_blob=e.get("source_blob", ""), summary=e.get("summary", ""),
        decision_seq=e.get("decision"), seq=e.get("seq", 0), t=float(e.get("t", 0.0)))
    s.current = number
    s.current_since = int(e.get("seq") or 0)
    s.chosen_base = None
    s.base_reason = None
    prop = s.proposals.get(e.get("proposal") or "")
    if prop is not None:
        prop.applied_version = number
        if s.plan_to_implement and prop.role == "implement":
            s.plan_step += 1  # one approved step done; the next request asks for the next
            if s.plan_step >= len(s.plan_steps):
                s.plan_to_implement = None
    if origin != "initial":
        for spent in _spent_targets(s):
            spent.iterations += 1
    if origin == "user-edit":
        s.fix_streak = 0


def _checkout(s: SessionState, e: ev.KernelCheckout) -> None:
    if int(e.get("version", -1)) in s.versions:
        s.current = int(e["version"])
        s.current_since = int(e.get("seq") or 0)
        s.fix_streak = 0
        s.chosen_base = s.current if e.get("by") == "user" else None
        s.base_reason = e.get("reason") if e.get("by") != "user" else None


def _run_start(s: SessionState, e: ev.RunStart) -> None:
    rid = str(e.get("run"))
    s.runs[rid] = RunInfo(id=rid, version=int(e.get("version", 0)), kind=e.get("kind", "eval"),
                          by=e.get("by", "user"), seq=e.get("seq", 0),
                          t_start=float(e.get("t", 0.0)))


def _run_result(s: SessionState, e: ev.RunResult) -> None:
    rid = str(e.get("run"))
    run = s.runs.get(rid)
    if run is not None:
        run.status = e.get("status", "unknown")
        run.t_end = float(e.get("t", 0.0))
        run.cancelled = bool(e.get("cancelled"))
        run.interrupted = bool(e.get("interrupted"))
    if e.get("cancelled") or e.get("status") == "error":
        return  # nothing was measured (an evaluator failure has its own error event)
    version = s.versions.get(int(e.get("version", -1)))
    if version is None:
        return
    before = s.best_rank
    judged = version.judgement = Judgement.from_event(
        e, s.header.get("backend") if isinstance(s.header, dict) else None)
    version.result_blob = e.get("result_blob")
    version.run = rid
    current = s.versions.get(s.best_version) if s.best_version is not None else None
    # best_of over every version again when the best itself was re-measured, or when the
    # new one could displace it (ranked higher, or an estimate within ESTIMATE_TIE of
    # it); a version below that changes nothing
    if current is None or current.number == version.number or (
            version.crownable and contends(version.rank, current.rank)):
        s._recompute_best()
    for spent in _spent_targets(s):
        spent.runs += 1
    after = s.best_rank
    improved = after is not None and after.ranked and after.better_than(before)
    if version.correct:
        s.fix_streak = 0
    if s.mode == "auto":
        s.evals_without_improvement = 0 if improved else s.evals_without_improvement + 1
    s.best_history.append(Milestone(rid, version.number, judged, s.best, after,
                                    float(e.get("t", 0.0))))


def outranks(a: Version, b: Version) -> bool:
    """``a`` ranks above ``b`` (``Rank.key``; a version without a rank ranks lowest)."""
    return rank_key(a.rank) > rank_key(b.rank)


def _profile_result(s: SessionState, e: ev.ProfileResult) -> None:
    rid = str(e.get("run"))
    run = s.runs.get(rid)
    if run is not None:
        run.status = "error" if e.get("error") else "done"
        run.t_end = float(e.get("t", 0.0))
    version = s.versions.get(int(e.get("version", -1)))
    if version is not None and e.get("profile_blob"):
        if e.get("static"):
            version.analysis_blob = e["profile_blob"]
        else:
            version.profile_blob = e["profile_blob"]


def _diagnosis(s: SessionState, e: ev.Diagnosis) -> None:
    entry = {k: v for k, v in e.items() if k not in ("type", "t")}
    s.diagnoses.append(entry)
    version = s.versions.get(int(e.get("version", -1)))
    if version is not None:
        version.diagnosis = entry


def _mode(s: SessionState, e: ev.ModeChange) -> None:
    mode = e.get("mode", "step")
    if mode == "auto" and s.mode != "auto":
        s.auto_spent = Spent()
        s.auto_since_t = float(e.get("t", 0.0))
        s.evals_without_improvement = 0
        s.agent_failures = 0  # a fresh start: the agent gets its chances again
        s.agent_finished = None
    if mode != "auto":
        s.auto_since_t = None
    s.mode = mode


def _auto_stop(s: SessionState, e: ev.AutoStop) -> None:
    s.auto_stops.append({"reason": e.get("reason"), "seq": e.get("seq"), "t": e.get("t")})


def _error(s: SessionState, e: ev.Error) -> None:
    s.errors.append({"message": e.get("message"), "where": e.get("where"), "seq": e.get("seq")})
    if e.get("where") == "agent":
        s.agent_failures += 1
        s.agent_failure_retryable = bool(e.get("retryable", True))
    prop = s.proposals.get(e.get("proposal") or "")
    if prop is not None:  # an approved proposal that could not be applied
        prop.apply_failed = True
        s.notes.append(f"{prop.id} could not be applied: {e.get('message')}")


def _agent_finished(s: SessionState, e: ev.AgentFinished) -> None:
    s.agent_finished = str(e.get("message") or "the agent has nothing more to try")


def _session_end(s: SessionState, e: ev.SessionEnd) -> None:
    s.ended = e.get("reason") or "end"
    active = s.active_run
    if active is not None:  # a run cannot outlive its session
        active.status, active.cancelled = "cancelled", True


def _marker(s: SessionState, e: ev.Marker) -> None:
    """A label in the log (``resumed``, ...): it changes no state."""


def _spent_targets(s: SessionState) -> list[Spent]:
    return [s.spent, s.auto_spent] if s.mode == "auto" else [s.spent]


# Events come off disk as plain dicts; each handler is filed under the kinds its
# annotation reads (``ev.by_kind``).
_HANDLERS: dict[str, Callable[[SessionState, Any], None]] = ev.by_kind(
    _user_message, _agent_message, _proposal, _decision, _version, _checkout, _run_start,
    _run_result, _profile_result, _diagnosis, _mode, _auto_stop, _error, _agent_finished,
    _marker, _session_end)
