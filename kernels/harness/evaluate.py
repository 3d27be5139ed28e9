"""One evaluation of a candidate, inside a worker: the ``eval`` op.

The order is part of the contract (docs/EVALUATION.md, "The steps, in order"):

1. Load the task runtime (cached per task in a warm worker) and pick the shape
   configurations meant for this host (small ones on CPU, all on hardware).
2. Compute the reference outputs for every configuration and trial, with fresh random
   keys, *before* the candidate's code is loaded: it cannot influence them.
3. Snapshot the guarded modules, then load the candidate (syntax error, import
   failure or missing entry point -> compile_error / runtime_error). After every
   piece of candidate code runs, and before its output is compared, the guarded
   modules are checked (``harness_tampering`` -> rejected, worker recycled).
4. Per configuration: trace (``no_pallas_call`` from the jaxpr -> rejected when the
   task requires Pallas) and lower for TPU (``lowering_platforms=("tpu",)``, lowered,
   not compiled) -> compile_error on failure, even where interpret mode would run it.
5. Run every trial (TPU interpret mode on a CPU host, native on a TPU), compare in
   float32; the first trial runs twice (``nondeterministic``).
6. Check for tampering, then time candidate and reference the same way
   (``kernels.harness.timing``) on one configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import replace
from typing import Any

import numpy as np

from kernels.harness import errors, integrity, timing, tpu_compile
from kernels.harness.backend import backend_info
from kernels.harness.compare import Host, compare, finite_or_none, to_host
from kernels.harness.execution import (
    execution_mode,
    jitted_reference,
    reset_interpret_state,
    task_runtime,
)
from kernels.result import EvalResult
from kernels.task import ShapeConfig, Task, TaskError

MIN_TRIALS = 3
HOST_SIM_ITERS = 3  # interpret-mode timing: host simulation time, not TPU performance
DEFAULT_CHIP = "v5e"  # the chip a CPU host compiles for when none is chosen
KEEP_INPUT_BYTES = 256 << 20  # trial inputs kept between the reference and candidate passes
_CROSS_PLATFORM_CALLBACK = "is different from the lowering platform"


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


def _task_error(exc: BaseException, path: Any, what: str) -> TaskError:
    """``exc`` raised by the task's own code, as a TaskError at the task file's line."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == str(path):
            line = tb.tb_lineno
        tb = tb.tb_next
    error = TaskError(path, f"{what}: {errors.short_message(exc)}", line=line)
    error.__cause__ = exc
    return error


class _Stop(Exception):
    """Ends an evaluation early with ``result`` already filled in."""


def evaluate_request(payload: dict[str, Any]) -> dict[str, Any]:
    """The ``eval`` op: ``{task, source, filename, options}`` -> EvalResult JSON."""
    evaluation = Evaluation(payload["task"], payload["source"],
                            payload.get("filename") or "kernel.py", payload.get("options") or {})
    result = evaluation.run()
    data = result.to_json()
    if evaluation.recycle:
        data["_recycle"] = True  # the worker process is no longer trustworthy
    return data


class Evaluation:
    def __init__(self, spec: dict[str, Any], source: str, filename: str,
                 options: dict[str, Any]) -> None:
        self.spec = spec
        self.task = Task.from_spec(spec)
        self.source = source
        self.filename = filename
        # Never fewer than MIN_TRIALS: one trial cannot tell a stale cache from a kernel.
        self.trials = max(int(options.get("trials") or MIN_TRIALS), MIN_TRIALS)
        self.iters = options.get("iters")
        self.time_budget_s = float(options.get("time_budget_s") or 3.0)
        self.lowering = bool(options.get("lowering", True))
        self.timing = bool(options.get("timing", True))
        self.shape_names = options.get("shapes")
        self.backend = backend_info()
        self.interpret = self.backend["mode"] == "tpu-interpret"
        self.flags: list[str] = []
        self.phases: dict[str, float] = {}
        self.recycle = False
        self.lowering_limited = False
        self.pallas_lines: list[int] = []  # where the candidate calls pallas_call
        self.outside_compute: list[str] = []  # work found outside every pallas_call
        self.snapshot: integrity.ModuleSnapshot | None = None
        self._kept_inputs: dict[tuple[str, int], tuple[tuple, tuple]] = {}
        self._kept_bytes = 0  # a shape could not be lowered for host reasons
        self.result = EvalResult(status="correct", backend=None)
        self.chip = str(options.get("chip") or _own_chip(self.backend) or DEFAULT_CHIP)
        self.tpu_jobs: list[tuple[ShapeConfig, tuple, tuple, Any]] = []  # config, inputs, job
        if self.lowering:
            tpu_compile.start()  # its thread predates the candidate's: not "background_threads"
        self.shape_details: list[dict[str, Any]] = []

    # -- driver ----------------------------------------------------------------------

    def run(self) -> EvalResult:
        from kernels.result import Backend

        started = time.perf_counter()
        self.result.backend = Backend(**self.backend)
        try:
            self._run()
        except _Stop:
            pass
        finally:
            self._restore()
        if self.result.tpu is None and self.tpu_jobs:
            with contextlib.suppress(_Stop):
                self._tpu_verdict(None, apply=False)  # stopped early: still say what it compiled to
        result = self.result
        result.integrity = {"flags": sorted(set(self.flags))}
        if self.outside_compute:
            result.integrity["outside_compute"] = self.outside_compute[:20]
        result.extra.update(shapes=self.shape_details, phases=self.phases,
                            interpret=self.interpret)
        result.duration_s = time.perf_counter() - started
        return result

    def _restore(self) -> None:
        """Undo what a candidate may have changed in this process's JAX configuration."""
        if self.snapshot is None:
            return
        changed, restored = self.snapshot.restore_config()
        if changed:
            self.flags.append("jax_config_changed")
            self.result.extra["jax_config_changed"] = changed
            if not restored:
                self.recycle = True

    def _phase(self, name: str, since: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - since

    def _fail(self, status: str, kind: str, exc: BaseException | None = None,
              message: str | None = None, hint: str | None = None) -> None:
        error = (errors.describe(exc, kind, self.filename) if exc is not None
                 else {"kind": kind, "message": message or kind, "line": None,
                       "traceback": None, "hint": hint})
        if message:
            error["message"] = message
        if error["line"] is None and kind == "runtime" and len(self.pallas_lines) == 1:
            # A failure inside an interpreted kernel has no Python frame of the candidate:
            # point at the pallas_call that launched it.
            error["line"] = self.pallas_lines[0]
        if hint:
            error["hint"] = hint
        if kind == "task":  # the task's fault: point at the task's file, not the candidate
            error["line"] = exc.line if isinstance(exc, TaskError) else None
            error["file"] = exc.path if isinstance(exc, TaskError) else None
        from kernels.result import EvalError

        self.result.status = status
        self.result.error = EvalError(**error)
        raise _Stop

    def _run(self) -> None:

        t = time.perf_counter()
        try:
            runtime = task_runtime(self.spec)
            configs = self._configs(runtime)
        except _Stop:
            raise
        except Exception as exc:  # the task's fault, not the candidate's
            if not isinstance(exc, TaskError):
                exc = _task_error(exc, self.task.reference_path, "loading the task failed")
            self._fail("runtime_error", "task", exc, message=str(exc))
        self._phase("runtime_s", t)

        # 2. references first, with fresh keys the candidate cannot predict
        t = time.perf_counter()
        seeds = {c.name: [int.from_bytes(os.urandom(4), "little") for _ in range(self.trials)]
                 for c in configs}
        references: dict[str, list[Host]] = {}
        try:
            for config in configs:
                references[config.name] = []
                for seed in seeds[config.name]:
                    dyn, static = self._inputs(runtime, config, seed)
                    fn = jitted_reference(runtime, len(dyn), len(static))
                    # same mode as the candidate: a reference may itself use Pallas
                    with execution_mode(self.interpret):
                        references[config.name].append(to_host(fn(*dyn, *static)))
        except Exception as exc:
            if self.interpret:
                reset_interpret_state()
            if not isinstance(exc, TaskError):  # the reference itself failed
                exc = _task_error(exc, self.task.reference_path, "the reference failed")
            self._fail("runtime_error", "task", exc, message=str(exc))
        self._phase("reference_s", t)

        # 3. the candidate
        t = time.perf_counter()
        self.snapshot = integrity.ModuleSnapshot()
        entry = self._load_candidate(runtime)
        self._check_tampering()
        self._phase("load_s", t)

        # 4 + 5. trace, lower, run, compare: configuration by configuration
        for config in configs:
            self.shape_details.append(self._check_config(
                runtime, entry, config, seeds[config.name], references[config.name]))
        details = self.shape_details
        failed = [d for d in details if not d["correct"]]
        abs_diffs = [d["max_abs_diff"] for d in details if d["max_abs_diff"] is not None]
        rel_diffs = [d["max_rel_diff"] for d in details if d["max_rel_diff"] is not None]
        all_correct = not failed
        self.result.correctness = {
            "correct": all_correct, "trials": self.trials,
            # null when a failing shape has no number to give (NaN output, wrong shape)
            "max_abs_diff": max(abs_diffs) if abs_diffs and not any(
                d["max_abs_diff"] is None for d in failed) else None,
            "max_rel_diff": max(rel_diffs) if rel_diffs else None,
            "atol": details[0]["atol"], "rtol": details[0]["rtol"],
            "reason": f"{failed[0]['name']}: {failed[0]['reason']}" if failed else None,
        }
        t = time.perf_counter()
        self._tpu_verdict(runtime)  # joins the background compiles; a refusal stops here
        self._phase("tpu_wait_s", t)
        if self.snapshot is not None and self.snapshot.new_threads():
            self.flags.append("background_threads")
            self.recycle = True  # they would run on during the next candidate's timing
        if not all_correct:
            self.result.status = "incorrect"
            return

        # 6. timing
        if self.timing:
            t = time.perf_counter()
            self._time(runtime, entry, configs, seeds)
            self._phase("timing_s", t)

    # -- steps -----------------------------------------------------------------------

    def _configs(self, runtime: Any) -> list[ShapeConfig]:
        platform = self.backend["platform"]
        all_configs = list(runtime.configs())
        host = list(replace(self.task, shapes=tuple(all_configs)).shapes_for(platform))
        if self.shape_names:
            known = {c.name for c in all_configs}
            unknown = [n for n in self.shape_names if n not in known]
            if unknown:
                self._fail("runtime_error", "task", message=f"unknown shape configuration(s) "
                           f"{unknown}; the task has {sorted(known)}")
            host = [c for c in all_configs if c.name in self.shape_names]
        if not host:
            sizes = ", ".join(f"{c.name} ({c.size})" for c in all_configs)
            self._fail("runtime_error", "task", message=f"no shape configuration is meant for "
                       f"a {platform} host (the task has: {sizes}); add a small one or "
                       "shrink one with --set", hint="On a CPU host only configurations "
                       "marked size='small' run (TPU interpret mode is slow).")
        return host

    def _jit(self, fn: Any, dyn: tuple, static: tuple) -> Any:
        import jax

        static_argnums = tuple(range(len(dyn), len(dyn) + len(static))) or None
        return jax.jit(fn, static_argnums=static_argnums)

    def _load_candidate(self, runtime: Any) -> Any:
        from kernels.harness.runtime import MissingEntryPoint

        try:
            return runtime.load_candidate(self.source, self.filename)
        except SyntaxError as exc:
            self._fail("compile_error", "syntax", exc,
                       message=f"SyntaxError: {exc.msg} (line {exc.lineno})")
        except MissingEntryPoint as exc:
            self._fail("compile_error", "missing_entry", exc, message=str(exc),
                       hint=f"Define `def {self.task.entry}(*inputs)` at module level; it "
                            "receives the task's inputs and returns the output.")
        except BaseException as exc:  # import-time failure, sys.exit included
            self._fail("runtime_error", "exit" if isinstance(exc, SystemExit) else "import",
                       exc)
        raise AssertionError("unreachable")

    def _check_config(self, runtime: Any, entry: Any, config: ShapeConfig,
                      seeds: list[int], references: list[Host]) -> dict[str, Any]:

        atol, rtol = runtime.tolerance(config, references[0].dtype)
        detail: dict[str, Any] = {
            "name": config.name, "held_out": config.held_out, "trials": 0,
            "atol": atol, "rtol": rtol, "correct": False, "reason": None,
            "max_abs_diff": None, "max_rel_diff": None,
        }
        if not config.held_out:
            detail["params"] = config.params
        dyn, static = self._inputs(runtime, config, seeds[0])
        fn = self._jit(entry, dyn, static)

        t = time.perf_counter()
        try:
            # under the chip's abstract device: lowering asks the trace's context which
            # TPU it is for (integer division, sign), and a CPU is not an answer
            with tpu_compile.abstract_device(self.chip if self.lowering else None):
                traced = fn.trace(*dyn, *static)
        except BaseException as exc:
            self._fail("compile_error", "exit" if isinstance(exc, SystemExit) else "trace", exc)
        self._check_tampering()
        self.pallas_lines = integrity.pallas_call_lines(traced.jaxpr, self.filename)
        if not integrity.contains_pallas_call(traced.jaxpr):
            self.flags.append("no_pallas_call")
            if self.task.require_pallas:
                self._fail("rejected", "no_pallas_call", message="the candidate contains no "
                           "pallas_call, and this task requires a Pallas kernel",
                           hint="Write the computation as a pl.pallas_call kernel; a plain "
                                "jax.numpy rewrite is not accepted for this task.")
        else:
            outside = integrity.outside_compute(traced.jaxpr, self.filename)
            if outside:  # the work is done by XLA around the kernel, not by the kernel
                self.flags.append("compute_outside_kernel")
                self.outside_compute = sorted({*self.outside_compute, *outside})
        if self.lowering:
            try:
                with tpu_compile.abstract_device(self.chip):  # a TPU, not the host, answers
                    traced.lower(lowering_platforms=("tpu",))
            except Exception as exc:
                message = errors.short_message(exc)
                if _CROSS_PLATFORM_CALLBACK in message and self.interpret:
                    # Host callbacks (pure_callback, debug.print) need a live TPU backend
                    # to lower for TPU: a limit of this host, not the candidate's fault.
                    self.result.lowering = {"tpu": "skipped", "message": "host callbacks "
                                            "cannot be lowered for TPU without a TPU: "
                                            + message}
                else:
                    self.result.lowering = {"tpu": "error", "message": message,
                                            "shape": config.name}
                    self._fail("compile_error", "lowering", exc)
                    self.lowering_limited = True
            else:
                if not self.lowering_limited:
                    self.result.lowering = {"tpu": "ok", "message": None}
                self._submit_tpu_compile(fn, config, dyn, static)
        self._phase("trace_lower_s", t)

        t = time.perf_counter()
        worst_abs, worst_rel = 0.0, 0.0
        for trial, (seed, expected) in enumerate(zip(seeds, references, strict=True)):
            if trial:
                dyn, static = self._inputs(runtime, config, seed)
            out = self._execute(fn, dyn, static)
            if trial == 0:
                again = self._execute(fn, dyn, static)
                if not integrity.outputs_identical(out.leaves, again.leaves):
                    self.flags.append("nondeterministic")
            if integrity.is_degenerate(expected.leaves):  # every trial: the same flags each run
                self.flags.append("degenerate_reference")
            verdict = compare(out, expected, atol, rtol)
            detail["trials"] = trial + 1
            if verdict.max_abs_diff is not None:
                worst_abs = max(worst_abs, verdict.max_abs_diff)
                worst_rel = max(worst_rel, verdict.max_rel_diff or 0.0)
            if not verdict.close:
                known = verdict.max_abs_diff is not None
                detail.update(reason=f"trial {trial + 1}: {verdict.reason}",
                              max_abs_diff=finite_or_none(worst_abs) if known else None,
                              max_rel_diff=finite_or_none(worst_rel) if known else None)
                self._phase("trials_s", t)
                return detail
        detail.update(correct=True, max_abs_diff=finite_or_none(worst_abs),
                      max_rel_diff=finite_or_none(worst_rel))
        self._phase("trials_s", t)
        return detail

    def _inputs(self, runtime: Any, config: ShapeConfig, seed: int) -> tuple[tuple, tuple]:
        """Inputs for one trial. Kept from the reference pass while they are small (the
        candidate never saw them: it was loaded later); rebuilt from the same key when
        keeping them all would cost too much memory (TPU-sized configurations)."""
        import jax

        key = (config.name, seed)
        if key in self._kept_inputs:
            return self._kept_inputs[key]
        inputs = runtime.make_inputs(config, jax.random.PRNGKey(seed))
        size = sum(int(getattr(a, "nbytes", 0)) for a in inputs[0])
        if self._kept_bytes + size <= KEEP_INPUT_BYTES:
            self._kept_inputs[key] = inputs
            self._kept_bytes += size
        return inputs

    def _execute(self, fn: Any, dyn: tuple, static: tuple) -> Host:
        import jax

        t = time.perf_counter()
        try:
            with execution_mode(self.interpret):
                out = jax.block_until_ready(fn(*dyn, *static))
            self._phase("kernel_run_s", t)  # compile (first call) + run of the candidate
        except BaseException as exc:
            if self.interpret:
                reset_interpret_state()
            kind = "exit" if isinstance(exc, SystemExit) else "runtime"
            self._fail("runtime_error", kind, exc)
        self._check_tampering()
        return to_host(out)

    def _check_tampering(self) -> None:
        """After every piece of candidate code ran: before its outputs are compared."""
        assert self.snapshot is not None
        changed = self.snapshot.changed()
        if changed:
            self.flags.append("harness_tampering")
            self.recycle = True
            shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
            self._fail("rejected", "harness_tampering", message="the candidate replaced "
                       f"attributes of modules the harness relies on: {shown}")

    def _time(self, runtime: Any, entry: Any, configs: list[ShapeConfig],
              seeds: dict[str, list[int]]) -> None:

        visible = [c for c in configs if not c.held_out] or configs
        # The biggest visible configuration: the one where the kernel's work dominates.
        sized = []
        for config in visible:
            dyn, static = self._inputs(runtime, config, seeds[config.name][0])
            sized.append((sum(int(np.prod(a.shape)) for a in dyn), config, dyn, static))
        _, config, dyn, static = max(sized, key=lambda item: item[0])
        kernel_fn = self._jit(entry, dyn, static)
        ref_fn = jitted_reference(runtime, len(dyn), len(static))
        budget = self.time_budget_s / 2
        # Off-TPU the interpreter's time is a host simulation time: a few calls, no more.
        iters = self.iters or (HOST_SIM_ITERS if self.interpret else None)
        try:
            with execution_mode(self.interpret):
                t = time.perf_counter()
                kernel = timing.measure(kernel_fn, (*dyn, *static), budget, iters)
                self._phase("kernel_timing_s", t)
                baseline = timing.measure(ref_fn, (*dyn, *static), budget, iters)
        except Exception as exc:
            if self.interpret:
                reset_interpret_state()
            self._fail("runtime_error", "runtime", exc)
        self._check_tampering()  # a patched clock would fake the speedup
        flops, flops_source = None, "task"
        with contextlib.suppress(Exception):
            flops = runtime.flops(config, dyn)
        if flops is None:  # the task gives none (most JAXBench workloads): ask XLA
            flops, flops_source = _xla_flops(ref_fn, dyn, static), "xla_cost_analysis"
        self.result.timing = timing.record(kernel, baseline, self.backend["mode"], config.name,
                                           flops)
        self.result.timing["flops_source"] = flops_source if flops is not None else None
        if self.interpret:
            self.result.timing["label"] = "host simulation time"
        if (self.result.timing["speedup"] or 0.0) > integrity.SUSPICIOUS_SPEEDUP:
            self.flags.append("suspicious_speedup")

    # -- the TPU compiler (kernels.harness.tpu_compile) --------------------------------

    def _submit_tpu_compile(self, fn: Any, config: ShapeConfig, dyn: tuple,
                            static: tuple) -> None:
        """Lower for the session's chip now (tracing runs candidate code: checked for
        tampering right after) and compile in the background, overlapped with the
        trials. On a TPU host the compile is the device's own, done at once."""
        where, why = tpu_compile.target(self.chip)
        if where is None:
            self.tpu_jobs.append((config, dyn, static, why))
            return
        try:
            lowered = tpu_compile.lower(fn, dyn, static, where)
        except Exception as exc:
            self._check_tampering()
            self.tpu_jobs.append((config, dyn, static, exc))
            return
        self._check_tampering()
        job = tpu_compile.submit(lowered, where)
        if where.native:
            job.result()  # the dump directory must not see the trials' own compiles
        self.tpu_jobs.append((config, dyn, static, job))

    def _tpu_verdict(self, runtime: Any, apply: bool = True) -> None:
        """The ``tpu`` section from the compiles; with ``apply``, a refusal by the TPU
        compiler makes the evaluation a compile_error naming the compiler's message."""
        if not self.tpu_jobs:
            return
        verdicts = []
        for config, dyn, static, job in self.tpu_jobs:
            if isinstance(job, str):
                found = {"compile": "unavailable", "message": job}
            elif isinstance(job, BaseException):
                message = errors.short_message(job)
                unavailable = _CROSS_PLATFORM_CALLBACK in message or "callback" in message
                found = {"compile": "unavailable" if unavailable else "error",
                         "kind": "lowering", "message": message}
            else:
                found = job.result()
            verdicts.append((config, dyn, static, found))
        refused = [v for v in verdicts if v[3]["compile"] == "error"]
        sized = [v for v in verdicts if not v[0].held_out] or verdicts
        config, dyn, static, found = (refused or [max(
            sized, key=lambda v: sum(int(np.prod(a.shape)) for a in v[1]))])[0]
        section: dict[str, Any] = {
            "chip": self.chip, "compile": found["compile"],
            "message": tpu_compile.short(found["message"]) if found.get("message") else None,
            "vmem_bytes": found.get("vmem_bytes"), "vmem_limit_bytes": found.get(
                "vmem_limit_bytes") or _scoped_limit(self.chip),
            "estimate": found.get("estimate"), "reference_estimate": None,
            "estimated_speedup": None, "shape": config.name if not config.held_out else None,
            "estimate_unavailable": found.get("estimate_unavailable"),
            "compile_s": sum(v[3].get("compile_s") or 0.0 for v in verdicts),
            "compiled_shapes": len(verdicts),
        }
        where, _ = tpu_compile.target(self.chip)
        if found["compile"] == "ok" and found.get("estimate") and runtime is not None \
                and where is not None:
            key = "|".join((json.dumps(self.spec, sort_keys=True, default=str), config.name,
                            json.dumps(config.params, sort_keys=True, default=str), self.chip))
            ref = tpu_compile.reference_estimate(
                key, jitted_reference(runtime, len(dyn), len(static)), dyn, static, where)
            section["reference_estimate"] = ref
            if ref and found["estimate"]["cycles"]:
                section["estimated_speedup"] = ref["cycles"] / found["estimate"]["cycles"]
            elif not ref:
                section["estimate_unavailable"] = ("no estimate for the XLA reference on "
                                                   f"{self.chip}")
        self.result.tpu = section
        if apply and found["compile"] == "error":
            from kernels.result import EvalError

            kind = found.get("kind") or "tpu_compile"
            what = {"vmem": "exceeds the scoped VMEM", "mosaic": "is refused by Mosaic",
                    "lowering": "cannot be lowered"}.get(kind, "is refused by the TPU compiler")
            hint = None
            if kind == "vmem":
                used, limit = section["vmem_bytes"], section["vmem_limit_bytes"]
                hint = (f"The kernel's blocks need {_mib(used)} of VMEM; {self.chip} gives a "
                        f"kernel {_mib(limit)} by default. Use smaller blocks, fewer "
                        "double-buffered operands, or raise the limit with "
                        "pltpu.CompilerParams(vmem_limit_bytes=...).")
            self.result.status = "compile_error"
            self.result.error = EvalError(
                kind="tpu_compile" if kind != "lowering" else "lowering",
                message=f"on {self.chip} the kernel {what} (shape {config.name}): "
                        f"{section['message']}",
                line=self.pallas_lines[0] if len(self.pallas_lines) == 1 else None,
                traceback=None, hint=hint)
            raise _Stop


def _own_chip(backend: dict[str, Any]) -> str | None:
    """On a TPU host: the device's own chip (its device time ranks kernels)."""
    if backend.get("platform") != "tpu":
        return None
    from profiling.chips import chip_for_device

    try:
        return chip_for_device("tpu", backend.get("device_kind") or "").name
    except KeyError:
        return None


def _scoped_limit(chip: str) -> int | None:
    from profiling.chips import get_chip

    try:
        return get_chip(chip).scoped_vmem_bytes
    except KeyError:
        return None


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / (1 << 20):.1f} MiB"
