"""How the controller has kernels judged: ``PoolEvaluator``, the ``Evaluator`` (protocol
in ``kernels.executors``, re-exported here) over ``kernels.workers.WorkerPool``.

The controller needs ``evaluate``, ``profile``, ``backend`` and the workers' state (with
a listener for its changes); keeping them behind this seam lets tests of pure controller logic use an in-process evaluator while every
real path (the CLI, the TUI, the flow tests) runs candidates in worker processes.
Cancelling an ``evaluate`` await kills that worker and the pool starts a fresh one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernels.executors import Evaluator, StateListener
from kernels.result import Backend, EvalResult
from kernels.task import Task
from kernels.workers import EvalOptions, WorkerPool

__all__ = ["Evaluator", "PoolEvaluator"]


class PoolEvaluator:
    """``Evaluator`` over a started ``WorkerPool`` (the pool's lifetime is the caller's)."""

    def __init__(self, pool: WorkerPool, options: EvalOptions | None = None,
                 profile_timeout_s: float = 300.0, chip: str | None = None) -> None:
        self.pool = pool
        self.options = options or EvalOptions()
        self.profile_timeout_s = profile_timeout_s
        self.chip = chip  # the chip profiles are analysed for (None: the worker's own)

    async def evaluate(self, task: Task, source: str) -> EvalResult:
        return await self.pool.evaluate(task, source, self.options)

    async def evaluate_on_chips(self, task: Task, source: str,
                                chips: list[str]) -> list[EvalResult]:
        """One evaluation per TPU generation (``tilewright eval --chips``): which ones
        the TPU compiler accepts the kernel for, with VMEM and estimate each. Untimed:
        the verdicts and estimates are what is asked for."""
        from dataclasses import replace

        return [await self.pool.evaluate(task, source,
                                         replace(self.options, chip=chip, timing=False))
                for chip in chips]

    async def profile(self, task: Task, source: str, logdir: Path) -> dict[str, Any]:
        payload = {"task": task.to_spec(), "source": source, "filename": "kernel.py",
                   "logdir": str(logdir)}
        if self.chip:
            payload["chip"] = self.chip
        result = await self.pool.request("profile", payload, self.profile_timeout_s)
        result.pop("_stderr", None)
        return result

    async def lookup_api(self, name: str) -> dict[str, Any]:
        """The installed JAX's signature and docstring for ``name`` (worker op ``lookup_api``)."""
        result = await self.pool.request("lookup_api", {"name": name}, 60.0)
        return {k: v for k, v in result.items() if not k.startswith("_")}

    async def backend(self) -> Backend:
        return await self.pool.backend()

    @property
    def state(self) -> str:
        return self.pool.state

    def set_state_listener(self, callback: StateListener | None) -> None:
        self.pool.on_state_change = callback
