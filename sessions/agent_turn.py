"""One agent turn: iterate ``agent.propose(request)``, pass live events on, and collect
the reply text, the summed usage and the proposal, the answer (a text-only reply to a question) or the reason there is none,
and the read-only tool calls answered on the way.

``UsageReport``s are increments (one per model reply) and are summed. A proposal that
does not carry what its kind needs (a kernel without source, a tuning without
changes, a plan without steps) is a problem of the agent's, reported as such rather
than applied.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tilewright.agents.base import (
    Agent,
    AgentRequest,
    Answer,
    Failure,
    Finished,
    Notice,
    Proposal,
    ProposalReady,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolResult,
    Usage,
    UsageReport,
)

Live = Callable[..., None]


@dataclass
class AgentTurn:
    parts: list[str] = field(default_factory=list)
    final_text: str | None = None
    usage: Usage = field(default_factory=Usage)
    proposal: Proposal | None = None
    failure: str | None = None
    retryable: bool = True  # False when the agent said asking again will not help
    finished: str | None = None  # the agent has nothing more to try (not an error)
    answer: str | None = None  # a text-only reply to a question: an answer, not a failure
    # Read-only tool calls answered during the turn: {"id", "name", "input", "output",
    # "is_error"}; recorded with the agent.message so replay shows them too.
    tools: list[dict[str, Any]] = field(default_factory=list)

    def text(self) -> str:
        return self.final_text if self.final_text else "".join(self.parts)

    def usage_json(self) -> dict[str, Any]:
        return asdict(self.usage)

    def tools_field(self) -> dict[str, Any]:
        """The read-only tool calls of the turn, for its agent.message (absent when none)."""
        calls = [c for c in self.tools if c.get("output") is not None]
        return {"tools": calls} if calls else {}

    def add_usage(self, more: Usage) -> None:
        u = self.usage
        self.usage = Usage(
            input_tokens=u.input_tokens + more.input_tokens,
            output_tokens=u.output_tokens + more.output_tokens,
            cache_read_tokens=u.cache_read_tokens + more.cache_read_tokens,
            cache_write_tokens=u.cache_write_tokens + more.cache_write_tokens,
            cost_usd=u.cost_usd + more.cost_usd,
            cost_known=u.cost_known and more.cost_known)

    def problem(self) -> str | None:
        """Why this turn yields nothing to decide on, or None when it does."""
        if self.failure is not None:
            return self.failure
        if self.finished is not None:
            return self.finished
        if self.answer is not None and self.proposal is None:
            return None
        p = self.proposal
        if p is None:
            return "the agent ended its reply without a proposal"
        if p.kind == "kernel" and not p.source:
            return "the agent proposed a kernel without its source"
        if p.kind == "tuning" and not p.tuning:
            return "the agent proposed a tuning change without any changes"
        if p.kind == "plan" and not p.plan:
            return "the agent proposed a plan without steps"
        if p.kind not in ("kernel", "tuning", "plan"):
            return f"the agent proposed an unknown kind {p.kind!r}"
        return None


async def stream_turn(agent: Agent, request: AgentRequest, turn: AgentTurn,
                      live: Live) -> None:
    """Fill ``turn`` from the agent's stream. Cancelling the caller closes the stream
    (the agent's own ``finally`` blocks run), which is how a streaming answer stops."""
    try:
        stream = agent.propose(request)
    except Exception as exc:
        turn.failure = f"the agent failed to start: {type(exc).__name__}: {exc}"
        return
    closer = getattr(stream, "aclose", None)
    try:
        async for event in stream:
            if isinstance(event, TextDelta):
                turn.parts.append(event.text)
                live("agent.delta", text=event.text)
            elif isinstance(event, ToolCallDelta):  # shown while it streams, not kept
                live("agent.tool_delta", name=event.name, id=event.id, text=event.arguments)
            elif isinstance(event, ToolCall):
                turn.tools.append({"id": event.id, "name": event.name, "input": event.input,
                                   "output": None, "is_error": False})
                live("agent.tool", name=event.name, input=event.input, id=event.id)
            elif isinstance(event, ToolResult):
                for call in turn.tools:
                    if call["id"] == event.id:
                        call.update(output=event.output, is_error=event.is_error)
                live("agent.tool_result", name=event.name, id=event.id, output=event.output,
                     is_error=event.is_error)
            elif isinstance(event, Notice):
                live("agent.notice", text=event.text, level=event.level)
            elif isinstance(event, UsageReport):
                turn.add_usage(event.usage)
                live("agent.usage", usage=asdict(event.usage))
            elif isinstance(event, ProposalReady):
                turn.proposal = event.proposal
                turn.final_text = event.text or None
                break  # exactly one proposal ends a turn
            elif isinstance(event, Answer):
                turn.answer = event.text
                turn.final_text = event.text or None
                break  # an answer ends a turn as a proposal does
            elif isinstance(event, Failure):
                turn.failure = event.message
                turn.retryable = event.retryable
                break
            elif isinstance(event, Finished):
                turn.finished = event.message
                break
    except Exception as exc:  # an agent bug is a failed turn, not a dead controller
        turn.failure = f"the agent raised {type(exc).__name__}: {exc}"
    finally:
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()


def plan_steps(plan: str) -> list[str]:
    """The numbered steps of a plan (``1. ...`` or ``1) ...``, continuation lines joined);
    a plan without numbered lines is one step."""
    import re

    steps: list[str] = []
    for line in plan.splitlines():
        match = re.match(r"\s*(?:[-*]\s*)?(?:step\s*)?\d+[.):]\s+(.*)", line, re.IGNORECASE)
        if match:
            steps.append(match.group(1).strip())
        elif steps and line.strip() and line.startswith((" ", "\t")):
            steps[-1] += " " + line.strip()
    return steps or [plan.strip()]
