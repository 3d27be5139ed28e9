"""Timing on the judge's own device: the route of a host with a chip.

On a TPU host the judge holds the chip and runs the candidate's exported programs
itself (``kernels.worker.evaluation.exported``). What ranks there is the production
program's device time against the XLA reference's, both checked on fresh inputs on the
chip (``timing.time_on_device``: the profiler's device plane, pipelined calls where no
trace can be had); where the production program cannot run there (it does not fit HBM,
it did not export whole), the largest check shape is timed the same way and the record
says why. ``estimate`` reports the same measurement beside the estimate
(``measured_json``). The same code times a CPU host that takes the route for tests.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from tilewright.kernels.judge.result import EvalError, shape_label
from tilewright.kernels.worker.candidate import judge
from tilewright.kernels.worker.errors import Stopped, short_message
from tilewright.kernels.worker.evaluation import timing


def export_platform(backend: dict[str, Any], route: str | None) -> str | None:
    """Where the judge runs the candidate's exported programs itself: on a TPU host
    always (libtpu admits one process per chip, and the judge holds it), elsewhere only
    when the options ask for that route (``route = "exported"``: a CPU host runs it with
    the kernels in the plain interpreter, to test the route without a TPU)."""
    platform = str(backend.get("platform") or "cpu")
    if platform == "tpu" or route == "exported":
        return platform
    return None


@dataclass
class Measured:
    """A device timing and what it was measured on."""

    found: timing.DeviceTiming
    runtime: Any
    config: Any
    dyn: tuple
    static: tuple
    ref_fn: Any


def timed(program: Any, ref_fn: Any, runtime: Any, config: Any, tree: str | None,
          tolerance: tuple[float, float], static: tuple, iters: int | None,
          budget_s: float) -> timing.DeviceTiming:
    """``timing.time_on_device`` with the candidate's process tree stopped meanwhile and
    the trace written to a directory of its own (removed after)."""
    logdir = tempfile.mkdtemp(prefix="tw-device-time-")
    try:
        with judge.process().paused():
            return timing.time_on_device(program, ref_fn, runtime, config, tree, tolerance,
                                         static, iters=iters, budget_s=budget_s,
                                         logdir=logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def at_check_shape(runner: Any, runtime: Any, config: Any, dyn: tuple, static: tuple,
                   ref_fn: Any, tree: str | None, dtype: Any, iters: int | None,
                   budget_s: float, kernel_line: int | None) -> Measured:
    """The check shape's exported program (checked and compiled already) timed against
    the reference; a failure of the timing itself is the kernel's runtime error."""
    try:
        found = timed(runner.function(config.name), ref_fn, runtime, config, tree,
                      runtime.tolerance(config, dtype), static, iters, budget_s)
    except Stopped:
        raise
    except Exception as exc:
        raise Stopped("runtime_error", EvalError(
            kind="runtime", message=f"timing on the {runner.platform.upper()} failed: "
            f"{short_message(exc)}", line=kernel_line)) from None
    return Measured(found, runtime, config, dyn, static, ref_fn)


def at_production(production: Any, runner: Any, kernel_line: int | None,
                  iters: int | None, budget_s: float) -> Measured | str:
    """The candidate's production program (the one the verdict and the estimate are
    for) run on the chip on fresh production inputs, checked against the reference
    there and timed against it; or why it could not be (no production program, inputs
    or outputs that do not fit the chip's HBM, a failure there)."""
    import jax

    from tilewright.kernels.worker.execution import jitted_reference, task_runtime

    if production is None or production.reply is None or runner is None:
        return "no production program was exported"
    blob = production.reply.programs.get("full")
    if not blob:
        return "the production program could not be exported whole"
    config = production.config
    try:
        runtime = task_runtime(production.spec)
        dyn, static = runtime.make_inputs(config, jax.random.PRNGKey(0))
        ref_fn = jitted_reference(runtime, len(dyn), len(static))
        shapes = jax.eval_shape(lambda *d: ref_fn(*d, *static), *dyn)
        out_dtype = jax.tree.leaves(shapes)[0].dtype
    except Exception as exc:
        return f"the production inputs could not be built on the chip: {short_message(exc)}"
    try:
        program = runner.adopt(config.name, blob, dyn, kernel_line, 0)
    except Stopped as stop:
        return f"the production program did not compile on the chip: {stop.error.message}"
    try:
        found = timed(program.exported.call, ref_fn, runtime, config, None,
                      runtime.tolerance(config, out_dtype), static, iters, budget_s)
    except Exception as exc:
        return f"running at the production shape failed: {short_message(exc)}"
    return Measured(found, runtime, config, dyn, static, ref_fn)


def record(m: Measured, mode: str, platform: str, interpret: bool,
           flops: float | None, flops_source: str | None) -> dict[str, Any]:
    """The contract's ``timing`` object for a device timing (``m.found`` correct)."""
    found = m.found
    out = timing.record(found.kernel, found.baseline, mode, m.config.name, flops)
    out["method"] = found.method
    out["flops_source"] = flops_source if flops is not None else None
    out["clock"] = ("the device's own clock (profiler device plane)"
                    if found.method == "device_trace" else
                    "the judge's clock around calls issued back to back, one wait "
                    "(pipelined: no device plane here)")
    if found.method != "device_trace":
        out["why_not_device_trace"] = found.why_not_trace
        if platform == "tpu":
            out["label"] = "pipelined wall time (no device trace)"
    if found.device:
        out["device"] = found.device
    out["per_call_wall"] = {**(found.per_call or {}),
                            "note": "one call, one wait: host dispatch included"}
    out["pipelined"] = found.pipelined
    out["route"] = "exported"
    out["shape_label"] = shape_label([(a.shape, a.dtype) for a in m.dyn])
    out["checked_calls"] = found.checked
    out["input_sets"] = found.input_sets
    out["candidate_paused"] = judge.process().proc is not None
    if interpret:
        out["label"] = "host simulation time"
    return out


def measured_json(m: Measured) -> dict[str, Any]:
    """The ``estimate`` op's measured figures on a TPU host, beside the estimate."""
    found = m.found
    if found.kernel is None or found.baseline is None:
        return {"unavailable": f"the kernel's output at {m.config.name} was wrong: "
                               f"{found.failure}"}
    kernel, baseline = found.kernel["median_ms"], found.baseline["median_ms"]
    return {"method": found.method, "device": found.device, "shape": m.config.name,
            "shape_label": shape_label([(a.shape, a.dtype) for a in m.dyn]),
            "median_ms": kernel, "p10_ms": found.kernel["p10_ms"],
            "p90_ms": found.kernel["p90_ms"], "baseline_median_ms": baseline,
            "speedup": baseline / kernel if kernel else None,
            "why_not_device_trace": found.why_not_trace, "per_call_wall": found.per_call}
