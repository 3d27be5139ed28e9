"""Every event a session holds, typed, and the one writer that records them.

A persisted event is one line of ``events.jsonl``: ``seq``, ``t``, ``type`` and the
fields below. Each type is a ``TypedDict`` whose ``type`` is a ``Literal``, so an
emitter builds ``RunResult(type="run.result", run=..., ...)`` and a reader narrows on
``event["type"]``. They are TypedDicts, not dataclasses, on purpose: the event *is* the
JSON object, key order included, so what is written stays byte for byte what older
versions wrote and every old session still loads. ``NotRequired`` marks a field older
logs (or some emitters) leave out; readers use ``.get`` for those.

Live-only notifications (``"live": true``, never written) are typed the same way.

``EventWriter`` is the one append-fold-publish step the controller and search share:
append the event to the log, fold it into the state, hand it to every subscriber. A
subscriber that raises is removed and the failure is recorded as an ``error`` event
(``where: subscriber``), so a broken observer is seen, never silently dropped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import (
    Any,
    Literal,
    NotRequired,
    Protocol,
    TypedDict,
    TypeVar,
    cast,
    get_args,
    get_type_hints,
)

from tilewright.kernels.source.printable import printable_fields

# -- persisted events -----------------------------------------------------------------


class UserMessage(TypedDict):
    type: Literal["user.message"]
    text: str
    seq: NotRequired[int]
    t: NotRequired[float]


class AgentMessage(TypedDict):
    type: Literal["agent.message"]
    text: str
    role: str
    proposal: str | None
    usage: dict[str, Any] | None
    cancelled: NotRequired[bool]  # the user stopped the stream
    answer: NotRequired[bool]  # a text-only reply to a question
    notes_seen: NotRequired[int]
    about: NotRequired[int | None]  # the version an answer is about
    tools: NotRequired[list[dict[str, Any]]]  # read-only tool calls, when any
    seq: NotRequired[int]
    t: NotRequired[float]


class AgentProposal(TypedDict):
    type: Literal["agent.proposal"]
    proposal: str
    kind: str  # plan | kernel | tuning
    summary: str
    rationale: str | None
    base_version: int | None
    source_blob: str | None
    plan: str | None
    tuning: dict[str, Any] | None
    role: str
    notes_seen: NotRequired[int]
    base_chosen: NotRequired[bool]  # the agent named ``base_version`` itself
    via: NotRequired[str]  # how the agent made it (its ``meta["via"]``: template, rule, ...)
    proposer: NotRequired[str]  # search: agent | tuning
    strategy: NotRequired[str]  # search: what the proposer named
    lineage: NotRequired[int]  # search: the slot in the tree
    round: NotRequired[int]
    slot: NotRequired[int]
    seq: NotRequired[int]
    t: NotRequired[float]


class UserDecision(TypedDict):
    type: Literal["user.decision"]
    proposal: str | None
    decision: Literal["approve", "reject", "edit"]
    by: str  # user | auto
    note: str | None
    source_blob: str | None  # the edited source (decision edit)
    plan: NotRequired[str]  # a plan the person reworded
    # an auto rejection: the proposal is this correct version's program at the production
    # shape (sessions.core.same_program); its number stands for the proposal's
    same_as: NotRequired[int]
    seq: NotRequired[int]
    t: NotRequired[float]


class KernelVersion(TypedDict):
    type: Literal["kernel.version"]
    version: int
    parent: int | None
    origin: str  # initial | template | agent | tuning | user-edit
    proposal: str | None
    source_blob: str | None
    summary: str
    decision: int | None  # seq of the authorising user.decision (None: initial)
    seq: NotRequired[int]
    t: NotRequired[float]


class KernelCheckout(TypedDict):
    type: Literal["kernel.checkout"]
    version: int
    by: str
    reason: NotRequired[str]  # by auto: why (a regression: back to the best version)
    seq: NotRequired[int]
    t: NotRequired[float]


class RunStart(TypedDict):
    type: Literal["run.start"]
    run: str
    version: int
    # profile: a captured trace with the static analysis; analysis: the static analysis
    # alone (nothing runs), made after an evaluation so every version gets a diagnosis
    kind: Literal["eval", "profile", "analysis"]
    by: str
    seq: NotRequired[int]
    t: NotRequired[float]


class RunResult(TypedDict):
    """One evaluation's outcome. ``status`` is the evaluation's status, ``cancelled``
    (the user stopped it, or the app died mid-run: ``interrupted``) or ``error`` (the
    evaluator failed, not the kernel; an ``error`` event says why)."""

    type: Literal["run.result"]
    run: str
    version: int
    status: str
    correct: bool | None
    median_ms: float | None
    result_blob: str | None
    cancelled: bool
    interrupted: NotRequired[bool]
    # what interrupted it: ``disconnect`` (the terminal went away: SIGHUP) or
    # ``terminated`` (SIGTERM); absent when the app died and the resume settled it
    cause: NotRequired[str]
    flags: NotRequired[list[str]]
    error: NotRequired[str | None]
    # EvalError.kind when the evaluation failed with one; "task" means the task itself
    # failed (its input builder or reference, or its size under the worker's limits)
    error_kind: NotRequired[str | None]
    # the ranking fields of Judgement.event_fields: the Rank (kernels.judge.rank.Rank,
    # as JSON), the chip, the compile verdict and VMEM, the production configuration
    rank: NotRequired[dict[str, Any] | None]
    chip: NotRequired[str | None]
    tpu_compile: NotRequired[str | None]
    vmem_bytes: NotRequired[int | None]
    vmem_limit_bytes: NotRequired[int | None]
    production_shape: NotRequired[str | None]
    # Logs written before ranks were recorded carry these instead of ``rank``: the
    # number that ranked (``speedup``), where it came from and how it read
    # (``Judgement.from_event`` reads them).
    speedup: NotRequired[float | None]
    rank_source: NotRequired[str | None]
    rank_label: NotRequired[str | None]
    rank_shape: NotRequired[str | None]
    seq: NotRequired[int]
    t: NotRequired[float]


class ProfileResult(TypedDict):
    type: Literal["profile.result"]
    run: str
    version: int
    profile_blob: str | None
    logdir: str | None
    error: str | None
    static: NotRequired[bool]  # an ``analysis`` run: the static analysis only, no trace
    seq: NotRequired[int]
    t: NotRequired[float]


class Diagnosis(TypedDict):
    """What limits a profiled version: ``profiling.diagnose``'s dict (its keys below)
    with the version and the profile run it came from."""

    type: Literal["diagnosis"]
    version: int
    run: str
    kind: str  # the first finding: memory_bound | vmem_pressure | per_step_overhead ...
    summary: str
    evidence: NotRequired[dict[str, Any]]
    findings: NotRequired[list[dict[str, Any]]]
    advice: NotRequired[str]
    sources: NotRequired[list[str]]  # static | roofline | trace | tpu_compiler
    seq: NotRequired[int]
    t: NotRequired[float]


class ModeChange(TypedDict):
    type: Literal["mode.change"]
    mode: Literal["step", "auto"]
    by: str  # user | auto | resume | search | disconnect | terminated
    seq: NotRequired[int]
    t: NotRequired[float]


class AutoStop(TypedDict):
    type: Literal["auto.stop"]
    reason: str
    seq: NotRequired[int]
    t: NotRequired[float]


class AgentFinished(TypedDict):
    type: Literal["agent.finished"]
    message: str
    role: str
    seq: NotRequired[int]
    t: NotRequired[float]


class Error(TypedDict):
    type: Literal["error"]
    message: str
    where: str  # agent | apply | evaluator | executor | controller | subscriber | search ...
    retryable: NotRequired[bool]
    proposal: NotRequired[str]
    parent: NotRequired[int | None]  # search: the slot the agent failed to fill
    lineage: NotRequired[int]
    round: NotRequired[int]
    slot: NotRequired[int]
    seq: NotRequired[int]
    t: NotRequired[float]


class Marker(TypedDict):
    type: Literal["marker"]
    label: str  # resumed | lesson | ...
    text: NotRequired[str]
    outcome: NotRequired[str]
    seq: NotRequired[int]
    t: NotRequired[float]


class SessionEnd(TypedDict):
    type: Literal["session.end"]
    reason: str
    seq: NotRequired[int]
    t: NotRequired[float]


class SearchStart(TypedDict):
    type: Literal["search.start"]
    config: dict[str, Any]
    root: int | None
    executor: str
    agent: str
    seq: NotRequired[int]
    t: NotRequired[float]


class SearchResume(TypedDict):
    type: Literal["search.resume"]
    config: dict[str, Any]
    executor: str
    seq: NotRequired[int]
    t: NotRequired[float]


class SearchRound(TypedDict):
    type: Literal["search.round"]
    lineage: int
    round: int
    beam: list[int]
    repair: list[int]
    best_version: int | None
    best_rank: NotRequired[dict[str, Any] | None]  # kernels.judge.rank.Rank as JSON
    best_speedup: NotRequired[float | None]  # logs written before best_rank
    partial: NotRequired[bool]
    seq: NotRequired[int]
    t: NotRequired[float]


class SearchPrune(TypedDict):
    type: Literal["search.prune"]
    version: int
    reason: str
    by: str
    seq: NotRequired[int]
    t: NotRequired[float]


class SearchEnd(TypedDict):
    type: Literal["search.end"]
    reason: str
    best_version: int | None
    best_rank: NotRequired[dict[str, Any] | None]  # kernels.judge.rank.Rank as JSON
    best_speedup: NotRequired[float | None]  # logs written before best_rank
    evaluations: int
    seq: NotRequired[int]
    t: NotRequired[float]


Event = (UserMessage | AgentMessage | AgentProposal | UserDecision | KernelVersion
         | KernelCheckout | RunStart | RunResult | ProfileResult | Diagnosis | ModeChange
         | AutoStop | AgentFinished | Error | Marker | SessionEnd | SearchStart
         | SearchResume | SearchRound | SearchPrune | SearchEnd)

EventType = Literal[
    "user.message", "agent.message", "agent.proposal", "user.decision", "kernel.version",
    "kernel.checkout", "run.start", "run.result", "profile.result", "diagnosis",
    "mode.change", "auto.stop", "agent.finished", "error", "marker", "session.end",
    "search.start", "search.resume", "search.round", "search.prune", "search.end"]

# -- live-only notifications ----------------------------------------------------------


class AgentStart(TypedDict):
    type: Literal["agent.start"]
    live: Literal[True]
    role: str
    agent: str


class AgentDelta(TypedDict):
    """Streamed reply text; consecutive deltas may be joined by an observer."""

    type: Literal["agent.delta"]
    live: Literal[True]
    text: str


class AgentTool(TypedDict):
    type: Literal["agent.tool"]
    live: Literal[True]
    name: str
    input: dict[str, Any]
    id: str | None


class AgentToolDelta(TypedDict):
    """A tool call while it streams: ``text`` is the next piece of its raw JSON
    arguments; ``agent.tool`` with the same ``id`` follows with the whole call."""

    type: Literal["agent.tool_delta"]
    live: Literal[True]
    name: str
    id: str | None
    text: str


class AgentToolResult(TypedDict):
    type: Literal["agent.tool_result"]
    live: Literal[True]
    name: str
    id: str | None
    output: Any
    is_error: bool


class AgentNotice(TypedDict):
    type: Literal["agent.notice"]
    live: Literal[True]
    text: str
    level: str


class AgentUsage(TypedDict):
    type: Literal["agent.usage"]
    live: Literal[True]
    usage: dict[str, Any]


class Notice(TypedDict):
    type: Literal["notice"]
    live: Literal[True]
    text: str
    level: str


class WorkerState(TypedDict):
    type: Literal["worker.state"]
    live: Literal[True]
    state: str


class ControllerBusyEvent(TypedDict):
    type: Literal["controller.busy"]
    live: Literal[True]
    what: str  # agent | run | profile | step


class ControllerIdle(TypedDict):
    type: Literal["controller.idle"]
    live: Literal[True]


class RunProgress(TypedDict):
    """What an evaluation knows before its result: the production-shape verdict (then
    the estimate, ``final``) while the trials still run; the ``tpu`` section as the
    eval JSON will carry it."""

    type: Literal["run.progress"]
    live: Literal[True]
    run: str
    version: int
    tpu: dict[str, Any]
    final: bool


LiveEvent = (AgentStart | AgentDelta | AgentToolDelta | AgentTool | AgentToolResult | AgentNotice
             | AgentUsage | Notice | WorkerState | ControllerBusyEvent | ControllerIdle
             | RunProgress)

LiveType = Literal["agent.start", "agent.delta", "agent.tool_delta", "agent.tool",
                   "agent.tool_result",
                   "agent.notice", "agent.usage", "notice", "worker.state",
                   "controller.busy", "controller.idle", "run.progress"]

LIVE_TYPES: frozenset[LiveType] = frozenset(get_args(LiveType))

# Live kinds whose consecutive events an observer may join into one (their ``text``
# pieces concatenate; ``agent.tool_delta`` only within the same ``id``).
DELTA_TYPES: frozenset[LiveType] = frozenset({"agent.delta", "agent.tool_delta"})

AnyEvent = Event | LiveEvent
# What subscribers receive: persisted events as written (with seq and t), live ones as sent.
Subscriber = Callable[[AnyEvent], None]


def live(type_: LiveType, **fields: Any) -> LiveEvent:
    """A live-only notification: ``{"type": ..., "live": True, **fields}``."""
    return cast("LiveEvent", {"type": type_, "live": True, **fields})


def kinds_read(handler: Callable[..., Any]) -> tuple[str, ...]:
    """The kinds of event ``handler`` reads: the ``type`` Literal of each TypedDict its
    last parameter is annotated with (one event type, or a union of them)."""
    last = list(inspect.signature(handler).parameters)[-1]
    annotation = get_type_hints(handler)[last]
    kinds = []
    for typed in get_args(annotation) or (annotation,):
        literal = get_type_hints(typed).get("type")
        if literal is None or not get_args(literal):
            raise TypeError(f"{handler.__qualname__} reads {typed!r}, not an event type")
        kinds.extend(get_args(literal))
    return tuple(kinds)


_Handler = TypeVar("_Handler", bound=Callable[..., Any])


def by_kind(*handlers: _Handler) -> dict[str, _Handler]:
    """A reader's dispatch table: each handler filed under the kinds of event it reads
    (``kinds_read``), so no table spells a kind by hand and none can file a handler
    under a kind its annotation does not name. Two handlers for one kind are an error."""
    table: dict[str, _Handler] = {}
    for handler in handlers:
        for kind in kinds_read(handler):
            if kind in table:
                raise TypeError(f"{kind!r} is read by both {table[kind].__qualname__} and "
                                f"{handler.__qualname__}")
            table[kind] = handler
    return table


# -- the writer -----------------------------------------------------------------------


class Folds(Protocol):
    """A state that events are folded into (``SessionState``, ``SearchState``)."""

    def apply(self, event: Event) -> None: ...


class Appends(Protocol):
    """Where events are written down (``sessions.log.SessionLog``): ``append`` returns
    the event as stored, with its ``seq`` and ``t``."""

    def append(self, type_: EventType, **fields: Any) -> Event: ...


class EventWriter:
    """Append, fold, publish: the only way a live session's state changes.

    ``state`` is folded in place; ``subscribe`` returns an unsubscribe function."""

    def __init__(self, log: Appends, state: Folds) -> None:
        self.log = log
        self.state = state
        self._subscribers: list[Subscriber] = []

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def emit(self, event: Event) -> Event:
        """Persist one event, fold it, tell the subscribers; returns it as written (with
        its ``seq`` and ``t``). Its text (a model's summary, a candidate's error, a note)
        is written without control characters (``kernels.source.printable``): every screen,
        report and generated file that shows an event shows it so."""
        fields = printable_fields(dict(event))
        kind = fields.pop("type")
        stored = self.log.append(kind, **fields)
        self.state.apply(stored)
        self.publish(stored)
        return stored

    def live(self, event: LiveEvent) -> None:
        """Tell the subscribers something not worth keeping (never written)."""
        self.publish(printable_fields(dict(event)))  # type: ignore[arg-type]

    def publish(self, event: AnyEvent) -> None:
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception as exc:  # a broken observer must not stop the loop
                if callback in self._subscribers:
                    self._subscribers.remove(callback)
                # The broken one is gone, so this cannot recurse into it.
                self.emit(Error(type="error", message=f"subscriber removed: {exc!r}",
                                where="subscriber"))

