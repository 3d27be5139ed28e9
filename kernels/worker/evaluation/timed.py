"""Timing a checked candidate against its reference, for an ``Evaluation``
(``kernels.worker.evaluation.evaluate``): off a TPU through the judge's round trip to
the candidate process (``timing``), on a TPU host through the exported program on the
chip (``on_chip``); and the work the timed shape does (the task's count, else XLA's).

Worker-side (the judge).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tilewright.kernels.judge.result import shape_label
from tilewright.kernels.tasks.task import ShapeConfig
from tilewright.kernels.worker.candidate import judge
from tilewright.kernels.worker.evaluation import integrity, on_chip, timing
from tilewright.kernels.worker.evaluation.compare import Host
from tilewright.kernels.worker.execution import jitted_reference

# ``ev`` below is the ``Evaluation`` (``evaluate``, which imports this module: typed Any so
# that the room keeps no import circle)
Evaluation = Any


def time_kernel(ev: Evaluation, runtime: Any, configs: list[ShapeConfig],
                seeds: dict[str, list[int]], references: dict[str, list[Host]]) -> None:
    """Time candidate and reference (``kernels.worker.evaluation.timing``) on one configuration:
    on hardware the production shape when it was checked (what is ranked is timed
    there); else the biggest visible configuration, where the kernel's work
    dominates."""
    visible = [c for c in configs if not c.held_out] or configs
    production = ev.task.production
    chosen = [c for c in visible if not ev.interpret and production is not None
              and c == production]
    sized = []
    for config in chosen or visible:
        dyn, static = ev._inputs(runtime, config, seeds[config.name][0])
        sized.append((sum(int(np.prod(a.shape)) for a in dyn), config, dyn, static))
    _, config, dyn, static = max(sized, key=lambda item: item[0])
    ref_fn = jitted_reference(runtime, len(dyn), len(static))
    budget = ev.options.time_budget_s / 2
    expected = references[config.name][0]
    if ev.channel.runner is not None:
        _time_on_chip(ev, runtime, config, dyn, static, ref_fn, expected)
        return
    calls = timing.time_candidate(
        ev.channel, runtime, config, expected, ev.out_trees.get(config.name),
        runtime.tolerance(config, expected.dtype), ref_fn, interpret=ev.interpret,
        iters=ev.options.iters, budget_s=budget)
    if calls.failure is not None or calls.kernel is None:
        ev.result.status = "incorrect"
        ev.result.correctness = {**(ev.result.correctness or {}), "correct": False,
                                   "reason": f"{config.name}: timed call: {calls.failure}"}
        return
    ev.phases["kernel_timing_s"] = ev.phases.get("kernel_timing_s", 0.0) + calls.loop_s
    baseline = timing.time_reference(ref_fn, (*dyn, *static), interpret=ev.interpret,
                                     iters=ev.options.iters, budget_s=budget)
    flops, flops_source = _flops(runtime, config, dyn, static, ref_fn)
    record = timing.record(calls.kernel, baseline, ev.backend["mode"], config.name,
                           flops)
    record["flops_source"] = flops_source if flops is not None else None
    record["clock"] = "judge (round trip to the candidate process)"
    record["shape_label"] = shape_label([(a.shape, a.dtype) for a in dyn])
    record["checked_calls"] = calls.checked
    # the candidate process was stopped (SIGSTOP) while the baseline was timed
    record["candidate_paused"] = judge.process().proc is not None
    if ev.interpret:
        record["label"] = "host simulation time"
    keep_timing(ev, record)

def _time_on_chip(ev: Evaluation, runtime: Any, config: ShapeConfig, dyn: tuple, static: tuple,
                  ref_fn: Any, expected: Host) -> None:
    """The exported route (``kernels.worker.evaluation.on_chip``): on a TPU host the
    production program's device time against the reference's, else (or where that
    cannot run) this check shape's, timed the same way."""
    runner = ev.channel.runner
    assert runner is not None
    measured: on_chip.Measured | str | None = None
    if ev.export_for == "tpu":  # what ranks is the program that will run
        measured = on_chip.at_production(ev.production, runner, ev._kernel_line(),
                                         ev.options.iters, ev.options.time_budget_s)
        if isinstance(measured, str):
            ev.result.extra["production_timing"] = {"unavailable": measured}
    if not isinstance(measured, on_chip.Measured):
        measured = on_chip.at_check_shape(
            runner, runtime, config, dyn, static, ref_fn, ev.out_trees.get(config.name),
            expected.dtype, ev.options.iters, ev.options.time_budget_s,
            ev._kernel_line())
    found = measured.found
    if found.failure is not None or found.kernel is None or found.baseline is None:
        ev.result.status = "incorrect"
        ev.result.correctness = {**(ev.result.correctness or {}), "correct": False,
                                   "reason": f"{measured.config.name}: timed call: "
                                             f"{found.failure}"}
        return
    flops, source = _flops(measured.runtime, measured.config, measured.dyn,
                           measured.static, measured.ref_fn)
    keep_timing(ev, on_chip.record(measured, ev.backend["mode"],
                                     ev.backend["platform"], ev.interpret, flops,
                                     source))

def keep_timing(ev: Evaluation, record: dict[str, Any]) -> None:
    ev.result.timing = record
    if (record["speedup"] or record["host_ratio"] or 0.0) > integrity.SUSPICIOUS_SPEEDUP:
        ev.flags.append("suspicious_speedup")


def _flops(runtime: Any, config: ShapeConfig, dyn: tuple, static: tuple,
           ref_fn: Any) -> tuple[float | None, str]:
    """The work at ``config``: the task's own count, else XLA's cost analysis of the
    reference (most JAXBench workloads give none); and which it is."""
    try:
        flops = runtime.flops(config, dyn)
    except Exception:
        flops = None
    if flops is not None:
        return flops, "task"
    return _xla_flops(ref_fn, dyn, static), "xla_cost_analysis"


def _xla_flops(ref_fn: Any, dyn: tuple, static: tuple) -> float | None:
    """The reference's floating-point operations as XLA's cost analysis counts them on
    this host (the reference is plain XLA, so the count is a full one)."""
    try:
        analysis = ref_fn.lower(*dyn, *static).compile().cost_analysis()
    except Exception:
        return None
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if analysis else {}
    value = (analysis or {}).get("flops")
    return float(value) if isinstance(value, int | float) and value > 0 else None
