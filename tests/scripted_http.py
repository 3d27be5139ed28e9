"""The HTTP plumbing shared by the local provider stand-ins (``anthropic_server``,
``openai_server``), for tests that drive a real SDK against 127.0.0.1.

``ScriptedServer`` is a ``ThreadingHTTPServer`` on a free port that answers each request
with the next step of a script (an SSE ``Stream`` or a JSON ``Status``), falling back to
``default`` when the script runs out, and records every POST it received (``Recorded``:
path, lower-cased headers, JSON body). Used as a context manager it serves on a daemon
thread; leaving the ``with`` block sets ``release`` (which ends any hanging stream) and
shuts the server down. ``disconnected`` is set when a client drops a stream mid-way.

A provider module subclasses ``ScriptedServer`` and implements ``on_post`` (routes, key
checks, error bodies), optionally ``on_get``; its stream type says how to encode its
events (``frames``) and what follows the last one (``trailer``). The stream's
``hang_after=N`` holds the connection open before event N, probing with SSE comments
until the client goes away or ``release`` is set; ``cut_after=N`` closes it before
event N (no trailer).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Protocol, Self, TypeVar

# How long a hanging stream waits in all before giving up: 400 probes of 50 ms.
_HANG_PROBES = 400
_HANG_PROBE_S = 0.05


class SSEStream(Protocol):
    """What the shared stream writer needs from a provider's ``Stream``."""

    hang_after: int | None
    cut_after: int | None

    def frames(self) -> list[bytes]:
        """Each event as complete SSE bytes (ending in a blank line)."""
        ...

    def trailer(self) -> bytes:
        """Bytes sent after the last event when the stream was not cut (may be empty)."""
        ...


StreamT = TypeVar("StreamT", bound=SSEStream)


@dataclass
class Status:
    """A non-streamed JSON answer: an HTTP status with a body and extra headers."""

    code: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Recorded:
    """One POST the server received; ``key`` is the ``Authorization: Bearer`` key."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def bearer(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return auth[7:] if auth.startswith("Bearer ") else None

    @property
    def key(self) -> str | None:
        return self.bearer


class Handler(BaseHTTPRequestHandler):
    """Reads and records requests for its ``scripted`` server and writes JSON or SSE
    answers; ``ScriptedServer`` makes one subclass per server instance."""

    protocol_version = "HTTP/1.1"
    scripted: ScriptedServer[Any]  # set on the per-server subclass

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        self.scripted.on_get(self)

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        headers = {k.lower(): v for k, v in self.headers.items()}
        rec = self.scripted.recorded(self.path, headers, body)
        self.scripted.requests.append(rec)
        self.scripted.on_post(self, rec)

    def send_json(self, code: int, body: dict[str, Any],
                  headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def send_stream(self, step: SSEStream) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        try:
            for n, frame in enumerate(step.frames()):
                if step.cut_after is not None and n == step.cut_after:
                    break
                if step.hang_after is not None and n == step.hang_after:
                    # Hold the stream open, probing with SSE comments: a write fails
                    # once the client has closed the connection.
                    for _ in range(_HANG_PROBES):
                        if self.scripted.release.wait(timeout=_HANG_PROBE_S):
                            break
                        self.wfile.write(self.scripted.keepalive)
                        self.wfile.flush()
                self.wfile.write(frame)
                self.wfile.flush()
            else:
                tail = step.trailer()
                if tail:
                    self.wfile.write(tail)
                    self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.scripted.disconnected.set()
        self.close_connection = True


class ScriptedServer(Generic[StreamT]):
    """A local server answering from a script of steps; subclasses add the routes."""

    url_suffix = ""  # appended to the base URL (OpenAI-style base URLs end in /v1)
    keepalive = b": ping\n\n"  # the SSE comment a hanging stream probes with
    recorded: type[Recorded] = Recorded

    def __init__(self, default: StreamT | Status) -> None:
        self.requests: list[Recorded] = []
        self._script: list[StreamT | Status] = []
        self._lock = threading.Lock()
        self.default = default
        self.disconnected = threading.Event()
        self.release = threading.Event()  # set to end a hanging stream early
        handler = type("Handler", (Handler,), {"scripted": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}{self.url_suffix}"

    def script(self, *steps: StreamT | Status) -> None:
        with self._lock:
            self._script.extend(steps)

    def _next(self) -> StreamT | Status:
        with self._lock:
            return self._script.pop(0) if self._script else self.default

    def answer(self, handler: Handler) -> None:
        """Answer with the next scripted step (or ``default``)."""
        step = self._next()
        if isinstance(step, Status):
            return handler.send_json(step.code, step.body, step.headers)
        handler.send_stream(step)

    def on_post(self, handler: Handler, rec: Recorded) -> None:
        """Route a recorded POST: check path and key, then usually ``answer``."""
        raise NotImplementedError

    def on_get(self, handler: Handler) -> None:
        # What BaseHTTPRequestHandler answers for a method with no do_ handler.
        handler.send_error(HTTPStatus.NOT_IMPLEMENTED, f"Unsupported method ({handler.command!r})")

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
