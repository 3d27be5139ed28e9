"""Any OpenAI-compatible chat-completions endpoint through the official ``openai`` SDK.

One provider reaches OpenAI itself, Gemini's OpenAI-compatible endpoint, routers such as
OpenRouter, and local inference servers (vLLM, Ollama, SGLang). It speaks the same
``Provider`` interface as Claude (``agents.providers.claude``): the agent loop, prompts, tool
definitions and reply parsing are shared, and this module only translates. Messages
arrive in the shared (Anthropic-style) block format and are turned into chat messages;
the tools become ``function`` tools; the streamed chunks are assembled here (text
deltas, tool-call argument deltas split across chunks) into one ``FinalMessage``.

The SDK is imported lazily, and its own retries are off: 429, 5xx and connection errors
are retried here with the same notices as Claude (``agents.providers.retry``). A chunk that is not
JSON is skipped with a warning instead of ending the reply; a stream that closes before
its end is retried. A server that refuses tools (a model without tool support) is asked
again without them, and the model answers with a fenced block, which the shared parser
accepts; ``tools = false`` skips that first refused request.

Configuration (``[agent]`` in ``agents.config``, where the defaults are; environment where
named): ``provider = "openai"``, ``model``
(TILEWRIGHT_MODEL; default gpt-4.1), ``base_url`` (else OPENAI_BASE_URL; default
OpenAI's API), ``tools`` (default true), ``max_tokens``, ``max_retries``, ``retry_base_s``,
``retry_max_s``, ``timeout_s``, ``prices``. The key comes from OPENAI_API_KEY (Gemini's
endpoint also takes GEMINI_API_KEY). Local servers need none: an endpoint other than
OpenAI's, Gemini's or OpenRouter's works key-less, and is checked to be listening when
the agent is made, so a server that is not running is one clear error, not four retries.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tilewright.agents.base import Failure, Notice, TextDelta, ToolCall, ToolCallDelta, Usage
from tilewright.agents.config import Config, coerce
from tilewright.agents.errors import AgentError
from tilewright.agents.providers.prices import PRICES_AS_OF, cost_usd, price_for
from tilewright.agents.providers.provider import (
    FinalMessage,
    MalformedToolCall,
    ProviderEvent,
    parse_tool_input,
)
from tilewright.agents.providers.retry import Again, Judged, retrying, short, status_kind

DEFAULT_MODEL = "gpt-4.1"
OPENAI_ENDPOINT = "https://api.openai.com/v1"
GEMINI_ENDPOINT = "https://generativelanguage.googleapis.com/v1beta/openai/"
# Hosted endpoints that always need a key: asking without one fails before any request.
KEYED_HOSTS = ("api.openai.com", "generativelanguage.googleapis.com", "openrouter.ai")
KEYLESS = "not-needed"  # what a key-less request sends (the SDK insists on some key)
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
         "function_call": "tool_use"}


class NoOpenAIKey(AgentError):
    """A hosted OpenAI-compatible endpoint was asked for without a key."""

    def __init__(self, endpoint: str) -> None:
        gemini = "GEMINI_API_KEY or " if "googleapis" in endpoint else ""
        super().__init__(
            f"No API key for {endpoint}: set {gemini}OPENAI_API_KEY in the environment, or "
            "run with the offline agent instead (--agent offline), which needs no key.")
        self.next_step = "run with --agent offline, or export OPENAI_API_KEY"


class ServerUnreachable(AgentError):
    """Nothing listens at a key-less (local) endpoint."""

    def __init__(self, endpoint: str, why: str) -> None:
        super().__init__(
            f"No OpenAI-compatible server answers at {endpoint} ({why}): start it, or set "
            "OPENAI_BASE_URL (or [agent] base_url) to where it listens, or run with the "
            "offline agent instead (--agent offline).")
        self.next_step = "start the server, or run with --agent offline"


class IncompleteReply(Exception):
    """The chunk stream closed before its end; retried like a connection error."""


class StreamedError(Exception):
    """An ``{"error": ...}`` object sent inside the stream (vLLM does this mid-reply)."""

    def __init__(self, message: str, status: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status


@dataclass(frozen=True)
class Endpoint:
    """Where requests go and which key they carry; never holds the key's value in repr."""

    model: str
    base_url: str  # always explicit: OPENAI_ENDPOINT when nothing is configured
    key_source: str | None  # the variable the key came from; None: key-less
    key_required: bool

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).hostname or ""


def endpoint(config: Config | dict[str, Any] | None) -> Endpoint:
    """The effective model, endpoint and key source (no network, no key value)."""
    cfg = coerce(config)
    model = cfg.agent.model or DEFAULT_MODEL  # TILEWRIGHT_MODEL already applied
    base_url = (cfg.base_url("openai") or "").strip() or OPENAI_ENDPOINT
    host = urlsplit(base_url).hostname or ""
    required = any(host == h or host.endswith("." + h) for h in KEYED_HOSTS)
    source = None
    names = ("OPENAI_API_KEY", "GEMINI_API_KEY") if "googleapis" in host else ("OPENAI_API_KEY",)
    for name in names:
        if os.environ.get(name, "").strip():
            source = name
            break
    return Endpoint(str(model), base_url, source, required)


def usable(config: Config | dict[str, Any] | None) -> bool:
    """Whether ``auto`` may pick this provider: a key, or a key-less endpoint configured."""
    ep = endpoint(config)
    return ep.key_source is not None or not ep.key_required


def _check_listening(base_url: str, timeout: float = 3.0) -> None:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AgentError(f"[agent] base_url {base_url!r} is not an http(s) URL: set it (or "
                         "OPENAI_BASE_URL) to the server's address, e.g. "
                         "http://127.0.0.1:8000/v1")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            pass
    except OSError as exc:
        raise ServerUnreachable(base_url, exc.strerror or type(exc).__name__) from None


class OpenAIProvider:
    """One model behind ``openai.AsyncOpenAI``; ``stream`` yields ``ProviderEvent``s."""

    name = "openai"

    def __init__(self, config: Config | dict[str, Any] | None = None, *,
                 check_server: bool = True) -> None:
        cfg = coerce(config)
        agent_cfg = cfg.agent
        ep = endpoint(cfg)
        if ep.key_required and ep.key_source is None:
            raise NoOpenAIKey(ep.base_url)
        if ep.key_source is None and check_server:
            _check_listening(ep.base_url)
        self.endpoint = ep
        self.model = ep.model
        self.base_url = ep.base_url
        self.label = (self.model if ep.base_url == OPENAI_ENDPOINT
                      else f"{self.model} at {ep.host}")
        self._key = os.environ[ep.key_source].strip() if ep.key_source else KEYLESS
        self.tools_enabled = agent_cfg.tools
        self.max_tokens = agent_cfg.max_tokens
        self.attempts = max(1, agent_cfg.max_retries)
        self.retry_base_s = agent_cfg.retry_base_s
        self.retry_max_s = agent_cfg.retry_max_s
        self.timeout_s = agent_cfg.timeout_s
        # Router and Gemini names may carry a vendor prefix ("openai/gpt-4.1",
        # "models/gemini-2.5-pro"); the table is keyed by the bare name.
        self.price = (price_for(self.model, agent_cfg.prices)
                      or price_for(self.model.rsplit("/", 1)[-1], agent_cfg.prices))
        self.notices: list[str] = []
        if self.price is None:
            self.notices.append(
                f"no price known for {self.model} (tilewright's table is as of "
                f"{PRICES_AS_OF}): its cost shows as unknown. Set [agent.prices.\"{self.model}\"] "
                "input and output (USD per MTok; 0 for a local server) to count it.")
        self._client: Any = None

    def _sdk_client(self) -> Any:
        if self._client is None:
            import openai  # slow import: only when a reply is actually requested

            self._client = openai.AsyncOpenAI(api_key=self._key, base_url=self.base_url,
                                              max_retries=0, timeout=self.timeout_s)
        return self._client

    async def stream(self, system: list[dict[str, Any]], messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]]) -> AsyncIterator[ProviderEvent]:
        import openai

        client = self._sdk_client()

        def judge(exc: Exception) -> Judged:
            if bool(tools) and self.tools_enabled and _refuses_tools(exc):
                self.tools_enabled = False  # for the rest of the session too
                return Again(Notice(f"{self.label} does not take tools here ({short(exc)}); "
                                    "asking again without them: it answers with a fenced "
                                    "block. Set [agent] tools = false to skip this request.",
                                    level="warning"))
            kind = _retry_kind(exc)
            if kind is None:
                return Failure(self._describe(exc, getattr(exc, "status_code", None)),
                               retryable=False)
            return kind

        def connection_hint(failure: Failure, exc: Exception) -> Failure:
            if isinstance(exc, openai.APIConnectionError) \
                    and getattr(exc, "status_code", None) is None:
                return Failure(f"{failure.message}. Check that the server at "
                               f"{self.base_url} is running (OPENAI_BASE_URL / "
                               "[agent] base_url), or use the offline agent "
                               "(--agent offline).", retryable=True)
            return failure

        async for event in retrying(
                lambda: self._one_attempt(client, system, messages,
                                          tools if bool(tools) and self.tools_enabled else []),
                attempts=self.attempts, base_s=self.retry_base_s, max_s=self.retry_max_s,
                retryable=(openai.APIConnectionError, openai.APIStatusError, StreamedError,
                           IncompleteReply, *_transport_errors()),
                judge=judge, notices=self.notices, sdk_error=openai.OpenAIError, sdk="OpenAI",
                gave_up_as=connection_hint):
            yield event

    async def _one_attempt(self, client: Any, system: list[dict[str, Any]],
                           messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]]) -> AsyncIterator[ProviderEvent]:
        kwargs: dict[str, Any] = {
            "model": self.model, "stream": True,
            "messages": chat_messages(system, messages, tools_on=bool(tools)),
            "stream_options": {"include_usage": True}}
        # OpenAI's newer models take only max_completion_tokens; other servers know max_tokens.
        kwargs["max_completion_tokens" if self.base_url == OPENAI_ENDPOINT
               else "max_tokens"] = self.max_tokens
        if tools:
            kwargs["tools"] = function_tools(tools)
        reply = _Assembly()
        async with client.chat.completions.with_streaming_response.create(**kwargs) as response:
            async for data in _sse_data(response.iter_lines()):
                if data.strip() == "[DONE]":
                    reply.done = True
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    reply.skipped += 1
                    if reply.skipped == 1:
                        yield Notice(f"skipped a malformed chunk from {self.endpoint.host} "
                                     f"(not JSON): {data[:80]!r}", level="warning")
                    continue
                for event in reply.add(chunk):
                    yield event
        if not reply.done and reply.finish is None:
            raise IncompleteReply("the reply stream ended before its last chunk")
        final = reply.final(self.price)
        for call in final.tool_calls:  # whole calls only: their arguments are complete now
            yield call
        yield final

    def _describe(self, exc: Exception, status: int | None) -> str:
        where = self.endpoint.host
        if status == 401:
            return (f"{where} rejected the API key (401): check OPENAI_API_KEY, or use the "
                    "offline agent (--agent offline).")
        if status == 403:
            return f"{where} refused the request (403): {short(exc)}"
        if status == 404:
            return (f"Model or endpoint not found at {self.base_url} (404): {short(exc)}; "
                    "check [agent] model / base_url.")
        if status in (400, 422):
            return f"{where} rejected the request ({status}): {short(exc)}"
        return f"{where} API error ({status}): {short(exc)}"


class _Assembly:
    """The reply as its chunks arrive: text, tool calls by index, finish reason, usage."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.finish: str | None = None
        self.usage: dict[str, int] = {}
        self.done = False
        self.skipped = 0

    def add(self, chunk: Any) -> list[TextDelta | ToolCallDelta]:
        if not isinstance(chunk, dict):
            self.skipped += 1
            return []
        if isinstance(chunk.get("error"), dict):
            err = chunk["error"]
            code = err.get("code")
            raise StreamedError(str(err.get("message") or err),
                                code if isinstance(code, int) else None)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        out: list[TextDelta | ToolCallDelta] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                self.text.append(content)
                out.append(TextDelta(content))
            for position, call in enumerate(delta.get("tool_calls") or []):
                if isinstance(call, dict):
                    shown = self._add_call(position, call)
                    if shown is not None:
                        out.append(shown)
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
        return out

    def _add_call(self, position: int, call: dict[str, Any]) -> ToolCallDelta | None:
        """Add one tool-call delta; what the chat shows of it live (once it has a name)."""
        index = call.get("index")
        if not isinstance(index, int):  # servers that leave out the index: match by id
            known = [i for i, c in self.calls.items() if call.get("id") and c["id"] == call["id"]]
            index = known[0] if known else len(self.calls) + position
        slot = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        if call.get("id"):
            slot["id"] = str(call["id"])
        fn = call.get("function") or {}
        name = fn.get("name")
        if name and name != slot["name"]:  # a name sent whole each time, or in pieces
            slot["name"] += str(name)
        piece = str(fn["arguments"]) if fn.get("arguments") else ""
        slot["arguments"] += piece
        if not slot["name"]:
            return None
        # The same id the whole ToolCall gets in ``final``: the chat fills in one entry.
        return ToolCallDelta(slot["id"] or f"call_{index}", slot["name"], piece)

    def final(self, price: dict[str, float] | None) -> FinalMessage:
        text = "".join(self.text)
        calls, malformed = [], []
        content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        for index in sorted(self.calls):
            slot = self.calls[index]
            call_id = slot["id"] or f"call_{index}"
            raw = slot["arguments"] if slot["arguments"].strip() else "{}"
            value, error = parse_tool_input(raw)
            if value is None:
                malformed.append(MalformedToolCall(slot["name"], call_id, raw, error))
                value = {}
            else:
                calls.append(ToolCall(slot["name"], value, call_id))
            content.append({"type": "tool_use", "id": call_id, "name": slot["name"],
                            "input": value})
        return FinalMessage(text=text, tool_calls=tuple(calls), malformed=tuple(malformed),
                            stop_reason=_STOP.get(self.finish or "", self.finish),
                            usage=_usage(self.usage, price), content=tuple(content))


def _usage(raw: dict[str, Any], price: dict[str, float] | None) -> Usage:
    prompt = int(raw.get("prompt_tokens") or 0)
    details = raw.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    tokens = Usage(input_tokens=max(0, prompt - cached),
                   output_tokens=int(raw.get("completion_tokens") or 0),
                   cache_read_tokens=cached)
    if price is None:
        return Usage(**{**tokens.__dict__, "cost_usd": 0.0, "cost_known": False})
    # A table row without a cache price charges cached tokens as input: an upper bound.
    row = {**price, "cache_read": price.get("cache_read", price.get("input", 0.0))}
    return Usage(**{**tokens.__dict__, "cost_usd": cost_usd(tokens, row)})


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The ``data`` of each server-sent event (comments and other fields skipped)."""
    buf: list[str] = []
    async for line in lines:
        if not line.strip():
            if buf:
                yield "\n".join(buf)
                buf = []
        elif line.startswith("data:"):
            buf.append(line[5:].removeprefix(" "))
    if buf:
        yield "\n".join(buf)


def function_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The shared tool definitions (name, description, input_schema) as function tools."""
    return [{"type": "function", "function": {
        "name": t["name"], "description": t.get("description", ""),
        "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}}
        for t in tools]


def chat_messages(system: list[dict[str, Any]], messages: list[dict[str, Any]], *,
                  tools_on: bool) -> list[dict[str, Any]]:
    """Shared (Anthropic-style) system blocks and messages as chat-completions messages.

    Text blocks are joined into one string (local servers often accept nothing else);
    ``tool_use`` blocks become ``tool_calls`` and ``tool_result`` blocks ``tool``
    messages right after them. Without tools, both become plain text.
    """
    out: list[dict[str, Any]] = []
    system_text = "\n\n".join(b.get("text", "") for b in system if b.get("type") == "text")
    if system_text:
        out.append({"role": "system", "content": system_text})
    for message in messages:
        role, content = message.get("role", "user"), message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        blocks = [b for b in content or [] if isinstance(b, dict)]
        texts = [b.get("text", "") for b in blocks if b.get("type") == "text" and b.get("text")]
        if role == "assistant":
            uses = [b for b in blocks if b.get("type") == "tool_use"]
            entry: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts)}
            if uses and tools_on:
                entry["tool_calls"] = [{"id": b["id"], "type": "function", "function": {
                    "name": b["name"], "arguments": json.dumps(b.get("input") or {})}}
                    for b in uses]
                entry["content"] = entry["content"] or None
            elif uses:
                entry["content"] = "\n\n".join(texts + [
                    f"(called {b['name']} with {json.dumps(b.get('input') or {})})" for b in uses])
            out.append(entry)
            continue
        extra: list[str] = []
        for block in blocks:
            if block.get("type") != "tool_result":
                continue
            result = _result_text(block.get("content"))
            if block.get("is_error"):
                result = f"Error: {result}"
            if tools_on:
                out.append({"role": "tool", "tool_call_id": block.get("tool_use_id", ""),
                            "content": result})
            else:
                extra.append(result)
        if texts or extra:
            out.append({"role": role, "content": "\n\n".join(extra + texts)})
    return out


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))
    return "" if content is None else str(content)


def _refuses_tools(exc: Exception) -> bool:
    """A 400-class answer about tools: the model or server cannot call them."""
    status = getattr(exc, "status_code", None)
    return status in (400, 404, 422, 501) and "tool" in short(exc).lower()


def _transport_errors() -> tuple[type[Exception], ...]:
    try:
        import httpx2
    except ImportError:
        return ()
    return (httpx2.TransportError,)


def _retry_kind(exc: Exception) -> str | None:
    import openai

    if isinstance(exc, (IncompleteReply, *_transport_errors())):
        return "connection lost mid-reply (the partial reply is discarded)"
    if isinstance(exc, openai.APITimeoutError):
        return "timed out"
    if isinstance(exc, openai.APIConnectionError):
        return "connection error"
    if isinstance(exc, StreamedError) and exc.status_code is None:
        return "server error (in the stream)"
    return status_kind(getattr(exc, "status_code", None))
