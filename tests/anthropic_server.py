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
Keys are accepted from ``x-api-key`` or ``Authorization: Bearer``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Stream:
    events: list[tuple[str, dict[str, Any]]]
    hang_after: int | None = None  # stop after this many events and wait for a disconnect
    cut_after: int | None = None  # close the connection after this many events


@dataclass
class Status:
    code: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def key(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return self.headers.get("x-api-key") or (auth[7:] if auth.startswith("Bearer ") else None)


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


class MessagesServer:
    def __init__(self, default: Stream | Status | None = None) -> None:
        self.requests: list[Recorded] = []
        self._script: list[Stream | Status] = []
        self._lock = threading.Lock()
        self.default = default or text_reply("Nothing scripted for this request.")
        self.disconnected = threading.Event()
        self.release = threading.Event()  # set to end a Hang early
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def script(self, *steps: Stream | Status) -> None:
        with self._lock:
            self._script.extend(steps)

    def _next(self) -> Stream | Status:
        with self._lock:
            return self._script.pop(0) if self._script else self.default

    def __enter__(self) -> MessagesServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append(Recorded(self.path, headers, body))
                if not self.path.startswith("/v1/messages"):
                    return self._json(404, {"type": "error", "error": {
                        "type": "not_found_error", "message": self.path}})
                rec = server.requests[-1]
                if not rec.key:
                    return self._json(401, {"type": "error", "error": {
                        "type": "authentication_error", "message": "missing key"}})
                step = server._next()
                if isinstance(step, Status):
                    return self._json(step.code, step.body, step.headers)
                self._stream(step)

            def _json(self, code: int, body: dict, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, step: Stream) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                try:
                    for n, (name, data) in enumerate(step.events):
                        if step.cut_after is not None and n == step.cut_after:
                            break
                        if step.hang_after is not None and n == step.hang_after:
                            # Hold the stream open, probing with SSE comments: a write
                            # fails once the client has closed the connection.
                            for _ in range(400):
                                if server.release.wait(timeout=0.05):
                                    break
                                self.wfile.write(b": ping\n\n")
                                self.wfile.flush()
                        self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    server.disconnected.set()
                self.close_connection = True

        return Handler
