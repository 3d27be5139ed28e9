"""How a session has kernels judged: ``PoolEvaluator``, a session's options bound over a
judge (``kernels.pool.Judge``: this machine's worker processes, a Ray cluster, or a
test's double).

A session judges every version with the options it opened with (the config's ``[eval]``,
a resumed session's recorded ones, the flags) and profiles for its chip. The binding is
itself a ``Judge``: an operation given no options uses the bound ones, so the controller
asks ``evaluate(task, source)`` and the chip check ``evaluate_on_chips(task, source,
chips)``, while everything else (state, backend, the API lookup) is the judge's own. It
adds what only a session needs: one progress listener (``set_progress_listener``: the
production verdict reaches the controller's live ``run.progress`` while the trials run).

Keeping the judge behind this seam lets tests of pure controller logic use an in-process
judge while every real path (the CLI, the TUI, the flow tests) runs candidates in worker
processes. Cancelling an ``evaluate`` await kills that worker and the pool starts a fresh
one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from tilewright.kernels.judge.options import EvalOptions, ProfileOptions
from tilewright.kernels.judge.protocol import (
    ApiAnswer,
    EstimateJSON,
    InputsJSON,
    JudgeState,
    ProfileJSON,
)
from tilewright.kernels.judge.result import Backend, EvalResult
from tilewright.kernels.pool import Judge, ProgressListener, StateListener, on_chips
from tilewright.kernels.tasks.task import Task

__all__ = ["PoolEvaluator"]


class PoolEvaluator:
    """A ``Judge`` with a session's options bound: every evaluation with ``options``,
    every profile for ``chip`` (None: the worker's own) within ``profile_timeout_s``.

    ``judge`` is any judge: a ``WorkerPool`` (a session's one worker), an executor, a
    test's double. Its caller starts it and closes it (``close`` here closes it too).
    """

    def __init__(self, judge: Judge, options: EvalOptions | None = None,
                 profile_timeout_s: float = 300.0, chip: str | None = None) -> None:
        self.judge = judge
        self.name = self.judge.name
        self.options = options or EvalOptions()
        self.profile_options = ProfileOptions(chip=chip, timeout_s=profile_timeout_s)
        self.progress_listener: ProgressListener | None = None

    # -- the judge's own --------------------------------------------------------------

    @property
    def capacity(self) -> int:  # a Ray judge learns its capacity when it starts
        return self.judge.capacity

    async def start(self) -> None:
        await self.judge.start()

    async def close(self) -> None:
        await self.judge.close()

    async def __aenter__(self) -> PoolEvaluator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def state(self) -> JudgeState:
        return self.judge.state

    def set_state_listener(self, callback: StateListener | None) -> None:
        self.judge.set_state_listener(callback)

    async def backend(self) -> Backend | None:
        return await self.judge.backend()

    async def lookup_api(self, name: str) -> ApiAnswer:
        """The installed JAX's signature and docstring for ``name`` (the model's tool)."""
        return await self.judge.lookup_api(name)

    async def inputs(self, task: Task) -> InputsJSON:
        return await self.judge.inputs(task)

    def describe(self) -> str:
        return self.judge.describe()

    # -- with the session's options ------------------------------------------------------

    def set_progress_listener(self, callback: ProgressListener | None) -> None:
        """Who hears an evaluation's progress before its result (the production-shape
        verdict and estimate while the trials run), when the call names no listener."""
        self.progress_listener = callback

    async def evaluate(self, task: Task, source: str, options: EvalOptions | None = None, *,
                       filename: str = "kernel.py",
                       on_progress: ProgressListener | None = None) -> EvalResult:
        return await self.judge.evaluate(task, source, options or self.options,
                                         filename=filename,
                                         on_progress=on_progress or self.progress_listener)

    async def evaluate_on_chips(self, task: Task, source: str, chips: Sequence[str],
                                options: EvalOptions | None = None) -> list[EvalResult]:
        """One evaluation per TPU generation (``tilewright eval --chips``, the TUI's chip
        check): which ones the TPU compiler accepts the kernel for, with VMEM and
        estimate each. Untimed: the verdicts and estimates are what is asked for."""
        # Straight to the judge: the run's progress listener must not hear a chip check.
        return await on_chips(self.judge, task, source, chips, options or self.options)

    async def estimate(self, task: Task, source: str, options: EvalOptions | None = None, *,
                       filename: str = "kernel.py") -> EstimateJSON:
        return await self.judge.estimate(task, source, options or self.options,
                                         filename=filename)

    async def profile(self, task: Task, source: str, logdir: Path | None,
                      options: ProfileOptions | None = None, *,
                      filename: str = "kernel.py") -> ProfileJSON:
        return await self.judge.profile(task, source, logdir, options or self.profile_options,
                                        filename=filename)

    async def analyze(self, task: Task, source: str) -> ProfileJSON:
        """The static analysis alone (a profile with ``static_only``: grid, blocks, VMEM,
        bytes, flops, roofline for the chip; nothing runs), for the diagnosis every
        evaluated version gets."""
        found = await self.judge.profile(task, source, None,
                                         replace(self.profile_options, static_only=True))
        return {k: v for k, v in found.items() if not k.startswith("_")}
