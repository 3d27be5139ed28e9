"""The narrow agent interface every proposer implements.

The offline agent, the Claude agent and the scripted test agent all plug into the
controller the same way: ``agent.propose(request)`` is an async iterator of
``AgentEvent``s that ends with exactly one ``ProposalReady``, ``Answer`` (a text-only
reply to a question) or ``Failure`` (or ``Finished``).
The controller cancels a reply by cancelling the task that iterates it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from tilewright.kernels.judge.rank import Rank

Role = Literal["plan", "implement", "fix", "tune", "analyze"]
ProposalKind = Literal["plan", "kernel", "tuning"]


@dataclass(frozen=True)
class TaskBrief:
    """What an agent may know of a task. Never carries the held-out shape."""

    name: str
    description: str
    layout: str
    entry: str
    family: str | None
    reference_source: str
    shapes: tuple[dict[str, Any], ...]  # visible configurations only: {"name", "params"}
    atol: float
    rtol: float
    require_pallas: bool
    # The production shape (``Task.production``): {"name", "params"} and, once a worker
    # has built them, "inputs" [[shape, dtype], ...] (+ "config":
    # a JAXBench CONFIG as written). The estimate and the ranking are for
    # it; ``shapes`` are the check shapes (each may carry "inputs" the same way).
    production: dict[str, Any] | None = None
    signature: tuple[str, ...] = ()  # the reference function's parameter names
    overrides: dict[str, Any] = field(default_factory=dict)  # --set, as given
    literal_rewrites: tuple[tuple[Any, Any], ...] = ()  # hard-coded sizes rewritten
    # The function that defines the output when the reference only calls it (a task made
    # by ``tilewright new`` calls the user's function copied beside it; a converted
    # benchmark dispatches to its ``workload``): {"module": "model.py", "function":
    # "mm", "source": the module's text}. The templates and the model read it.
    defining: dict[str, str] | None = None
    # How many check configurations the agent cannot see (held out): only their number.
    hidden_checks: int = 0


@dataclass(frozen=True)
class VersionRow:
    """One version of the session as an agent sees it (``AgentRequest.history``), built
    by the session core from its state; its rank is the judge's ``Rank``, read once."""

    version: int
    status: str | None = None  # None before an evaluation
    rank: Rank | None = None  # what ranks it; None before an evaluation
    summary: str = ""
    median_ms: float | None = None
    parent: int | None = None
    origin: str | None = None
    # {NAME: value} of that version (kernels.source.tunables.config_of): what the
    # offline autotuner has tried, ordered by Rank.key
    tunables: dict[str, Any] | None = None
    # agents.prompts.evalfacts.version_numbers of its evaluation ({} before one)
    numbers: dict[str, Any] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    diagnosis: dict[str, Any] | None = None  # its own, never another version's
    steps: int | None = None  # grid steps, counted where ``steps_source`` says
    steps_source: str | None = None  # "tpu" (the estimate's shape) or "static"
    on_path: bool | None = None  # a graph search: on the root's path to the version asked
    # No evaluation of it has ended yet (not run, or running); a cancelled or failed run
    # has ended. Only where the session's runs were known (``sessions`` builds it).
    awaiting_result: bool = False

    @classmethod
    def of(cls, entry: VersionRow | Mapping[str, Any]) -> VersionRow:
        """A row from its JSON form (a recorded request, a test's literal); the rank
        from ``rank`` or, without one, from ``numbers``."""
        if isinstance(entry, VersionRow):
            return entry
        numbers = dict(entry.get("numbers") or {})
        steps = entry.get("steps")
        return cls(
            version=int(entry.get("version") or 0), status=entry.get("status"),
            rank=Rank.from_json(entry.get("rank")) or (
                numbers["rank"] if isinstance(numbers.get("rank"), Rank) else None),
            summary=str(entry.get("summary") or ""), median_ms=entry.get("median_ms"),
            parent=entry.get("parent"), origin=entry.get("origin"),
            tunables=dict(entry["tunables"]) if isinstance(entry.get("tunables"), dict)
            else None,
            numbers=numbers, flags=tuple(str(f) for f in entry.get("flags") or () if f),
            diagnosis=entry.get("diagnosis") or None,
            steps=steps if isinstance(steps, int) and not isinstance(steps, bool) else None,
            steps_source=entry.get("steps_source"), on_path=entry.get("on_path"),
            awaiting_result=entry.get("awaiting_result") is True)

    def to_json(self) -> dict[str, Any]:
        """The JSON form ``of`` reads (fields left at their defaults are left out)."""
        out: dict[str, Any] = {"version": self.version, "status": self.status,
                               "rank": self.rank.to_json() if self.rank else None,
                               "summary": self.summary, "median_ms": self.median_ms,
                               "parent": self.parent, "origin": self.origin}
        for name in ("tunables", "numbers", "flags", "diagnosis", "steps", "steps_source",
                     "on_path", "awaiting_result"):
            value = getattr(self, name)
            if value not in (None, {}, (), False):
                out[name] = list(value) if name == "flags" else value
        return out


@dataclass(frozen=True)
class AgentRequest:
    role: Role
    task: TaskBrief
    current_source: str | None  # the current kernel version, None before the first
    current_version: int | None = None
    last_eval: dict[str, Any] | None = None  # EvalResult.to_json() of the current version
    profile_summary: dict[str, Any] | None = None
    user_message: str | None = None
    notes: tuple[str, ...] = ()  # rejection notes and follow-ups since the last proposal
    # The session's versions, oldest first (rows given as JSON are read by VersionRow.of).
    history: tuple[VersionRow, ...] = ()
    chip: str = "cpu"
    lessons: tuple[str, ...] = ()  # remembered across sessions (agents.memory)
    # The latest diagnosis of a profile (the session core's ``diagnosis`` event):
    # {"version", "kind", "summary", "evidence": {...}, "findings": [...], "advice"}.
    diagnosis: dict[str, Any] | None = None
    # Read-only tools the agent may call mid-reply (agents.tools.Toolbox); None: none.
    tools: Any = None
    # Every proposal of the session that was rejected, oldest first: {"proposal", "kind",
    # "summary", "note", "by", "tuning", "config" (the tunables the tuning would have
    # set, on its base version), "source_sha256" (of a kernel proposal's source)}. An
    # agent never proposes one of these again, and reads the notes as constraints.
    rejected: tuple[dict[str, Any], ...] = ()
    # Where the proposal starts: ``current_version`` is the base (its source is
    # ``current_source``); the best version so far, the latest one made, and why the
    # base is what it is ("v3 regressed: back to the best", "checked out by the user").
    best_version: int | None = None
    latest_version: int | None = None
    base_reason: str | None = None
    # Read-only tool answers earlier in the session, oldest first (agents.prompts.context keeps
    # the newest within a budget): {"name", "input", "output", "is_error"}.
    lookups: tuple[dict[str, Any], ...] = ()
    backend: dict[str, Any] | None = None  # where evaluations run (the session header's)

    def __post_init__(self) -> None:
        if any(not isinstance(h, VersionRow) for h in self.history):
            object.__setattr__(self, "history", tuple(VersionRow.of(h) for h in self.history))


@dataclass(frozen=True)
class Proposal:
    kind: ProposalKind
    summary: str  # one line, shown in lists
    rationale: str = ""
    source: str | None = None  # kind == "kernel": the complete new kernel source
    plan: str | None = None  # kind == "plan": markdown steps
    tuning: dict[str, Any] | None = None  # kind == "tuning": {"NAME": new_value, ...}
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    # False when the model's price is unknown: cost_usd then counts nothing for it.
    cost_known: bool = True


# -- events streamed by an agent -------------------------------------------------------

@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCall:
    name: str
    input: dict[str, Any]
    id: str = ""


@dataclass(frozen=True)
class ToolCallDelta:
    """A tool call while it streams: ``arguments`` is the next piece of its raw JSON
    arguments (empty when the call just began). The whole ``ToolCall`` with the same
    ``id`` follows once its arguments are complete; this is only for showing it live."""

    id: str
    name: str
    arguments: str = ""


@dataclass(frozen=True)
class Notice:
    """Something the user should see: a retry with its wait, a fallback, a follow-up."""

    text: str
    level: Literal["info", "warning", "error"] = "info"


@dataclass(frozen=True)
class UsageReport:
    usage: Usage


@dataclass(frozen=True)
class ProposalReady:
    proposal: Proposal
    text: str = ""  # the agent's full prose reply


@dataclass(frozen=True)
class Answer:
    """A reply that is an answer, not a proposal: a question asked in the chat, an
    explanation (``/explain``). It ends the turn like a proposal does; nothing runs."""

    text: str


@dataclass(frozen=True)
class ToolResult:
    """What a read-only tool (``agents.tools``) returned to the agent; shown in the chat."""

    id: str
    name: str
    output: str
    is_error: bool = False


@dataclass(frozen=True)
class Failure:
    """The agent could not produce a proposal (API error, no key, gave up)."""

    message: str
    retryable: bool = False


@dataclass(frozen=True)
class Finished:
    """The agent has nothing more to propose: its own search is complete. Not an error
    (the offline tuner, once every neighbour of its best configuration is measured)."""

    message: str


AgentEvent = (TextDelta | ToolCallDelta | ToolCall | ToolResult | Notice | UsageReport
              | ProposalReady | Answer | Failure | Finished)


@runtime_checkable
class Agent(Protocol):
    name: str  # "offline" | "anthropic" | "scripted"
    label: str  # shown in the UI, e.g. "offline agent" or "Claude (claude-sonnet-4-6)"

    def propose(self, request: AgentRequest) -> AsyncIterator[AgentEvent]: ...
