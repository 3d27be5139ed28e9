"""The provider interface: one streamed model reply, as events.

A provider turns (system blocks, messages, tools) into an async stream of ``TextDelta``
and ``ToolCall`` events, ``Notice``s for retries, and exactly one final event: a
``FinalMessage`` (the whole reply with its token usage) or a ``Failure``. Cancelling the
task that iterates the stream closes the HTTP connection. Roles and parsing are built on
top of this and know nothing about the SDK.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from tilewright.agents.base import Failure, Notice, TextDelta, ToolCall, ToolCallDelta, Usage


@dataclass(frozen=True)
class MalformedToolCall:
    """A tool call whose input was not a JSON object; answered with a follow-up."""

    name: str
    id: str
    raw: str
    error: str


@dataclass(frozen=True)
class FinalMessage:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    malformed: tuple[MalformedToolCall, ...] = ()
    stop_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    # The assistant content blocks as the API wants them back in a follow-up turn.
    content: tuple[dict[str, Any], ...] = ()


ProviderEvent = TextDelta | ToolCallDelta | ToolCall | Notice | FinalMessage | Failure


class Provider(Protocol):
    name: str
    model: str

    def stream(self, system: list[dict[str, Any]], messages: list[dict[str, Any]],
               tools: list[dict[str, Any]]) -> AsyncIterator[ProviderEvent]: ...


def parse_tool_input(raw: str) -> tuple[dict[str, Any] | None, str]:
    """A tool call's streamed JSON arguments as a dict, or (None, what is wrong with them)."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON at character {exc.pos}: {exc.msg}"
    if not isinstance(value, dict):
        return None, f"expected a JSON object, got {type(value).__name__}"
    return value, ""


def add_usage(a: Usage, b: Usage) -> Usage:
    return Usage(
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        cache_read_tokens=a.cache_read_tokens + b.cache_read_tokens,
        cache_write_tokens=a.cache_write_tokens + b.cache_write_tokens,
        cost_usd=a.cost_usd + b.cost_usd,
        cost_known=a.cost_known and b.cost_known,
    )
