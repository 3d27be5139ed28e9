"""How the controller has kernels judged: ``PoolEvaluator``, the ``Evaluator`` (protocol
in ``kernels.executors``, re-exported here) over a ``kernels.executors.LocalExecutor``:
the same class a search submits its candidates to, so the controller and search reach
the worker processes (``kernels.workers.WorkerPool``) through one wrapper.

The controller needs ``evaluate``, ``evaluate_on_chips``, ``profile``, ``backend`` and
the workers' state (with a listener for its changes); keeping them behind this seam lets
tests of pure controller logic use an in-process evaluator while every real path (the
CLI, the TUI, the flow tests) runs candidates in worker processes. Cancelling an
``evaluate`` await kills that worker and the pool starts a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kernels.executors import Evaluator, LocalExecutor, StateListener
from kernels.result import Backend, EvalResult
from kernels.task import Task
from kernels.workers import EvalOptions, WorkerPool

__all__ = ["Evaluator", "PoolEvaluator"]


class PoolEvaluator:
    """``Evaluator`` over a ``LocalExecutor``, every evaluation with ``options``.

    ``judge`` is that executor (the caller starts and closes it) or a ``WorkerPool``
    (wrapped with ``LocalExecutor.over``; its lifetime stays the caller's). ``chip`` is
    the TPU generation profiles are analysed for (None: the worker's own).
    """

    def __init__(self, judge: WorkerPool | LocalExecutor, options: EvalOptions | None = None,
                 profile_timeout_s: float = 300.0, chip: str | None = None) -> None:
        self.executor = judge if isinstance(judge, LocalExecutor) else LocalExecutor.over(judge)
        self.options = options or EvalOptions()
        self.profile_timeout_s = profile_timeout_s
        self.chip = chip
        self.progress_listener: Callable[[dict[str, Any]], None] | None = None

    @property
    def pool(self) -> LocalExecutor:
        """Where worker ops go (``request(op, payload, timeout)``), for evaluators that
        send their own, e.g. a profile without a trace."""
        return self.executor

    async def evaluate(self, task: Task, source: str) -> EvalResult:
        return await self.executor.submit(task, source, self.options,
                                          on_progress=self.progress_listener)

    def set_progress_listener(self, callback: Callable[[dict[str, Any]], None] | None) -> None:
        """Who hears an evaluation's progress before its result (the production-shape
        verdict and estimate while the trials run)."""
        self.progress_listener = callback

    async def evaluate_on_chips(self, task: Task, source: str,
                                chips: list[str]) -> list[EvalResult]:
        """One evaluation per TPU generation (``tilewright eval --chips``): which ones
        the TPU compiler accepts the kernel for, with VMEM and estimate each. Untimed:
        the verdicts and estimates are what is asked for."""
        return [await self.executor.submit(task, source,
                                           replace(self.options, chip=chip, timing=False))
                for chip in chips]

    async def profile(self, task: Task, source: str, logdir: Path) -> dict[str, Any]:
        return await self.executor.profile(task, source, logdir, chip=self.chip,
                                           timeout_s=self.profile_timeout_s)

    async def analyze(self, task: Task, source: str) -> dict[str, Any]:
        """The static analysis alone (the ``profile`` op with ``static_only``: grid,
        blocks, VMEM, bytes, flops, roofline for the chip; nothing runs), for the
        diagnosis every evaluated version gets."""
        payload: dict[str, Any] = {"task": task.to_spec(), "source": source,
                                   "filename": "kernel.py", "static_only": True}
        if self.chip:
            payload["chip"] = self.chip
        result = await self.executor.request("profile", payload, self.profile_timeout_s)
        return {k: v for k, v in result.items() if not k.startswith("_")}

    async def lookup_api(self, name: str) -> dict[str, Any]:
        """The installed JAX's signature and docstring for ``name`` (worker op ``lookup_api``)."""
        result = await self.executor.request("lookup_api", {"name": name}, 60.0)
        return {k: v for k, v in result.items() if not k.startswith("_")}

    async def backend(self) -> Backend | None:
        return await self.executor.backend()

    @property
    def state(self) -> str:
        return self.executor.state

    def set_state_listener(self, callback: StateListener | None) -> None:
        self.executor.set_state_listener(callback)
