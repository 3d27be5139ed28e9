"""A local stand-in for the Anthropic Messages API, for tests that drive the real SDK.

``MessagesServer`` is a ``ThreadingHTTPServer`` on 127.0.0.1 that answers
``POST /v1/messages`` from a script of responses (SSE streams or error statuses) and
records every request it received (headers and JSON body). When the script runs out it
answers with ``default`` (a plain text reply unless set). Use it as a context manager::

    with MessagesServer() as server:
        server.script(text_reply("hello"))
        config = {"agent": {"base_url": server.url, ...}}

Helpers build the SSE event lists: ``text_reply``, ``tool_reply``, ``error_status``.
``Stream(..., hang_after=N)`` stops mid-stream until the client disconnects
(cancellation tests); ``Stream(..., cut_after=N)`` closes the connection mid-stream.
Keys are accepted from ``x-api-key`` or ``Authorization: Bearer``. The server plumbing
(script, recording, SSE writing) lives in ``scripted_http``; this module holds the
Messages API's event format, route, key check and error bodies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Imported as ``tests.anthropic_server`` or, with tests/ on sys.path, as ``anthropic_server``.
if __package__:
    from .scripted_http import Handler, ScriptedServer, Status
    from .scripted_http import Recorded as _Recorded
else:
    from scripted_http import Handler, ScriptedServer, Status
    from scripted_http import Recorded as _Recorded

__all__ = ["MessagesServer", "Recorded", "Status", "Stream", "error_status", "text_reply",
           "tool_reply"]


@dataclass
class Stream:
    events: list[tuple[str, dict[str, Any]]]
    hang_after: int | None = None  # stop after this many events and wait for a disconnect
    cut_after: int | None = None  # close the connection after this many events

    def frames(self) -> list[bytes]:
        return [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                for name, data in self.events]

    def trailer(self) -> bytes:
        return b""


class Recorded(_Recorded):
    @property
    def key(self) -> str | None:
        return self.headers.get("x-api-key") or self.bearer


def _start(model: str, input_tokens: int, cache_read: int, cache_write: int) -> tuple[str, dict]:
    return ("message_start", {"type": "message_start", "message": {
        "id": "msg_local", "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1,
                  "cache_read_input_tokens": cache_read,
                  "cache_creation_input_tokens": cache_write}}})


def _end(stop_reason: str, output_tokens: int) -> list[tuple[str, dict]]:
    return [("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                               "usage": {"output_tokens": output_tokens}}),
            ("message_stop", {"type": "message_stop"})]


def _text_block(index: int, text: str, chunks: int) -> list[tuple[str, dict]]:
    events = [("content_block_start", {"type": "content_block_start", "index": index,
                                       "content_block": {"type": "text", "text": ""}})]
    step = max(1, len(text) // max(1, chunks))
    for i in range(0, len(text), step):
        events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                               "delta": {"type": "text_delta",
                                                         "text": text[i:i + step]}}))
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def text_reply(text: str, *, chunks: int = 4, model: str = "claude-sonnet-4-5",
               usage: tuple[int, int, int, int] = (1200, 300, 0, 1000),
               stop_reason: str = "end_turn") -> Stream:
    """A streamed plain-text reply. usage = (input, output, cache_read, cache_write)."""
    inp, out, read, write = usage
    return Stream([_start(model, inp, read, write), *_text_block(0, text, chunks),
                   *_end(stop_reason, out)])


def tool_reply(name: str, tool_input: dict[str, Any] | str, *, text: str = "",
               model: str = "claude-sonnet-4-5", tool_id: str = "toolu_01",
               usage: tuple[int, int, int, int] = (1200, 500, 1000, 0)) -> Stream:
    """A reply with optional text and one tool call; a str input is sent raw (malformed JSON)."""
    inp, out, read, write = usage
    events = [_start(model, inp, read, write)]
    index = 0
    if text:
        events += _text_block(0, text, 2)
        index = 1
    raw = tool_input if isinstance(tool_input, str) else json.dumps(tool_input)
    events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                           "content_block": {"type": "tool_use", "id": tool_id,
                                                             "name": name, "input": {}}}))
    half = len(raw) // 2
    for piece in (raw[:half], raw[half:]):
        events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                               "delta": {"type": "input_json_delta",
                                                         "partial_json": piece}}))
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return Stream(events + _end("tool_use", out))


def error_status(code: int, kind: str, message: str = "", retry_after: float | None = None) -> Status:
    headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
    return Status(code, {"type": "error", "error": {"type": kind, "message": message or kind}},
                  headers)


class MessagesServer(ScriptedServer[Stream]):
    recorded = Recorded

    def __init__(self, default: Stream | Status | None = None) -> None:
        super().__init__(default or text_reply("Nothing scripted for this request."))

    def on_post(self, handler: Handler, rec: _Recorded) -> None:
        if not rec.path.startswith("/v1/messages"):
            return handler.send_json(404, {"type": "error", "error": {
                "type": "not_found_error", "message": rec.path}})
        if not rec.key:
            return handler.send_json(401, {"type": "error", "error": {
                "type": "authentication_error", "message": "missing key"}})
        self.answer(handler)
