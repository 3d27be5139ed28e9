"""A local stand-in for an OpenAI-compatible chat-completions server (vLLM, Ollama, Gemini's
endpoint, OpenAI itself), for tests that drive the real ``openai`` SDK.

``ChatServer`` is a ``ThreadingHTTPServer`` on 127.0.0.1 that answers
``POST /v1/chat/completions`` from a script of steps (SSE streams or error statuses) and
records every request (path, headers, JSON body). When the script runs out it answers
with ``default``. ``GET /v1/models`` lists ``models``. Like a local server, it takes any
key or none, unless ``key`` is set (then anything else is a 401). Use it as a context
manager::

    with ChatServer() as server:
        server.script(text_reply("hello"))
        config = {"agent": {"base_url": server.url, ...}}

``url`` ends in ``/v1``, as OpenAI-compatible base URLs do. Helpers build the chunk lists:
``text_reply``, ``tool_reply`` (arguments split across chunks), ``error_status``. A chunk
given as a ``str`` is sent as its raw ``data:`` line (a malformed chunk).
``Stream(..., hang_after=N)`` stops after N chunks until the client disconnects;
``Stream(..., cut_after=N)`` closes the connection after N chunks; ``done=False`` leaves
out the final ``data: [DONE]``. The server plumbing (script, recording, SSE writing) lives
in ``scripted_http``; this module holds the chat-completions chunk format, routes, key
check and error bodies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Imported as ``tests.openai_server`` or, with tests/ on sys.path, as ``openai_server``.
if __package__:
    from .scripted_http import Handler, Recorded, ScriptedServer, Status
else:
    from scripted_http import Handler, Recorded, ScriptedServer, Status

__all__ = ["ChatServer", "Chunk", "Recorded", "Status", "Stream", "error_status",
           "text_reply", "tool_reply"]

Chunk = dict[str, Any] | str


@dataclass
class Stream:
    chunks: list[Chunk]
    hang_after: int | None = None
    cut_after: int | None = None
    done: bool = True

    def frames(self) -> list[bytes]:
        return [f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode()
                for c in self.chunks]

    def trailer(self) -> bytes:
        return b"data: [DONE]\n\n" if self.done else b""


def _chunk(model: str, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-local", "object": "chat.completion.chunk", "created": 1,
            "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _usage(model: str, usage: tuple[int, int, int]) -> dict[str, Any]:
    prompt, completion, cached = usage
    return {"id": "chatcmpl-local", "object": "chat.completion.chunk", "created": 1,
            "model": model, "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": cached}}}


def _pieces(text: str, n: int) -> list[str]:
    step = max(1, -(-len(text) // max(1, n)))
    return [text[i:i + step] for i in range(0, len(text), step)]


def text_reply(text: str, *, chunks: int = 4, model: str = "gpt-4.1",
               usage: tuple[int, int, int] | None = (1200, 300, 0),
               finish: str = "stop") -> Stream:
    """A streamed text reply; usage = (prompt, completion, cached prompt) or None (a
    server that does not report usage)."""
    out: list[Chunk] = [_chunk(model, {"role": "assistant", "content": ""})]
    out += [_chunk(model, {"content": piece}) for piece in _pieces(text, chunks)]
    out.append(_chunk(model, {}, finish))
    if usage is not None:
        out.append(_usage(model, usage))
    return Stream(out)


def tool_reply(name: str, arguments: dict[str, Any] | str, *, text: str = "",
               model: str = "gpt-4.1", call_id: str = "call_01", split: int = 3,
               usage: tuple[int, int, int] | None = (1500, 600, 1024)) -> Stream:
    """Optional text, then one tool call whose arguments arrive in ``split`` deltas (the
    first carries the id and name, the rest only the index and a piece of the JSON). A
    str ``arguments`` is sent as it is (malformed JSON)."""
    out: list[Chunk] = [_chunk(model, {"role": "assistant", "content": text[:len(text) // 2]})]
    if text[len(text) // 2:]:
        out.append(_chunk(model, {"content": text[len(text) // 2:]}))
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    for n, piece in enumerate(_pieces(raw, split)):
        call: dict[str, Any] = {"index": 0, "function": {"arguments": piece}}
        if n == 0:
            call = {"index": 0, "id": call_id, "type": "function",
                    "function": {"name": name, "arguments": piece}}
        out.append(_chunk(model, {"tool_calls": [call]}))
    out.append(_chunk(model, {}, "tool_calls"))
    if usage is not None:
        out.append(_usage(model, usage))
    return Stream(out)


def error_status(code: int, message: str = "", *, kind: str = "server_error",
                 retry_after: float | None = None) -> Status:
    headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
    return Status(code, {"error": {"message": message or kind, "type": kind, "code": None,
                                   "param": None}}, headers)


class ChatServer(ScriptedServer[Stream]):
    url_suffix = "/v1"
    keepalive = b": keep-alive\n\n"

    def __init__(self, default: Stream | Status | None = None, *, key: str | None = None,
                 models: tuple[str, ...] = ("gpt-4.1",)) -> None:
        super().__init__(default or text_reply("Nothing scripted for this request."))
        self.key = key
        self.models = models

    def on_get(self, handler: Handler) -> None:
        if handler.path.rstrip("/") != "/v1/models":
            return handler.send_json(404, {"error": {"message": f"no route {handler.path}"}})
        handler.send_json(200, {"object": "list", "data": [
            {"id": m, "object": "model", "created": 1, "owned_by": "local"}
            for m in self.models]})

    def on_post(self, handler: Handler, rec: Recorded) -> None:
        if rec.path.rstrip("/") != "/v1/chat/completions":
            return handler.send_json(404, {"error": {"message": f"no route {rec.path}",
                                                     "type": "not_found"}})
        if self.key is not None and rec.key != self.key:
            return handler.send_json(401, {"error": {"message": "Incorrect API key provided",
                                                     "type": "invalid_request_error",
                                                     "code": "invalid_api_key"}})
        self.answer(handler)
