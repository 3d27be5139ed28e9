"""Claude through the official ``anthropic`` SDK: a streaming ``Provider`` with retries.

The SDK is imported lazily (it takes seconds to import). The SDK's own retries are off
(``max_retries=0``): this module retries 429, 529 and connection errors itself with
exponential backoff, so that each retry reaches the user as a ``Notice`` while it waits.
Streaming reads the raw server-sent events and assembles the reply here, so a tool call
with malformed JSON input becomes a ``MalformedToolCall`` (answered with a follow-up)
instead of an exception. Any other API error ends the reply with a ``Failure``.

Configuration: ``[agent]`` in ``agents.config`` (``model``, else TILEWRIGHT_MODEL wins;
``base_url``, else ANTHROPIC_BASE_URL; ``max_tokens``, ``max_retries``, ``retry_base_s``,
``retry_max_s``, ``timeout_s``, ``prices``), where the defaults are.
The key comes only from ANTHROPIC_API_KEY.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import AsyncIterator
from typing import Any

from tilewright.agents.base import Failure, Notice, TextDelta, ToolCall, ToolCallDelta, Usage
from tilewright.agents.config import Config, coerce
from tilewright.agents.errors import NoApiKey
from tilewright.agents.providers.prices import PRICES_AS_OF, assumed_price, cost_usd, price_for
from tilewright.agents.providers.provider import (
    FinalMessage,
    MalformedToolCall,
    ProviderEvent,
    parse_tool_input,
)
from tilewright.agents.providers.retry import Judged, retrying
from tilewright.agents.providers.retry import short as _short

DEFAULT_MODEL = "claude-sonnet-4-6"


def api_key_from_env() -> str | None:
    key = os.environ.get("ANTHROPIC_API_KEY", "").strip()
    return key or None


class IncompleteReply(Exception):
    """The event stream closed before ``message_stop``; retried like a connection error."""


class AnthropicProvider:
    """One model behind ``AsyncAnthropic``; ``stream`` yields ``ProviderEvent``s."""

    name = "anthropic"

    def __init__(self, config: Config | dict[str, Any] | None = None,
                 api_key: str | None = None) -> None:
        cfg = coerce(config)
        agent_cfg = cfg.agent
        self.api_key = api_key or api_key_from_env()
        if not self.api_key:
            raise NoApiKey()
        self.model = agent_cfg.model or DEFAULT_MODEL  # TILEWRIGHT_MODEL already applied
        self.base_url = cfg.base_url("anthropic")
        self.max_tokens = agent_cfg.max_tokens
        self.attempts = max(1, agent_cfg.max_retries)
        self.retry_base_s = agent_cfg.retry_base_s
        self.retry_max_s = agent_cfg.retry_max_s
        self.timeout_s = agent_cfg.timeout_s
        self.price = price_for(self.model, agent_cfg.prices)
        self.notices: list[str] = []  # said once, before the first reply
        if self.price is None:
            assumed = assumed_price(self.model)
            if assumed:
                family, self.price = assumed
                self.notices.append(
                    f"no published price for {self.model} in tilewright's table (as of "
                    f"{PRICES_AS_OF}); assuming the latest {family} price (${self.price['input']:g} "
                    f"in / ${self.price['output']:g} out per MTok). Set [agent.prices] to correct it.")
            else:
                self.notices.append(f"no price known for {self.model}: cost shows as $0. Set "
                                    "[agent.prices] in the config file to count it.")
        self._client: Any = None
        self._warned: set[str] = set()

    def _sdk_client(self) -> Any:
        if self._client is None:
            import anthropic  # slow import: only when a reply is actually requested

            self._client = anthropic.AsyncAnthropic(
                api_key=self.api_key, base_url=self.base_url, max_retries=0,
                timeout=self.timeout_s)
        return self._client

    async def stream(self, system: list[dict[str, Any]], messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]]) -> AsyncIterator[ProviderEvent]:
        import anthropic

        client = self._sdk_client()

        def judge(exc: Exception) -> Judged:
            kind = _retry_kind(exc)
            return Failure(_describe(exc), retryable=False) if kind is None else kind

        async for event in retrying(
                lambda: self._one_attempt(client, system, messages, tools),
                attempts=self.attempts, base_s=self.retry_base_s, max_s=self.retry_max_s,
                retryable=(anthropic.APIConnectionError, anthropic.APIStatusError,
                           *_transport_errors()),
                judge=judge, notices=self.notices, sdk_error=anthropic.AnthropicError, sdk="Anthropic"):
            yield event

    async def _one_attempt(self, client: Any, system: list[dict[str, Any]],
                           messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]]) -> AsyncIterator[ProviderEvent]:
        kwargs: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens,
                                  "system": system, "messages": messages, "stream": True}
        if tools:
            kwargs["tools"] = tools
        blocks: dict[int, dict[str, Any]] = {}
        json_bufs: dict[int, str] = {}
        usage = {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
        stop_reason, finished = None, False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stream = await client.messages.create(**kwargs)
        for warning in caught:  # e.g. a deprecated model: shown in the chat, not on stderr
            text = str(warning.message).splitlines()[0]
            if text not in self._warned:
                self._warned.add(text)
                yield Notice(text, level="warning")
        async with stream:
            async for event in stream:
                etype = event.type
                if etype == "message_start":
                    _read_usage(usage, event.message.usage)
                elif etype == "content_block_start":
                    block = event.content_block.to_dict()
                    blocks[event.index] = block
                    if block.get("type") == "text":
                        block["text"] = block.get("text", "")
                    elif block.get("type") == "tool_use":  # shown live from here on
                        yield ToolCallDelta(block.get("id", ""), block.get("name", ""))
                elif etype == "content_block_delta":
                    delta = event.delta
                    block = blocks.setdefault(event.index, {"type": "text", "text": ""})
                    if delta.type == "text_delta":
                        block["text"] = block.get("text", "") + delta.text
                        yield TextDelta(delta.text)
                    elif delta.type == "input_json_delta":
                        json_bufs[event.index] = json_bufs.get(event.index, "") + delta.partial_json
                        if block.get("type") == "tool_use" and delta.partial_json:
                            yield ToolCallDelta(block.get("id", ""), block.get("name", ""),
                                                delta.partial_json)
                elif etype == "content_block_stop":
                    block = blocks.get(event.index, {})
                    if block.get("type") == "tool_use":
                        call = _finish_tool(block, json_bufs.get(event.index))
                        if isinstance(call, ToolCall):
                            yield call
                elif etype == "message_delta":
                    stop_reason = event.delta.stop_reason or stop_reason
                    _read_usage(usage, event.usage)
                elif etype == "message_stop":
                    finished = True
        if not finished:  # the stream ended early: a cut connection, not a reply
            raise IncompleteReply("the reply stream ended before message_stop")
        yield self._final(blocks, stop_reason, usage)

    def _final(self, blocks: dict[int, dict[str, Any]], stop_reason: str | None,
               usage: dict[str, int]) -> FinalMessage:
        text_parts, calls, malformed, content = [], [], [], []
        for index in sorted(blocks):
            block = blocks[index]
            if block.get("type") == "text":
                text_parts.append(block.get("text", ""))
                if block.get("text"):
                    content.append({"type": "text", "text": block["text"]})
            elif block.get("type") == "tool_use":
                bad = block.get("_malformed")
                if bad:
                    malformed.append(MalformedToolCall(block["name"], block["id"], bad[0], bad[1]))
                    content.append({"type": "tool_use", "id": block["id"], "name": block["name"],
                                    "input": {}})
                else:
                    calls.append(ToolCall(block["name"], block["input"], block["id"]))
                    content.append({"type": "tool_use", "id": block["id"], "name": block["name"],
                                    "input": block["input"]})
        tokens = Usage(input_tokens=usage["input"], output_tokens=usage["output"],
                       cache_read_tokens=usage["cache_read"], cache_write_tokens=usage["cache_write"])
        tokens = Usage(**{**tokens.__dict__, "cost_usd": cost_usd(tokens, self.price)})
        return FinalMessage(text="".join(text_parts), tool_calls=tuple(calls),
                            malformed=tuple(malformed), stop_reason=stop_reason, usage=tokens,
                            content=tuple(content))


def _finish_tool(block: dict[str, Any], raw: str | None) -> ToolCall | None:
    """Parse the streamed JSON of a tool call; a malformed one is marked, not raised."""
    if raw is None or not raw.strip():
        raw = json.dumps(block.get("input") or {})
    value, error = parse_tool_input(raw)
    if value is None:
        block["_malformed"] = (raw, error)
        return None
    block["input"] = value
    return ToolCall(block["name"], value, block.get("id", ""))


def _read_usage(into: dict[str, int], usage: Any) -> None:
    if usage is None:
        return
    # Usage counts are cumulative: a later report overwrites an earlier one.
    for key, attr in (("input", "input_tokens"), ("output", "output_tokens"),
                      ("cache_read", "cache_read_input_tokens"),
                      ("cache_write", "cache_creation_input_tokens")):
        value = getattr(usage, attr, None)
        if value is not None:
            into[key] = int(value)


def _error_type(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("type", ""))
    return ""


def _transport_errors() -> tuple[type[Exception], ...]:
    """The HTTP library's transport errors (a stream cut mid-way surfaces as these)."""
    try:
        import httpx2
    except ImportError:
        return (IncompleteReply,)
    return (httpx2.TransportError, IncompleteReply)


def _retry_kind(exc: Exception) -> str | None:
    """What to tell the user before retrying, or None when retrying cannot help."""
    import anthropic

    if isinstance(exc, _transport_errors()):
        return "connection lost mid-reply (the partial reply is discarded)"
    if isinstance(exc, anthropic.APIConnectionError):
        return "connection error" if not isinstance(exc, anthropic.APITimeoutError) else "timed out"
    status = getattr(exc, "status_code", None)
    etype = _error_type(exc)
    if status == 429 or etype == "rate_limit_error":
        return "rate limited"
    if status == 529 or etype == "overloaded_error":
        return "API overloaded (529)"
    if status in (500, 502, 503, 504) or etype == "api_error":
        return f"server error ({status})"
    return None


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    if status == 401:
        return ("Anthropic rejected the API key (401): check ANTHROPIC_API_KEY, or use the "
                "offline agent (--agent offline).")
    if status == 403:
        return f"Anthropic refused the request (403): {_short(exc)}"
    if status == 404:
        return f"Model or endpoint not found (404): {_short(exc)}; check [agent] model / base_url."
    if status == 400:
        return f"Anthropic rejected the request (400): {_short(exc)}"
    return f"Anthropic API error ({status}): {_short(exc)}"
