"""Judging on this machine: ``LocalExecutor``, N long-lived worker processes.

N is bounded by the CPU cores this process may use and, on a TPU host, by the chips
(one chip per worker, ``chip_env`` pins it). The worker processes are
``kernels.pool.workers.WorkerPool``s, each a judge by itself; this class hands each
request to a pool with a free worker, for a search, the CLIs and the benchmarks (a
session judges through its own single pool).

App-side module: no JAX here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tilewright.kernels.judge.options import EvalOptions, ProfileOptions
from tilewright.kernels.judge.protocol import (
    ApiAnswer,
    EstimateJSON,
    ExecutorError,
    InputsJSON,
    JudgeState,
    ProfileJSON,
    ProgressListener,
    StateListener,
    combined_state,
    on_chips,
)
from tilewright.kernels.judge.result import Backend, EvalResult
from tilewright.kernels.pool.env import chip_env, local_tpu_chips, usable_cores
from tilewright.kernels.tasks.task import Task

if TYPE_CHECKING:
    from tilewright.kernels.pool.workers import WorkerPool



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


class LocalExecutor:
    """Evaluations on this machine's worker processes.

    On a CPU host one ``WorkerPool(size=N)``; on a TPU host with several chips one
    single-worker pool per chip, each pinned to its chip. With several pools a free-slot
    queue hands each submission a pool with an idle worker, so ``capacity`` evaluations
    run at once; a single pool queues its requests itself.

    On a host with at most one chip a ``WorkerPool`` is a judge by itself (a session
    judges through one); this class is what fans requests out over one pool per chip.
    """

    name = "local"

    def __init__(self, workers: int | None = None, env_overrides: dict[str, str] | None = None,
                 ) -> None:
        self.capacity = local_worker_count(workers)
        self._env = dict(env_overrides or {})
        self._pools: list[WorkerPool] = []
        self._free: asyncio.Queue[WorkerPool] | None = None  # only with several pools
        self._chips = local_tpu_chips()
        self._listener: StateListener | None = None
        self._reported = "stopped"  # the state the listener was last told

    async def start(self) -> None:
        from tilewright.kernels.pool.workers import WorkerPool

        if self._pools:
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

    async def evaluate(self, task: Task, source: str, options: EvalOptions | None = None, *,
                       filename: str = "kernel.py",
                       on_progress: ProgressListener | None = None) -> EvalResult:
        """Evaluate one candidate; cancelling the caller kills and replaces that worker.
        ``on_progress`` hears the worker's progress (``WorkerPool.evaluate``)."""
        async with self._slot("evaluate") as pool:
            return await pool.evaluate(task, source, options, filename=filename,
                                       on_progress=on_progress)

    async def evaluate_on_chips(self, task: Task, source: str, chips: Sequence[str],
                                options: EvalOptions | None = None) -> list[EvalResult]:
        return await on_chips(self, task, source, chips, options)

    async def estimate(self, task: Task, source: str, options: EvalOptions | None = None, *,
                       filename: str = "kernel.py") -> EstimateJSON:
        async with self._slot("estimate") as pool:
            return await pool.estimate(task, source, options, filename=filename)

    async def profile(self, task: Task, source: str, logdir: Path | None,
                      options: ProfileOptions | None = None, *,
                      filename: str = "kernel.py") -> ProfileJSON:
        async with self._slot("profile") as pool:
            return await pool.profile(task, source, logdir, options, filename=filename)

    async def lookup_api(self, name: str) -> ApiAnswer:
        async with self._slot("lookup_api") as pool:
            return await pool.lookup_api(name)

    async def inputs(self, task: Task) -> InputsJSON:
        async with self._slot("inputs") as pool:
            return await pool.inputs(task)

    async def request(self, op: str, payload: dict[str, Any],
                      timeout: float = 120.0) -> dict[str, Any]:
        """Run worker op ``op`` on a free worker: ``WorkerPool.request``'s result dict
        (the request's captured stderr under ``"_stderr"``)."""
        async with self._slot(op) as pool:
            return await pool.request(op, payload, timeout)

    async def backend(self) -> Backend | None:
        """Where evaluations run (platform, mode, device kind, JAX version); None before
        start()."""
        if not self._pools:
            return None
        return await self._pools[0].backend()

    @property
    def state(self) -> JudgeState:
        """The workers' state: busy when any worker is, restarting when any is, ..."""
        return combined_state(pool.state for pool in self._pools)

    def set_state_listener(self, callback: StateListener | None) -> None:
        self._listener = callback
        self._reported = self.state
        for pool in self._pools:
            self._hook(pool)

    def _hook(self, pool: WorkerPool) -> None:
        # The pools are this executor's own: it alone listens to them.
        pool.on_state_change = self._pool_changed if self._listener is not None else None

    def _pool_changed(self, _pool_state: str) -> None:
        state = self.state
        if state != self._reported and self._listener is not None:
            self._reported = state
            self._listener(state)

    def describe(self) -> str:
        where = f"{self._chips} TPU chips" if self._chips else f"{usable_cores()} cores"
        return f"local: {self.capacity} worker process(es) ({where})"
