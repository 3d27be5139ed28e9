"""The TPU verdict of one evaluation: compile and estimate at the production shape.

Correctness is checked at the check shapes; this part of an evaluation says whether
the kernel compiles for the chip at the production shape (the size the user runs) and
what the TPU compiler estimates there, against the XLA reference compiled for the same
chip and shape. It starts right after the candidate loads (the candidate process
exports its production program; the judge exports the reference and hands both to its
compile processes in a background thread) and is joined after the trials, so the
compiles overlap with them.

The ``tpu`` section it builds (docs/EVALUATION.md): ``chip``, ``compile`` and its
``message``/``kind``, ``vmem_bytes`` of ``vmem_limit_bytes``, ``shape`` (the production
configuration's name), ``shape_label``, ``input_shapes``, ``params``, ``kernels`` (each
``pallas_call``: grid, steps, how its grid was shortened), ``grid_steps``, ``estimate``
and ``reference_estimate`` (``{cycles, seconds, method, detail, ops, incomplete}``),
``estimated_speedup``, ``basis``, ``estimate_unavailable`` (why there is none),
``cached`` and ``compile_s``. A kernel the compiler refuses at the production shape is
a ``compile_error`` and never ranked, whatever the check shapes said.

Worker-side (the judge).
"""

from __future__ import annotations

import json
import pickle
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kernels.harness import compile_pool, estimates, fidelity, ops, tpu_compile
from kernels.harness.channel import CandidateChannel, CheckVerdict, ProductionReply
from kernels.harness.errors import Stopped, task_failure
from kernels.harness.ops import op
from kernels.result import EvalError, array_text, shape_label
from kernels.task import ShapeConfig, Task, TaskError
from profiling.chips import DEFAULT_TPU

_POOL: ThreadPoolExecutor | None = None
_REFERENCE_PLANS: dict[str, estimates.ReferencePlan | str] = {}
_REFERENCE_RESULTS: dict[str, tuple[Any, ...]] = {}
_CACHE_SIZE = 32


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tw-production")
    return _POOL


def start() -> None:
    """Start the background thread now: before the harness snapshots the live threads,
    so it is never mistaken for one a candidate left behind."""
    _pool().submit(lambda: None).result()


def production_task(task: Task) -> Task:
    """The task at its production shape; a task without one (built by hand, not by a
    loader) uses its largest visible check configuration."""
    found = task.production_task()
    if found is not None:
        return found
    from dataclasses import replace

    visible = [s for s in task.shapes if not s.held_out] or list(task.shapes)
    largest = max(visible, key=lambda s: sum(v for v in s.params.values()
                                             if isinstance(v, int) and not isinstance(v, bool)))
    return replace(task, shapes=(largest,))


class ProductionRun:
    """The production part of one evaluation of ``task`` for ``chip``: the candidate's
    program comes over ``channel``, every wait ends by ``deadline``, each compile
    process may use ``compile_memory_mb`` (None: ``compile_pool.COMPILE_MEMORY_MB``)."""

    def __init__(self, task: Task, chip: str, channel: CandidateChannel, deadline: float,
                 compile_memory_mb: int | None = None) -> None:
        self.chip = chip
        self.channel = channel
        self.deadline = deadline
        self.task = production_task(task)
        self.spec = self.task.to_spec()
        self.config: ShapeConfig = self.task.shapes[0]
        self.inputs: list[tuple[tuple[int, ...], str]] = []
        self.reply: ProductionReply | None = None  # the candidate process's answer
        self.job: Future[dict[str, Any]] | None = None
        self.started = 0.0
        self.memory_mb = int(compile_memory_mb or compile_pool.COMPILE_MEMORY_MB)
        self.unavailable: str | None = None  # why nothing could be compiled

    @property
    def label(self) -> str:
        return shape_label(self.inputs)

    def where(self) -> str:
        arrays = ", ".join(array_text(s, d) for s, d in self.inputs)
        return f"at the production shape {self.config.name} ({arrays})"

    # -- main thread, before the trials --------------------------------------------------
    def start(self) -> None:
        """Signature (the task's code), the candidate's export (its process), the
        reference's export (here), then the compiles in the background."""
        from kernels.harness.execution import task_runtime

        self.started = time.perf_counter()
        # The compile processes import JAX while the candidate traces (started on the
        # first evaluation, not with the worker: three processes importing JAX at once
        # on a small machine slow the first one down).
        compile_pool.compilers().start()
        try:
            runtime = task_runtime(self.spec)
            dyn, static, _how = runtime.input_signature(self.config)
        except TaskError as exc:
            raise task_failure(exc, f"{self.where_name()}: {exc}") from exc
        except Exception as exc:
            error = TaskError(self.task.reference_path, f"{self.where_name()}: building the "
                              f"inputs failed: {type(exc).__name__}: {exc}")
            raise task_failure(error, str(error)) from exc
        self.inputs = [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in dyn]
        try:
            reply = self.channel.production(
                self.spec, self.chip, self.where(),
                pickle.dumps(([(list(s), d) for s, d in self.inputs], tuple(static))))
        except Stopped as stop:
            if stop.error.kind == "lowering":  # the TPU lowering refused
                stop.lowering = {"tpu": "error", "message": stop.error.message,
                                 "shape": self.config.name}
            raise
        self.reply = reply
        plans = reply.plans
        if reply.unavailable is not None:  # e.g. host callbacks, off-TPU
            self.unavailable = reply.unavailable
            return
        programs = reply.programs
        ref_key = json.dumps([self.spec, self.chip], sort_keys=True, default=str)
        plan = _REFERENCE_PLANS.get(ref_key)
        if plan is None:
            try:
                plan = estimates.reference_plan(self.spec, self.chip)
            except Exception as exc:  # the task's reference at its own size
                plan = (f"the XLA reference could not be exported {self.where()}: "
                        f"{type(exc).__name__}: {str(exc)[:300]}")
            if len(_REFERENCE_PLANS) >= _CACHE_SIZE:
                _REFERENCE_PLANS.pop(next(iter(_REFERENCE_PLANS)))
            _REFERENCE_PLANS[ref_key] = plan
        self.verdict: Future[dict[str, Any]] = Future()
        refused = self._static_vmem(plans)
        if refused is not None:  # no compile can succeed: say so now, not after minutes
            self.verdict.set_result(refused)
            done: Future[dict[str, Any]] = Future()
            done.set_result({"verdict": refused, "estimate": None, "unavailable": None})
            self.job = done
            return
        self.job = _pool().submit(self._compile, programs, plans, plan, ref_key,
                                  self.deadline)

    def _static_vmem(self, plans: list[dict[str, Any]]) -> dict[str, Any] | None:
        """A kernel whose blocks alone, each once, exceed the VMEM it may use is refused
        without compiling: Mosaic takes minutes on such a kernel at production sizes
        (a whole-array 4096x8192x8192 matmul: over 150 s) before it says the same."""
        chip_limit = _scoped_limit(self.chip)
        for plan in plans:
            need = int(plan.get("vmem_at_least") or 0)
            limit = plan.get("vmem_limit") or chip_limit
            if limit and need > limit:
                return {"compile": "error", "kind": "vmem", "vmem_bytes": need,
                        "vmem_limit_bytes": int(limit), "compile_s": 0.0,
                        "message": f"{plan.get('name')}: its blocks need at least "
                                   f"{need / 2**20:.1f} MiB of VMEM (each block once, before "
                                   f"the pipeline's double buffering, plus scratch), over "
                                   f"the {int(limit) / 2**20:.1f} MiB a kernel may use on "
                                   f"{self.chip} (a check made before compiling)"}
        return None

    def where_name(self) -> str:
        return f"at the production shape {self.config.name}"

    # -- background thread -------------------------------------------------------------
    def _compile(self, programs: dict[str, bytes], plans: list[dict[str, Any]],
                 plan: estimates.ReferencePlan | str, ref_key: str,
                 deadline: float) -> dict[str, Any]:
        def verdict_known(answer: dict[str, Any]) -> None:
            self.verdict.set_result(answer)
            self._stream({"verdict": answer, "estimate": None, "unavailable": "estimating"},
                         final=False)

        out = estimates.candidate_estimate(programs, plans, self.chip, deadline,
                                           self.memory_mb, on_verdict=verdict_known)
        if not self.verdict.done():
            self.verdict.set_result(out["verdict"])
        if out["verdict"].get("compile") != "ok" or out["estimate"] is None:
            self._stream(out, final=True)
            return out
        if isinstance(plan, str):
            out["reference"] = (None, None, plan)
        elif ref_key in _REFERENCE_RESULTS:
            out["reference"] = _REFERENCE_RESULTS[ref_key]
        else:
            found = estimates.reference_estimate(plan, deadline, self.memory_mb)
            out["reference"] = found
            if found[0] is not None:  # a failure may be time: try again next evaluation
                if len(_REFERENCE_RESULTS) >= _CACHE_SIZE:
                    _REFERENCE_RESULTS.pop(next(iter(_REFERENCE_RESULTS)))
                _REFERENCE_RESULTS[ref_key] = found
        self._stream(out, final=True)
        return out

    def _stream(self, out: dict[str, Any], final: bool) -> None:
        """The production verdict (and estimate) as soon as they are known, to the app
        (a progress frame of the request; ``kernels.harness.ops.progress``), while the
        trials go on: the UI shows it before the evaluation ends."""
        try:
            section = self._filled(self._blank(), out)
        except Exception:  # a partial answer that cannot be read yet: nothing to say
            return
        ops.progress({"kind": "production", "final": final, "tpu": section})

    # -- after the trials ------------------------------------------------------------------
    def section(self, verdict_only: bool = False) -> dict[str, Any]:
        """Join the compiles (until the evaluation's deadline) and build ``tpu``; with
        ``verdict_only`` (a kernel already judged wrong) do not wait for the estimates."""
        section = self._blank()
        if self.job is None:
            why = self.unavailable or "not compiled"
            section["message"] = section["estimate_unavailable"] = why
            return section
        try:
            if verdict_only and not self.job.done():
                verdict = self.verdict.result(timeout=max(self.deadline - time.monotonic(),
                                                          0.1))
                out = {"verdict": verdict, "estimate": None,
                       "unavailable": "not estimated: the kernel is not correct"}
            else:
                out = self.job.result(timeout=max(self.deadline - time.monotonic(), 0.1))
        except TimeoutError:
            why = ("the production compile did not finish before the evaluation's deadline "
                   "(raise --timeout)")
            section.update(message=why, estimate_unavailable=why)
            return section
        except Exception as exc:  # a harness bug: say so, the evaluation stands
            why = f"the production compile failed: {type(exc).__name__}: {exc}"[:500]
            section.update(message=why, estimate_unavailable=why)
            return section
        return self._filled(section, out)

    def _plans(self) -> list[dict[str, Any]]:
        return self.reply.plans if self.reply is not None else []

    def _blank(self) -> dict[str, Any]:
        plans = self._plans()
        return {
            "chip": self.chip, "compile": "unavailable", "message": None, "kind": None,
            "vmem_bytes": None, "vmem_limit_bytes": _scoped_limit(self.chip),
            "shape": self.config.name, "shape_label": self.label,
            "input_shapes": [array_text(s, d) for s, d in self.inputs],
            "params": self.config.params,
            "kernels": [{k: p.get(k) for k in ("name", "grid", "steps", "semantics", "axis",
                                               "units_full", "units", "data_dependent")}
                        for p in plans],
            "grid_steps": sum(int(p.get("steps") or 0) for p in plans),
            "estimate": None, "reference_estimate": None, "estimated_speedup": None,
            "basis": None, "compiler_speedup": None, "floor": None, "fidelity": None,
            "estimate_unavailable": None, "cached": None, "compile_s": None,
            "compile_peak_mb": None,
        }

    def _filled(self, section: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
        """``section`` from the compiles' answers (``out``)."""
        plans = self._plans()
        section["compile_s"] = time.perf_counter() - self.started
        section["compile_peak_mb"] = round(compile_pool.compilers().peak_rss_mb) or None
        verdict = out["verdict"]
        section["compile"] = verdict.get("compile") or "unavailable"
        section["kind"] = verdict.get("kind")
        if verdict.get("why") == "crashed":  # libtpu aborted on the kernel: a TPU would too
            section.update(compile="error", kind="tpu_compile")
        message = verdict.get("message")
        section["message"] = tpu_compile.short(message) if message else None
        section["vmem_bytes"] = verdict.get("vmem_bytes")
        if verdict.get("vmem_limit_bytes"):
            section["vmem_limit_bytes"] = verdict["vmem_limit_bytes"]
        if section["compile"] != "ok":
            section["estimate_unavailable"] = ("the kernel does not compile at the production "
                                               "shape" if section["compile"] == "error"
                                               else section["message"])
            return section
        section["estimate"] = out.get("estimate")
        reference = out.get("reference")
        ref, ref_verdict, ref_why = reference if reference else (None, None, None)
        section["reference_estimate"] = ref
        section["cached"] = bool(out.get("cached"))
        section["floor"] = self._floor(verdict, ref_verdict, plans)
        if out.get("estimate") is None:
            section["estimate_unavailable"] = out.get("unavailable") or "no estimate"
        elif ref is None:
            section["estimate_unavailable"] = ref_why or "no estimate for the XLA reference"
        elif ref.get("cycles") and out["estimate"].get("cycles"):
            section["compiler_speedup"] = ref["cycles"] / out["estimate"]["cycles"]
            section["estimated_speedup"], section["basis"] = fidelity.floored_speedup(
                out["estimate"], ref, section["floor"])
        klass = fidelity.program_class((ref_verdict or {}).get("cost"),
                                       (ref_verdict or {}).get("opcodes"),
                                       verdict.get("opcodes"), plans, self._dtype(), self.chip)
        section["fidelity"] = fidelity.lookup(self.chip, klass, section["basis"])
        return section

    def _dtype(self) -> str | None:
        """The dtype of the largest input (it decides which ridge point applies)."""
        if not self.inputs:
            return None
        import math

        return max(self.inputs, key=lambda item: math.prod(item[0]))[1]

    def _floor(self, verdict: dict[str, Any], ref_verdict: dict[str, Any] | None,
               plans: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The memory floor of the kernel's program (its kernels' block traffic plus
        XLA's bytes for the ops around them) and of the reference (XLA's bytes)."""
        traffic, complete = fidelity.kernel_traffic(plans)
        cost = verdict.get("cost") or {}
        declared = sum(p.get("declared_bytes") or 0.0 for p in plans)
        outside = max((cost.get("bytes_accessed") or 0.0) - declared, 0.0)
        ref_bytes = ((ref_verdict or {}).get("cost") or {}).get("bytes_accessed")
        found = fidelity.floor(self.chip, traffic + outside, ref_bytes,
                                fidelity.efficiency(self.chip))
        if found is not None:
            found["kernel_complete"] = complete
        return found

    def structure_differs(self, checked: list[list[list[str]]]) -> bool:
        """The kernels traced at the production shape compute something else than the
        ones checked (a kernel that is honest only at small sizes)."""
        production = self.reply.structure if self.reply is not None else None
        if production is None:
            return False
        return any(isinstance(c, list) and c != production for c in checked)


# -- the verdict, applied to an evaluation -------------------------------------------------

def production_verdict(production: ProductionRun | None, checked: list[list[Any]], chip: str,
                       line: int | None, apply: bool) -> tuple[dict[str, Any] | None,
                                                                list[str]]:
    """Join the production compiles: the ``tpu`` section and the flags it raises
    (``production_program_differs``: the kernels traced at the production shape compute
    something else than the ones ``checked``). With ``apply``, a refusal at the
    production shape is the evaluation's compile error, naming the compiler's message:
    ``Stopped`` carrying the section and the flags. Without it (a kernel already judged
    wrong, or stopped early) only the verdict is waited for."""
    if production is None:
        return None, []
    section = production.section(verdict_only=not apply)
    flags = ["production_program_differs"] if production.structure_differs(checked) else []
    if not apply or section["compile"] != "error":
        return section, flags
    kind = section.get("kind") or "tpu_compile"
    what = {"vmem": "exceeds the scoped VMEM", "mosaic": "is refused by Mosaic",
            "lowering": "cannot be lowered"}.get(kind, "is refused by the TPU compiler")
    hint = None
    if kind == "vmem":
        used, limit = section["vmem_bytes"], section["vmem_limit_bytes"]
        hint = (f"The kernel's blocks need {_mib(used)} of VMEM; {chip} gives a kernel "
                f"{_mib(limit)} by default. Tile the arrays (a grid over blocks that fit), "
                "fewer double-buffered operands, or raise the limit with "
                "pltpu.CompilerParams(vmem_limit_bytes=...).")
    raise Stopped("compile_error", EvalError(
        kind="tpu_compile" if kind != "lowering" else "lowering",
        message=f"{production.where()} on {chip} the kernel {what}: {section['message']}",
        line=line, traceback=None, hint=hint), flags=tuple(flags), tpu=section)


def check_shape_refusal(verdicts: list[CheckVerdict] | None, chip: str,
                        line: int | None) -> None:
    """On a TPU host the check shapes are compiled for the device itself (that is what
    runs): a refusal there is the evaluation's compile error too (``Stopped``)."""
    for found in verdicts or []:
        if found.compile != "error":
            continue
        message = tpu_compile.short(found.message or "compile failed")
        raise Stopped("compile_error", EvalError(
            kind="tpu_compile", message=f"at the check shape {found.config} on {chip} the "
            f"TPU compiler refuses the kernel: {message}", line=line, traceback=None,
            hint=None))


def compiler_abort(chip: str, fatal: str, line: int | None) -> Stopped:
    """The TPU compiler aborted the candidate process while compiling the kernel (a
    failed internal check, not the kernel's own run): on a TPU the compile fails the same
    way, so it is a compile error naming the compiler's check."""
    message = tpu_compile.short(fatal)
    tpu = {"chip": chip, "compile": "error", "message": message, "vmem_bytes": None,
           "vmem_limit_bytes": _scoped_limit(chip) if chip else None, "estimate": None,
           "reference_estimate": None, "estimated_speedup": None,
           "estimate_unavailable": "the TPU compiler aborted", "shape": None}
    hint = ("The TPU compiler has trouble with 16-bit floats here: load the blocks and "
            "compute in float32 inside the kernel (x.astype(jnp.float32)), then cast the "
            "result to the output dtype.") if re.search(r"bf16|f16|packed", fatal) \
        else "Simplify the kernel around the operation the check names, or change its " \
             "block shapes or dtypes."
    return Stopped("compile_error", EvalError(
        kind="tpu_compile", message=f"on {chip or 'the TPU'} the TPU compiler aborted on this "
        f"kernel (an internal compiler check failed; the compile would fail on a TPU too): "
        f"{message}", line=line, traceback=None, hint=hint), tpu=tpu)


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / (1 << 20):.1f} MiB"


def _scoped_limit(chip: str) -> int | None:
    from profiling.chips import get_chip

    try:
        return get_chip(chip).scoped_vmem_bytes
    except KeyError:
        return None


@op("reference_estimate")
def reference_request(payload: dict[str, Any]) -> dict[str, Any]:
    """The ``reference_estimate`` op: ``{task, chip, timeout_s}`` -> the task's XLA
    reference at its production shape, estimated as every evaluation estimates it:
    ``{estimate, cost, opcodes, compile, why, shape_label, input_shapes, class}``."""
    from kernels.harness.execution import task_runtime

    task = production_task(Task.from_spec(payload["task"]))
    chip = str(payload.get("chip") or DEFAULT_TPU)
    spec = task.to_spec()
    runtime = task_runtime(spec)
    dyn, _static, _ = runtime.input_signature(task.shapes[0])
    inputs = [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in dyn]
    compile_pool.compilers().start()
    deadline = time.monotonic() + float(payload.get("timeout_s") or 600.0)
    plan = estimates.reference_plan(spec, chip)
    found, verdict, why = estimates.reference_estimate(
        plan, deadline, int(payload.get("compile_memory_mb") or compile_pool.COMPILE_MEMORY_MB))
    verdict = verdict or {}
    import math

    dtype = max(inputs, key=lambda i: math.prod(i[0]))[1] if inputs else None
    return {"estimate": found, "cost": verdict.get("cost"), "opcodes": verdict.get("opcodes"),
            "compile": verdict.get("compile"), "why": why, "shape_label": shape_label(inputs),
            "input_shapes": [array_text(s, d) for s, d in inputs],
            "class": fidelity.program_class(verdict.get("cost"), verdict.get("opcodes"), None,
                                            [], dtype, chip),
            "compile_peak_mb": round(compile_pool.compilers().peak_rss_mb) or None}
