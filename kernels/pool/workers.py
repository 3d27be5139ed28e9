"""Worker processes that run JAX for the app: ``WorkerPool``, ``EvalOptions``.

The app never imports JAX. A ``WorkerPool`` keeps long-lived ``python -m
tilewright.kernels.worker.main`` processes that import JAX once and evaluate candidates sent
as source text over a private socket. A request that times out, crashes its worker
(abort, segfault, ``os._exit``), exceeds the memory limit or is cancelled kills that
worker (its whole process group) and a fresh one is started in the background; the
result says what happened. Workers get an environment without secrets, their
stdout/stderr go to a per-worker capture file that is read back per request (into
``EvalResult.stderr``), and they die with the app (see ``kernels.worker.main``).

Workers confine themselves (``kernels.confinement``); every result carries the report
as ``confinement``. A worker that has to be killed for time or memory during ``eval``
is followed by a probe that runs only the task's reference under the same limits: when
the reference alone does not fit, the result blames the task, not the kernel.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tilewright.kernels import confinement as _confinement
from tilewright.kernels.judge.calibration import calibration_path
from tilewright.kernels.judge.options import EvalOptions, ProfileOptions
from tilewright.kernels.judge.process_failure import FAILURE_HINTS
from tilewright.kernels.judge.protocol import (
    ApiAnswer,
    InputsJSON,
    JudgeState,
    ProfileJSON,
    StateListener,
    on_chips,
    public,
)
from tilewright.kernels.judge.result import ESTIMATE_SCHEMA, Backend, EvalError, EvalResult
from tilewright.kernels.pool.env import (
    CALIBRATION,
    ESTIMATE_CACHE,
    usable_cores,
    worker_environment,
)
from tilewright.kernels.pool.process import (
    WorkerFailure,
    WorkerOpError,
    WorkerProcess,
    WorkerStartError,
    sweep_scratch,
)
from tilewright.kernels.tasks.copies import TaskCopyError, restore
from tilewright.kernels.tasks.task import Task

if TYPE_CHECKING:
    from tilewright.kernels.judge.protocol import ProgressListener

__all__ = ["EvalOptions", "WorkerFailure", "WorkerOpError", "WorkerPool", "WorkerStartError"]

STATES = ("starting", "idle", "busy", "restarting", "stopped")
_CLOSED = WorkerStartError("the worker pool was closed")  # queue sentinel for waiters
RECYCLE_FRACTION = 0.5  # a worker above this share of its memory limit is replaced when idle
LOOKUP_TIMEOUT_S = 60.0  # a name lookup in the worker's JAX
INPUTS_TIMEOUT_S = 120.0  # a task's input builder, run abstractly


def _default_memory_limit_mb() -> int:
    """Half the machine's memory, at most 16 GiB: room for a kernel, not for a leak."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return int(min(pages // 2, 16 << 30) >> 20)
    except (ValueError, OSError, AttributeError):
        return 8192


def _estimate_cache(env: dict[str, str]) -> str | None:
    """The judges' on-disk cache of TPU compiles (``kernels.worker.tpu.compile_pool``): under
    ``$TILEWRIGHT_CACHE_DIR`` or the user cache dir, shared by every worker of this user,
    made writable for the worker (never for the candidate's process). ``env`` gains the
    two variables; None when no cache directory can be made."""
    root = env.get("TILEWRIGHT_CACHE_DIR") or os.environ.get("TILEWRIGHT_CACHE_DIR")
    if not root:
        try:
            from platformdirs import user_cache_dir

            root = user_cache_dir("tilewright")
        except ImportError:
            return None
    path = os.path.join(root, "estimates")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    env[ESTIMATE_CACHE] = path
    writable = [p for p in env.get(_confinement.ENV_WRITABLE, "").split(os.pathsep) if p]
    env[_confinement.ENV_WRITABLE] = os.pathsep.join([*writable, path])
    return path


def _calibration_file(env: dict[str, str]) -> None:
    """The user's ``tilewright calibrate`` pairs, readable by the judge (its
    ``tpu.fidelity`` reports them beside the public figures), when there are any."""
    try:
        path = calibration_path()
    except ImportError:
        return
    if not path.is_file():
        return
    env[CALIBRATION] = str(path)
    readable = [p for p in env.get(_confinement.ENV_READABLE, "").split(os.pathsep) if p]
    env[_confinement.ENV_READABLE] = os.pathsep.join([*readable, str(path)])


class WorkerPool:
    """Long-lived JAX worker processes. Use ``async with WorkerPool() as pool:``.

    A pool is a judge by itself (``kernels.judge.protocol.Judge``): a session binds its
    options straight over one (``sessions.evaluator.PoolEvaluator``), and
    ``LocalExecutor`` fans requests out over one pool per TPU chip.

    ``memory_limit_mb`` bounds each worker's resident memory (default: half the RAM,
    at most 16 GiB); ``env_overrides`` are added to the (secret-free) environment.
    ``on_state_change(state)`` is called whenever ``state`` changes.
    """

    name = "local"

    def __init__(self, size: int = 1, env_overrides: Mapping[str, str] | None = None, *,
                 memory_limit_mb: int | None = None, startup_timeout_s: float = 180.0,
                 on_state_change: Callable[[str], None] | None = None) -> None:
        if size < 1:
            raise ValueError("a WorkerPool needs at least one worker")
        self.size = size
        # A candidate must not read the app's environment or memory through /proc.
        self.app_protection = _confinement.protect_app()
        self.env = worker_environment(overrides=env_overrides)
        self.estimate_cache = _estimate_cache(self.env)
        _calibration_file(self.env)
        self.confinement: dict[str, Any] | None = None  # the latest worker's report
        self.memory_limit_mb = memory_limit_mb or _default_memory_limit_mb()
        self.startup_timeout_s = startup_timeout_s
        self.on_state_change = on_state_change
        self._idle: asyncio.Queue[WorkerProcess | BaseException] | None = None
        self._workers: dict[str, WorkerProcess] = {}
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
        # What apps that died without closing left in the temp dir (a dropped terminal).
        await asyncio.to_thread(sweep_scratch)
        self._idle = asyncio.Queue()
        self._starting = self.size
        self._update_state()
        results = await asyncio.gather(*(self._spawn() for _ in range(self.size)),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.close()
            raise errors[0]

    async def _spawn(self, restarting: bool = False) -> WorkerProcess:
        worker = WorkerProcess()
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
        if worker.confinement is not None:
            self.confinement = {**worker.confinement, "app": self.app_protection}
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
            worker.killed_for = worker.killed_for or "closed"
            await worker.kill()
            worker.close_channel()
        self._workers.clear()
        self._busy.clear()
        self._started = False
        if self._idle is not None:
            self._idle.put_nowait(_CLOSED)  # requests waiting for a worker give up
        self._update_state()

    @property
    def capacity(self) -> int:
        return self.size

    def describe(self) -> str:
        return f"local: {self.size} worker process(es) ({usable_cores()} cores)"

    def set_state_listener(self, callback: StateListener | None) -> None:
        self.on_state_change = cast("Callable[[str], None] | None", callback)

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._workers.values() if w.pid is not None]

    @property
    def state(self) -> JudgeState:
        return cast(JudgeState, self._state)

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

    async def _acquire(self) -> WorkerProcess:
        await self.start()
        queue = self._idle
        assert queue is not None
        while True:
            if self._closed or queue is not self._idle:
                queue.put_nowait(_CLOSED)  # wake the next waiter too
                raise WorkerFailure("cancelled", "the worker pool was closed")
            if (not self._workers and not self._starting and not self._restarting
                    and self._idle.empty() and not self._closed):
                self._restarting += 1  # every worker died and its replacement failed: retry
                self._update_state()
                task = asyncio.ensure_future(self._spawn(restarting=True))
                self._tasks.add(task)
                task.add_done_callback(self._spawn_done)
            item = await queue.get()
            if item is _CLOSED:
                continue  # re-checked at the top of the loop
            if isinstance(item, BaseException):
                if not self._workers and not self._restarting:
                    raise WorkerStartError(f"no worker could be started: {item}") from item
                continue
            if item.name in self._workers:
                self._busy.add(item.name)
                self._update_state()
                return item

    def _release(self, worker: WorkerProcess) -> None:
        self._busy.discard(worker.name)
        if not self._closed and self._idle is not None:
            self._idle.put_nowait(worker)
        self._update_state()

    def _replace(self, worker: WorkerProcess) -> None:
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
        moved = None
        options = payload.get("options") if isinstance(payload.get("options"), dict) else {}
        if op == "profile":  # the judge answers before this deadline, within this memory
            payload = {"timeout_s": timeout, "memory_limit_mb": self.memory_limit_mb,
                       **payload}
        if op == "profile" and (payload.get("logdir") or options.get("logdir")):
            # The worker writes only to its scratch dir: the trace is moved afterwards.
            # (``logdir`` may sit at the payload's top level or in its options.)
            moved = str(payload.get("logdir") or options["logdir"])
            payload = {**payload, "logdir": None}
            if options:
                payload["options"] = {**options, "logdir": None}
        try:
            reply, stderr = await self._round_trip(op, payload, timeout)
        except TaskCopyError as exc:
            raise WorkerOpError({"type": "TaskError", "message": str(exc)}) from exc
        if not reply.get("ok"):
            raise WorkerOpError(reply.get("error") or {}, stderr)
        result = dict(reply.get("result") or {})
        if moved and isinstance(result.get("logdir"), str):
            result = await asyncio.to_thread(_move_tree, result, result["logdir"], moved)
        result["_stderr"] = stderr
        result["_handler_s"] = reply.get("handler_s")
        return result

    async def _round_trip(self, op: str, payload: dict[str, Any], timeout: float,
                          on_progress: ProgressListener | None = None
                          ) -> tuple[dict[str, Any], str]:
        worker = await self._acquire()
        mapping: dict[str, str] = {}
        if isinstance(payload.get("task"), dict):
            # The worker cannot read the user's files: it gets a copy of the task in its
            # scratch dir, and the reply gets the task's own paths back.
            try:
                spec, mapping = await asyncio.to_thread(worker.tasks.localize, payload["task"])
            except BaseException:
                self._release(worker)
                raise
            payload = {**payload, "task": spec}
        heard = None
        if on_progress is not None:
            def heard(data: dict[str, Any]) -> None:
                on_progress(restore(data, mapping))
        try:
            reply = await worker.call(op, payload, timeout, self.memory_limit_mb,
                                      on_progress=heard)
        except WorkerFailure as failure:
            failure.stderr = restore(failure.stderr, mapping)
            failure.message = restore(failure.message, mapping)
            self._replace(worker)
            raise
        except asyncio.CancelledError:
            self._replace(worker)
            raise
        except BaseException:
            self._replace(worker)  # unknown state: do not reuse it
            raise
        reply = restore(reply, mapping)
        stderr = restore(worker.read_capture(), mapping)
        result = reply.get("result")
        if isinstance(result, dict) and result.pop("_recycle", False):
            self._replace(worker)  # the candidate left it untrustworthy (patched, threads)
        elif reply.get("recycle"):
            self._replace(worker)  # the judge itself changed: never reuse it
        elif (worker.rss_mb() or 0.0) > RECYCLE_FRACTION * self.memory_limit_mb + worker.device_memory_mb:
            self._replace(worker)  # caches of many candidates add up: start afresh
        else:
            self._release(worker)
        return reply, stderr

    async def evaluate(self, task: Task, source: str, options: EvalOptions | None = None,
                       filename: str = "kernel.py",
                       on_progress: ProgressListener | None = None
                       ) -> EvalResult:
        """Evaluate candidate ``source`` on ``task``; never raises for the candidate's faults.
        ``on_progress(data)`` hears what the worker says before its result (the
        production-shape verdict and estimate, ``{kind: "production", final, tpu}``)."""
        options = options or EvalOptions()
        payload = {"task": task.to_spec(), "source": source, "filename": filename,
                   "options": {**options.to_json(), "memory_limit_mb": self.memory_limit_mb}}
        started = time.perf_counter()
        try:
            reply, stderr = await self._round_trip("eval", payload, options.timeout_s,
                                                   on_progress)
        except TaskCopyError as exc:  # the task cannot be handed over: the task's problem
            return EvalResult(
                status="runtime_error", backend=self._backend,
                error=EvalError(kind="task", message=str(exc),
                                hint="Evaluate a task directory that holds only the task."),
                duration_s=time.perf_counter() - started, confinement=self.confinement)
        except WorkerFailure as failure:
            status = "timeout" if failure.kind == "timeout" else "crashed"
            error = EvalError(kind=failure.kind, message=failure.message,
                              hint=FAILURE_HINTS.get(failure.kind))
            extra: dict[str, Any] = {}
            if failure.reached:  # how far the judge got before it was killed
                extra["phases"] = dict(failure.reached.get("phases") or {})
                extra["last_phase"] = {k: failure.reached.get(k)
                                       for k in ("phase", "shape", "at_s")}
            if failure.kind in ("timeout", "memory") and not self._closed:
                extra["reference_probe"], blamed = await self._blame(
                    task, options, failure.kind, failure.message)
            else:
                blamed = None
            result = EvalResult(
                status=status, backend=self._backend, error=error,
                duration_s=time.perf_counter() - started, stderr=failure.stderr,
                extra=extra, confinement=self.confinement)
            result.blame_task(blamed)
            return result
        if not reply.get("ok"):  # the harness itself raised: say so, never blame the kernel
            error = reply.get("error") or {}
            return EvalResult(
                status="runtime_error", backend=self._backend,
                error=EvalError(kind="harness", message=f"{error.get('type')}: "
                                f"{error.get('message')}", traceback=error.get("traceback")),
                duration_s=time.perf_counter() - started, stderr=stderr)
        result = EvalResult.from_json(reply["result"])
        result.stderr = stderr
        killed = (result.extra.get("candidate_process") or {}).get("killed")
        if killed in ("timeout", "memory") and result.error and not self._closed:
            # the judge killed the candidate process: blame the task when its reference
            # alone does not fit either (docs/SECURITY.md, "Errors blame the right party")
            result.extra["reference_probe"], blamed = await self._blame(
                task, options, killed, result.error.message)
            result.blame_task(blamed)
        result.duration_s = time.perf_counter() - started
        result.extra.setdefault("phases", {})["worker_s"] = reply.get("handler_s")
        result.confinement = self.confinement
        result.note_leftovers(reply.get("leftover_processes"))
        return result

    async def estimate(self, task: Task, source: str, options: EvalOptions | None = None,
                       filename: str = "kernel.py") -> dict[str, Any]:
        """The production-shape verdict and estimate of ``source`` without a correctness
        check (``tilewright.estimate/1``: status ok | compile_error | ..., tpu, error);
        a killed worker is reported as the status, never raised."""
        options = options or EvalOptions()
        payload = {"task": task.to_spec(), "source": source, "filename": filename,
                   "options": {**options.to_json(), "memory_limit_mb": self.memory_limit_mb}}
        try:
            reply, stderr = await self._round_trip("estimate", payload, options.timeout_s)
        except WorkerFailure as failure:
            return {"schema": ESTIMATE_SCHEMA,
                    "status": "timeout" if failure.kind == "timeout" else "crashed",
                    "tpu": None, "error": {"kind": failure.kind, "message": failure.message},
                    "stderr": failure.stderr}
        if not reply.get("ok"):
            error = reply.get("error") or {}
            return {"schema": ESTIMATE_SCHEMA, "status": "runtime_error", "tpu": None,
                    "error": {"kind": "harness", "message": f"{error.get('type')}: "
                              f"{error.get('message')}"}, "stderr": stderr}
        return {**reply["result"], "stderr": stderr}

    async def evaluate_on_chips(self, task: Task, source: str, chips: Sequence[str],
                                options: EvalOptions | None = None) -> list[EvalResult]:
        return await on_chips(self, task, source, chips, options)

    async def profile(self, task: Task, source: str, logdir: Path | None,
                      options: ProfileOptions | None = None, *,
                      filename: str = "kernel.py") -> ProfileJSON:
        """Profile one candidate into ``logdir`` (the worker's ``profile`` op: trace
        digest, static ``pallas_call`` analysis, roofline for the chip)."""
        options = options or ProfileOptions()
        payload: dict[str, Any] = {
            "task": task.to_spec(), "source": source, "filename": filename,
            "options": {**options.to_json(), "logdir": str(logdir) if logdir else None}}
        result = await self.request("profile", payload, options.timeout_s)
        stderr = result.pop("_stderr", "")
        if options.stderr:
            result["stderr"] = stderr
        return cast(ProfileJSON, result)

    async def lookup_api(self, name: str) -> ApiAnswer:
        """The installed JAX's signature and docstring for ``name`` (op ``lookup_api``)."""
        return cast(ApiAnswer, public(await self.request("lookup_api", {"name": name},
                                                         LOOKUP_TIMEOUT_S)))

    async def inputs(self, task: Task) -> InputsJSON:
        """The task's input signature per shape (op ``inputs``)."""
        return cast(InputsJSON, public(await self.request(
            "inputs", {"task": task.to_spec()}, INPUTS_TIMEOUT_S)))

    async def _blame(self, task: Task, options: EvalOptions, killed: str, message: str
                     ) -> tuple[str, EvalError | None]:
        """After a kill for ``killed`` (timeout or memory): the reference probe's word
        (fits, exceeds, unknown) and, when the task's reference alone does not fit
        either, the error that blames the task instead of the kernel."""
        fits = await self._reference_fits(task, options)
        word = {True: "fits", False: "exceeds", None: "unknown"}[fits]
        if fits is not False:
            return word, None
        what = "ran out of time" if killed == "timeout" else "exceeded the memory limit"
        return word, EvalError(
            kind="task", message=f"the task's reference alone {what} under the same limits: "
            f"a task problem, not the kernel's ({message})",
            hint="Use smaller shapes (--set KEY=VALUE), or raise --timeout / the memory "
                 "limit; the kernel was not judged.")

    async def _reference_fits(self, task: Task, options: EvalOptions) -> bool | None:
        """Run the task's reference alone (as the candidate too, so twice) with twice the
        time and the same memory: False when even that is killed (the task is at fault),
        True when it finishes, None when the probe could not say."""
        try:
            source = task.reference_source()
        except OSError:
            return None
        if task.layout == "native":
            source += "\n\nkernel = reference\n"
        probe = EvalOptions(trials=options.trials, iters=1, timeout_s=2 * options.timeout_s,
                            time_budget_s=0.0, lowering=False, timing=False,
                            shapes=options.shapes)
        payload = {"task": task.to_spec(), "source": source, "filename": "reference-probe.py",
                   "options": probe.to_json()}
        try:
            await self._round_trip("eval", payload, probe.timeout_s)
        except WorkerFailure as failure:
            return False if failure.kind in ("timeout", "memory") else None
        except (WorkerStartError, WorkerOpError, TaskCopyError):
            return None
        return True


def _move_tree(result: dict[str, Any], src: str, dest: str) -> dict[str, Any]:
    """Move a profile's files from the worker's scratch dir to ``dest`` and rewrite the
    paths in ``result`` to their new place."""
    os.makedirs(dest, exist_ok=True)
    shutil.copytree(src, dest, dirs_exist_ok=True, symlinks=True)  # never follow out
    shutil.rmtree(src, ignore_errors=True)

    def fix(value: Any) -> Any:
        if isinstance(value, str) and value.startswith(src):
            return dest + value[len(src):]
        if isinstance(value, dict):
            return {k: fix(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fix(v) for v in value]
        return value

    return fix(result)
