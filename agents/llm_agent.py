"""An ``Agent`` over any ``Provider``: builds the prompt, streams, parses, follows up.

One ``propose`` call is one short conversation: the cached prefix plus the turn's
context, then up to ``followups`` corrective turns when the reply cannot be used (no
code, a syntax error, no entry point, malformed tool input). Usage is reported after
every model reply, so budgets see tokens as they are spent. It ends with exactly one
``ProposalReady`` or ``Failure``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agents.base import (
    AgentEvent,
    AgentRequest,
    Failure,
    Notice,
    ProposalReady,
    UsageReport,
)
from agents.context import first_user_message, system_blocks
from agents.parsing import parse_reply
from agents.provider import FinalMessage, Provider
from agents.roles import TOOLS


class LLMAgent:
    """The model-backed agent; ``name``/``label`` come from the provider."""

    def __init__(self, provider: Provider, followups: int = 2) -> None:
        self.provider = provider
        self.followups = followups
        self.name = provider.name
        self.label = f"Claude ({provider.model})" if provider.name == "anthropic" else provider.model

    async def propose(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        system = system_blocks()
        messages: list[dict[str, Any]] = [first_user_message(request)]
        for turn in range(self.followups + 1):
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
            parsed = parse_reply(reply, request)
            if parsed.proposal is not None:
                yield ProposalReady(parsed.proposal, text=reply.text)
                return
            if turn == self.followups:
                yield Failure(f"no usable proposal after {turn + 1} replies; last problem: "
                              f"{parsed.followup}", retryable=True)
                return
            yield Notice(f"asking the model again ({turn + 1}/{self.followups}): {parsed.followup}",
                         level="warning")
            messages.extend(_followup_turn(reply, parsed.followup or "", parsed.tool_use_id))


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
