"""Where evaluations run: on this machine's worker processes, or on a Ray cluster.

An ``Executor`` takes ``(task, source, options)`` and returns an ``EvalResult``; its
``capacity`` says how many evaluations it runs at once, so a search knows how many
candidates to keep in flight. Two implementations:

- ``LocalExecutor``: N long-lived worker processes (``kernels.workers.WorkerPool``),
  N bounded by the CPU cores and, on a TPU host, by the chips (one chip per worker).
- ``RayExecutor``: each evaluation is a Ray task with a resource request
  (``num_cpus=1`` here, ``{"TPU": chips}`` on a TPU host); inside the Ray worker the
  evaluation still runs in a worker process of its own (``kernels.workers``), so JAX is
  never imported by the Ray driver (the app) nor by the Ray worker itself. The
  controller and the session log stay on the driver. ``ray`` is imported lazily: it is
  an optional extra (``pip install tilewright[ray]``). Every node of a cluster needs
  tilewright installed; a task directory the node lacks travels with the request
  (small trees only, else put the suite on a shared filesystem).

Both are ``Judge``s, as is the controller's ``Evaluator``: one protocol says what every
judge exposes (its workers' ``state``, a listener for its changes, the ``Backend`` its
evaluations run on), and ``Evaluator`` (one session, its options fixed) and ``Executor``
(a search, many evaluations at once) extend it. The controller's evaluator is built on a
``LocalExecutor`` too (``sessions.evaluator.PoolEvaluator``), so one class wraps
``WorkerPool`` for both.

A local Ray instance (no ``--address``) listens on loopback only (GCS, raylet, object
store, dashboard agent): Ray has no authentication, and its own security guidance is
to never expose its ports to an untrusted network. A remote cluster is the user's
explicit choice (``--address``); keep it on a private network or behind a firewall, as
docs/SECURITY.md says.

App-side module: no JAX here.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import logging
import os
import socket
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from kernels.result import Backend, EvalResult
from kernels.task import Task

if TYPE_CHECKING:
    from kernels.workers import WorkerPool

EXECUTORS = ("local", "ray")
LOOPBACK = "127.0.0.1"

# A task directory is shipped along with a Ray task when the remote node does not have
# it (another host of a cluster); bigger trees must be on a shared filesystem.
_SHIP_FILE_LIMIT = 1 << 20
_SHIP_TOTAL_LIMIT = 8 << 20
# A profile's logdir (xplane trace, Perfetto JSON) travels back from a Ray node up to
# this size; a bigger one stays on the node and the result says where.
_PROFILE_SHIP_LIMIT = 64 << 20


class ExecutorError(Exception):
    """An executor that cannot start: says why and what to do about it."""


StateListener = Callable[[str], None]

# What a judge's ``state`` says, from least to most pressing: several pools combine to
# the most pressing of their states (busy when any worker is busy, restarting when any
# is restarting).
STATES = ("stopped", "idle", "busy", "starting", "restarting")


def combined_state(states: Iterable[str]) -> str:
    """One state for several pools: the most pressing of theirs ("stopped" for none)."""
    rank = {name: i for i, name in enumerate(STATES)}
    return max(states, key=lambda st: rank.get(st, 0), default="stopped")


@runtime_checkable
class Judge(Protocol):
    """What everything that judges kernels exposes, whichever side uses it: its workers'
    state (one of ``STATES``), one listener for that state's changes (None detaches
    it), and where evaluations run (None before there is anything to ask)."""

    @property
    def state(self) -> str: ...

    def set_state_listener(self, callback: StateListener | None) -> None: ...

    async def backend(self) -> Backend | None: ...


@runtime_checkable
class Evaluator(Judge, Protocol):
    """What a session's controller needs (``sessions.evaluator.PoolEvaluator`` over a
    ``LocalExecutor``): evaluate and profile one source with the session's options, and
    compile it for other TPU generations (``evaluate_on_chips``, untimed)."""

    async def evaluate(self, task: Task, source: str) -> EvalResult: ...

    async def evaluate_on_chips(self, task: Task, source: str,
                                chips: list[str]) -> list[EvalResult]: ...

    async def profile(self, task: Task, source: str, logdir: Path) -> dict[str, Any]: ...


@runtime_checkable
class Executor(Judge, Protocol):
    """What a search needs: ``capacity`` evaluations at once, each with its options."""

    name: str  # "local" | "ray"
    capacity: int  # evaluations run at once

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def submit(self, task: Task, source: str, options: Any = None) -> EvalResult: ...

    async def profile(self, task: Task, source: str, logdir: Path, chip: str | None = None,
                      timeout_s: float = 300.0) -> dict[str, Any]: ...

    def describe(self) -> str: ...


def usable_cores() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def local_tpu_chips() -> int:
    """TPU chips on this host, found without JAX: /dev/accel* (v4, v5e) or /dev/vfio/N."""
    visible = os.environ.get("TPU_VISIBLE_CHIPS")
    if visible:
        return len([c for c in visible.split(",") if c.strip()])
    accel = glob.glob("/dev/accel[0-9]*")
    if accel:
        return len(accel)
    return len([p for p in glob.glob("/dev/vfio/*") if Path(p).name.isdigit()])


def chip_env(chip: int, port: int) -> dict[str, str]:
    """Environment that pins one worker process to one TPU chip of the host."""
    return {
        "TPU_VISIBLE_CHIPS": str(chip),
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_PORT": str(port),
        "TPU_PROCESS_ADDRESSES": f"localhost:{port}",
        "CLOUD_TPU_TASK_ID": "0",
    }


def local_worker_count(requested: int | None = None) -> int:
    """Workers for a LocalExecutor: what was asked, at most one per core and per chip."""
    cores = usable_cores()
    chips = local_tpu_chips()
    limit = min(cores, chips) if chips else cores
    if requested is None:
        return max(1, limit)
    if requested < 1:
        raise ExecutorError(f"--workers must be at least 1 (got {requested})")
    return min(requested, max(1, limit))


def _options_dict(options: Any) -> dict[str, Any] | None:
    if options is None:
        return None
    if isinstance(options, dict):
        return dict(options)
    return asdict(options)


def _eval_options(data: dict[str, Any] | None) -> Any:
    from kernels.workers import EvalOptions

    return EvalOptions(**data) if data else None


class LocalExecutor:
    """Evaluations on this machine's worker processes.

    On a CPU host one ``WorkerPool(size=N)``; on a TPU host with several chips one
    single-worker pool per chip, each pinned to its chip. With several pools a free-slot
    queue hands each submission a pool with an idle worker, so ``capacity`` evaluations
    run at once; a single pool queues its requests itself.

    ``LocalExecutor.over(pool)`` wraps a ``WorkerPool`` its caller starts and closes (a
    session's controller judges through one: ``sessions.evaluator.PoolEvaluator``); the
    executor's ``close`` leaves that pool running.
    """

    name = "local"

    def __init__(self, workers: int | None = None, env_overrides: dict[str, str] | None = None,
                 ) -> None:
        self.capacity = local_worker_count(workers)
        self._env = dict(env_overrides or {})
        self._pools: list[WorkerPool] = []
        self._owned = True  # False: the pools are the caller's, close() leaves them
        self._free: asyncio.Queue[WorkerPool] | None = None  # only with several pools
        self._chips = local_tpu_chips()
        self._listener: StateListener | None = None
        self._reported = "stopped"  # the state the listener was last told

    @classmethod
    def over(cls, pool: WorkerPool) -> LocalExecutor:
        """An executor over ``pool``, whose lifetime stays the caller's (started or not:
        its first request starts it)."""
        executor = cls(workers=1)
        executor.capacity = pool.size
        executor._pools = [pool]
        executor._owned = False
        return executor

    async def start(self) -> None:
        from kernels.workers import WorkerPool

        if self._pools:
            if not self._owned:
                await self._pools[0].start()  # a no-op when the caller started it
            return
        if self._chips > 1 and self.capacity > 1:
            self._pools = [
                WorkerPool(size=1, env_overrides={**self._env, **chip_env(i, 8476 + i)})
                for i in range(self.capacity)
            ]
        else:
            self._pools = [WorkerPool(size=self.capacity, env_overrides=self._env or None)]
        for pool in self._pools:
            self._hook(pool)  # a listener set before start() sees "starting"
        started: list[WorkerPool] = []
        try:
            for pool in self._pools:
                await pool.__aenter__()
                started.append(pool)
        except BaseException:
            for pool in started:
                await pool.__aexit__(None, None, None)
            self._pools = []
            raise
        if len(self._pools) > 1:
            self._free = asyncio.Queue()
            per_pool = self.capacity // len(self._pools)
            for pool in self._pools:
                for _ in range(per_pool):
                    self._free.put_nowait(pool)

    async def close(self) -> None:
        if not self._owned:
            return  # the caller's pool: it closes it
        pools, self._pools, self._free = self._pools, [], None
        for pool in pools:
            await pool.__aexit__(None, None, None)

    async def __aenter__(self) -> LocalExecutor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def _slot(self, what: str) -> AsyncIterator[WorkerPool]:
        """A pool with a worker for this request (held until the request is done)."""
        if not self._pools:
            raise ExecutorError(f"LocalExecutor.{what} before start(): use `async with`")
        if self._free is None:
            yield self._pools[0]
            return
        pool = await self._free.get()
        try:
            yield pool
        finally:
            self._free.put_nowait(pool)

    async def submit(self, task: Task, source: str, options: Any = None,
                     on_progress: Callable[[dict[str, Any]], None] | None = None
                     ) -> EvalResult:
        """Evaluate one candidate; cancelling the caller kills and replaces that worker.
        ``on_progress`` hears the worker's progress (``WorkerPool.evaluate``)."""
        async with self._slot("submit") as pool:
            return await pool.evaluate(task, source, options, on_progress=on_progress)

    async def request(self, op: str, payload: dict[str, Any],
                      timeout: float = 120.0) -> dict[str, Any]:
        """Run worker op ``op`` on a free worker: ``WorkerPool.request``'s result dict
        (the request's captured stderr under ``"_stderr"``)."""
        async with self._slot(op) as pool:
            return await pool.request(op, payload, timeout)

    async def profile(self, task: Task, source: str, logdir: Path, chip: str | None = None,
                      timeout_s: float = 300.0) -> dict[str, Any]:
        """Profile one candidate into ``logdir`` on a free worker (the worker's ``profile``
        op: trace digest, static ``pallas_call`` analysis, roofline for ``chip``)."""
        payload: dict[str, Any] = {"task": task.to_spec(), "source": source,
                                   "filename": "kernel.py", "logdir": str(logdir)}
        if chip:
            payload["chip"] = chip
        result = await self.request("profile", payload, timeout_s)
        result.pop("_stderr", None)
        return result

    async def backend(self) -> Backend | None:
        """Where evaluations run (platform, mode, device kind, JAX version); None before
        start()."""
        if not self._pools:
            return None
        return await self._pools[0].backend()

    @property
    def state(self) -> str:
        """The workers' state: busy when any worker is, restarting when any is, ..."""
        return combined_state(pool.state for pool in self._pools)

    def set_state_listener(self, callback: StateListener | None) -> None:
        self._listener = callback
        self._reported = self.state
        for pool in self._pools:
            self._hook(pool)

    def _hook(self, pool: WorkerPool) -> None:
        if self._listener is not None:
            pool.on_state_change = self._pool_changed
        elif pool.on_state_change == self._pool_changed:
            # Only our own hook: a pool the caller shares may have another listener now.
            pool.on_state_change = None

    def _pool_changed(self, _pool_state: str) -> None:
        state = self.state
        if state != self._reported and self._listener is not None:
            self._reported = state
            self._listener(state)

    def describe(self) -> str:
        where = f"{self._chips} TPU chips" if self._chips else f"{usable_cores()} cores"
        return f"local: {self.capacity} worker process(es) ({where})"


# -- Ray ------------------------------------------------------------------------------

def _pack_task(task: Task) -> dict[str, Any]:
    """The task spec plus its files (small trees only), for nodes without the directory."""
    spec = task.to_spec()
    files: dict[str, str] = {}
    total = 0
    root = Path(task.root)
    for path in sorted(root.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        size = path.stat().st_size
        total += size
        if size > _SHIP_FILE_LIMIT or total > _SHIP_TOTAL_LIMIT:
            files = {}  # too big to ship: the cluster must share the filesystem
            break
        try:
            files[str(path.relative_to(root))] = path.read_text()
        except UnicodeDecodeError:
            files = {}
            break
    return {"spec": spec, "files": files}


def _unpack_task(packed: dict[str, Any]) -> Task:
    """Rebuild the Task on a Ray node, writing its files to a cache dir if it lacks them."""
    spec = dict(packed["spec"])
    root = Path(spec["root"])
    files = packed.get("files") or {}
    if not root.exists() and files:
        digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:16]
        local = Path(tempfile.gettempdir()) / "tilewright-ray-tasks" / digest
        if not local.exists():
            staging = Path(tempfile.mkdtemp(prefix="stage-", dir=local.parent
                                            if local.parent.exists() else None))
            for rel, text in files.items():
                dest = staging / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(text)
            local.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):  # another task may have won the race
                staging.rename(local)
        for key in ("root", "reference_path", "kernel_path", "input_gen_path"):
            if spec.get(key):
                spec[key] = str(local / Path(spec[key]).relative_to(root))
    return Task.from_spec(spec)


class _EvalHost:
    """One per Ray worker process: an event loop thread holding a one-worker pool.

    Ray reuses its worker processes between tasks, so the JAX worker started for the
    first evaluation serves the following ones (no JAX import per evaluation).
    """

    _instance: _EvalHost | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="tilewright-eval-host")
        self.thread.start()
        self.pool: Any = None

    @classmethod
    def get(cls) -> _EvalHost:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    async def _started(self) -> Any:
        from kernels.workers import WorkerPool

        if self.pool is None:
            pool = WorkerPool(size=1)
            await pool.__aenter__()
            self.pool = pool
        return self.pool

    async def _evaluate(self, task: Task, source: str, options: Any) -> EvalResult:
        return await (await self._started()).evaluate(task, source, options)

    async def _request(self, op: str, payload: dict[str, Any], timeout: float
                       ) -> dict[str, Any]:
        return await (await self._started()).request(op, payload, timeout)

    def request(self, op: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        future = asyncio.run_coroutine_threadsafe(self._request(op, payload, timeout),
                                                  self.loop)
        return future.result()

    def evaluate(self, task: Task, source: str, options: Any) -> EvalResult:
        future = asyncio.run_coroutine_threadsafe(self._evaluate(task, source, options),
                                                  self.loop)
        return future.result()


def ray_backend() -> dict[str, Any]:
    """Body of a Ray task that reports the backend of this node's evaluation worker (as
    plain data: the driver rebuilds the ``Backend``)."""
    host = _EvalHost.get()

    async def backend() -> dict[str, Any]:
        from kernels.workers import WorkerPool

        if host.pool is None:
            pool = WorkerPool(size=1)
            await pool.__aenter__()
            host.pool = pool
        return asdict(await host.pool.backend())

    return asyncio.run_coroutine_threadsafe(backend(), host.loop).result()


def ray_evaluate(packed: dict[str, Any], source: str, options: dict[str, Any] | None,
                 ) -> dict[str, Any]:
    """Body of the Ray task: evaluate in a worker process of this node, return eval JSON."""
    task = _unpack_task(packed)
    result = _EvalHost.get().evaluate(task, source, _eval_options(options))
    data = result.to_json()
    data.setdefault("extra", {})["executor"] = {"name": "ray", "node": os.uname().nodename}
    return data


def ray_profile(packed: dict[str, Any], source: str, chip: str | None,
                timeout_s: float) -> dict[str, Any]:
    """Body of a profiling Ray task: profile in a worker process of this node into a
    scratch logdir, and send back the result with the logdir's files (the trace, the
    Perfetto JSON) when they fit ``_PROFILE_SHIP_LIMIT``; the driver writes them into
    the session."""
    import shutil

    task = _unpack_task(packed)
    logdir = Path(tempfile.mkdtemp(prefix="tilewright-ray-profile-"))
    payload: dict[str, Any] = {"task": task.to_spec(), "source": source,
                               "filename": "kernel.py", "logdir": str(logdir)}
    if chip:
        payload["chip"] = chip
    try:
        result = _EvalHost.get().request("profile", payload, timeout_s)
        result.pop("_stderr", None)
        files: dict[str, bytes] | None = {}
        total = 0
        for path in sorted(logdir.rglob("*")):
            if not path.is_file():
                continue
            total += path.stat().st_size
            if total > _PROFILE_SHIP_LIMIT:
                files = None
                break
            files[str(path.relative_to(logdir))] = path.read_bytes()  # type: ignore[index]
        return {"result": result, "logdir": str(logdir), "files": files,
                "node": os.uname().nodename}
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def _relocate(value: Any, old: str, new: str) -> Any:
    """``value`` with every path under ``old`` (the node's scratch logdir) moved to ``new``."""
    if isinstance(value, str):
        return new + value[len(old):] if value == old or value.startswith(old + "/") else value
    if isinstance(value, list):
        return [_relocate(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _relocate(v, old, new) for k, v in value.items()}
    return value


class RayExecutor:
    """Evaluations as Ray tasks, on a local Ray instance or the cluster at ``address``.

    ``resources`` is the request of one evaluation (default ``{"TPU": 1}`` where the
    cluster has TPUs, else one CPU). ``capacity`` is how many such requests the
    cluster can hold at once (or ``workers`` when given). The driver process (this one)
    keeps the controller and the session log; only source text and eval JSON travel.
    """

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None,
                 resources: dict[str, float] | None = None, num_cpus: int | None = None,
                 ) -> None:
        self.address = address
        self.requested = workers
        self.resources = dict(resources) if resources else None
        self.num_cpus = num_cpus  # of a local instance started here
        self.capacity = workers or 1
        self._ray: Any = None
        self._owns_ray = False
        self._remote: Any = None
        self._slots: asyncio.Semaphore | None = None
        self._running = 0  # submissions holding a slot
        self._state = "stopped"
        self._listener: StateListener | None = None

    async def start(self) -> None:
        self._set_state("starting")
        try:
            await self._start()
        except BaseException:
            self._set_state("stopped")
            raise
        self._set_state("busy" if self._running else "idle")

    async def _start(self) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ExecutorError(
                "the ray executor needs Ray: pip install 'tilewright[ray]' "
                "(or use --executor local)") from exc
        self._ray = ray
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "logging_level": logging.ERROR,
                "log_to_driver": False,
                "configure_logging": True,
            }
            if self.address:
                _check_reachable(self.address)
                kwargs["address"] = self.address
            else:
                kwargs["num_cpus"] = self.num_cpus or self.requested or local_worker_count()
                kwargs["object_store_memory"] = 80 * 1024 * 1024
                # Loopback only: Ray's services have no authentication.
                _ray_on_loopback(ray)
                kwargs["dashboard_host"] = LOOPBACK
            # Ray's own loggers go to stderr before logging_level applies; quiet them.
            logging.getLogger("ray").setLevel(logging.ERROR)
            try:
                await asyncio.to_thread(ray.init, **kwargs)
            except ConnectionError as exc:
                raise ExecutorError(
                    f"cannot reach a Ray cluster at {self.address}: {exc} "
                    "(start one with `ray start --head`, or drop --address)") from exc
            self._owns_ray = True
        total = ray.cluster_resources()
        if self.resources is None:
            chips = total.get("TPU", 0)
            self.resources = {"TPU": 1.0} if chips else {"CPU": 1.0}
        fits = min(int(total.get(k, 0) // v) for k, v in self.resources.items() if v > 0)
        if fits < 1:
            raise ExecutorError(
                f"the Ray cluster cannot hold one evaluation's request {self.resources} "
                f"(it has {dict(total)})")
        self.capacity = min(self.requested, fits) if self.requested else fits
        self._remote = self._on_a_node(ray_evaluate, "tilewright.eval")
        self._slots = asyncio.Semaphore(self.capacity)

    async def close(self) -> None:
        if self._ray is not None and self._owns_ray:
            await asyncio.to_thread(self._ray.shutdown)
        self._owns_ray = False
        self._remote = None
        self._set_state("stopped")

    async def __aenter__(self) -> RayExecutor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def submit(self, task: Task, source: str, options: Any = None) -> EvalResult:
        """Run one evaluation as a Ray task; cancelling the caller force-cancels it."""
        if self._remote is None or self._slots is None:
            raise ExecutorError("RayExecutor.submit before start(): use `async with`")
        async with self._slots:
            self._count_running(+1)
            try:
                data = await self._run(task, source, options)
            finally:
                self._count_running(-1)
        if isinstance(data, EvalResult):
            return data
        return EvalResult.from_json(data)

    async def _run(self, task: Task, source: str, options: Any) -> dict[str, Any] | EvalResult:
        # Packing reads the task's files: off the event loop the UI shares.
        packed = await asyncio.to_thread(_pack_task, task)
        try:
            data: dict[str, Any] = await self._awaited(
                self._remote.remote(packed, source, _options_dict(options)))
        except self._ray.exceptions.RayError as exc:
            from kernels.result import EvalError

            return EvalResult(status="crashed", backend=None, error=EvalError(
                kind="crashed", message=f"Ray task failed: {type(exc).__name__}: {exc}"))
        return data

    async def profile(self, task: Task, source: str, logdir: Path, chip: str | None = None,
                      timeout_s: float = 300.0) -> dict[str, Any]:
        """Profile one candidate as a Ray task on an evaluation node (same resources as
        an evaluation); its trace files are written into ``logdir`` here, the session's,
        and the result's paths point at them."""
        if self._ray is None or self._slots is None or self.resources is None:
            raise ExecutorError("RayExecutor.profile before start(): use `async with`")
        remote = self._on_a_node(ray_profile, "tilewright.profile")
        packed = await asyncio.to_thread(_pack_task, task)
        async with self._slots:
            self._count_running(+1)
            try:
                shipped: dict[str, Any] = await self._awaited(
                    remote.remote(packed, source, chip, timeout_s))
            finally:
                self._count_running(-1)
        result: dict[str, Any] = shipped["result"]
        files = shipped.get("files")
        if files is None:
            result["trace_note"] = (f"the trace stayed on Ray node {shipped.get('node')} "
                                    f"(over {_PROFILE_SHIP_LIMIT >> 20} MiB)")
            return result
        logdir = Path(logdir)
        for rel, data in files.items():
            dest = logdir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(dest.write_bytes, data)
        relocated: dict[str, Any] = _relocate(result, shipped["logdir"], str(logdir))
        relocated.setdefault("extra", {})["executor"] = {"name": "ray",
                                                         "node": shipped.get("node")}
        return relocated

    def _on_a_node(self, body: Callable[..., Any], name: str) -> Any:
        """``body`` as a Ray remote function with one evaluation's resource request."""
        assert self._ray is not None and self.resources is not None
        cpus = self.resources.get("CPU", 0.0)
        custom = {k: v for k, v in self.resources.items() if k != "CPU"}
        return self._ray.remote(body).options(num_cpus=cpus, resources=custom or None,
                                              max_retries=0, name=name)

    async def _awaited(self, ref: Any) -> Any:
        """A Ray task's result; cancelling the caller force-cancels the task (which kills
        that Ray worker; its JAX worker child dies with it)."""
        try:
            return await ref
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)
            raise

    def _count_running(self, delta: int) -> None:
        self._running += delta
        if self._state in ("idle", "busy"):  # not once closed
            self._set_state("busy" if self._running else "idle")

    @property
    def state(self) -> str:
        """stopped, starting, then idle or busy (any submission running on the cluster)."""
        return self._state

    def set_state_listener(self, callback: StateListener | None) -> None:
        self._listener = callback

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            if self._listener is not None:
                self._listener(state)

    async def backend(self) -> Backend | None:
        """The backend of one evaluation node (the first to answer); None before start()
        or when no node answers."""
        if self._ray is None or self.resources is None:
            return None
        remote = self._on_a_node(ray_backend, "tilewright.backend")
        try:
            data = await remote.remote()
        except self._ray.exceptions.RayError:
            return None
        return Backend(**data)

    def describe(self) -> str:
        where = self.address or "local Ray instance"
        return f"ray: {self.capacity} concurrent evaluation(s) on {where}, each {self.resources}"


def _ray_on_loopback(ray: Any) -> None:
    """Make a local Ray instance bind 127.0.0.1. Ray turns "127.0.0.1" given as the node
    address into the host's outward IP, except where clusters are disabled (its macOS
    and Windows default); that switch is an environment variable read at import, so it
    is set for Ray's child processes and on the already imported constants module."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    with contextlib.suppress(ImportError, AttributeError):
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a cluster address nobody answers at (ray.init would retry for
    minutes, printing warnings). ``auto`` and addresses without a port are left to Ray."""
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ExecutorError(
            f"cannot reach a Ray cluster at {address}: {exc.strerror or exc} (start one with "
            "`ray start --head` and pass the address it prints, or drop --address to use "
            "a local Ray instance)") from None


def make_executor(kind: str, workers: int | None = None, address: str | None = None,
                  ) -> LocalExecutor | RayExecutor:
    """The executor named on the command line (``--executor local|ray``)."""
    if kind == "local":
        if address:
            raise ExecutorError("--address only applies to --executor ray")
        return LocalExecutor(workers)
    if kind == "ray":
        return RayExecutor(address=address, workers=workers)
    raise ExecutorError(f"unknown executor {kind!r}: choose one of {', '.join(EXECUTORS)}")
