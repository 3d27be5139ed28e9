"""An ``Agent`` over any ``Provider``: builds the prompt, streams, parses, follows up.

One ``propose`` call is one short conversation: the cached prefix plus the turn's
context, read-only tool rounds (``agents.tools``: answered here and sent back, up to
``max_tool_rounds``), then up to ``followups`` corrective turns when the reply cannot be
used (no code, a syntax error, no entry point, malformed tool input). Usage is reported
after every model reply, so budgets see tokens as they are spent. It ends with exactly
one ``ProposalReady``, ``Answer`` (a text-only reply to a question or an explanation)
or ``Failure``. Any provider (Anthropic, OpenAI-compatible) shares this loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from tilewright.agents.base import (
    AgentEvent,
    AgentRequest,
    Answer,
    Failure,
    Notice,
    ProposalReady,
    ToolResult,
    UsageReport,
)
from tilewright.agents.prompts.context import first_user_message, system_blocks
from tilewright.agents.prompts.parsing import parse_reply
from tilewright.agents.prompts.roles import TOOL_KIND, TOOLS
from tilewright.agents.providers.provider import FinalMessage, Provider
from tilewright.agents.tools import READ_TOOL_NAMES, run_tool_calls


class LLMAgent:
    """The model-backed agent; ``name``/``label`` come from the provider."""

    def __init__(self, provider: Provider, followups: int = 2, max_tool_rounds: int = 8) -> None:
        self.provider = provider
        self.followups = followups
        self.max_tool_rounds = max_tool_rounds
        self.name = provider.name
        self.label = f"Claude ({provider.model})" if provider.name == "anthropic" else provider.model

    async def propose(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        system = system_blocks()
        messages: list[dict[str, Any]] = [first_user_message(request)]
        said: list[str] = []  # the text of every reply in this turn (tool rounds included)
        followups = tool_rounds = 0
        while True:
            reply: FinalMessage | None = None
            async for event in self.provider.stream(system, messages, TOOLS):
                if isinstance(event, FinalMessage):
                    reply = event
                elif isinstance(event, Failure):
                    yield event
                    return
                else:
                    yield event
            if reply is None:  # a provider must end with a final event; be safe anyway
                yield Failure("the model's reply ended without a final message", retryable=True)
                return
            yield UsageReport(reply.usage)
            if reply.text.strip():
                said.append(reply.text.strip())
            reads = [c for c in reply.tool_calls if c.name in READ_TOOL_NAMES]
            proposing = any(c.name in TOOL_KIND for c in reply.tool_calls)
            if reads and not proposing and not reply.malformed \
                    and tool_rounds < self.max_tool_rounds:
                # Read-only tools: answer them and let the model carry on (no decision).
                tool_rounds += 1
                results = []
                async for result in run_tool_calls(getattr(request, "tools", None), reads):
                    results.append(result)
                    yield result
                messages.extend(_tool_turn(reply, results))
                continue
            parsed = parse_reply(reply, request)
            if parsed.proposal is not None:
                yield ProposalReady(parsed.proposal, text=reply.text)
                return
            if parsed.answer is not None:
                yield Answer("\n\n".join(said) or parsed.answer)
                return
            if followups == self.followups:
                yield Failure(f"no usable proposal after {followups + 1} replies; last problem: "
                              f"{parsed.followup}", retryable=True)
                return
            followups += 1
            yield Notice(f"asking the model again ({followups}/{self.followups}): "
                         f"{parsed.followup}", level="warning")
            messages.extend(_followup_turn(reply, parsed.followup or "", parsed.tool_use_id))


def _tool_turn(reply: FinalMessage, results: list[ToolResult]) -> list[dict[str, Any]]:
    """The assistant's reply with its tool calls, and one tool_result per tool_use."""
    content = list(reply.content)
    by_id = {r.id: r for r in results}
    answer: list[dict[str, Any]] = []
    for block in content:
        if block.get("type") == "tool_use":
            result = by_id.get(block["id"])
            answer.append({"type": "tool_result", "tool_use_id": block["id"],
                           "is_error": result.is_error if result else True,
                           "content": result.output if result else
                           "Not run: only read-only tools are answered mid-reply."})
    return [{"role": "assistant", "content": content}, {"role": "user", "content": answer}]


def _followup_turn(reply: FinalMessage, text: str, tool_use_id: str | None) -> list[dict[str, Any]]:
    """The assistant's reply and our answer; every tool_use is answered by a tool_result."""
    content = list(reply.content) or [{"type": "text", "text": reply.text or "(empty reply)"}]
    answer: list[dict[str, Any]] = []
    for block in content:
        if block.get("type") == "tool_use":
            is_target = tool_use_id is None or block["id"] == tool_use_id
            answer.append({"type": "tool_result", "tool_use_id": block["id"], "is_error": True,
                           "content": text if is_target else "Not applied: see the other result."})
    if not answer or tool_use_id is None:
        answer.append({"type": "text", "text": text})
    return [{"role": "assistant", "content": content}, {"role": "user", "content": answer}]
