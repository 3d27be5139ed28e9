"""The TPU verdict of one evaluation: compile and estimate at the production shape.

Correctness is checked at the check shapes; this part of an evaluation says whether
the kernel compiles for the chip at the production shape (the size the user runs) and
what the TPU compiler estimates there, against the XLA reference compiled for the same
chip and shape. The compiles run beside the trials (``kernels.worker.tpu.production_run``);
``production_verdict`` joins them after the trials and holds the program that will run
to the one that was checked.

The ``tpu`` section it builds (docs/EVALUATION.md): ``chip``, ``compile`` and its
``message``/``kind``, ``vmem_bytes`` of ``vmem_limit_bytes``, ``shape`` (the production
configuration's name), ``shape_label``, ``input_shapes``, ``params``, ``kernels`` (each
``pallas_call``: grid, steps, how its grid was shortened), ``grid_steps``, ``estimate``
and ``reference_estimate`` (``{cycles, seconds, method, detail, ops, incomplete}``),
``estimated_speedup``, ``basis``, ``estimate_unavailable`` (why there is none),
``reference_roofline`` (the reference's FLOPs and compulsory bytes at the chip's peak),
``kernel_time_s`` (the kernel's time that orders candidates: the larger of its estimate
and its memory floor), ``roofline_ratio`` (the reference's roofline over that time,
where the reference has no estimate), ``floor``, ``fidelity``, ``deadline_s`` (how long
the production compiles may take, and ``deadline_why``), ``cached`` and ``compile_s``. A
kernel the compiler refuses at the production shape is a ``compile_error`` and never
ranked, whatever the check shapes said.

The XLA reference's figures are the same for every candidate of a task: they come from
``kernels.worker.tpu.reference`` (once per task, chip and libtpu, kept on disk, computed
in the background while candidates are judged).

Worker-side (the judge).
"""

from __future__ import annotations

import re
from typing import Any

from tilewright.kernels.judge.result import EvalError, array_text, shape_label
from tilewright.kernels.tasks.task import Task
from tilewright.kernels.worker.candidate.channel import CheckVerdict
from tilewright.kernels.worker.errors import Stopped
from tilewright.kernels.worker.ops import op
from tilewright.kernels.worker.tpu import (
    compile_pool,
    fidelity,
    reference,
    reference_programs,
    tpu_compile,
)
from tilewright.kernels.worker.tpu.production_run import ProductionRun
from tilewright.profiling.chips import DEFAULT_TPU


def production_verdict(production: ProductionRun | None, checked: list[list[Any]], chip: str,
                       line: int | None, apply: bool,
                       retraced: tuple[str | None, str | None] = (None, None)
                       ) -> tuple[dict[str, Any] | None, list[str]]:
    """Join the production compiles: the ``tpu`` section and the flags it raises. With
    ``apply`` (a kernel correct at the check shapes), the program that will run must be
    the program that was checked, or the candidate is ``rejected``:

    - its kernels at the production shape compute what the checked ones compute
      (``checked``: their bodies' structure at each check shape);
    - its grid writes every block of every output at the production shape;
    - it is the same program when traced again the same way (``retraced``: the first
      and the second production trace's fingerprints), so it does not depend on when or
      from where it is traced.

    Then a refusal by the TPU compiler at the production shape is the evaluation's
    compile error, naming the compiler's message (``Stopped`` carrying the section and
    the flags); an estimate that prices the kernels below their own compute bound is
    flagged ``estimate_below_roofline`` (never ranked). Without ``apply`` (a kernel
    already judged wrong, or stopped early) only the verdict is waited for."""
    if production is None:
        return None, []
    section = production.section(verdict_only=not apply)
    differs = production.structure_differs(checked)
    flags = ["production_program_differs"] if differs else []
    outside = production.reply.outside_compute if production.reply is not None else ()
    if outside:  # the program that will run does its work outside the kernels
        flags.append("compute_outside_kernel")
        section["outside_compute"] = list(outside)[:20]
    if not apply:
        return section, flags
    where = production.where()
    refusal = None
    if differs:
        refusal = ("production_program_differs", f"{where} the kernels compute something "
                   "else than the kernels checked at the check shapes (their bodies "
                   "differ): the program that would run was never checked")
    elif retraced[0] and retraced[1] and retraced[0] != retraced[1]:
        flags.append("trace_dependent")
        refusal = ("trace_dependent", f"{where} the candidate traced a different program "
                   "the second time it was traced the same way (after the check shapes): "
                   "its program depends on when or from where it is traced, so the "
                   "program that would run is not the one checked")
    else:
        short = _uncovered(production)
        if short:
            flags.append("partial_coverage")
            refusal = ("partial_coverage", f"{where} {short}: the rest of the output is "
                       "never computed by the program that would run")
    if refusal is not None:
        kind, message = refusal
        raise Stopped("rejected", EvalError(
            kind=kind, message=message, line=line, traceback=None,
            hint="Make the kernel the same program at every size: the same body, a grid "
                 "whose blocks cover the whole output, nothing that depends on how it is "
                 "called."), flags=tuple(flags), tpu=section)
    if section.get("implausible"):
        flags.append("estimate_below_roofline")
    if section["compile"] != "error":
        return section, flags
    kind = section.get("kind") or "tpu_compile"
    what = {"vmem": "does not fit the VMEM it may use", "mosaic": "is refused by Mosaic",
            "lowering": "cannot be lowered"}.get(kind, "is refused by the TPU compiler")
    hint = None
    if kind == "vmem":
        used = section.get("vmem_needed_bytes") or section["vmem_bytes"]
        limit = section["vmem_limit_bytes"]
        capacity = section.get("vmem_capacity_bytes")
        source = section.get("vmem_limit_source") or "the chip's default scoped limit"
        hint = (f"The program needs {_mib(used)} of VMEM; the limit in force is "
                f"{_mib(limit)} ({source}) and a {chip} core has {_mib(capacity)}. Tile the "
                "arrays (a grid over blocks that fit), use fewer double-buffered operands, "
                "or, within the chip's VMEM, raise the limit with "
                "pltpu.CompilerParams(vmem_limit_bytes=...).")
        if section.get("refused_by"):
            hint += (" The estimate compile counts XLA's own temporaries beside the "
                     "kernel's scoped VMEM: leave room for them.")
    raise Stopped("compile_error", EvalError(
        kind="tpu_compile" if kind != "lowering" else "lowering",
        message=f"{where} on {chip} the kernel {what}: {section['message']}",
        line=line, traceback=None, hint=hint), flags=tuple(flags), tpu=section)


def _uncovered(production: ProductionRun) -> str | None:
    """Which output the production grid leaves partly unwritten, in words; None when every
    output written through blocks is covered (or its coverage cannot be known)."""
    for plan in production._plans():
        for row in plan.get("coverage") or []:
            visited, total = row.get("visited"), row.get("total")
            if isinstance(visited, int) and isinstance(total, int) and visited < total:
                shape = "x".join(str(d) for d in row.get("shape") or [])
                return (f"the grid of {plan.get('name')} writes {visited} of the {total} "
                        f"blocks of its output {row.get('output')} ({shape})")
    return None


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
           "vmem_limit_bytes": tpu_compile.scoped_vmem_limit(chip) if chip else None, "estimate": None,
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


@op("reference_estimate")
def reference_request(payload: dict[str, Any]) -> dict[str, Any]:
    """The ``reference_estimate`` op: ``{task, chip, timeout_s}`` -> the task's XLA
    reference at its production shape, as every evaluation ranks against it (its record,
    ``kernels.worker.tpu.reference``, waited for up to ``timeout_s``): ``{estimate, cost,
    opcodes, compile, why, roofline, flops, io_bytes, scaling, cached, shape_label,
    input_shapes, class}``."""
    from tilewright.kernels.worker.execution import task_runtime

    given = Task.from_spec(payload["task"])
    task = given.production_task() or given
    chip = str(payload.get("chip") or DEFAULT_TPU)
    spec = task.to_spec()
    runtime = task_runtime(spec)
    dyn, _static, _ = runtime.input_signature(task.shapes[0])
    inputs = [(tuple(int(d) for d in a.shape), str(a.dtype)) for a in dyn]
    ticket = reference.BOOK.request(
        spec, chip, int(payload.get("compile_memory_mb") or compile_pool.COMPILE_MEMORY_MB))
    record = ticket.wait(float(payload.get("timeout_s") or 600.0))
    if record is None:
        record = {"estimate": None, "why": f"not worked out within "
                  f"{float(payload.get('timeout_s') or 600.0):.0f} s (it goes on in the "
                  "background)", "roofline": reference_programs.roofline(ticket.cost, chip)}
    import math

    dtype = max(inputs, key=lambda i: math.prod(i[0]))[1] if inputs else None
    return {**record, "shape_label": shape_label(inputs),
            "input_shapes": [array_text(s, d) for s, d in inputs],
            "class": fidelity.program_class(record.get("cost"), record.get("opcodes"), None,
                                            [], dtype, chip,
                                            convolves=bool(record.get("convolutions"))),
            "compile_peak_mb": round(compile_pool.compilers().peak_rss_mb) or None}
