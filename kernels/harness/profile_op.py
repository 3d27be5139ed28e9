"""The worker op ``profile``: static analysis, a captured trace and its conversion.

Payload: ``{task: Task.to_spec(), source, filename, options: {chip, iters, shape,
logdir, python_tracer, static_only}}`` (options may also be given at the payload's top level). Steps: load the task runtime and the candidate, build
inputs for the first small visible configuration (or ``shape``), analyze every
``pallas_call`` statically for the target chip, trace ``iters`` timed calls
(``profiling.capture``; TPU interpret mode on a CPU host), convert the xplane with
xprof into our ``Timeline`` (``profiling.convert``), and return the profile JSON
(schema ``tilewright.profile/1``). Candidate faults come back as ``status: "error"``
with ``error: {kind, message, line, traceback, hint}``; the op itself never raises for them.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kernels.harness.ops import op
from profiling import SCHEMA
from profiling.chips import backend_is_interpret

DEFAULT_TARGET = "v5e"  # what a CPU host analyzes for when no --chip is given


@op("profile")
def profile(payload: dict[str, Any]) -> dict[str, Any]:
    # Options may also sit at the top level of the payload (``{"logdir": ...}``).
    options = {k: payload[k] for k in ("chip", "iters", "shape", "logdir", "python_tracer",
                                       "static_only")
               if payload.get(k) is not None}
    options.update({k: v for k, v in (payload.get("options") or {}).items() if v is not None})
    from kernels.harness import integrity

    # Candidate code runs in this warm worker: if it patched a module the harness relies
    # on, changed jax.config or left threads running, the pool replaces the worker.
    snapshot = integrity.ModuleSnapshot()
    result = run_profile(payload["task"], payload["source"],
                         payload.get("filename") or "kernel.py", options)
    _changed_config, restored = snapshot.restore_config()
    if snapshot.changed() or snapshot.new_threads() or not restored:
        result["_recycle"] = True
    return result


def run_profile(spec: dict[str, Any], source: str, filename: str,
                options: dict[str, Any]) -> dict[str, Any]:
    import jax

    from kernels.harness import errors
    from kernels.harness.backend import backend_info
    from kernels.harness.runtime import load_runtime
    from profiling import chips

    started = time.perf_counter()
    phases: dict[str, float] = {}
    backend = backend_info()
    interpret = backend_is_interpret(backend)
    out: dict[str, Any] = {"schema": SCHEMA, "status": "ok", "backend": backend, "error": None}

    try:
        target = chips.get_chip(options["chip"]) if options.get("chip") else \
            _native_chip(backend) or chips.get_chip(DEFAULT_TARGET)
    except KeyError as exc:
        return _error(out, "usage", str(exc.args[0]))
    out["chip"] = target.to_json()
    measured_chip = _native_chip(backend)

    def fail(kind: str, exc: BaseException) -> dict[str, Any]:
        out["status"] = "error"
        out["error"] = errors.describe(exc, kind, filename)
        out["duration_s"] = time.perf_counter() - started
        return out

    t0 = time.perf_counter()
    try:
        runtime = load_runtime(spec)
        config = _pick_config(runtime, backend["platform"], options.get("shape"))
        dyn, static = runtime.make_inputs(config, jax.random.PRNGKey(0))
    except Exception as exc:
        return fail("task", exc)
    out["shape"] = {"name": config.name, "params": config.params,
                    "inputs": [[list(a.shape), str(a.dtype)] for a in dyn]}
    try:
        entry = runtime.load_candidate(source, filename)
    except SyntaxError as exc:
        return fail("syntax", exc)
    except Exception as exc:
        return fail("import", exc)
    task_flops = None
    with contextlib.suppress(Exception):
        task_flops = runtime.flops(config, dyn)
    phases["load_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    from profiling.static import analyze_callable, tpu_context

    try:
        analysis = analyze_callable(entry, tuple(dyn), tuple(static), chip=target,
                                    task_flops=task_flops)
        with tpu_context(target):
            outputs = jax.tree_util.tree_leaves(
                jax.eval_shape(lambda *d: entry(*d, *static), *dyn))
    except Exception as exc:
        return fail("trace", exc)
    out["analysis"] = analysis
    phases["static_s"] = time.perf_counter() - t0

    if options.get("static_only"):
        out.update(logdir=None, run_dir=None, perfetto=None, wall=None, timeline=None,
                   top_ops=[], per_iteration=None,
                   pallas_share={"value": None, "reason": "static analysis only (no run)"})
        return _finish(out, analysis, dyn, outputs, target, measured_chip, task_flops,
                       interpret, phases, started)

    t0 = time.perf_counter()
    logdir = Path(options.get("logdir") or tempfile.mkdtemp(prefix="tilewright-profile-"))
    iters = int(options.get("iters") or (3 if interpret else 20))
    static_argnums = tuple(range(len(dyn), len(dyn) + len(static))) or None
    fn = jax.jit(entry, static_argnums=static_argnums)
    from profiling.capture import capture

    try:
        # Off a TPU the kernel runs in interpret mode as if on the target chip, so APIs
        # that ask for the TPU's tiling (emit_pipeline) work there too.
        with _execution_mode(interpret), tpu_context(target) if interpret else \
                contextlib.nullcontext():
            cap = capture(fn, (*dyn, *static), logdir, iters=iters,
                          python_tracer=bool(options.get("python_tracer")))
    except Exception as exc:
        if interpret:
            _reset_interpret_state()
        return fail("runtime", exc)
    phases["capture_s"] = time.perf_counter() - t0
    out["logdir"] = cap["logdir"]
    out["run_dir"] = cap["run_dir"]
    out["perfetto"] = cap["perfetto"]
    out["wall"] = {"iters": cap["iters"], "iter_ms": cap["iter_ms"],
                   "median_ms": sorted(cap["iter_ms"])[len(cap["iter_ms"]) // 2]}

    t0 = time.perf_counter()
    try:
        _convert(out, cap, analysis)
    except Exception as exc:  # the raw trace is kept; say why there is no timeline
        out.update(timeline=None, top_ops=[], per_iteration=None,
                   pallas_share={"value": None,
                                 "reason": f"xprof could not convert the trace: {exc}"})
        out["convert_error"] = f"{type(exc).__name__}: {exc}"
    phases["convert_s"] = time.perf_counter() - t0
    return _finish(out, analysis, dyn, outputs, target, measured_chip, task_flops, interpret,
                   phases, started)


def _finish(out: dict[str, Any], analysis: dict[str, Any], dyn: Any, outputs: list[Any],
            target: Any, measured_chip: Any, task_flops: float | None, interpret: bool,
            phases: dict[str, float], started: float) -> dict[str, Any]:
    from profiling.digest import digest

    out["roofline"] = _roofline(out, analysis, dyn, outputs, target, measured_chip, task_flops,
                                interpret)
    out["phases"] = phases
    out["duration_s"] = time.perf_counter() - started
    out["digest"] = digest(out)  # the few lines an agent reads
    return out


def _convert(out: dict[str, Any], cap: dict[str, Any], analysis: dict[str, Any]) -> None:
    from profiling import convert

    names = [k["name"] for k in analysis["kernels"]]
    if not cap["xplane"]:
        out["timeline"] = None
        out["top_ops"] = []
        out["pallas_share"] = {"value": None, "reason": "the profiler wrote no xplane file"}
        return
    trace, log = convert.trace_events(cap["xplane"][0])
    timeline = convert.timeline_from_trace(trace)
    exported = Path(cap["run_dir"]) / "tilewright_timeline.json"
    exported.write_text(json.dumps(timeline.to_chrome_trace()))
    out["timeline"] = timeline.to_json()
    out["timeline"]["chrome_trace"] = str(exported)
    out["timeline"]["summary"] = timeline.summary()
    out["top_ops"] = convert.top_ops(timeline)
    out["pallas_share"] = convert.pallas_share(timeline, names)
    out["per_iteration"] = convert.module_times(timeline)
    out["xprof_log"] = (cap.get("log") or []) + log[-20:]


def _roofline(out: dict[str, Any], analysis: dict[str, Any], dyn: Any, outputs: list[Any],
              target: Any, measured_chip: Any, task_flops: float | None,
              interpret: bool) -> dict[str, Any]:
    import numpy as np

    from profiling import chips

    flops = task_flops or analysis["totals"]["flops"] or None
    # Compulsory traffic: every input read once, every output written once.
    in_bytes = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in dyn)
    out_bytes = sum(int(np.prod(o.shape)) * np.dtype(o.dtype).itemsize for o in outputs)
    float_dtypes = {str(a.dtype) for a in dyn if np.issubdtype(a.dtype, np.floating)}
    dtype = "f32" if float_dtypes and float_dtypes <= {"float32", "float64"} else "bf16"
    roof = chips.bound(flops, in_bytes + out_bytes, target, dtype)
    kernel_bytes = analysis["totals"]["bytes_total"] or None
    roof["kernel_bytes"] = kernel_bytes
    roof["kernel_bound_ms"] = chips.bound(flops, kernel_bytes, target, dtype)["bound_ms"] \
        if kernel_bytes else None
    if target.kind == "tpu" and analysis["kernels"]:
        # A static estimate for the target chip: the blocking's bound plus the fixed
        # per-grid-step cost (STEP_OVERHEAD_S). Labeled as an estimate everywhere.
        from profiling.static_rules import STEP_OVERHEAD_S

        steps = sum((k["steps"] or 1) * k["calls"] for k in analysis["kernels"])
        roof["step_overhead_ms"] = steps * STEP_OVERHEAD_S * 1e3
        roof["estimate_ms"] = (roof["kernel_bound_ms"] or roof["bound_ms"]) + roof["step_overhead_ms"]
    else:
        roof["step_overhead_ms"] = roof["estimate_ms"] = None
    measured = None
    if out.get("wall") and measured_chip is not None and measured_chip.name == target.name:
        per = out.get("per_iteration") or {}
        measured = per.get("median_ms") or out["wall"]["median_ms"]
    placed = chips.placement(roof, measured)
    placed["note"] = (None if measured is not None else
                      "static analysis only: nothing was run" if not out.get("wall") else
                      ("measured in TPU interpret mode on the CPU: a simulator, not comparable "
                       f"with {target.label}'s bound") if interpret else
                      f"measured on another chip than {target.label}")
    return placed


def _native_chip(backend: dict[str, Any]) -> Any:
    from profiling import chips

    if backend["mode"] != "native":
        return None
    try:
        return chips.chip_for_device(backend["platform"], backend["device_kind"])
    except KeyError:
        return None


def _pick_config(runtime: Any, platform: str, name: str | None) -> Any:
    configs = runtime.configs_for(platform)
    if name:
        for c in runtime.configs():
            if c.name == name:
                return c
        raise ValueError(f"no shape configuration named {name!r}; the task has: "
                         + ", ".join(c.name for c in runtime.configs()))
    visible = [c for c in configs if not c.held_out] or configs
    if not visible:
        raise ValueError(f"no shape configuration is meant for a {platform} host; "
                         "add a small one or shrink one with --set")
    return visible[0]


@contextlib.contextmanager
def _execution_mode(interpret: bool) -> Any:
    if not interpret:
        yield
        return
    from jax.experimental.pallas import tpu as pltpu

    with pltpu.force_tpu_interpret_mode():
        yield


def _reset_interpret_state() -> None:
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()


def _error(out: dict[str, Any], kind: str, message: str) -> dict[str, Any]:
    out["status"] = "error"
    out["error"] = {"kind": kind, "message": message, "line": None, "traceback": None,
                    "hint": None}
    return out
