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
import os
import random
import re
import time
from dataclasses import replace
from typing import Any

import numpy as np

from kernels.harness import errors, integrity, judge, timing, tpu_compile, wire
from kernels.harness.backend import backend_info
from kernels.harness.compare import Host, compare, finite_or_none, to_host
from kernels.harness.execution import (
    execution_mode,
    jitted_reference,
    reset_interpret_state,
    task_runtime,
)
from kernels.harness.ops import op
from kernels.harness.verdict import ProductionRun
from kernels.result import EvalResult
from kernels.task import ShapeConfig, Task, TaskError
from profiling.chips import backend_is_interpret

MIN_TRIALS = 3
HOST_SIM_ITERS = 3  # interpret-mode timing: host simulation time, not TPU performance
DEFAULT_CHIP = "v5e"  # the chip a CPU host compiles for when none is chosen
KEEP_INPUT_BYTES = 256 << 20  # trial inputs kept between the reference and candidate passes
_CROSS_PLATFORM_CALLBACK = "is different from the lowering platform"
TIMED_SAMPLE = 8  # timed calls whose outputs are checked on hardware (all, off-TPU)
TEXT_LIMIT = 64 * 1024  # any string the candidate process reports
_PALLAS_CUSTOM_CALL = "tpu_custom_call"  # how a Pallas TPU kernel appears in StableHLO
# What the candidate process may report as its failure (anything else: a violation).
_CANDIDATE_STATUSES = {
    "compile_error": {"syntax", "missing_entry", "trace", "lowering", "exit"},
    "runtime_error": {"import", "exit", "runtime"},
    "rejected": {"harness_tampering", "platform_dependent", "interpret_param"},
}
_FAILURE_HINTS = {
    "timeout": "Look for a loop that never ends, or raise --timeout for big shapes in "
               "interpret mode (one interpreted call can take seconds on a CPU).",
    "crashed": "The process died in native code; the captured stderr may say where.",
    "exited": "Kernels must not call os._exit/sys.exit; return the output instead.",
    "memory": "Check the sizes the kernel allocates (scratch shapes, intermediate arrays).",
}
# The judge's scan of the TPU lowering for work outside the kernel (summed over ops).
hlo_outside_compute = integrity.hlo_outside_compute


def _text(value: Any, limit: int = TEXT_LIMIT) -> str | None:
    """A string the candidate process reported, bounded; anything else is None."""
    return value[-limit:] if isinstance(value, str) else None


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


ESTIMATE_SCHEMA = "tilewright.estimate/1"


@op("estimate")
def estimate_request(payload: dict[str, Any]) -> dict[str, Any]:
    """The ``estimate`` op: ``{task, source, filename, options}`` -> the production-shape
    verdict and estimate without any correctness check: ``{schema, status (ok |
    compile_error | runtime_error | timeout | crashed | rejected), tpu, error,
    duration_s}``."""
    options = {**(payload.get("options") or {}), "check": False, "timing": False,
               "lowering": True}
    evaluation = Evaluation(payload["task"], payload["source"],
                            payload.get("filename") or "kernel.py", options)
    result = evaluation.run().to_json()
    status = "ok" if result["status"] == "correct" else result["status"]
    out = {"schema": ESTIMATE_SCHEMA, "status": status, "tpu": result.get("tpu"),
           "error": result.get("error"), "backend": result.get("backend"),
           "integrity": result.get("integrity"), "duration_s": result.get("duration_s"),
           "phases": (result.get("extra") or {}).get("phases")}
    if evaluation.recycle:
        out["_recycle"] = True
    return out


@op("eval")
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
        self.options = options
        self.task = Task.from_spec(spec)
        self.source = source
        self.filename = filename
        # Never fewer than MIN_TRIALS: one trial cannot tell a stale cache from a kernel.
        self.trials = max(int(options.get("trials") or MIN_TRIALS), MIN_TRIALS)
        self.iters = options.get("iters")
        self.time_budget_s = float(options.get("time_budget_s") or 3.0)
        self.lowering = bool(options.get("lowering", True))
        self.timing = bool(options.get("timing", True))
        # False: no correctness check at all, only the production verdict and estimate
        # (the ``estimate`` op: ``tilewright estimate``, benchmarks)
        self.check = bool(options.get("check", True))
        self.shape_names = options.get("shapes")
        self.backend = backend_info()
        self.interpret = backend_is_interpret(self.backend)
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
        self.tpu_jobs: list[tuple[ShapeConfig, tuple, tuple, Any]] = []  # TPU host: check shapes
        self.production: ProductionRun | None = None  # the production-shape verdict
        self.check_structures: list[Any] = []  # what the kernels compute, per check shape
        self.shape_details: list[dict[str, Any]] = []
        # The candidate runs in another process (kernels.harness.judge); this one judges.
        timeout_s = float(options.get("timeout_s") or 120.0)
        margin = min(max(0.15 * timeout_s, 0.3), 5.0)  # answer before the app kills us
        self.deadline = time.monotonic() + timeout_s - margin
        self.memory_limit_mb = int(options.get("memory_limit_mb") or judge.DEFAULT_MEMORY_MB)
        self.recycle_candidate = False
        self.candidate_info: dict[str, Any] = {"pid": None, "restarted": False,
                                               "lowering_checked": False}
        self.out_trees: dict[str, str] = {}
        self.current_config = ""
        self._leftovers = 0
        self.timed_checked = 0
        self.timed_failure: str | None = None

    # -- driver ----------------------------------------------------------------------

    def run(self) -> EvalResult:
        from kernels.result import Backend

        started = time.perf_counter()
        self.result.backend = Backend(**self.backend)
        try:
            self._run()
        except _Stop:
            pass
        if self.result.tpu is None and self.production is not None \
                and (self.production.job is not None or self.production.unavailable):
            saved = (self.result.status, self.result.error)
            with contextlib.suppress(_Stop):
                self._tpu_verdict(None, apply=False)  # stopped early: still say what it compiled to
            self.result.status, self.result.error = saved
        self._finish_candidate()
        result = self.result
        self.candidate_info["started"] = judge.process().started
        result.extra["candidate_process"] = self.candidate_info
        if self._leftovers:
            result.extra["leftover_processes"] = self._leftovers
            self.flags.append("spawned_processes")
        result.integrity = {"flags": sorted(set(self.flags))}
        if self.outside_compute:
            result.integrity["outside_compute"] = self.outside_compute[:20]
        result.extra.update(shapes=self.shape_details, phases=self.phases,
                            interpret=self.interpret)
        result.duration_s = time.perf_counter() - started
        return result

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
            configs = self._configs(runtime) if self.check else []
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

        # 3. the candidate, in its own process
        t = time.perf_counter()
        self._load_candidate(runtime)
        self._phase("load_s", t)

        # 3b. its program at the production shape, compiled while the trials run
        if self.lowering:
            t = time.perf_counter()
            self.production = ProductionRun(self)
            self.production.start()
            self._phase("production_export_s", t)
        if not self.check:  # the ``estimate`` op: the production verdict and estimate only
            t = time.perf_counter()
            self._tpu_verdict(runtime)
            self._phase("tpu_wait_s", t)
            return

        # 4 + 5. trace, lower, run, compare: configuration by configuration
        for config in configs:
            self.shape_details.append(self._check_config(
                runtime, config, seeds[config.name], references[config.name]))
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
        # Joins the background compiles; a refusal at the production shape stops here. A
        # kernel wrong at the check shapes is reported wrong first: that is what to fix.
        self._tpu_verdict(runtime, apply=all_correct)
        self._phase("tpu_wait_s", t)
        if not all_correct:
            self.result.status = "incorrect"
            return

        # 6. timing
        if self.timing:
            t = time.perf_counter()
            self._time(runtime, configs, seeds, references)
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

    # -- the candidate process (kernels.harness.candidate via kernels.harness.judge) --

    def _candidate(self, op: str, header: dict[str, Any], blob: bytes = b"",
                   max_blob: int = 1 << 20) -> tuple[dict[str, Any], bytes]:
        """One request to the candidate process. A killed process (timeout, crash, exit,
        memory, a forged or malformed reply) ends the evaluation with that status; an
        error the candidate's code raised ends it with the status the process names."""
        proc = judge.process()
        proc.memory_limit_mb = self.memory_limit_mb
        self.candidate_info["pid"] = proc.pid
        try:
            reply, data = proc.request(op, header, blob, self.deadline, max_blob)
        except judge.CandidateFailure as failure:
            self.candidate_info.update(killed=failure.kind, restarted=True)
            proc.start()  # a fresh one warms up for the next evaluation
            if failure.kind == "crashed" and failure.compiler:
                self._compiler_crashed(failure.fatal or failure.message)
            kind = "crashed" if failure.kind == "protocol" else failure.kind
            self._fail("timeout" if kind == "timeout" else "crashed", kind,
                       message=failure.message, hint=_FAILURE_HINTS.get(kind))
        self.candidate_info["pid"] = proc.pid
        self._leftovers += int(reply.get("leftover_processes") or 0)
        if reply.get("ok") is True:
            return reply, data
        status = reply.get("status")
        error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        kind = error.get("kind")
        if status not in _CANDIDATE_STATUSES or kind not in _CANDIDATE_STATUSES[status]:
            self._protocol_violation(f"an unknown failure {status!r}/{kind!r}")
        if kind == "harness_tampering":
            self.flags.append("harness_tampering")
            self.recycle_candidate = True
        elif status == "rejected":  # platform_dependent, interpret_param: named in flags
            self.flags.append(kind)
        message = _text(error.get("message")) or kind
        line = error.get("line") if isinstance(error.get("line"), int) else None
        if line is None and kind == "runtime" and len(self.pallas_lines) == 1:
            line = self.pallas_lines[0]  # a failure inside an interpreted kernel
        from kernels.result import EvalError

        self.result.status = status
        self.result.error = EvalError(kind=kind, message=message, line=line,
                                      traceback=_text(error.get("traceback")),
                                      hint=_text(error.get("hint")))
        raise _Stop

    def _compiler_crashed(self, fatal: str) -> None:
        """The TPU compiler aborted the candidate process while compiling the kernel (a
        failed internal check, not the kernel's own run): on a TPU the compile fails the
        same way, so it is a compile error naming the compiler's check."""
        from kernels.result import EvalError

        message = tpu_compile.short(fatal)
        self.result.tpu = {
            "chip": self.chip, "compile": "error", "message": message, "vmem_bytes": None,
            "vmem_limit_bytes": _scoped_limit(self.chip) if self.chip else None,
            "estimate": None, "reference_estimate": None, "estimated_speedup": None,
            "estimate_unavailable": "the TPU compiler aborted", "shape": None,
        }
        hint = ("The TPU compiler has trouble with 16-bit floats here: load the blocks and "
                "compute in float32 inside the kernel (x.astype(jnp.float32)), then cast "
                "the result to the output dtype.") if re.search(r"bf16|f16|packed", fatal) \
            else "Simplify the kernel around the operation the check names, or change its "\
                 "block shapes or dtypes."
        self.result.status = "compile_error"
        self.result.error = EvalError(
            kind="tpu_compile", message=f"on {self.chip or 'the TPU'} the TPU compiler aborted on this "
            f"kernel (an internal compiler check failed; the compile would fail on a TPU "
            f"too): {message}",
            line=self.pallas_lines[0] if len(self.pallas_lines) == 1 else None,
            traceback=None, hint=hint)
        raise _Stop

    def _protocol_violation(self, what: str) -> None:
        judge.process().kill()
        judge.process().start()
        self.candidate_info.update(killed="protocol", restarted=True)
        self._fail("crashed", "crashed", message=f"the candidate process sent {what}; it was "
                   "killed and replaced", hint=_FAILURE_HINTS["crashed"])

    def _outputs(self, reply: dict[str, Any], data: bytes, expected: Host) -> Host:
        """The candidate's outputs as untrusted data: allowlisted dtypes, exact sizes."""
        try:
            leaves = wire.unpack_arrays(reply.get("arrays"), data)
        except wire.ProtocolError as exc:
            self._protocol_violation(f"malformed outputs ({exc})")
        tree = self.out_trees.get(self.current_config) or expected.tree
        dtype = leaves[0].dtype if leaves else None
        return Host([np.asarray(leaf).astype(np.float32) for leaf in leaves], tree, dtype)

    def _max_blob(self, expected: Host) -> int:
        """Outputs may be at most this large: twice the reference's, in float64, plus 1 MiB."""
        return 2 * sum(int(leaf.size) * 8 for leaf in expected.leaves) + (1 << 20)

    def _load_candidate(self, runtime: Any) -> None:
        self._candidate("load", {"spec": self.spec, "filename": self.filename,
                                 "interpret": self.interpret, "chip": self.chip,
                                 "lowering": self.lowering,
                                 # what runs on a TPU host is compiled for the device
                                 "check_compile": self._native()}, self.source.encode())

    def _native(self) -> bool:
        where, _ = tpu_compile.target(self.chip) if self.lowering else (None, None)
        return where is not None and where.native

    def _finish_candidate(self) -> None:
        """Put back what the candidate changed in its process; decide whether the process
        stays warm for the next evaluation."""
        proc = judge.process()
        if proc.proc is None or not proc.ready:
            return
        try:
            reply, _ = proc.request("finish", {}, b"", max(self.deadline,
                                                            time.monotonic() + 5.0))
        except judge.CandidateFailure:
            proc.start()
            return
        changed = [c for c in reply.get("config_changed") or [] if isinstance(c, str)]
        if changed:
            self.flags.append("jax_config_changed")
            self.result.extra["jax_config_changed"] = changed[:20]
            if not reply.get("restored"):
                self.recycle_candidate = True
        if reply.get("threads"):
            self.flags.append("background_threads")
            self.recycle_candidate = True  # they would run on during the next timing
        if reply.get("tampered") and "harness_tampering" not in self.flags:
            self.recycle_candidate = True
        if self.recycle_candidate:
            proc.kill()
            proc.start()
            self.candidate_info["restarted"] = True

    def _check_config(self, runtime: Any, config: ShapeConfig,
                      seeds: list[int], references: list[Host]) -> dict[str, Any]:

        atol, rtol = runtime.tolerance(config, references[0].dtype)
        detail: dict[str, Any] = {
            "name": config.name, "held_out": config.held_out, "trials": 0,
            "atol": atol, "rtol": rtol, "correct": False, "reason": None,
            "max_abs_diff": None, "max_rel_diff": None,
        }
        if not config.held_out:
            detail["params"] = config.params
        self.current_config = config.name
        dyn, static = self._inputs(runtime, config, seeds[0])

        t = time.perf_counter()
        facts, _ = self._candidate("prepare", {"config": config.name},
                                   judge.pickled(dyn, static))
        self._judge_facts(config, facts, dyn, static, references[0])
        self._phase("trace_lower_s", t)

        t = time.perf_counter()
        worst_abs, worst_rel = 0.0, 0.0
        max_blob = self._max_blob(references[0])
        for trial, (seed, expected) in enumerate(zip(seeds, references, strict=True)):
            if trial:
                dyn, static = self._inputs(runtime, config, seed)
            blob = judge.pickled(dyn, static)
            started = time.perf_counter()
            out = self._outputs(*self._candidate("run", {"config": config.name}, blob,
                                                 max_blob), expected)
            self._phase("kernel_run_s", started)
            if trial == 0:
                again = self._outputs(*self._candidate("run", {"config": config.name}, blob,
                                                       max_blob), expected)
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

    def _judge_facts(self, config: ShapeConfig, facts: dict[str, Any], dyn: tuple,
                     static: tuple, expected: Host) -> None:
        """Decide from what the candidate process reported, checking what can be checked:
        the TPU lowering's StableHLO text is scanned here for the Pallas custom call and
        for compute outside it; the jaxpr-derived facts are the candidate process's word
        (docs/SECURITY.md says what remains trusted)."""
        lines = facts.get("pallas_lines")
        self.pallas_lines = [x for x in lines if isinstance(x, int)][:50] \
            if isinstance(lines, list) else []
        self.out_trees[config.name] = _text(facts.get("out_tree")) or ""
        hlo = facts.get("hlo_text") if isinstance(facts.get("hlo_text"), str) else None
        claims_pallas = facts.get("pallas_call") is True
        has_pallas = claims_pallas if hlo is None else _PALLAS_CUSTOM_CALL in hlo
        if hlo is not None:
            self.candidate_info["lowering_checked"] = True
        if hlo is not None and claims_pallas != has_pallas:
            self.flags.append("harness_tampering")
            self.recycle_candidate = True
            self._fail("rejected", "harness_tampering", message="the candidate process's "
                       "report contradicts its TPU lowering (pallas_call "
                       f"{'claimed' if claims_pallas else 'denied'}, the lowered program "
                       f"{'has' if has_pallas else 'has no'} Pallas kernel)")
        if not has_pallas:
            self.flags.append("no_pallas_call")
            if self.task.require_pallas:
                self._fail("rejected", "no_pallas_call", message="the candidate contains no "
                           "pallas_call, and this task requires a Pallas kernel",
                           hint="Write the computation as a pl.pallas_call kernel; a plain "
                                "jax.numpy rewrite is not accepted for this task.")
        else:
            outside = [x for x in facts.get("outside_compute") or [] if isinstance(x, str)]
            if hlo is not None:
                sizes = [int(np.prod(getattr(a, "shape", ()))) for a in dyn]
                sizes += [int(leaf.size) for leaf in expected.leaves]
                outside += hlo_outside_compute(hlo, max(sizes, default=0))
            if outside:  # the work is done by XLA around the kernel, not by the kernel
                self.flags.append("compute_outside_kernel")
                self.outside_compute = sorted({*self.outside_compute, *outside})
        lowering = facts.get("lowering")
        if isinstance(lowering, dict) and lowering.get("tpu") in ("ok", "skipped", "error"):
            found = {"tpu": lowering["tpu"], "message": _text(lowering.get("message"))}
            if found["tpu"] == "error":
                self.result.lowering = {**found, "shape": config.name}
                error = facts.get("lowering_error") or {}
                from kernels.result import EvalError

                self.lowering_limited = True
                self.result.status = "compile_error"
                self.result.error = EvalError(
                    kind="lowering", message=_text(error.get("message")) or found["message"]
                    or "lowering failed", line=error.get("line") if isinstance(
                        error.get("line"), int) else None,
                    traceback=_text(error.get("traceback")), hint=_text(error.get("hint")))
                raise _Stop
            if found["tpu"] == "skipped" or not self.lowering_limited:
                self.result.lowering = found
            if self._native():  # compiled for the device at this check shape too
                self.tpu_jobs.append((config, dyn, tuple(static), None))
        structure = facts.get("structure")
        if isinstance(structure, list):
            self.check_structures.append(structure)

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

    def _time(self, runtime: Any, configs: list[ShapeConfig],
              seeds: dict[str, list[int]], references: dict[str, list[Host]]) -> None:
        """Time the candidate's compiled program from here (the judge's clock, round trip
        of a ``call`` on inputs staged just before), every timed call on fresh inputs;
        the outputs of a random sample of them (all, off-TPU) are checked against
        references computed here. Then stop the candidate process and time the baseline."""
        import jax

        visible = [c for c in configs if not c.held_out] or configs
        # On hardware the production shape when it was checked (what is ranked is timed
        # there); else the biggest visible configuration, where the kernel's work
        # dominates.
        production = self.task.production
        chosen = [c for c in visible if not self.interpret and production is not None
                  and c == production]
        sized = []
        for config in chosen or visible:
            dyn, static = self._inputs(runtime, config, seeds[config.name][0])
            sized.append((sum(int(np.prod(a.shape)) for a in dyn), config, dyn, static))
        _, config, dyn, static = max(sized, key=lambda item: item[0])
        self.current_config = config.name
        ref_fn = jitted_reference(runtime, len(dyn), len(static))
        budget = self.time_budget_s / 2
        # Off-TPU the interpreter's time is a host simulation time: a few calls, no more.
        iters = self.iters or (HOST_SIM_ITERS if self.interpret else None)
        expected = references[config.name][0]
        max_blob = self._max_blob(expected)
        atol, rtol = runtime.tolerance(config, expected.dtype)
        rng = random.SystemRandom()

        def one_call(check: bool) -> float:
            seed = rng.getrandbits(32)
            fresh = runtime.make_inputs(config, jax.random.PRNGKey(seed))
            self._candidate("stage", {"config": config.name}, judge.pickled(*fresh))
            started = time.perf_counter()
            self._candidate("call", {})
            elapsed = time.perf_counter() - started
            if check:
                with execution_mode(self.interpret):
                    want = to_host(ref_fn(*fresh[0], *fresh[1]))
                got = self._outputs(*self._candidate("fetch", {}, b"", max_blob), want)
                verdict = compare(got, want, atol, rtol)
                self.timed_checked += 1
                if not verdict.close:
                    self.timed_failure = verdict.reason
            return elapsed

        warm = one_call(check=True)
        if iters is None:
            target = min(max(int(budget / max(warm, 1e-6)), timing.MIN_ITERS), timing.MAX_ITERS)
        else:
            target = max(int(iters), 1)
        # Which calls are checked is drawn here and never told: all of them off-TPU.
        checked = set(range(target)) if self.interpret or target <= TIMED_SAMPLE else \
            set(rng.sample(range(target), TIMED_SAMPLE))
        samples: list[float] = []
        t = time.perf_counter()
        deadline = t + budget
        for i in range(target):
            samples.append(one_call(check=i in checked))
            if self.timed_failure is not None:
                break
            if iters is None and len(samples) >= timing.MIN_ITERS \
                    and time.perf_counter() > deadline:
                break
        if self.timed_failure is not None:
            self.result.status = "incorrect"
            self.result.correctness = {**(self.result.correctness or {}), "correct": False,
                                       "reason": f"{config.name}: timed call: "
                                                 f"{self.timed_failure}"}
            return
        self._phase("kernel_timing_s", t)
        kernel = timing.summarize(samples, warmup=1, extra_s=warm)
        proc = judge.process()
        try:
            with proc.paused(), execution_mode(self.interpret):
                baseline = timing.measure(ref_fn, (*dyn, *static), budget, iters)
        except Exception as exc:
            if self.interpret:
                reset_interpret_state()
            self._fail("runtime_error", "task", exc, message=f"timing the reference "
                       f"failed: {errors.short_message(exc)}")
        flops, flops_source = None, "task"
        with contextlib.suppress(Exception):
            flops = runtime.flops(config, dyn)
        if flops is None:  # the task gives none (most JAXBench workloads): ask XLA
            flops, flops_source = _xla_flops(ref_fn, dyn, static), "xla_cost_analysis"
        self.result.timing = timing.record(kernel, baseline, self.backend["mode"], config.name,
                                           flops)
        self.result.timing["flops_source"] = flops_source if flops is not None else None
        self.result.timing["clock"] = "judge (round trip to the candidate process)"
        from kernels.result import shape_label

        self.result.timing["shape_label"] = shape_label([(a.shape, a.dtype) for a in dyn])
        self.result.timing["checked_calls"] = self.timed_checked
        # the candidate process was stopped (SIGSTOP) while the baseline was timed
        self.result.timing["candidate_paused"] = proc.proc is not None
        if self.interpret:
            self.result.timing["label"] = "host simulation time"
        if (self.result.timing["speedup"] or 0.0) > integrity.SUSPICIOUS_SPEEDUP:
            self.flags.append("suspicious_speedup")

    # -- the TPU compiler (kernels.harness.verdict, kernels.harness.tpu_compile) --------

    def _tpu_verdict(self, runtime: Any, apply: bool = True) -> None:
        """The ``tpu`` section: the compile and estimate at the production shape
        (``kernels.harness.verdict``). With ``apply``, a refusal by the TPU compiler
        there, or at a check shape on a TPU host, makes the evaluation a compile_error
        naming the compiler's message."""
        if self.tpu_jobs and apply:
            self._check_shape_refusal()
        if self.production is None:
            return
        section = self.production.section(verdict_only=not apply)
        self.result.tpu = section
        if self.production.structure_differs(self.check_structures):
            self.flags.append("production_program_differs")
        if apply and section["compile"] == "error":
            from kernels.result import EvalError

            kind = section.get("kind") or "tpu_compile"
            what = {"vmem": "exceeds the scoped VMEM", "mosaic": "is refused by Mosaic",
                    "lowering": "cannot be lowered"}.get(kind, "is refused by the TPU compiler")
            hint = None
            if kind == "vmem":
                used, limit = section["vmem_bytes"], section["vmem_limit_bytes"]
                hint = (f"The kernel's blocks need {_mib(used)} of VMEM; {self.chip} gives a "
                        f"kernel {_mib(limit)} by default. Tile the arrays (a grid over "
                        "blocks that fit), fewer double-buffered operands, or raise the "
                        "limit with pltpu.CompilerParams(vmem_limit_bytes=...).")
            self.result.status = "compile_error"
            self.result.error = EvalError(
                kind="tpu_compile" if kind != "lowering" else "lowering",
                message=f"{self.production.where()} on {self.chip} the kernel {what}: "
                        f"{section['message']}",
                line=self.pallas_lines[0] if len(self.pallas_lines) == 1 else None,
                traceback=None, hint=hint)
            raise _Stop

    def _check_shape_refusal(self) -> None:
        """On a TPU host the check shapes are compiled for the device itself (that is
        what runs): a refusal there is a compile error too."""
        proc = judge.process()
        if not proc.ready:  # killed: nothing compiled to report
            return
        reply, _ = self._candidate("verdicts", {})
        for found in reply.get("verdicts") or []:
            if not isinstance(found, dict) or found.get("compile") != "error":
                continue
            from kernels.result import EvalError

            message = tpu_compile.short(_text(found.get("message")) or "compile failed")
            self.result.status = "compile_error"
            self.result.error = EvalError(
                kind="tpu_compile", message=f"at the check shape {found.get('config')} on "
                f"{self.chip} the TPU compiler refuses the kernel: {message}",
                line=self.pallas_lines[0] if len(self.pallas_lines) == 1 else None,
                traceback=None, hint=None)
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
