"""One worker process and its private channel, seen from the app: ``WorkerProcess``.

Starts ``python -m tilewright.kernels.worker.main`` in its own process group with a socketpair
for requests (``kernels.pool.protocol``) and a capture file as its stdout/stderr,
sends one request at a time, and kills the process (group) when a request times out,
is cancelled or the process grows past its memory limit; a process that dies on its
own is classified (crashed by a signal, exited). ``kernels.pool.workers.WorkerPool`` owns
these. App side: no JAX here.

Each worker gets a private scratch directory (its only writable place under
``kernels.confinement``) and reports the confinement it achieved when it is ready.
Everything that comes back (replies, captured output) passes ``clean`` first: the
app's secret values are redacted and long strings cut, so nothing downstream (results,
session blobs, the screen, requests to a model) sees what a candidate tried to leak.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from tilewright.kernels import confinement
from tilewright.kernels.judge.process_failure import exited, signal_death
from tilewright.kernels.pool import forks, protocol
from tilewright.kernels.pool.env import redact, secret_values, worker_environment
from tilewright.kernels.source.printable import printable
from tilewright.kernels.tasks.copies import TASKS_DIRNAME, TaskCopies

STDERR_LIMIT = 64 * 1024  # keep the tail of what a request printed
WORKER_MODULE = "tilewright.kernels.worker.main"
STRING_LIMIT = 64 * 1024  # any one string in a reply (an error message, a traceback)
MEMORY_POLL_S = 0.2
# The most a progress frame may extend a request's deadline by (the judge's production
# compiles of a big program: kernels.worker.tpu.production_run.PRODUCTION_MAX_S and a margin).
MAX_EXTENSION_S = 960.0


def clean(value: Any, secrets_: list[str], limit: int = STRING_LIMIT) -> Any:
    """``value`` (a reply, or text) with secrets redacted, control characters removed
    (what a candidate printed or raised reaches terminals, screens and files:
    ``kernels.source.printable``) and every string at most ``limit`` characters (the tail is
    kept: a traceback ends with the error)."""
    if isinstance(value, str):
        if len(value) > limit:
            value = f"[... {len(value) - limit} characters cut ...]" + value[-limit:]
        return printable(redact(value, secrets_))
    if isinstance(value, dict):
        return {clean(k, secrets_, limit) if isinstance(k, str) else k: clean(v, secrets_, limit)
                for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v, secrets_, limit) for v in value]
    return value


class WorkerFailure(Exception):
    """A request whose worker had to be killed: ``kind`` is timeout, crashed, exited,
    memory or cancelled; ``stderr`` is what the worker printed during the request."""

    def __init__(self, kind: str, message: str, stderr: str = "",
                 reached: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.stderr = stderr
        self.reached = reached  # the last phase the worker said it finished, if any


def how_far(reached: dict[str, Any] | None) -> str:
    """Words for the last phase a killed request had finished (its progress frames)."""
    if not reached:
        return "it had reported no finished phase"
    phases = reached.get("phases") or {}
    spent = ", ".join(f"{k.removesuffix('_s')} {v:g} s" for k, v in phases.items()
                      if isinstance(v, int | float))
    shape = f" at the check shape {reached['shape']}" if reached.get("shape") else ""
    return (f"its last finished phase was {str(reached.get('phase', '?')).removesuffix('_s')}"
            f"{shape}, {reached.get('at_s', '?')} s in (so far: {spent})")


class WorkerOpError(Exception):
    """The worker ran the op and the op raised (the worker is fine)."""

    def __init__(self, error: dict[str, Any], stderr: str = "") -> None:
        super().__init__(f"{error.get('type')}: {error.get('message')}")
        self.error = error
        self.stderr = stderr


class WorkerStartError(Exception):
    """A worker could not start (JAX missing or broken, bad environment)."""



SCRATCH_PREFIX = "tilewright-scratch-"
_SCRATCH_NAME = re.compile(re.escape(SCRATCH_PREFIX) + r"(\d+)-")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def sweep_scratch(parent: str | None = None) -> list[str]:
    """Remove the scratch folders (``tilewright-scratch-<pid>-*`` in the temp dir) of
    this user's apps that are no longer running; the folders removed. A folder of a
    running app (this one's included) stays, and so does one named without a pid."""
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    uid = os.getuid()
    for entry in entries:
        match = _SCRATCH_NAME.match(entry.name)
        if match is None:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or \
                    entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if _running(int(match.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.exists(entry.path):
            removed.append(entry.path)
    return removed


class _ForkedWorker:
    """A worker the app's zygote forked: the part of ``asyncio.subprocess.Process`` the
    pool uses (``pid``, ``returncode``, ``wait``, ``kill``)."""

    def __init__(self, forked: forks.Forked) -> None:
        self.forked = forked
        self.pid = forked.pid

    @property
    def returncode(self) -> int | None:
        return self.forked.poll()

    async def wait(self) -> int:
        while (code := self.forked.poll()) is None:
            await asyncio.sleep(0.01)
        return code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def _fork_worker(env: dict[str, str], scratch: str, fd: int, capture: int
                 ) -> _ForkedWorker | None:
    """A worker forked from this app's zygote (started with the workers' default
    environment, quiet: the app's terminal is a screen), its socket ``fd``, its stdout
    and stderr the ``capture`` file, in a session of its own; None: start it the
    ordinary way (an import-time setting of ``env`` differs, or no zygote; a zygote is
    not started for a worker it could not fork)."""
    server = forks.zygote()
    if server.started is None:
        default = worker_environment()
        if forks.import_time(env) != forks.import_time(default):
            # it would refuse this one: it is started for a worker it can fork
            with server.cond:
                server.why = forks.DIFFERS
            return None
        server.start(default, tempfile.gettempdir(), quiet=True)
    forked = server.spawn(WORKER_MODULE, ["--scratch", scratch],
                          {**env, "TMPDIR": scratch}, scratch, fd, output=capture,
                          session=True)
    return _ForkedWorker(forked) if forked is not None else None


class WorkerProcess:
    """One worker process and its channel."""

    _ids = itertools.count(1)

    def __init__(self) -> None:
        self.name = f"w{next(self._ids)}"
        self.proc: asyncio.subprocess.Process | _ForkedWorker | None = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        # Closed in close_channel(); lives as long as the worker.
        self.capture = tempfile.TemporaryFile(prefix="tilewright-worker-", mode="w+b")  # noqa: SIM115
        self.backend: dict[str, Any] | None = None
        self.ops: list[str] = []
        self.killed_for: str | None = None  # why we killed it, if we did
        self.startup_log = ""
        self._request_ids = itertools.count(1)
        # The app's pid in the name: a folder whose app is gone (killed, or its terminal
        # hung up before it could clean up) is removed by the next pool (sweep_scratch).
        self.scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
        # Tasks reach the worker as copies in its scratch dir (it cannot read the user's
        # files); the judge gives its candidate process this directory to read.
        self.tasks = TaskCopies(os.path.join(self.scratch, TASKS_DIRNAME))
        self.confinement: dict[str, Any] | None = None
        self.device_memory_mb = 0
        self.serving_pid: int | None = None  # differs from proc.pid inside a PID namespace
        # Read once: the values a candidate's output must never carry back.
        self.secrets = secret_values()

    @property
    def pid(self) -> int | None:
        """The process that serves requests (the app started its parent when the worker
        runs in a PID namespace)."""
        if self.serving_pid is not None:
            return self.serving_pid
        return self.proc.pid if self.proc else None

    async def start(self, env: dict[str, str], timeout_s: float) -> None:
        parent_sock, child_sock = socket.socketpair()
        os.makedirs(self.tasks.parent, exist_ok=True)  # before it confines itself
        try:
            # A fork of the app's zygote, which imported JAX once for every worker of
            # this app (the same process, about 1.5 s of CPU sooner: a worker replaced
            # after a hang is back at once); else as the zygote would have made it:
            # -P: neither the app's working directory nor a script's directory goes on
            # sys.path (``cd task && tilewright eval --task .`` with an argparse.py in
            # the task imported that file before any confinement); cwd: its scratch.
            self.proc = await asyncio.to_thread(
                _fork_worker, env, self.scratch, child_sock.fileno(), self.capture.fileno())
            self.proc = self.proc or await asyncio.create_subprocess_exec(
                sys.executable, "-P", "-m", WORKER_MODULE,
                "--fd", str(child_sock.fileno()), "--parent", str(os.getpid()),
                "--scratch", self.scratch,
                pass_fds=(child_sock.fileno(),), stdin=asyncio.subprocess.DEVNULL,
                stdout=self.capture, stderr=self.capture, env={**env, "TMPDIR": self.scratch},
                start_new_session=True,  # own process group: killpg takes grandchildren too
                cwd=self.scratch,
            )
        finally:
            child_sock.close()
        self.reader, self.writer = await asyncio.open_unix_connection(sock=parent_sock)
        try:
            ready = await asyncio.wait_for(protocol.recv(self.reader), timeout_s)
        except TimeoutError:
            ready = None
        if not ready or ready.get("type") != "ready":
            await self.kill()
            log = self.read_capture()
            errors = [ln for ln in log.splitlines() if re.match(r"^\w+(Error|Exception): ", ln)]
            summary = errors[-1] if errors else "it said nothing"
            raise WorkerStartError(
                f"the JAX worker process did not start: {summary}\n"
                f"(JAX_PLATFORMS={env.get('JAX_PLATFORMS', '<unset>')}; the worker's output "
                f"follows)\n{log[-4000:]}")
        self.backend = ready["backend"]
        self.ops = ready.get("ops", [])
        self.confinement = ready.get("confinement")
        # The chip's memory mapped into the worker (kernels.worker.main._device_memory_mb)
        # is not the host memory the watch is for.
        device_mb = ready.get("device_memory_mb")
        self.device_memory_mb = device_mb if isinstance(device_mb, int) and device_mb > 0 \
            else 0
        # The serving process, found in the subtree of the process we started (its own
        # word for its pid is checked against that subtree, never taken as it is).
        claimed = ready.get("serving_pid") if isinstance(ready.get("serving_pid"), int) \
            else None
        local = ready.get("local_pid") if isinstance(ready.get("local_pid"), int) else None
        if self.proc is not None and local is not None:
            self.serving_pid = confinement.find_in_subtree(self.proc.pid, local, claimed)
        elif claimed is not None:
            self.serving_pid = claimed
        # Start-up chatter (libtpu warnings and the like): kept apart, not in any result.
        self.startup_log = self.read_capture()

    def read_capture(self) -> str:
        """What the worker printed since the last call (its last STDERR_LIMIT bytes, read
        from the end: a 300 MB print must not become 300 MB of app memory); empties the
        capture file."""
        if self.capture.closed:  # the pool was closed under a pending request
            return ""
        self.capture.flush()
        size = self.capture.seek(0, os.SEEK_END)
        start = max(0, size - STDERR_LIMIT)
        self.capture.seek(start)
        data = self.capture.read(STDERR_LIMIT)
        self.capture.seek(0)
        self.capture.truncate()
        text = data.decode(errors="replace")
        if start:
            text = f"[... {start} bytes cut ...]\n" + text
        return printable(redact(text, self.secrets))

    async def call(self, op: str, payload: dict[str, Any], timeout_s: float,
                   memory_limit_mb: int,
                   on_progress: Callable[[dict[str, Any]], None] | None = None
                   ) -> dict[str, Any]:
        """Send one request and wait for its reply; raises WorkerFailure when the worker
        had to be killed (it is then dead and must be replaced). Progress frames the
        worker sends before its reply (same id and nonce) go to ``on_progress``."""
        assert self.writer is not None and self.reader is not None
        self.read_capture()
        request_id = next(self._request_ids)
        # A reply must echo this: a frame forged by candidate code (which runs in the
        # worker and can find the socket) without it is refused.
        nonce = secrets.token_hex(16)
        self.writer.write(protocol.encode({"id": request_id, "nonce": nonce, "op": op,
                                           "payload": payload}))
        watch = asyncio.ensure_future(self._watch_memory(memory_limit_mb
                                                         + self.device_memory_mb))
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        reached: dict[str, Any] | None = None
        try:
            await self.writer.drain()
            while True:
                # timeout_at, not wait_for: on 3.11 wait_for returns a frame that arrives
                # as the request is cancelled and drops the cancellation (the judge sends
                # a frame per finished phase, so this happened)
                async with asyncio.timeout_at(until):
                    reply = await protocol.recv(self.reader)
                if not (isinstance(reply, dict) and "progress" in reply and "ok" not in reply):
                    break
                if reply.get("id") != request_id or reply.get("nonce") != nonce \
                        or not isinstance(reply["progress"], dict):
                    continue
                if reply["progress"].get("kind") == "phase":  # kept for a timeout's words
                    reached = clean(reply["progress"], self.secrets)
                    # A finished phase is progress: the deadline bounds each phase, not
                    # the sum (on a chip the judge checks every shape at full size, and a
                    # gelu at 8192x8192 outran 120 s in all while nothing hung)
                    until = max(until, loop.time() + timeout_s)
                    continue
                # The judge compiling a big program at the production shape says how
                # long it may still take (its stated deadline): not a hung worker.
                more = reply["progress"].get("deadline_in_s")
                if isinstance(more, int | float) and 0 < more <= MAX_EXTENSION_S:
                    until = max(until, loop.time() + float(more))
                if on_progress is not None:
                    with contextlib.suppress(Exception):  # a listener's bug is not ours
                        on_progress(clean(reply["progress"], self.secrets))
        except TimeoutError:
            self.killed_for = "timeout"
            await self.kill()
            raise WorkerFailure(
                "timeout", f"no answer and no finished phase within {timeout_s:g} s (an "
                "infinite loop or a very slow kernel); the worker was killed and replaced; "
                f"{how_far(reached)}",
                self.read_capture(), reached) from None
        except asyncio.CancelledError:
            self.killed_for = "cancelled"
            self.kill_now()
            raise
        except protocol.ProtocolError as exc:
            self.killed_for = "protocol"
            await self.kill()
            raise WorkerFailure("crashed", f"the worker's reply was unreadable ({exc}): "
                                "something wrote into the harness's channel; the worker was "
                                "replaced", self.read_capture()) from None
        except ConnectionError:
            reply = None
        finally:
            watch.cancel()
        if reply is None:
            code = await self._wait_exit()
            raise self._death(code)
        if reply.get("id") != request_id or reply.get("nonce") != nonce:
            self.killed_for = "protocol"
            await self.kill()
            raise WorkerFailure("crashed", "the worker sent a reply that does not answer this "
                                "request (forged by the candidate?); the worker was replaced",
                                self.read_capture())
        return clean(reply, self.secrets)

    def _death(self, code: int | None) -> WorkerFailure:
        stderr = self.read_capture()
        if self.killed_for == "closed":
            return WorkerFailure("cancelled", "the worker pool was closed during the request",
                                 stderr)
        if self.killed_for == "memory":
            return WorkerFailure("memory", "the worker exceeded its memory limit and was "
                                 "killed (a huge allocation or a leak)", stderr)
        if code is not None and code < 0:
            return WorkerFailure("crashed", "the worker process crashed: "
                                 f"{signal_death(code)}", stderr)
        return WorkerFailure("exited", exited(code, "the worker process"), stderr)

    async def _wait_exit(self) -> int | None:
        assert self.proc is not None
        try:
            return await asyncio.wait_for(self.proc.wait(), 5.0)
        except TimeoutError:  # closed its socket but lingers: finish it
            return await self.kill()

    def rss_mb(self) -> float | None:
        """Resident memory of the serving process (Linux /proc; None where unavailable)."""
        try:
            with open(f"/proc/{self.pid}/statm") as f:
                pages = int(f.read().split()[1])
            return pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
        except (OSError, ValueError, IndexError, AttributeError):
            return None

    async def _watch_memory(self, limit_mb: int) -> None:
        """RSS watchdog (RLIMIT_AS would break XLA, which reserves huge address space).
        Linux only: elsewhere there is no /proc to read and no limit is enforced."""
        if self.rss_mb() is None:
            return
        while True:
            await asyncio.sleep(MEMORY_POLL_S)
            rss = self.rss_mb()
            if rss is None:
                return
            if rss > limit_mb:
                self.killed_for = "memory"
                self.kill_now()
                return

    def kill_now(self) -> None:
        """SIGKILL the worker, its process group and every process below it (a child
        that left the group with setsid included) without waiting."""
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(OSError):
            confinement.kill_tree(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def kill(self) -> int | None:
        self.kill_now()
        if self.proc is None:
            return None
        return await self.proc.wait()

    def close_channel(self) -> None:
        if self.writer is not None:
            self.writer.close()
        with contextlib.suppress(OSError):
            self.capture.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
