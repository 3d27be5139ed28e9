"""The judge protocol: what every judge of kernels offers, whoever asks.

One protocol for one act. A session's controller, a search, the CLIs (``tilewright
eval``, ``estimate``, ``profile``, ``tasks``, ``calibrate``), the benchmarks and the
test doubles all meet the same ``Judge``: this machine's worker processes
(``kernels.pool.workers.WorkerPool``, and ``kernels.pool.local.LocalExecutor`` over one
pool per TPU chip), a Ray cluster
(``kernels.pool.ray.RayExecutor``), a binding of a session's options over either
(``sessions.evaluator.PoolEvaluator``), or an in-process double in the tests. Every
implementation passes one reusable conformance suite
(``kernels.judge.conformance``).

The seam is typed: options are ``kernels.judge.options.EvalOptions`` and ``ProfileOptions``
(None: the judge's own defaults, which for a binding are the options it binds), results
are ``kernels.judge.result.EvalResult`` or the schema'd JSON objects the CLIs print
(``tilewright.profile/1``, ``tilewright.estimate/1``), states are ``JudgeState``.

What each operation promises:

- ``evaluate``: never raises for the kernel's faults (they are the result's status); a
  cancelled await kills that evaluation (a local worker is replaced). ``on_progress``
  hears progress frames before the result (``{kind: "production", final, tpu}``: the
  production verdict while the trials run) where the judge can stream them (a Ray task
  cannot: it hears none).
- ``evaluate_on_chips``: one untimed evaluation per TPU generation (``on_chips``),
  for "which chips accept this kernel" (verdicts and estimates, no timing).
- ``estimate``: the production-shape verdict and estimate only, no correctness check;
  a killed worker is the status, never raised.
- ``profile``: the profile JSON, its trace files under ``logdir`` (None: a directory of
  the judge's); bookkeeping keys start with ``_``. A worker that dies raises
  ``kernels.pool.process.WorkerFailure``, an op that fails ``WorkerOpError``.
- ``lookup_api``: the installed JAX's signature and docstring for a name (the model's
  read-only tool), from the judge's worker: the app never imports JAX.
- ``inputs``: what the task's input builder makes at each of its shapes, built
  abstractly (TPU sizes cost nothing), or the task's own error (``tilewright tasks``).
- ``state`` / ``set_state_listener``: one of ``STATES``, and one listener that hears
  each change (never the same state twice in a row; None detaches it).
- ``backend``: where evaluations run; None before there is anything to ask.
- ``start`` / ``close`` (or ``async with``): a judge that cannot start raises
  ``ExecutorError`` or ``kernels.pool.process.WorkerStartError`` saying why.

App-side module: no JAX here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

from tilewright.kernels.judge.options import EvalOptions, ProfileOptions
from tilewright.kernels.judge.result import Backend, EvalResult
from tilewright.kernels.tasks.task import Task

JudgeState = Literal["stopped", "idle", "busy", "starting", "restarting"]
# From least to most pressing: several pools combine to the most pressing of their
# states (busy when any worker is busy, restarting when any is restarting).
STATES: tuple[JudgeState, ...] = ("stopped", "idle", "busy", "starting", "restarting")
StateListener = Callable[[JudgeState], None]

ESTIMATE_STATUSES = ("ok", "compile_error", "runtime_error", "timeout", "crashed", "rejected")
ProfileJSON = dict[str, Any]  # tilewright.profile/1 (profiling.SCHEMA)
EstimateJSON = dict[str, Any]  # tilewright.estimate/1: schema, status, tpu, error, ...
ApiAnswer = dict[str, Any]  # kernels.worker.requests.lookup_op's answer: name, signature, doc, ...
InputsJSON = dict[str, Any]  # kernels.worker.requests.inputs_op's: {configs: [...]} or {error}


class ProgressFrame(TypedDict, total=False):
    """What a judge says about an evaluation before its result: the production-shape
    verdict and estimate (``kind: "production"``; ``final`` once the estimate is in)."""

    kind: str
    final: bool
    tpu: dict[str, Any]


ProgressListener = Callable[[ProgressFrame], None]


class ExecutorError(Exception):
    """A judge that cannot start or serve: says why and what to do about it."""


@runtime_checkable
class Judge(Protocol):
    """What every judge of kernels offers (the module docstring says what each promises)."""

    name: str  # "local", "ray", or a double's
    capacity: int  # evaluations it runs at once

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Judge: ...

    async def __aexit__(self, *exc: object) -> None: ...

    @property
    def state(self) -> JudgeState: ...

    def set_state_listener(self, callback: StateListener | None) -> None: ...

    async def backend(self) -> Backend | None: ...

    async def evaluate(self, task: Task, source: str, options: EvalOptions | None = None, *,
                       filename: str = "kernel.py",
                       on_progress: ProgressListener | None = None) -> EvalResult: ...

    async def evaluate_on_chips(self, task: Task, source: str, chips: Sequence[str],
                                options: EvalOptions | None = None) -> list[EvalResult]: ...

    async def estimate(self, task: Task, source: str, options: EvalOptions | None = None, *,
                       filename: str = "kernel.py") -> EstimateJSON: ...

    async def profile(self, task: Task, source: str, logdir: Path | None,
                      options: ProfileOptions | None = None, *,
                      filename: str = "kernel.py") -> ProfileJSON: ...

    async def lookup_api(self, name: str) -> ApiAnswer: ...

    async def inputs(self, task: Task) -> InputsJSON: ...

    def describe(self) -> str: ...


def combined_state(states: Iterable[str]) -> JudgeState:
    """One state for several pools: the most pressing of theirs ("stopped" for none)."""
    present = set(states)
    found = [state for state in STATES if state in present]  # STATES is in rank order
    return found[-1] if found else "stopped"


async def on_chips(judge: Judge, task: Task, source: str, chips: Sequence[str],
                   options: EvalOptions | None) -> list[EvalResult]:
    """``evaluate_on_chips`` for every judge: one evaluation per TPU generation, in turn
    (a warm worker compiles each reference once), untimed (the verdicts and estimates
    are what is asked for)."""
    base = options or EvalOptions()
    return [await judge.evaluate(task, source, replace(base, chip=chip, timing=False))
            for chip in chips]


def public(answer: dict[str, Any]) -> dict[str, Any]:
    """A worker's answer without its bookkeeping (``_stderr``, ``_handler_s``)."""
    return {k: v for k, v in answer.items() if not k.startswith("_")}
