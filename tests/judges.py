"""In-process judges for tests that need no worker: both implement the judge protocol
(``kernels.pool.Judge``) and pass its conformance suite
(``tests/test_judge_conformance.py``).

- ``MarkedJudge``: a source line ``# eval: STATUS SPEEDUP`` decides the result (default:
  correct, 1.0), so pure controller logic runs in milliseconds: SPEEDUP is the TPU
  compiler's estimated speedup for the chip (the rank off-TPU, ``tpu_estimate``) and
  the interpreter's host ratio; ``# eval: STATUS SPEEDUP host`` leaves the estimate out
  (the compiler gave nothing: host simulation ranks), ``... roofline`` gives the
  reference no estimate (the kernel's estimate against the reference's roofline).
  ``gate`` holds every evaluation until set; ``sources`` records what was evaluated.
- ``RefusingJudge``: for snapshot tests, which must never evaluate, profile or compile:
  any such call fails the test; its state, backend and lifecycle are a judge's.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tilewright.kernels.judge.options import EvalOptions, ProfileOptions
from tilewright.kernels.judge.result import ESTIMATE_SCHEMA, Backend, EvalResult
from tilewright.kernels.pool import JudgeState, ProgressListener, StateListener, on_chips
from tilewright.kernels.tasks.task import Task

CPU = Backend(platform="cpu", mode="tpu-interpret", device_kind="cpu", jax_version="test")
_MARK = re.compile(r"# eval: (\w+) ([\d.]+)(?: (host|roofline)\b)?")
_PROGRAM = re.compile(r"# program: (\w+)")  # its program at the production shape
CLOCK_HZ = 1.5e9  # v5e's
REFERENCE_CYCLES = 1_500_000  # the XLA reference's estimate: 1 ms at CLOCK_HZ


class _InProcess:
    """The lifecycle and state of a judge that needs nothing started: always ready, one
    evaluation at a time (``idle`` until closed, as the controller's tests expect)."""

    name = "in-process"
    capacity = 1

    def __init__(self) -> None:
        self._state: JudgeState = "idle"
        self._listener: StateListener | None = None

    @property
    def state(self) -> JudgeState:
        return self._state

    def set_state_listener(self, callback: StateListener | None) -> None:
        self._listener = callback

    def _set(self, state: JudgeState) -> None:
        if state != self._state:
            self._state = state
            if self._listener is not None:
                self._listener(state)

    async def start(self) -> None:
        self._set("idle")

    async def close(self) -> None:
        self._set("stopped")

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def describe(self) -> str:
        return f"{self.name}: an in-process test double"


class MarkedJudge(_InProcess):
    """A source's ``# eval: STATUS SPEEDUP`` marker is its verdict."""

    name = "marked"

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        super().__init__()
        self.gate = gate
        self.sources: list[str] = []
        self.identities: list[str] = []  # the sources asked which program they are
        self.started = asyncio.Event()

    async def backend(self) -> Backend:
        return CPU

    async def evaluate(self, task: Task, source: str, options: EvalOptions | None = None, *,
                       filename: str = "kernel.py",
                       on_progress: ProgressListener | None = None) -> EvalResult:
        self.sources.append(source)
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        status, speedup, kind = self._marked(source)
        timed = options is None or options.timing
        # TPU interpret mode: the ratio is the host's, never a speedup (kernels.worker.evaluation.timing)
        timing = {"method": "wall_clock", "mode": "tpu-interpret", "median_ms": 10.0 / speedup,
                  "p10_ms": 9.0 / speedup, "p90_ms": 11.0 / speedup,
                  "baseline_median_ms": 10.0, "speedup": None,
                  "host_ratio": speedup} if timed else None
        chip = options.chip if options is not None and options.chip else "v5e"
        return EvalResult(status=status, backend=CPU, timing=timing,
                          tpu=estimated(chip, speedup, kind),
                          correctness={"correct": status == "correct"})

    async def evaluate_on_chips(self, task: Task, source: str, chips: Sequence[str],
                                options: EvalOptions | None = None) -> list[EvalResult]:
        return await on_chips(self, task, source, chips, options)

    async def estimate(self, task: Task, source: str, options: EvalOptions | None = None, *,
                       filename: str = "kernel.py") -> dict[str, Any]:
        status, _, _ = self._marked(source)
        found = {"schema": ESTIMATE_SCHEMA, "tpu": None, "error": None,
                 "status": "ok" if status in ("correct", "incorrect") else status}
        if options is not None and options.identity_only:  # ``# program: NAME`` names it
            self.identities.append(source)
            program = _PROGRAM.search(source)
            found["program"] = program.group(1) if program else None
        return found

    async def profile(self, task: Task, source: str, logdir: Path | None,
                      options: ProfileOptions | None = None, *,
                      filename: str = "kernel.py") -> dict[str, Any]:
        found: dict[str, Any] = {"schema": "tilewright.profile/1", "status": "ok", "ops": [],
                                 "logdir": str(logdir)}
        if options is not None and options.stderr:
            found["stderr"] = ""
        return found

    async def lookup_api(self, name: str) -> dict[str, Any]:
        return {"name": name, "signature": "(...)", "doc": "a test double's answer"}

    async def inputs(self, task: Task) -> dict[str, Any]:
        return {"configs": [{"name": s.name, "held_out": s.held_out, "how": "test double",
                             "inputs": [], "static": []} for s in task.shapes]}

    @staticmethod
    def _marked(source: str) -> tuple[str, float, str | None]:
        match = _MARK.search(source)
        return (match.group(1), float(match.group(2)), match.group(3)) if match \
            else ("correct", 1.0, None)


def estimated(chip: str, speedup: float, kind: str | None = None) -> dict[str, Any]:
    """A ``tpu`` section the way the judge writes one (``kernels.worker.tpu.verdict``):
    the kernel's estimate ``speedup`` times faster than the XLA reference's at the
    production shape (``kind`` "host": the compiler gave no estimate; "roofline": none
    for the reference, only its roofline)."""
    tpu: dict[str, Any] = {"chip": chip, "compile": "ok", "shape": "prod",
                           "shape_label": "4096x4096"}
    if kind == "host":
        return {**tpu, "estimate_unavailable": "a test double's: no estimate"}
    cycles = max(1, round(REFERENCE_CYCLES / speedup))
    tpu.update(estimate={"cycles": cycles, "seconds": cycles / CLOCK_HZ, "method": "direct"},
               kernel_time_s=cycles / CLOCK_HZ)
    reference = REFERENCE_CYCLES / CLOCK_HZ
    if kind == "roofline":
        return {**tpu, "reference_roofline": {"seconds": reference},
                "roofline_ratio": reference / tpu["kernel_time_s"],
                "estimate_unavailable": "no estimate for the XLA reference"}
    return {**tpu, "reference_estimate": {"cycles": REFERENCE_CYCLES, "seconds": reference,
                                          "method": "direct"},
            "estimated_speedup": speedup, "basis": "compiler"}


class RefusingJudge(_InProcess):
    """Never asked to run anything while a snapshot is taken; says so if it is."""

    name = "refusing"

    async def backend(self) -> None:
        return None

    async def evaluate(self, *args: Any, **kwargs: Any) -> EvalResult:
        raise AssertionError("a snapshot test must not evaluate")

    async def evaluate_on_chips(self, *args: Any, **kwargs: Any) -> list[EvalResult]:
        raise AssertionError("a snapshot test must not compile for other chips")

    async def estimate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("a snapshot test must not estimate")

    async def profile(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("a snapshot test must not profile")

    async def lookup_api(self, name: str) -> dict[str, Any]:
        raise AssertionError("a snapshot test must not ask the worker")

    async def inputs(self, task: Task) -> dict[str, Any]:
        raise AssertionError("a snapshot test must not build inputs")
