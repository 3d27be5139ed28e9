"""Worker processes that run JAX for the app: ``WorkerPool``, ``EvalOptions``.

The app never imports JAX. A ``WorkerPool`` keeps long-lived ``python -m
kernels.harness.worker`` processes that import JAX once and evaluate candidates sent
as source text over a private socket. A request that times out, crashes its worker
(abort, segfault, ``os._exit``), exceeds the memory limit or is cancelled kills that
worker (its whole process group) and a fresh one is started in the background; the
result says what happened. Workers get an environment without secrets, their
stdout/stderr go to a per-worker capture file that is read back per request (into
``EvalResult.stderr``), and they die with the app (see ``kernels.harness.worker``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kernels.harness import protocol
from kernels.result import Backend, EvalError, EvalResult
from kernels.task import Task
from kernels.worker_env import worker_environment

STATES = ("starting", "idle", "busy", "restarting", "stopped")
STDERR_LIMIT = 64 * 1024  # keep the tail of what a request printed
MEMORY_POLL_S = 0.2
RECYCLE_FRACTION = 0.5  # a worker above this share of its memory limit is replaced when idle


@dataclass
class EvalOptions:
    """How thoroughly to evaluate. ``trials`` below 3 count as 3 (the harness's floor);
    ``shapes`` restricts to named configurations; ``time_budget_s`` bounds the timing
    of candidate + reference together when ``iters`` is None."""

    trials: int = 3
    iters: int | None = None  # None: adaptive, bounded by time_budget_s
    timeout_s: float = 120.0
    time_budget_s: float = 3.0
    lowering: bool = True
    timing: bool = True
    shapes: list[str] | None = None


class WorkerFailure(Exception):
    """A request whose worker had to be killed: ``kind`` is timeout, crashed, exited,
    memory or cancelled; ``stderr`` is what the worker printed during the request."""

    def __init__(self, kind: str, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.stderr = stderr


class WorkerOpError(Exception):
    """The worker ran the op and the op raised (the worker is fine)."""

    def __init__(self, error: dict[str, Any], stderr: str = "") -> None:
        super().__init__(f"{error.get('type')}: {error.get('message')}")
        self.error = error
        self.stderr = stderr


class WorkerStartError(Exception):
    """A worker could not start (JAX missing or broken, bad environment)."""


def _default_memory_limit_mb() -> int:
    """Half the machine's memory, at most 16 GiB: room for a kernel, not for a leak."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return int(min(pages // 2, 16 << 30) >> 20)
    except (ValueError, OSError, AttributeError):
        return 8192


class _Worker:
    """One worker process and its channel."""

    _ids = itertools.count(1)

    def __init__(self) -> None:
        self.name = f"w{next(self._ids)}"
        self.proc: asyncio.subprocess.Process | None = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        # Closed in close_channel(); lives as long as the worker.
        self.capture = tempfile.TemporaryFile(prefix="tilewright-worker-", mode="w+b")  # noqa: SIM115
        self.backend: dict[str, Any] | None = None
        self.ops: list[str] = []
        self.killed_for: str | None = None  # why we killed it, if we did
        self.startup_log = ""
        self._request_ids = itertools.count(1)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self, env: dict[str, str], timeout_s: float) -> None:
        parent_sock, child_sock = socket.socketpair()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kernels.harness.worker",
                "--fd", str(child_sock.fileno()), "--parent", str(os.getpid()),
                pass_fds=(child_sock.fileno(),), stdin=asyncio.subprocess.DEVNULL,
                stdout=self.capture, stderr=self.capture, env=env,
                start_new_session=True,  # own process group: killpg takes grandchildren too
            )
        finally:
            child_sock.close()
        self.reader, self.writer = await asyncio.open_unix_connection(sock=parent_sock)
        try:
            ready = await asyncio.wait_for(protocol.recv(self.reader), timeout_s)
        except TimeoutError:
            ready = None
        if not ready or ready.get("type") != "ready":
            code = await self.kill()
            raise WorkerStartError(
                f"worker process did not start (exit {code}):\n{self.read_capture()[-4000:]}")
        self.backend = ready["backend"]
        self.ops = ready.get("ops", [])
        # Start-up chatter (libtpu warnings and the like): kept apart, not in any result.
        self.startup_log = self.read_capture()

    def read_capture(self) -> str:
        """What the worker printed since the last call; empties the capture file."""
        self.capture.flush()
        self.capture.seek(0)
        data = self.capture.read()
        self.capture.seek(0)
        self.capture.truncate()
        text = data.decode(errors="replace")
        if len(text) > STDERR_LIMIT:
            text = f"[... {len(text) - STDERR_LIMIT} characters cut ...]\n" + text[-STDERR_LIMIT:]
        return text

    async def call(self, op: str, payload: dict[str, Any], timeout_s: float,
                   memory_limit_mb: int) -> dict[str, Any]:
        """Send one request and wait for its reply; raises WorkerFailure when the worker
        had to be killed (it is then dead and must be replaced)."""
        assert self.writer is not None and self.reader is not None
        self.read_capture()
        request_id = next(self._request_ids)
        self.writer.write(protocol.encode({"id": request_id, "op": op, "payload": payload}))
        watch = asyncio.ensure_future(self._watch_memory(memory_limit_mb))
        try:
            await self.writer.drain()
            reply = await asyncio.wait_for(protocol.recv(self.reader), timeout_s)
        except TimeoutError:
            self.killed_for = "timeout"
            await self.kill()
            raise WorkerFailure(
                "timeout", f"no answer within {timeout_s:g} s (an infinite loop or a very "
                "slow kernel); the worker was killed and replaced", self.read_capture()) from None
        except asyncio.CancelledError:
            self.killed_for = "cancelled"
            self.kill_now()
            raise
        except (ConnectionError, protocol.ProtocolError):
            reply = None
        finally:
            watch.cancel()
        if reply is None:
            code = await self._wait_exit()
            raise self._death(code)
        return reply

    def _death(self, code: int | None) -> WorkerFailure:
        stderr = self.read_capture()
        if self.killed_for == "memory":
            return WorkerFailure("memory", "the worker exceeded its memory limit and was "
                                 "killed (a huge allocation or a leak)", stderr)
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            why = {"SIGABRT": "aborted (os.abort, a failed assertion in native code)",
                   "SIGSEGV": "segmentation fault", "SIGBUS": "bus error",
                   "SIGKILL": "killed (possibly by the system's out-of-memory killer)",
                   "SIGFPE": "floating-point exception"}.get(name, "killed by a signal")
            return WorkerFailure("crashed", f"the worker process crashed: {name}, {why}", stderr)
        return WorkerFailure("exited", f"the worker process exited with code {code} during "
                             "the request (os._exit or sys.exit outside the harness)", stderr)

    async def _wait_exit(self) -> int | None:
        assert self.proc is not None
        try:
            return await asyncio.wait_for(self.proc.wait(), 5.0)
        except TimeoutError:  # closed its socket but lingers: finish it
            return await self.kill()

    def rss_mb(self) -> float | None:
        """Resident memory of the worker (Linux /proc; None where unavailable)."""
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
        """SIGKILL the worker's process group without waiting."""
        if self.proc is None or self.proc.returncode is not None:
            return
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


class WorkerPool:
    """Long-lived JAX worker processes. Use ``async with WorkerPool() as pool:``.

    ``memory_limit_mb`` bounds each worker's resident memory (default: half the RAM,
    at most 16 GiB); ``env_overrides`` are added to the (secret-free) environment.
    ``on_state_change(state)`` is called whenever ``state`` changes.
    """

    def __init__(self, size: int = 1, env_overrides: Mapping[str, str] | None = None, *,
                 memory_limit_mb: int | None = None, startup_timeout_s: float = 180.0,
                 on_state_change: Callable[[str], None] | None = None) -> None:
        if size < 1:
            raise ValueError("a WorkerPool needs at least one worker")
        self.size = size
        self.env = worker_environment(overrides=env_overrides)
        self.memory_limit_mb = memory_limit_mb or _default_memory_limit_mb()
        self.startup_timeout_s = startup_timeout_s
        self.on_state_change = on_state_change
        self._idle: asyncio.Queue[_Worker | BaseException] | None = None
        self._workers: dict[str, _Worker] = {}
        self._busy: set[str] = set()
        self._starting = 0
        self._restarting = 0
        self._closed = False
        self._started = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._backend: Backend | None = None
        self._state = "stopped"

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the workers and wait until each has imported JAX."""
        if self._started:
            return
        self._started = True
        self._closed = False
        self._idle = asyncio.Queue()
        self._starting = self.size
        self._update_state()
        results = await asyncio.gather(*(self._spawn() for _ in range(self.size)),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.close()
            raise errors[0]

    async def _spawn(self, restarting: bool = False) -> _Worker:
        worker = _Worker()
        try:
            await worker.start(self.env, self.startup_timeout_s)
        except BaseException as exc:  # failed, or cancelled by close(): leave nothing behind
            worker.kill_now()
            worker.close_channel()
            if restarting and self._idle is not None:
                self._idle.put_nowait(exc)  # wake a waiter with the reason
            raise
        finally:
            if restarting:
                self._restarting -= 1
            else:
                self._starting -= 1
        if self._closed:
            await worker.kill()
            worker.close_channel()
            return worker
        self._workers[worker.name] = worker
        if self._backend is None:
            self._backend = Backend(**worker.backend)  # type: ignore[arg-type]
        assert self._idle is not None
        self._idle.put_nowait(worker)
        self._update_state()
        return worker

    async def close(self) -> None:
        """Kill every worker (they hold no state worth a graceful exit)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for worker in list(self._workers.values()):
            await worker.kill()
            worker.close_channel()
        self._workers.clear()
        self._busy.clear()
        self._started = False
        self._update_state()

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._workers.values() if w.pid is not None]

    @property
    def state(self) -> str:
        return self._state

    def _update_state(self) -> None:
        if self._closed or not self._started:
            state = "stopped"
        elif self._restarting:
            state = "restarting"
        elif self._starting:
            state = "starting"
        elif self._busy:
            state = "busy"
        else:
            state = "idle"
        if state != self._state:
            self._state = state
            if self.on_state_change is not None:
                self.on_state_change(state)

    # -- requests --------------------------------------------------------------------

    async def backend(self) -> Backend:
        await self.start()
        if self._backend is None:  # every start-up failed so far; wait for one
            worker = await self._acquire()
            self._release(worker)
        assert self._backend is not None
        return self._backend

    async def _acquire(self) -> _Worker:
        await self.start()
        assert self._idle is not None
        while True:
            if (not self._workers and not self._starting and not self._restarting
                    and self._idle.empty() and not self._closed):
                self._restarting += 1  # every worker died and its replacement failed: retry
                self._update_state()
                task = asyncio.ensure_future(self._spawn(restarting=True))
                self._tasks.add(task)
                task.add_done_callback(self._spawn_done)
            item = await self._idle.get()
            if isinstance(item, BaseException):
                if not self._workers and not self._restarting:
                    raise WorkerStartError(f"no worker could be started: {item}") from item
                continue
            if item.name in self._workers:
                self._busy.add(item.name)
                self._update_state()
                return item

    def _release(self, worker: _Worker) -> None:
        self._busy.discard(worker.name)
        if not self._closed and self._idle is not None:
            self._idle.put_nowait(worker)
        self._update_state()

    def _replace(self, worker: _Worker) -> None:
        """Forget a dead worker and start a fresh one in the background."""
        worker.kill_now()
        self._workers.pop(worker.name, None)
        self._busy.discard(worker.name)
        worker.close_channel()
        reap = asyncio.ensure_future(worker.kill())
        self._tasks.add(reap)
        reap.add_done_callback(self._tasks.discard)
        if self._closed:
            self._update_state()
            return
        self._restarting += 1
        self._update_state()
        task = asyncio.ensure_future(self._spawn(restarting=True))
        self._tasks.add(task)
        task.add_done_callback(self._spawn_done)

    def _spawn_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the reason was handed to waiters
        self._update_state()

    async def request(self, op: str, payload: dict[str, Any],
                      timeout: float = 120.0) -> dict[str, Any]:
        """Run ``op`` in a worker; returns its result dict.

        Raises WorkerFailure (timeout, crash, exit, memory; the worker was replaced) or
        WorkerOpError (the op raised; the worker is fine). The request's captured
        stderr is in the result under ``"_stderr"``.
        """
        reply, stderr = await self._round_trip(op, payload, timeout)
        if not reply.get("ok"):
            raise WorkerOpError(reply.get("error") or {}, stderr)
        result = dict(reply.get("result") or {})
        result["_stderr"] = stderr
        result["_handler_s"] = reply.get("handler_s")
        return result

    async def _round_trip(self, op: str, payload: dict[str, Any],
                          timeout: float) -> tuple[dict[str, Any], str]:
        worker = await self._acquire()
        try:
            reply = await worker.call(op, payload, timeout, self.memory_limit_mb)
        except (WorkerFailure, asyncio.CancelledError):
            self._replace(worker)
            raise
        except BaseException:
            self._replace(worker)  # unknown state: do not reuse it
            raise
        stderr = worker.read_capture()
        result = reply.get("result")
        if isinstance(result, dict) and result.pop("_recycle", False):
            self._replace(worker)  # the candidate left it untrustworthy (patched, threads)
        elif (worker.rss_mb() or 0.0) > RECYCLE_FRACTION * self.memory_limit_mb:
            self._replace(worker)  # caches of many candidates add up: start afresh
        else:
            self._release(worker)
        return reply, stderr

    async def evaluate(self, task: Task, source: str, options: EvalOptions | None = None,
                       filename: str = "kernel.py") -> EvalResult:
        """Evaluate candidate ``source`` on ``task``; never raises for the candidate's faults."""
        options = options or EvalOptions()
        payload = {"task": task.to_spec(), "source": source, "filename": filename,
                   "options": asdict(options)}
        started = time.perf_counter()
        try:
            reply, stderr = await self._round_trip("eval", payload, options.timeout_s)
        except WorkerFailure as failure:
            status = "timeout" if failure.kind == "timeout" else "crashed"
            return EvalResult(
                status=status, backend=self._backend,
                error=EvalError(kind=failure.kind, message=failure.message,
                                hint=_FAILURE_HINTS.get(failure.kind)),
                duration_s=time.perf_counter() - started, stderr=failure.stderr)
        if not reply.get("ok"):  # the harness itself raised: say so, never blame the kernel
            error = reply.get("error") or {}
            return EvalResult(
                status="runtime_error", backend=self._backend,
                error=EvalError(kind="harness", message=f"{error.get('type')}: "
                                f"{error.get('message')}", traceback=error.get("traceback")),
                duration_s=time.perf_counter() - started, stderr=stderr)
        result = EvalResult.from_json(reply["result"])
        result.stderr = stderr
        result.duration_s = time.perf_counter() - started
        result.extra.setdefault("phases", {})["worker_s"] = reply.get("handler_s")
        return result


_FAILURE_HINTS = {
    "timeout": "Look for a loop that never ends, or raise --timeout for big shapes in "
               "interpret mode (one interpreted call can take seconds on a CPU).",
    "crashed": "The process died in native code; the captured stderr may say where.",
    "exited": "Kernels must not call os._exit/sys.exit; return the output instead.",
    "memory": "Check the sizes the kernel allocates (scratch shapes, intermediate arrays).",
}
