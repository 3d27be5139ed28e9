"""The worker op ``profile``: static analysis, a captured trace and its conversion.

Payload: ``{task: Task.to_spec(), source, filename, options: {chip, iters, shape,
logdir, python_tracer, static_only}}`` (options may also be given at the payload's top
level; ``timeout_s`` is the app's deadline for the request).

Candidate code never runs here, in the judge: the candidate's module is loaded, traced,
analyzed and run under the profiler in the judge's confined candidate process
(``kernels.worker.candidate.main``'s ``profile`` op: ``kernels.worker.candidate.profile``). The
judge builds the inputs (the task's code), sends them, and gets back data: the static
analysis, the outputs' shapes and the capture's facts, with the trace written in the
candidate process's scratch dir. The judge copies those files (regular files only,
bounded) into a directory of its own, converts the xplane with xprof into our
``Timeline`` (``profiling.convert``) and returns the profile JSON (schema
``tilewright.profile/1``). A candidate process that tampered with its modules, left
threads or changed jax.config is replaced. Candidate faults come back as
``status: "error"`` with ``error: {kind, message, line, traceback, hint}``; the op
itself never raises for them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tilewright.kernels.judge.result import EvalError
from tilewright.kernels.worker.errors import Stopped
from tilewright.kernels.worker.ops import op
from tilewright.profiling import SCHEMA
from tilewright.profiling.chips import DEFAULT_TPU, backend_is_interpret

TRACE_BYTES_LIMIT = 512 << 20  # a profile's files copied out of the candidate's scratch
TRACE_FILES_LIMIT = 200
# What the candidate process may report as a profile's failure (anything else: refused).
_FAULTS = {"compile_error": frozenset({"syntax", "missing_entry", "trace", "exit"}),
           "runtime_error": frozenset({"import", "exit", "runtime"}),
           "rejected": frozenset({"harness_tampering"})}


@op("profile")
def profile(payload: dict[str, Any]) -> dict[str, Any]:
    # Options may also sit at the top level of the payload (``{"logdir": ...}``).
    options = {k: payload[k] for k in ("chip", "iters", "shape", "logdir", "python_tracer",
                                       "static_only")
               if payload.get(k) is not None}
    options.update({k: v for k, v in (payload.get("options") or {}).items() if v is not None})
    timeout_s = float(payload.get("timeout_s") or options.get("timeout_s") or 300.0)
    if payload.get("memory_limit_mb"):
        options.setdefault("memory_limit_mb", payload["memory_limit_mb"])
    margin = min(max(0.15 * timeout_s, 0.3), 5.0)  # answer before the app kills us
    out = run_profile(payload["task"], payload["source"],
                      payload.get("filename") or "kernel.py", options,
                      time.monotonic() + timeout_s - margin)
    return _scrubbed(out, payload["task"])


def _scrubbed(out: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The profile without a held-out size in its error (a candidate judged in this
    process may remember the held-out shapes it was called with and quote them here)."""
    from tilewright.kernels.tasks.task import Task
    from tilewright.kernels.worker.errors import held_out_scrubber

    error = out.get("error")
    try:
        scrub = held_out_scrubber(Task.from_spec(spec)) if isinstance(error, dict) else None
    except Exception:
        scrub = None
    if scrub is not None:
        out["error"] = {k: scrub(v) for k, v in error.items()}
    return out


def run_profile(spec: dict[str, Any], source: str, filename: str,
                options: dict[str, Any], deadline: float | None = None) -> dict[str, Any]:
    import jax

    from tilewright.kernels.worker import errors
    from tilewright.kernels.worker.backend import backend_info
    from tilewright.kernels.worker.candidate import judge
    from tilewright.kernels.worker.execution import task_runtime
    from tilewright.profiling import chips

    started = time.perf_counter()
    deadline = deadline if deadline is not None else time.monotonic() + 300.0
    phases: dict[str, float] = {}
    backend = backend_info()
    interpret = backend_is_interpret(backend)
    out: dict[str, Any] = {"schema": SCHEMA, "status": "ok", "backend": backend, "error": None}

    try:
        target = chips.get_chip(options["chip"]) if options.get("chip") else \
            _native_chip(backend) or chips.get_chip(DEFAULT_TPU)
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
    # The static analysis alone needs no values: it is made at the production shape (what
    # the numbers that rank are for) from the inputs' shapes, so its blocks, steps and
    # bytes describe the program that will run. A trace runs the kernel: a check shape.
    production = None
    if options.get("static_only") and not options.get("shape"):
        from tilewright.kernels.tasks.task import Task

        production = Task.from_spec(spec).production_task()
    try:  # the task's code, in the judge: inputs, flops
        if production is not None:
            runtime = task_runtime(production.to_spec())
            config = production.shapes[0]
            dyn, static, _how = runtime.input_signature(config)
        else:
            runtime = task_runtime(spec)
            config = _pick_config(runtime, backend["platform"], options.get("shape"))
            dyn, static = runtime.make_inputs(config, jax.random.PRNGKey(0))
    except Exception as exc:
        return fail("task", exc)
    out["shape"] = {"name": config.name, "params": config.params,
                    "inputs": [[list(a.shape), str(a.dtype)] for a in dyn],
                    "production": production is not None}
    task_flops = None
    with contextlib.suppress(Exception):
        task_flops = runtime.flops(config, dyn)
    phases["inputs_s"] = time.perf_counter() - t0

    proc = judge.assign(source)  # the candidate's own process (never another's)
    proc.memory_limit_mb = int(options.get("memory_limit_mb") or proc.memory_limit_mb)
    try:
        return _profile(out, proc, spec, source, filename, options, target, measured_chip,
                        dyn, static, task_flops, interpret, phases, started, deadline)
    finally:  # after the trace was copied out: a recycled process takes its scratch along
        _finish_candidate(proc, deadline)


def _profile(out: dict[str, Any], proc: Any, spec: dict[str, Any], source: str,
             filename: str, options: dict[str, Any], target: Any, measured_chip: Any,
             dyn: Any, static: Any, task_flops: float | None, interpret: bool,
             phases: dict[str, float], started: float, deadline: float) -> dict[str, Any]:
    from tilewright.kernels.worker.candidate import judge

    iters = int(options.get("iters") or (3 if interpret else 20))
    static_only = bool(options.get("static_only"))
    # A host with a chip: only the judge may open it, so the candidate process analyses
    # and exports, and the run under the profiler is the judge's, of that program.
    from tilewright.kernels.worker.evaluation.on_chip import export_platform

    export_for = export_platform(out["backend"], options.get("route"))
    exported: dict[str, Any] = {}
    try:
        reply = _in_candidate_process(proc, spec, source, filename, interpret, target.name, {
            "chip": target.name, "interpret": interpret, "iters": iters,
            "python_tracer": bool(options.get("python_tracer")),
            "static_only": static_only or export_for is not None,
            "task_flops": task_flops}, judge.pickled(dyn, static), deadline,
            export_for=None if static_only else export_for, config=out["shape"]["name"],
            exported=exported)
    except _Fault as fault:
        out["status"] = "error"
        out["error"] = fault.error
        out["duration_s"] = time.perf_counter() - started
        return out
    for name in ("load_s", "static_s"):
        phases[name] = _seconds(reply.get(name))
    analysis = reply.get("analysis")
    outputs = _outputs(reply.get("outputs"))
    if not isinstance(analysis, dict) or outputs is None:
        return _error(out, "crashed", "the candidate process sent a malformed profile "
                      "(no analysis or outputs); it was replaced")
    out["analysis"] = analysis

    if static_only:
        out.update(logdir=None, run_dir=None, perfetto=None, wall=None, timeline=None,
                   top_ops=[], per_iteration=None,
                   pallas_share={"value": None, "reason": "static analysis only (no run)"})
        return _finish_safely(out, analysis, dyn, outputs, target, measured_chip, task_flops,
                              interpret, phases, started)

    t0 = time.perf_counter()
    if export_for is not None:  # the judge runs the exported program under the profiler
        try:
            cap = _capture_exported(exported, export_for, dyn, out["shape"]["name"], iters,
                                    options)
        except Stopped as stop:
            out["status"] = "error"
            out["error"] = {"kind": stop.error.kind, "message": stop.error.message,
                            "line": stop.error.line, "traceback": None,
                            "hint": stop.error.hint}
            out["duration_s"] = time.perf_counter() - started
            return out
        out["route"] = "exported"
        phases["capture_s"] = time.perf_counter() - t0
    else:
        try:
            cap = _take_trace(reply.get("capture"), proc.scratch, options.get("logdir"))
        except ValueError as exc:
            judge.recycle_candidate("it reported a trace outside its scratch dir")
            return _error(out, "crashed", f"the candidate process's trace was refused: {exc}")
        phases["capture_s"] = _seconds(reply.get("capture_s"))
    phases["copy_s"] = time.perf_counter() - t0
    out["logdir"] = cap["logdir"]
    out["run_dir"] = cap["run_dir"]
    out["perfetto"] = cap["perfetto"]
    out["wall"] = {"iters": cap["iters"], "iter_ms": cap["iter_ms"],
                   "median_ms": sorted(cap["iter_ms"])[len(cap["iter_ms"]) // 2]
                   if cap["iter_ms"] else None}

    t0 = time.perf_counter()
    try:
        _convert(out, cap, analysis)
    except Exception as exc:  # the raw trace is kept; say why there is no timeline
        out.update(timeline=None, top_ops=[], per_iteration=None,
                   pallas_share={"value": None,
                                 "reason": f"xprof could not convert the trace: {exc}"})
        out["convert_error"] = f"{type(exc).__name__}: {exc}"
    phases["convert_s"] = time.perf_counter() - t0
    return _finish_safely(out, analysis, dyn, outputs, target, measured_chip, task_flops,
                          interpret, phases, started)


class _Fault(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.error = error


def _capture_exported(exported: dict[str, Any], platform: str, dyn: Any, config: str,
                      iters: int, options: dict[str, Any]) -> dict[str, Any]:
    """The candidate's exported program, checked and compiled here
    (``ExportedPrograms.adopt``), run ``iters`` times under the profiler in this process,
    on its device: the trace's device plane is the chip's own."""
    import jax

    from tilewright.kernels.worker.evaluation.exported import ExportedPrograms
    from tilewright.profiling.capture import capture

    if not exported.get("blob"):
        raise Stopped("crashed", EvalError(kind="crashed", message="the candidate process "
                      "sent no exported program to profile"))
    runner = ExportedPrograms(platform)
    program = runner.adopt(config, exported["blob"], tuple(dyn), None, 0)
    logdir = options.get("logdir") or tempfile.mkdtemp(prefix="tilewright-profile-")
    flat = jax.device_put(jax.tree.leaves(tuple(dyn)))
    return capture(jax.jit(program.exported.call), tuple(flat), logdir, iters=iters,
                   python_tracer=False)


def _in_candidate_process(proc: Any, spec: dict[str, Any], source: str, filename: str,
                          interpret: bool, chip: str, header: dict[str, Any], blob: bytes,
                          deadline: float, *, export_for: str | None = None,
                          config: str = "", exported: dict[str, Any] | None = None,
                          ) -> dict[str, Any]:
    """Load the candidate in the candidate process and profile it there; then the
    ``finish`` report decides whether that process stays warm. ``export_for``: also have
    it export its program at ``config`` for the judge to run (into ``exported["blob"]``)."""
    from tilewright.kernels.worker.candidate import judge
    from tilewright.kernels.worker.candidate.channel import CandidateError

    def ask(name: str, head: dict[str, Any], data: bytes) -> dict[str, Any]:
        try:
            reply, found = proc.request(name, head, data, deadline,
                                        max_blob=256 << 20 if name == "prepare" else 1 << 20)
            if exported is not None and name == "prepare":
                exported["blob"] = found
        except judge.CandidateFailure as failure:
            proc.start()  # a fresh one warms up for the next request
            raise _Fault({"kind": failure.kind if failure.kind != "protocol" else "crashed",
                          "message": failure.message, "line": None, "traceback": None,
                          "hint": None}) from None
        if reply.get("ok") is True:
            return reply
        fault = CandidateError.parse(reply, _FAULTS)  # the channel's one reading of it
        if fault is None:
            judge.recycle_candidate("it reported an unknown failure")
            error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
            raise _Fault({"kind": "crashed", "message": f"the candidate process reported an "
                          f"unknown failure {reply.get('status')!r}/{error.get('kind')!r}; "
                          "it was replaced", "line": None, "traceback": None, "hint": None})
        if fault.kind == "harness_tampering":
            judge.recycle_candidate("it tampered with the harness")
        raise _Fault({"kind": fault.kind, "message": fault.message, "line": fault.line,
                      "traceback": fault.traceback, "hint": fault.hint})

    t0 = time.perf_counter()
    ask("load", {"spec": spec, "filename": filename, "interpret": interpret,
                 "chip": chip, "lowering": False, "export_for": export_for}, source.encode())
    load_s = time.perf_counter() - t0
    reply = ask("profile", header, blob)
    reply["load_s"] = load_s
    if export_for is not None:
        ask("prepare", {"config": config}, blob)
    return reply


def _finish_candidate(proc: Any, deadline: float) -> None:
    from tilewright.kernels.worker.candidate import judge
    from tilewright.kernels.worker.candidate.channel import FinishReport

    if proc.proc is None or not proc.ready:
        return
    try:
        reply, _ = proc.request("finish", {}, b"", max(deadline, time.monotonic() + 5.0))
    except judge.CandidateFailure:
        proc.start()
        return
    if FinishReport.parse(reply).untrustworthy:
        judge.recycle_candidate("the profiled candidate left it untrustworthy")


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _outputs(value: Any) -> list[Any] | None:
    """The outputs' (shape, dtype) pairs as the candidate process reported them."""
    import numpy as np

    if not isinstance(value, list) or len(value) > 4096:
        return None
    found = []
    for item in value:
        try:
            shape, dtype = item
            found.append(SimpleNamespace(shape=tuple(int(d) for d in shape),
                                         dtype=np.dtype(str(dtype))))
        except (TypeError, ValueError):
            return None
    return found


def _inside(path: Any, root: str) -> str:
    if not isinstance(path, str) or not root:
        raise ValueError("no path")
    real, base = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, base]) != base:
        raise ValueError(f"{path} is not in the candidate process's scratch dir")
    return real


def _take_trace(cap: Any, scratch: str | None, wanted: str | None) -> dict[str, Any]:
    """The candidate's trace copied into a directory of the judge's (regular files only,
    never through a link, within TRACE_*_LIMIT), with the capture's paths rewritten."""
    if not isinstance(cap, dict) or scratch is None:
        raise ValueError("no capture")
    source = _inside(cap.get("logdir"), scratch)
    run_dir = _inside(cap.get("run_dir") or source, scratch)
    dest = Path(wanted) if wanted else Path(tempfile.mkdtemp(prefix="tilewright-profile-"))
    dest.mkdir(parents=True, exist_ok=True)
    copied, total = 0, 0
    for current, dirs, files in os.walk(source, followlinks=False):
        for name in files:
            src = os.path.join(current, name)
            info = os.lstat(src)
            if not stat.S_ISREG(info.st_mode):
                continue
            total += info.st_size
            copied += 1
            if copied > TRACE_FILES_LIMIT or total > TRACE_BYTES_LIMIT:
                raise ValueError(f"more than {TRACE_FILES_LIMIT} files or "
                                 f"{TRACE_BYTES_LIMIT >> 20} MiB")
            target = dest / os.path.relpath(src, source)
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh, open(target, "wb") as out:
                shutil.copyfileobj(fh, out)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(current, d))]
    shutil.rmtree(source, ignore_errors=True)  # the candidate's copy is no longer needed

    def moved(path: str) -> str:
        return str(dest / os.path.relpath(path, source))

    new_run = Path(moved(run_dir))
    iter_ms = [float(x) for x in cap.get("iter_ms") or [] if isinstance(x, int | float)]
    return {"logdir": str(dest), "run_dir": str(new_run),
            "xplane": [str(p) for p in sorted(new_run.glob("*.xplane.pb"))],
            "perfetto": str(new_run / "perfetto_trace.json.gz")
            if (new_run / "perfetto_trace.json.gz").is_file() else None,
            "iters": len(iter_ms), "iter_ms": iter_ms,
            "log": [str(x)[:2000] for x in (cap.get("log") or [])[-50:]]}


def _finish_safely(out: dict[str, Any], analysis: dict[str, Any], dyn: Any,
                   outputs: list[Any], target: Any, measured_chip: Any,
                   task_flops: float | None, interpret: bool, phases: dict[str, float],
                   started: float) -> dict[str, Any]:
    """``_finish`` on an analysis the candidate process reported: one that does not
    have the expected form is an error of the profile, not of the judge."""
    try:
        return _finish(out, analysis, dyn, outputs, target, measured_chip, task_flops,
                       interpret, phases, started)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        from tilewright.kernels.worker.candidate import judge

        judge.recycle_candidate("it reported a malformed analysis")
        return _error(out, "crashed", f"the candidate process's analysis was malformed "
                      f"({type(exc).__name__}: {exc}); it was replaced")


def _finish(out: dict[str, Any], analysis: dict[str, Any], dyn: Any, outputs: list[Any],
            target: Any, measured_chip: Any, task_flops: float | None, interpret: bool,
            phases: dict[str, float], started: float) -> dict[str, Any]:
    from tilewright.profiling.digest import digest

    out["roofline"] = _roofline(out, analysis, dyn, outputs, target, measured_chip, task_flops,
                                interpret)
    out["phases"] = phases
    out["duration_s"] = time.perf_counter() - started
    out["digest"] = digest(out)  # the few lines an agent reads
    return out


def _convert(out: dict[str, Any], cap: dict[str, Any], analysis: dict[str, Any]) -> None:
    from tilewright.profiling import convert

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

    from tilewright.profiling import chips

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
        from tilewright.profiling.static_rules import STEP_OVERHEAD_S

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
    from tilewright.profiling import chips

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


def _error(out: dict[str, Any], kind: str, message: str) -> dict[str, Any]:
    out["status"] = "error"
    out["error"] = {"kind": kind, "message": message, "line": None, "traceback": None,
                    "hint": None}
    return out
