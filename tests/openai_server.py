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
out the final ``data: [DONE]``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Chunk = dict[str, Any] | str


@dataclass
class Stream:
    chunks: list[Chunk]
    hang_after: int | None = None
    cut_after: int | None = None
    done: bool = True


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
        return auth[7:] if auth.startswith("Bearer ") else None


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


class ChatServer:
    def __init__(self, default: Stream | Status | None = None, *, key: str | None = None,
                 models: tuple[str, ...] = ("gpt-4.1",)) -> None:
        self.requests: list[Recorded] = []
        self.key = key
        self.models = models
        self._script: list[Stream | Status] = []
        self._lock = threading.Lock()
        self.default = default or text_reply("Nothing scripted for this request.")
        self.disconnected = threading.Event()
        self.release = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, *steps: Stream | Status) -> None:
        with self._lock:
            self._script.extend(steps)

    def _next(self) -> Stream | Status:
        with self._lock:
            return self._script.pop(0) if self._script else self.default

    def __enter__(self) -> ChatServer:
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

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") != "/v1/models":
                    return self._json(404, {"error": {"message": f"no route {self.path}"}})
                self._json(200, {"object": "list", "data": [
                    {"id": m, "object": "model", "created": 1, "owned_by": "local"}
                    for m in server.models]})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                headers = {k.lower(): v for k, v in self.headers.items()}
                rec = Recorded(self.path, headers, body)
                server.requests.append(rec)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._json(404, {"error": {"message": f"no route {self.path}",
                                                      "type": "not_found"}})
                if server.key is not None and rec.key != server.key:
                    return self._json(401, {"error": {"message": "Incorrect API key provided",
                                                      "type": "invalid_request_error",
                                                      "code": "invalid_api_key"}})
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
                    for n, chunk in enumerate(step.chunks):
                        if step.cut_after is not None and n == step.cut_after:
                            break
                        if step.hang_after is not None and n == step.hang_after:
                            for _ in range(400):  # probe until the client goes away
                                if server.release.wait(timeout=0.05):
                                    break
                                self.wfile.write(b": keep-alive\n\n")
                                self.wfile.flush()
                        data = chunk if isinstance(chunk, str) else json.dumps(chunk)
                        self.wfile.write(f"data: {data}\n\n".encode())
                        self.wfile.flush()
                    else:
                        if step.done:
                            self.wfile.write(b"data: [DONE]\n\n")
                            self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    server.disconnected.set()
                self.close_connection = True

        return Handler
