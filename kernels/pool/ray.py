"""Judging on a Ray cluster: ``RayExecutor``, each evaluation a Ray task.

Each evaluation is a Ray task with a resource request (``num_cpus=1`` here,
``{"TPU": chips}`` on a TPU host); inside the Ray worker the evaluation still runs in a
worker process of its own (``kernels.pool.workers``), so JAX is never imported by the Ray
driver (the app) nor by the Ray worker itself. The controller and the session log stay
on the driver; only source text, options and result JSON travel. ``ray`` is imported
lazily: it is an optional extra (``pip install tilewright[ray]``). Every node of a
cluster needs tilewright installed; a task directory the node lacks travels with the
request (small trees only, else put the suite on a shared filesystem). A Ray task
streams no progress frames: ``on_progress`` hears nothing, the result has it all.

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
import hashlib
import logging
import os
import socket
import tempfile
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tilewright.kernels.judge import protocol
from tilewright.kernels.judge.options import EvalOptions, ProfileOptions
from tilewright.kernels.judge.protocol import (
    ExecutorError,
    JudgeState,
    StateListener,
    on_chips,
)
from tilewright.kernels.judge.result import ESTIMATE_SCHEMA, Backend, EvalError, EvalResult
from tilewright.kernels.pool.local import local_worker_count
from tilewright.kernels.tasks.task import Task

if TYPE_CHECKING:
    from tilewright.kernels.pool.workers import WorkerPool

LOOPBACK = "127.0.0.1"

# A task directory is shipped along with a Ray task when the remote node does not have
# it (another host of a cluster); bigger trees must be on a shared filesystem.
_SHIP_FILE_LIMIT = 1 << 20
_SHIP_TOTAL_LIMIT = 8 << 20
# A profile's logdir (xplane trace, Perfetto JSON) travels back from a Ray node up to
# this size; a bigger one stays on the node and the result says where.
_PROFILE_SHIP_LIMIT = 64 << 20

_T = TypeVar("_T")


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
        self.pool: WorkerPool | None = None

    @classmethod
    def get(cls) -> _EvalHost:
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def call(self, work: Callable[[WorkerPool], Awaitable[_T]]) -> _T:
        """``work(pool)`` on this node's worker pool (started on first use), from the Ray
        task's thread."""
        async def run() -> _T:
            from tilewright.kernels.pool.workers import WorkerPool

            if self.pool is None:
                pool = WorkerPool(size=1)
                await pool.__aenter__()
                self.pool = pool
            return await work(self.pool)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()


def _node() -> dict[str, Any]:
    return {"name": "ray", "node": os.uname().nodename}


def ray_backend() -> dict[str, Any]:
    """Body of a Ray task that reports the backend of this node's evaluation worker (as
    plain data: the driver rebuilds the ``Backend``)."""
    return asdict(_EvalHost.get().call(lambda pool: pool.backend()))


def ray_evaluate(packed: dict[str, Any], source: str, options: dict[str, Any],
                 filename: str = "kernel.py") -> dict[str, Any]:
    """Body of the Ray task: evaluate in a worker process of this node, return eval JSON."""
    task = _unpack_task(packed)
    result = _EvalHost.get().call(lambda pool: pool.evaluate(
        task, source, EvalOptions.from_json(options), filename=filename))
    data = result.to_json()
    data.setdefault("extra", {})["executor"] = _node()
    return data


def ray_estimate(packed: dict[str, Any], source: str, options: dict[str, Any],
                 filename: str = "kernel.py") -> dict[str, Any]:
    """Body of an estimating Ray task: ``tilewright.estimate/1`` from this node."""
    task = _unpack_task(packed)
    return _EvalHost.get().call(lambda pool: pool.estimate(
        task, source, EvalOptions.from_json(options), filename=filename))


def ray_lookup(name: str) -> dict[str, Any]:
    """Body of a Ray task that looks ``name`` up in this node's JAX."""
    return _EvalHost.get().call(lambda pool: pool.lookup_api(name))


def ray_inputs(packed: dict[str, Any]) -> dict[str, Any]:
    """Body of a Ray task that runs the task's input builder abstractly on this node."""
    task = _unpack_task(packed)
    return _EvalHost.get().call(lambda pool: pool.inputs(task))


def ray_profile(packed: dict[str, Any], source: str, options: dict[str, Any],
                filename: str = "kernel.py") -> dict[str, Any]:
    """Body of a profiling Ray task: profile in a worker process of this node into a
    scratch logdir, and send back the result with the logdir's files (the trace, the
    Perfetto JSON) when they fit ``_PROFILE_SHIP_LIMIT``; the driver writes them into
    the session."""
    import shutil

    task = _unpack_task(packed)
    wanted = ProfileOptions.from_json(options)
    logdir = Path(tempfile.mkdtemp(prefix="tilewright-ray-profile-"))
    payload: dict[str, Any] = {"task": task.to_spec(), "source": source,
                               "filename": filename,
                               "options": {**wanted.to_json(), "logdir": str(logdir)}}
    try:
        result = _EvalHost.get().call(
            lambda pool: pool.request("profile", payload, wanted.timeout_s))
        stderr = result.pop("_stderr", "")
        if options.get("stderr"):
            result["stderr"] = stderr
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
        self._slots: asyncio.Semaphore | None = None
        self._running = 0  # submissions holding a slot
        self._state: JudgeState = "stopped"
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
        if self.address:  # asked for a cluster: one nobody answers at fails here, even
            _check_reachable(self.address)  # while this process holds another one
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "logging_level": logging.ERROR,
                "log_to_driver": False,
                "configure_logging": True,
            }
            if self.address:
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
        self._slots = asyncio.Semaphore(self.capacity)

    async def close(self) -> None:
        if self._ray is not None and self._owns_ray:
            await asyncio.to_thread(self._ray.shutdown)
        self._owns_ray = False
        self._slots = None
        self._set_state("stopped")

    async def __aenter__(self) -> RayExecutor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def evaluate(self, task: Task, source: str, options: EvalOptions | None = None, *,
                       filename: str = "kernel.py",
                       on_progress: protocol.ProgressListener | None = None) -> EvalResult:
        """Run one evaluation as a Ray task; cancelling the caller force-cancels it. A Ray
        task streams no progress: ``on_progress`` hears nothing."""
        try:
            data = await self._run(ray_evaluate, "tilewright.eval", task, source,
                                   (options or EvalOptions()).to_json(), filename)
        except self._ray_error() as exc:
            return EvalResult(status="crashed", backend=None, error=EvalError(
                kind="crashed", message=f"Ray task failed: {type(exc).__name__}: {exc}"))
        return EvalResult.from_json(data)

    async def evaluate_on_chips(self, task: Task, source: str, chips: Sequence[str],
                                options: EvalOptions | None = None) -> list[EvalResult]:
        return await on_chips(self, task, source, chips, options)

    async def estimate(self, task: Task, source: str, options: EvalOptions | None = None, *,
                       filename: str = "kernel.py") -> protocol.EstimateJSON:
        """The production verdict and estimate as a Ray task; a failed task is the
        status (``crashed``), as a killed worker is."""
        try:
            return await self._run(ray_estimate, "tilewright.estimate", task, source,
                                   (options or EvalOptions()).to_json(), filename)
        except self._ray_error() as exc:
            return {"schema": ESTIMATE_SCHEMA, "status": "crashed", "tpu": None,
                    "error": {"kind": "crashed",
                              "message": f"Ray task failed: {type(exc).__name__}: {exc}"},
                    "stderr": ""}

    async def lookup_api(self, name: str) -> protocol.ApiAnswer:
        try:
            return await self._run(ray_lookup, "tilewright.lookup_api", None, name)
        except self._ray_error() as exc:
            raise _failure(exc) from exc

    async def inputs(self, task: Task) -> protocol.InputsJSON:
        try:
            return await self._run(ray_inputs, "tilewright.inputs", task)
        except self._ray_error() as exc:
            raise _failure(exc) from exc

    async def profile(self, task: Task, source: str, logdir: Path | None,
                      options: ProfileOptions | None = None, *,
                      filename: str = "kernel.py") -> protocol.ProfileJSON:
        """Profile one candidate as a Ray task on an evaluation node (same resources as
        an evaluation); its trace files are written into ``logdir`` here (the session's)
        and the result's paths point at them."""
        wanted = options or ProfileOptions()
        data = {**wanted.to_json(), "stderr": wanted.stderr}
        try:
            shipped: dict[str, Any] = await self._run(ray_profile, "tilewright.profile",
                                                      task, source, data, filename)
        except self._ray_error() as exc:
            raise _failure(exc) from exc
        result: dict[str, Any] = shipped["result"]
        files = shipped.get("files")
        if files is None or logdir is None:
            if files is None:
                result["trace_note"] = (f"the trace stayed on Ray node {shipped.get('node')} "
                                        f"(over {_PROFILE_SHIP_LIMIT >> 20} MiB)")
            return result
        logdir = Path(logdir)
        for rel, blob in files.items():
            dest = logdir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(dest.write_bytes, blob)
        relocated: dict[str, Any] = _relocate(result, shipped["logdir"], str(logdir))
        relocated.setdefault("extra", {})["executor"] = {"name": "ray",
                                                         "node": shipped.get("node")}
        return relocated

    async def _run(self, body: Callable[..., Any], name: str, task: Task | None,
                   *args: Any) -> Any:
        """``body(packed task, *args)`` (without a task: ``body(*args)``) as a Ray task
        holding one evaluation slot; cancelling the caller force-cancels it."""
        if self._ray is None or self._slots is None or self.resources is None:
            raise ExecutorError(f"RayExecutor.{name.split('.')[-1]} before start(): use "
                                "`async with`")
        remote = self._on_a_node(body, name)
        # Packing reads the task's files: off the event loop the UI shares.
        packed = [await asyncio.to_thread(_pack_task, task)] if task is not None else []
        async with self._slots:
            self._count_running(+1)
            try:
                return await self._awaited(remote.remote(*packed, *args))
            finally:
                self._count_running(-1)

    def _ray_error(self) -> type[BaseException] | tuple[()]:
        """Ray's task failure (nothing to catch before Ray is imported)."""
        return self._ray.exceptions.RayError if self._ray is not None else ()

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
    def state(self) -> JudgeState:
        """stopped, starting, then idle or busy (any submission running on the cluster)."""
        return self._state

    def set_state_listener(self, callback: StateListener | None) -> None:
        self._listener = callback

    def _set_state(self, state: JudgeState) -> None:
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


def _failure(exc: BaseException) -> Exception:
    """A failed Ray task as the protocol's failure of the worker that served it."""
    from tilewright.kernels.pool.process import WorkerFailure

    return WorkerFailure("crashed", f"Ray task failed: {type(exc).__name__}: {exc}")
