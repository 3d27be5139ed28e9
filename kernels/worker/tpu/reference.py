"""The XLA reference at the production shape, worked out once per task, chip and libtpu.

Every candidate of a task is ranked against the same program: the task's XLA reference
compiled for the chip at the production shape. Its figures are therefore computed once,
off the candidates' critical path, and kept:

- **the record** (``ReferenceRecord``): the reference's compile verdict, XLA's cost
  analysis (FLOPs), the bytes it must move (every input read and every output written
  once: the compulsory traffic), its roofline for the chip, and the TPU compiler's
  estimate, or why there is none. Kept on disk by the exported program's hash, the chip
  and the libtpu version (``compile_pool.DiskCache``): a later evaluation, session or
  worker of the same task reads it instead of compiling anything.
- **the estimate**: whole when XLA's cost analysis puts the program within the
  estimator's budget; else at two smaller sizes and extrapolated by the cost per unit at
  the larger one. The size to scale is one whose halving halves the output: a task's
  batch-like size parameter (``--set``'s names), else axes of the reference's inputs
  (the rows of a matmul, the queries of an attention; ``shrink.batch_axes``), so a task
  brought in with ``tilewright new`` from a plain function scales too.
- **where the estimator cannot price it**, the record still carries the roofline
  (FLOPs at the chip's peak, compulsory bytes at its HBM bandwidth): candidates are then
  ranked by their own compiler cycles against it (``kernels.judge.rank.Rank``, source
  ``roofline``), never by host simulation.

``ReferenceBook`` is the judge's one entry point: ``request(spec, chip)`` in the main
thread (tracing the task's code there, before the trials) returns a ``Ticket`` whose
record is computed by a background thread in a compile process of its own, so a
candidate's own verdict and estimate never queue behind the reference's. Workers of one
host share the work through the disk cache and a lock file per record.

Worker-side (the judge); imports JAX to export the reference.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tilewright.kernels.worker.tpu import compile_pool, estimates, shrink, tpu_compile

# The reference is estimated whole when its XLA cost analysis is within these; else it
# is scaled along a batch-like size (measured here with the estimate flag: f32
# matmuls x(M, 8192) @ w(8192, 8192) at M=256, 34 GFLOP: 5 s and 1.0 GB; M=512: 13 s
# and 1.4 GB; M=4096: 95 s and 16.5 GB).
REFERENCE_FLOPS_BUDGET = 2.0 ** 36
REFERENCE_BYTES_BUDGET = 2.0 ** 30
# A smaller FLOP budget (GFLOP), for a machine that cannot afford the default (and for
# tests, which scale small programs the way big ones are scaled).
BUDGET_ENV = "TILEWRIGHT_REFERENCE_BUDGET_GFLOP"
# A smaller size prices the reference per unit only where its compute is at least this
# many times its compulsory memory traffic (else a bigger one is exported, within 4x the
# budget): see reference_plan.
CLEARLY_COMPUTE = 2.0
RECORD_VERSION = 4  # part of a record's key: a new way of computing it is a new record
# The most the background may spend on one reference (each compile is also bounded by
# compile_pool.COMPILE_TIMEOUT_S).
REFERENCE_TIMEOUT_S = 900.0


# -- exporting the reference ------------------------------------------------------------

@dataclass
class Scaling:
    """How the reference is made smaller for the estimator: a size parameter of the task
    (``kind`` param: ``name`` = the parameter) or axes of its inputs (``kind`` axes)."""

    kind: str  # param | axes
    name: str  # "batch_size", "x[0]"
    value: int  # its production size
    axes: shrink.Axes = ()

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "value": self.value,
                "axes": [list(a) for a in self.axes]}


@dataclass
class ReferencePlan:
    """The XLA reference's programs for the estimate: ``full`` always; ``scaled`` (the
    programs at ascending sizes of ``scaling``) when XLA's cost analysis puts the full
    program over the estimator's budget."""

    full: Exported
    chip: str
    scaled: list[tuple[int, Exported]] = field(default_factory=list)
    start: int = 0  # the preferred pair is scaled[start], scaled[start + 1]
    scaling: Scaling | None = None
    why_not_scaled: str | None = None

    @property
    def cost(self) -> dict[str, float]:
        """XLA's cost analysis of the full program, with its compulsory bytes."""
        return self.full.cost

    @property
    def param(self) -> str | None:
        return self.scaling.name if self.scaling else None

    @property
    def value(self) -> int | None:
        return self.scaling.value if self.scaling else None


class _Program:
    """The reference of one task configuration: its jitted function, input avals, static
    arguments and the names of its parameters."""

    def __init__(self, spec: dict[str, Any]) -> None:
        import jax

        from tilewright.kernels.tasks.task import Task
        from tilewright.kernels.worker.execution import jitted_reference, task_runtime

        runtime = task_runtime(spec)
        self.config = Task.from_spec(spec).shapes[0]
        dyn, static, _how = runtime.input_signature(self.config)
        self.fn = jitted_reference(runtime, len(dyn), len(static))
        self.avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in dyn]
        self.static = list(static)
        try:  # the task's own function (the runtime's ``reference`` adapts layouts)
            params = [p.name for p in inspect.signature(runtime._reference_fn()).parameters
                      .values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except Exception:
            params = []
        self.names = params[:len(self.avals)] if len(params) >= len(self.avals) else None


@dataclass
class Exported:
    """One exported reference program: its bytes, XLA's cost analysis of its lowering
    (with ``io_bytes``: every input read and every output written once, the traffic the
    program cannot avoid; ``f32_inputs``: 1.0 when the largest input is float32), and its
    fingerprint (the program without source locations: the same program from a task
    copied elsewhere has the same one, so its compiles and record are found again)."""

    blob: bytes
    cost: dict[str, float]
    fingerprint: str
    note: str | None = None  # how an equivalent program stands for it (``estimator_equivalent``)


def dot_cost(text: str) -> dict[str, float]:
    """The program's dots as the matrix unit will run them (``profiling.precision``):
    FLOPs in bf16 passes (an f32 dot at DEFAULT precision is one, HIGH three, HIGHEST
    six), int8 and fp8 FLOPs apart (their own rates), and their FLOPs as counted."""
    from tilewright.profiling.precision import dot_work

    dots = dot_work(text)
    out = {"dot_flops": 0.0, "dot_bf16_pass_flops": 0.0, "dot_int8_flops": 0.0,
           "dot_fp8_flops": 0.0, "dot_max_passes": 0.0}
    for dot in dots:
        out["dot_flops"] += dot.flops
        out["dot_max_passes"] = max(out["dot_max_passes"], float(dot.passes))
        if dot.dtype in ("i8", "ui8", "si8"):
            out["dot_int8_flops"] += dot.flops
        elif dot.dtype.startswith("f8"):
            out["dot_fp8_flops"] += dot.flops
        else:
            out["dot_bf16_pass_flops"] += dot.flops * dot.passes
    return out


def strip_locations(text: str) -> str:
    """StableHLO text without its ``loc(...)`` annotations and ``#loc`` definitions (they
    name the files the program was traced from)."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("#loc"):
            continue
        while " loc(" in line:
            start = line.index(" loc(")
            depth, end = 0, start + 4
            for end in range(start + 4, len(line)):
                depth += {"(": 1, ")": -1}.get(line[end], 0)
                if depth == 0:
                    break
            line = line[:start] + line[end + 1:]
        out.append(line)
    return "\n".join(out)


def export_program(fn: Any, avals: list[Any], static: list[Any], chip: str) -> Exported:
    """The reference exported for TPU (``Exported``): the program itself, or where it
    holds an op the estimator cannot price, its equivalent (``estimator_equivalent``;
    ``cost["equivalent"]`` is then 1.0 and ``Exported.note`` says how)."""
    import jax

    fn, static, note = estimator_equivalent(fn, avals, static)
    with tpu_compile.abstract_device(chip):
        exported = jax.export.export(fn, platforms=("tpu",))(*avals, *static)
        cost = _xla_cost(fn, avals, static)
    if "flops" not in cost:
        # On a TPU host the program lowers for the chip, whose client gave no cost
        # analysis here (the v5e at hand: none, so a 550 GFLOP reference went to the
        # estimator whole and did not finish in 150 s): XLA's CPU client counts it.
        with contextlib.suppress(Exception), jax.default_device(jax.devices("cpu")[0]):
            cost = _xla_cost(fn, avals, static)
    if avals:
        widest = max(avals, key=lambda a: math.prod(a.shape))
        cost["f32_inputs"] = 1.0 if str(widest.dtype) == "float32" else 0.0
    cost["io_bytes"] = float(sum(math.prod(a.shape) * a.dtype.itemsize
                                 for a in [*avals, *exported.out_avals]))
    text = strip_locations(exported.mlir_module())
    cost.update(dot_cost(text))
    if note:
        cost["equivalent"] = 1.0
    return Exported(bytes(exported.serialize()), cost,
                    hashlib.sha256(text.encode()).hexdigest(), note)


def _xla_cost(fn: Any, avals: list[Any], static: list[Any]) -> dict[str, float]:
    """XLA's cost analysis of ``fn`` lowered where JAX lowers it now ({} where the
    client has none)."""
    found: Any = None
    with contextlib.suppress(Exception):
        found = fn.lower(*avals, *static).cost_analysis()
    if isinstance(found, list | tuple):
        found = found[0] if found else {}
    return {k: float(v) for k, v in (found or {}).items()
            if isinstance(v, int | float) and v >= 0}


def _export_spec(spec: dict[str, Any], chip: str) -> Exported:
    program = _Program(spec)
    return export_program(program.fn, program.avals, program.static, chip)


# -- what the estimator cannot price, priced through an equivalent program -------------

RAGGED_EQUIVALENT = ("ragged_dot priced as dense per-group matmuls of the same sizes (equal "
                     "groups: the lhs rows split evenly over the groups; the same FLOPs and "
                     "the whole rhs read), since libtpu's estimator cannot price XLA's "
                     "ragged dot")


def _is_plain_ragged(eqn: Any) -> bool:
    """``ragged_dot(lhs[m, k], rhs[g, k, n], group_sizes[g])``: the lhs rows ragged over
    the groups of the rhs (an MoE layer's grouped matmul), no batch dimensions."""
    numbers = eqn.params.get("ragged_dot_dimension_numbers")
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    try:
        (contract, batch) = numbers.dot_dimension_numbers
        return (len(lhs.shape) == 2 and len(rhs.shape) == 3
                and tuple(contract[0]) == (1,) and tuple(contract[1]) == (1,)
                and not batch[0] and not batch[1]
                and tuple(numbers.lhs_ragged_dimensions) == (0,)
                and tuple(numbers.rhs_group_dimensions) == (0,))
    except (AttributeError, TypeError, ValueError):
        return False


def _dense_groups(lhs: Any, rhs: Any, out_dtype: Any) -> Any:
    """The grouped matmul with equal groups: lhs rows split evenly over rhs's groups
    (zero rows pad the last when they do not divide), one dense matmul per group."""
    import jax.numpy as jnp

    m, k = lhs.shape
    groups, _, n = rhs.shape
    rows = -(-m // groups)
    padded = jnp.pad(lhs, ((0, rows * groups - m), (0, 0))) if rows * groups != m else lhs
    out = jnp.einsum("gmk,gkn->gmn", padded.reshape(groups, rows, k), rhs,
                     preferred_element_type=out_dtype)
    return out.reshape(groups * rows, n)[:m]


def estimator_equivalent(fn: Any, avals: list[Any], static: list[Any]
                         ) -> tuple[Any, list[Any], str | None]:
    """``(fn, static, note)``: the program as it is, or, where it holds an op the TPU
    compiler's estimator cannot price (XLA's ragged dot: "Unsupported DMA direction"),
    an equivalent program of the dynamic inputs it can (static arguments folded in), and
    the note saying how it was priced. What is estimated is then labelled as such."""
    import jax

    from tilewright.kernels.worker.execution import bind_as_traced, rebound

    try:
        closed = jax.make_jaxpr(lambda *dyn: fn(*dyn, *static))(*avals)
    except Exception:
        return fn, static, None
    found = [0]

    def visit(jaxpr: Any) -> None:
        from jax.extend.core import ClosedJaxpr, Jaxpr

        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "ragged_dot_general" and _is_plain_ragged(eqn):
                found[0] += 1
            for value in eqn.params.values():
                inner = value.jaxpr if isinstance(value, ClosedJaxpr) else value
                if isinstance(inner, Jaxpr):
                    visit(inner)

    visit(closed.jaxpr)
    if not found[0]:
        return fn, static, None

    def bind(eqn: Any, invals: list[Any]) -> list[Any]:
        if eqn.primitive.name == "ragged_dot_general" and _is_plain_ragged(eqn):
            out_dtype = eqn.outvars[0].aval.dtype
            return [_dense_groups(invals[0], invals[1], out_dtype)]
        return bind_as_traced(eqn, invals)

    evaluate = rebound(closed, bind)

    def equivalent(*dyn: Any) -> Any:
        out = evaluate(*dyn)
        return out[0] if len(out) == 1 else tuple(out)

    return jax.jit(equivalent), [], RAGGED_EQUIVALENT


def budget_ratio(cost: dict[str, float]) -> float:
    """How far XLA's cost analysis puts the full program over the estimator's budget
    (at most 1.0: it is estimated whole). Without one, its dots' FLOPs and compulsory
    bytes stand in (read from the program itself): a program of unknown cost is not
    sent to the estimator whole."""
    flops = cost.get("flops", cost.get("dot_flops", 0.0))
    moved = cost.get("bytes accessed", cost.get("io_bytes", 0.0))
    return max(flops / flops_budget(), moved / REFERENCE_BYTES_BUDGET)


def scaling_options(spec: dict[str, Any], chip: str,
                    program: _Program | None = None) -> list[tuple[Scaling, Any]]:
    """The sizes the reference may be scaled along, each with the function exporting it
    at a given size: a size parameter of the task (what --set names) first, else axes of
    its inputs (``shrink.batch_axes``: found from the program's own shapes, whatever the
    layout names them)."""
    from tilewright.kernels.tasks.task import Task

    program = program or _Program(spec)
    task = Task.from_spec(spec)
    config = task.shapes[0]
    options: list[tuple[Scaling, Any]] = []
    choice = shrink.batch_parameter(task, config)
    if choice is not None:
        param, size = choice
        options.append((Scaling("param", param, size), lambda n, p=param: _export_spec(
            shrink.with_size(task, config, p, n).to_spec(), chip)))
    found = shrink.batch_axes(program.fn, program.avals, program.static)
    if found is not None:
        axes, size = found
        options.append((Scaling("axes", shrink.axes_name(axes, program.names), size, axes),
                        lambda n, a=axes: export_program(
                            program.fn, shrink.with_axes(program.avals, a, n),
                            program.static, chip)))
    return options


def scaling_key(options: list[tuple[Scaling, Any]] | None) -> str:
    """What the record's key holds of the scaling: ``whole`` (estimated whole), or the
    sizes it may be scaled along (two layouts of one program that scale differently get
    records of their own: one cannot answer for the other)."""
    if options is None:
        return "whole"
    return json.dumps([scaling.to_json() for scaling, _ in options], sort_keys=True)


def reference_plan(spec: dict[str, Any], chip: str, full: Exported | None = None,
                   options: list[tuple[Scaling, Any]] | None = None) -> ReferencePlan:
    """Export the reference at the production shape (``full``, when already exported)
    and, when it is too costly to estimate whole, at smaller sizes of a batch-like size
    (``options``: ``scaling_options``, when already found). Raises what the task's code
    raises."""
    program = _Program(spec)
    if full is None:
        full = export_program(program.fn, program.avals, program.static, chip)
    cost = full.cost
    plan = ReferencePlan(full, chip)
    budget = flops_budget()
    ratio = budget_ratio(cost)
    if ratio <= 1.0:
        return plan
    factor = 2 ** max(1, math.ceil(math.log2(ratio)))
    # Either scaling must leave at least one unit at the smaller of the two sizes.
    if options is None:
        options = scaling_options(spec, chip, program)
    usable = [(scaling, how) for scaling, how in options if scaling.value // (2 * factor) >= 1]
    what = (f"the XLA reference is too costly for the estimator at the production shape "
            f"(XLA counts {cost.get('flops', 0) / 1e9:,.0f} GFLOP, "
            f"{cost.get('bytes accessed', 0) / 2**20:,.0f} MiB)")
    if not options:
        plan.why_not_scaled = (f"{what} and no size of it (a parameter or an input axis) "
                               "halves its output when halved")
        return plan
    if not usable:
        names = " or ".join(scaling.name for scaling, _ in options)
        plan.why_not_scaled = (f"{what}, even with {names} at 1 (it would need 1/{factor} "
                               "of it)")
        return plan
    plan.scaling, exported = usable[0]
    value = plan.scaling.value
    larger = exported(value // factor)
    # The cost per unit is taken at the larger size; it must be in the regime the full
    # program is in. A matmul's weights are read once whatever its batch: at a small
    # batch their read is most of its time where the full one is compute-bound, and a
    # bigger size (up to 4x the budget) is worth its estimate. Near the ridge is not
    # far enough: XLA's bf16 4096x8192 @ 8192x8192 priced by its cost per row at 256
    # rows (compute 1.0x its compulsory traffic) was 12% over its whole estimate and 9%
    # over its time measured on a v5e; at 1024 rows (3.7x), 0.5% over the whole one.
    while factor > 2 and (_compute_over_memory(cost, chip) or 0.0) >= 1.0 \
            and (_compute_over_memory(larger.cost, chip) or 0.0) < CLEARLY_COMPUTE \
            and larger.cost.get("flops", 0.0) * 2 <= 4 * budget:
        factor //= 2
        larger = exported(value // factor)
    n2, n1 = value // factor, value // (2 * factor)
    plan.scaled = [(n1, exported(n1)), (n2, larger)]
    # The estimator aborts on some sizes of a program it estimates at others (a f32
    # matmul: at 128 and 1024 rows, not at 256 and 512, measured): one pair further up,
    # within 4x the budget, and one further down are ready to try instead.
    if n2 * 2 < value and larger.cost.get("flops", 0.0) * 2 <= 4 * budget:
        plan.scaled.append((n2 * 2, exported(n2 * 2)))
    if n1 // 2 >= 1:
        plan.scaled.insert(0, (n1 // 2, exported(n1 // 2)))
        plan.start = 1
    return plan


def flops_budget() -> float:
    """The FLOPs the estimator is given a whole reference for (``BUDGET_ENV`` lowers it)."""
    try:
        given = float(os.environ.get(BUDGET_ENV) or 0.0)
    except ValueError:
        given = 0.0
    return given * 1e9 if given > 0 else REFERENCE_FLOPS_BUDGET


def _compute_over_memory(cost: dict[str, float], chip: str) -> float | None:
    """A program's compute time over its memory time at the chip's peaks (its FLOPs,
    its dots at the precision XLA runs them, against its compulsory bytes): at least 1
    on the compute side of the ridge point. None without both figures."""
    if cost.get("dot_flops"):  # its dots at the precision XLA runs them
        roof = roofline(cost, chip)
        if not roof or not roof["memory_s"]:
            return None
        return roof["compute_s"] / roof["memory_s"]
    from tilewright.profiling.chips import get_chip

    try:
        spec = get_chip(chip)
    except KeyError:
        return None
    flops, moved = cost.get("flops"), cost.get("io_bytes")
    if not flops or not moved:
        return None
    peak = spec.f32_flops if cost.get("f32_inputs") else spec.bf16_flops
    return (flops / peak) / (moved / spec.hbm_bytes_per_s)


def roofline(cost: dict[str, float], chip: str) -> dict[str, Any] | None:
    """The reference's roofline on ``chip``: its FLOPs (XLA's count) at the chip's peak
    for the inputs' dtype, its compulsory bytes at the HBM bandwidth; the larger is the
    time no program computing it can beat. None without FLOPs or bytes."""
    from tilewright.profiling.chips import bound, get_chip

    flops, moved = cost.get("flops"), cost.get("io_bytes")
    try:
        spec = get_chip(chip)
    except KeyError:
        return None
    if not moved:
        return None
    dtype = "f32" if cost.get("f32_inputs") else "bf16"
    roof = bound(flops or 0.0, moved, spec, dtype)
    out = {"seconds": roof["bound_ms"] / 1e3, "flops": flops or 0.0, "bytes": moved,
           "dtype": roof["dtype"], "bound_by": roof["bound_by"],
           "compute_s": roof["compute_bound_ms"] / 1e3,
           "memory_s": roof["memory_bound_ms"] / 1e3,
           "peak_estimated": roof["peak_estimated"], "precision": None}
    if "dot_flops" in cost and cost["dot_flops"] > 0:
        # The dots at the precision XLA runs them (an f32 dot at DEFAULT: one bf16 pass,
        # not a third of the bf16 peak), the rest of the FLOPs as before.
        from tilewright.profiling.precision import mxu_rate

        dots_s = (cost.get("dot_bf16_pass_flops", 0.0) / spec.bf16_flops
                  + cost.get("dot_int8_flops", 0.0) / mxu_rate(spec, "i8")
                  + cost.get("dot_fp8_flops", 0.0) / mxu_rate(spec, "f8E4M3FN"))
        rest_s = max((flops or 0.0) - cost["dot_flops"], 0.0) / spec.peak_flops(dtype)
        compute_s = dots_s + rest_s
        seconds = max(compute_s, out["memory_s"])
        passes = int(cost.get("dot_max_passes") or 1)
        out.update(seconds=seconds, compute_s=compute_s,
                   bound_by="compute" if compute_s >= out["memory_s"] else "memory",
                   peak_estimated=False,
                   precision=("dots at the precision XLA uses: f32 at DEFAULT as one bf16 "
                              "pass" if passes == 1 else
                              f"dots at the precision XLA uses: up to {passes} bf16 passes "
                              "(HIGH 3, HIGHEST 6)"))
    return out


# -- estimating it -----------------------------------------------------------------------

def scale_reference(c1: int, c2: int, n1: int, n2: int, full: int) -> tuple[int, int, float]:
    """An XLA program's cycles at ``full`` of a batch-like size from its cycles at
    ``n1 < n2``: ``c2 * full / n2``, the cost per unit at the larger size. Not the line
    through both: XLA tiles a big batch and re-reads what a small one reads once (a
    4096-row f32 matmul against a line through 256 and 512 rows: 45% low; by the cost
    per row at 512: 4% high, measured). Returns (cycles, the line's figure, how far
    apart the two are, relative)."""
    value = round(c2 * full / max(n2, 1))
    linear, _ = estimates.scale(c1, c2, n1, n2, full)
    return value, linear, abs(value - linear) / max(value, 1)


def _reference_why(answer: dict[str, Any], at: str = "") -> str:
    if answer.get("why") == "crashed" and answer.get("fatal"):
        return (f"the TPU compiler (estimator) aborted on the XLA reference{at}: "
                f"{tpu_compile.short(answer['fatal'], 400)}")
    if answer.get("what"):
        return f"the TPU compiler (estimator) {answer['what']} on the XLA reference{at}"
    return f"XLA reference{at}: {estimates.why_no_records(answer)}"


def reference_estimate(plan: ReferencePlan, deadline: float, memory_mb: int,
                       kind: str = "estimate"
                       ) -> tuple[dict[str, Any] | None, dict[str, Any], str | None]:
    """(estimate, verdict answer, why not): the XLA reference at the production shape,
    whole or extrapolated from the plan's two smaller sizes. ``kind`` names the compile
    process the estimates run in (``reference``: its own, beside the candidates')."""
    comp = compile_pool.compilers()
    chip = plan.chip
    want, reason = estimates.estimates_possible(chip)
    whole: dict[str, Any] = {}
    if want and not plan.scaled and not plan.why_not_scaled:
        # Estimated whole: the estimator's compile says whether it compiles too, so the
        # verdict compiler compiles it only when that one does not (nobody waits for
        # this verdict alone: the record is worked out in the background).
        whole = comp.compile(plan.full.blob, chip, "estimate", deadline, memory_mb,
                             process=kind, fingerprint=plan.full.fingerprint)
        if whole.get("compile") == "ok" and whole.get("records") is not None:
            verdict = {k: v for k, v in whole.items() if k != "records"}
            if _total(whole["records"]) <= 0:
                return None, verdict, ("the TPU compiler (estimator) priced the XLA reference "
                                       "at 0 cycles (ops it cannot price)")
            return _labelled(estimates.estimate_of(whole["records"], chip), plan), verdict, None
    verdict = comp.compile(plan.full.blob, chip, "verdict", deadline, memory_mb,
                           fingerprint=plan.full.fingerprint)
    if verdict.get("compile") != "ok":
        return None, verdict, ("the XLA reference does not compile for "
                               f"{chip} at the production shape: "
                               f"{tpu_compile.short(verdict.get('message') or '', 300)}")
    if not want:
        return None, verdict, reason
    if not plan.scaled:
        if plan.why_not_scaled:
            return None, verdict, plan.why_not_scaled
        return None, verdict, _reference_why(whole)
    # The preferred pair, then the one above, then the one below.
    starts = [plan.start, plan.start + 1, plan.start - 1]
    pairs = [(plan.scaled[i], plan.scaled[i + 1]) for i in starts
             if 0 <= i < len(plan.scaled) - 1]
    why = None
    records: list[list[dict[str, Any]]] = []
    pair = pairs[0]
    name = plan.param
    for pair in pairs:
        records = []
        for n, program in pair:
            answer = comp.compile(program.blob, chip, "estimate", deadline, memory_mb,
                                  process=kind, fingerprint=program.fingerprint)
            if answer.get("compile") != "ok" or answer.get("records") is None:
                why = why or _reference_why(answer, f" with {name} at {n}")
                break
            if _total(answer["records"]) <= 0:  # nothing priced: no figure to scale
                why = why or (f"the TPU compiler (estimator) priced the XLA reference at 0 "
                              f"cycles with {name} at {n} (ops it cannot price)")
                break
            records.append(answer["records"])
        if len(records) == 2 or time.monotonic() > deadline:
            break
    if len(records) != 2:
        return None, verdict, why
    (n1, _), (n2, _) = pair
    totals = [_total(recs) for recs in records]
    full = int(plan.value or n2)
    value, linear, spread = scale_reference(totals[0], totals[1], n1, n2, full)
    found = estimates.estimate_of(
        records[1], chip, "scaled",
        f"XLA reference estimated with {name} at {n1} and {n2} ({totals[0]:,} and "
        f"{totals[1]:,} cycles) and scaled to {full} by its cost per unit at {n2} (a line "
        f"through both gives {linear:,}: {spread:.0%} apart)")
    found["spread"] = spread
    found["cycles"] = value
    found["seconds"] = tpu_compile.estimate(value, chip)["seconds"]
    found["ops"] = [{"name": f"XLA reference ({len(records[1])} ops, extrapolated)",
                     "kind": "xla", "cycles": value}]
    return _labelled(found, plan), verdict, None


def _total(records: list[dict[str, Any]]) -> int:
    """A program's cycles: every op's, times the identical ops its record stands for."""
    return sum(int(r["cycles"]) * int(r.get("count") or 1) for r in records)


def _labelled(found: dict[str, Any], plan: ReferencePlan) -> dict[str, Any]:
    """The estimate, saying so when an equivalent program was priced in its place."""
    note = plan.full.note
    if not note:
        return found
    detail = found.get("detail")
    return {**found, "equivalent": note, "detail": f"{detail}; {note}" if detail else note}


# -- the record, kept --------------------------------------------------------------------

def record_key(fingerprint: str, chip: str, libtpu: str, scaling: str = "whole") -> str:
    """The disk key of a reference record: everything that decides it (the program
    without source locations, which fixes its production shapes; the chip; libtpu; how
    it may be scaled, ``scaling_key``; the way records are made)."""
    return hashlib.sha256("|".join(["reference", str(RECORD_VERSION), chip, libtpu,
                                    fingerprint, scaling]).encode()).hexdigest()


def make_record(plan: ReferencePlan, found: dict[str, Any] | None,
                verdict: dict[str, Any], why: str | None, took: float) -> dict[str, Any]:
    """What every candidate of the task is ranked against (JSON)."""
    cost = dict(plan.cost)
    compiled = verdict.get("cost") or {}
    if compiled.get("flops"):  # the compiled program's count, when it gives one
        cost["flops"] = float(compiled["flops"])
    return {"version": RECORD_VERSION, "chip": plan.chip, "estimate": found, "why": why,
            "compile": verdict.get("compile"),
            "message": tpu_compile.short(verdict.get("message") or "", 300) or None,
            "cost": verdict.get("cost"), "opcodes": verdict.get("opcodes"),
            "flops": cost.get("flops"), "io_bytes": cost.get("io_bytes"),
            "roofline": roofline(cost, plan.chip),
            "scaling": plan.scaling.to_json() if plan.scaling else None,
            "equivalent": plan.full.note,
            "computed_s": round(took, 2)}


def _keep(record: dict[str, Any], answer_why: str | None) -> bool:
    """A record worth keeping on disk: an estimate, or a failure that would happen again
    (not a deadline, a busy host or a memory limit another run may not hit)."""
    if record.get("estimate") is not None:
        return True
    why = answer_why or ""
    # No way to scale it is no lasting answer either: a better way (another layout's
    # parameter, an axis found by a later version) must not meet this record.
    return not any(word in why for word in ("did not finish", "busy", "memory limit",
                                            "deadline", "slot", "no size of it",
                                            "smaller size"))


def reference_memory_mb(memory_mb: int) -> int:
    """The reference's compile process may use more than a candidate's (it runs once per
    task and chip, and a big XLA program's estimate needed 5-16 GB here): what the host
    gives a compile that needs more (``compile_pool.raised_memory_mb``: a third of its
    memory, at most 12 GiB), never less than ``memory_mb``."""
    return max(memory_mb, compile_pool.raised_memory_mb())


@contextlib.contextmanager
def _host_lock(root: Any, key: str, deadline: float) -> Iterator[None]:
    """One worker of this host computes a given record; the others wait for it (a file
    lock: a killed holder releases it). No cache directory: no coordination."""
    if root is None:
        yield
        return
    import filelock

    path = root / "references" / f"{key[:32]}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(path)
        lock.acquire(timeout=max(0.0, deadline - time.monotonic()), poll_interval=0.2)
    except filelock.Timeout:  # go ahead: a stuck holder must not stop this one
        yield
        return
    except OSError:  # cannot coordinate: go ahead alone
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.release()


# -- the book: one record per task and chip, computed in the background -------------------

class Ticket:
    """A reference record being had: ``wait(timeout)`` for it. ``cost`` is known at
    once (XLA's FLOPs and the compulsory bytes of the full program, from its export):
    the production deadline, the memory floor and the roofline need no estimate."""

    def __init__(self, cost: dict[str, float] | None = None) -> None:
        self.future: Future[dict[str, Any]] = Future()
        self.started = time.monotonic()
        self.cost = dict(cost or {})

    def done(self) -> bool:
        return self.future.done()

    def wait(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.future.result(timeout=max(timeout, 0.0))
        except TimeoutError:
            return None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @classmethod
    def of(cls, record: dict[str, Any], cost: dict[str, float] | None = None) -> Ticket:
        ticket = cls(cost)
        ticket.future.set_result(record)
        return ticket


class ReferenceBook:
    """This judge's reference records, by (task spec, chip)."""

    SIZE = 32

    def __init__(self) -> None:
        self.tickets: dict[str, Ticket] = {}
        self.lock = threading.Lock()
        self._thread: ThreadPoolExecutor | None = None

    def start(self) -> None:
        """The background thread, started before the harness snapshots live threads."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tw-reference")
            self._thread.submit(lambda: None).result()

    def request(self, spec: dict[str, Any], chip: str, memory_mb: int) -> Ticket:
        """The reference record of ``spec`` (at its one, production, configuration) for
        ``chip``: from memory, from disk, or computed in the background. The export runs
        here (the task's code, in the calling thread)."""
        key = json.dumps([spec, chip], sort_keys=True, default=str)
        with self.lock:
            ticket = self.tickets.get(key)
        if ticket is not None and (not ticket.done() or (ticket.wait(0) or {}).get("final")):
            return ticket  # being computed, or done for good (not a deadline's failure)
        comp = compile_pool.compilers()
        try:
            full = _export_spec(spec, chip)
        except Exception as exc:  # the task's reference at its own size
            ticket = Ticket.of({"estimate": None, "compile": None, "chip": chip,
                                "why": "the XLA reference could not be exported at the "
                                       f"production shape: {type(exc).__name__}: "
                                       f"{str(exc)[:300]}", "roofline": None, "final": True})
            return self._keep(key, ticket)
        options: list[tuple[Scaling, Any]] | None = None
        options_error: Exception | None = None
        if budget_ratio(full.cost) > 1.0:  # to be scaled: how is part of what decides it
            try:
                options = scaling_options(spec, chip)
            except Exception as exc:
                options, options_error = [], exc
        disk_key = record_key(full.fingerprint, chip, comp.libtpu, scaling_key(options))
        cached = comp.cache.get(disk_key)
        if cached is not None:
            return self._keep(key, Ticket.of({**cached, "cached": True, "final": True},
                                             full.cost))
        try:
            if options_error is not None:
                raise options_error
            plan = reference_plan(spec, chip, full, options)
        except Exception as exc:
            plan = ReferencePlan(full, chip)
            plan.why_not_scaled = (f"the XLA reference could not be exported at a smaller "
                                   f"size: {type(exc).__name__}: {str(exc)[:300]}")
        ticket = Ticket(full.cost)
        self._keep(key, ticket)
        self.start()
        assert self._thread is not None
        self._thread.submit(self._compute, plan, disk_key, ticket, memory_mb)
        return ticket

    def _keep(self, key: str, ticket: Ticket) -> Ticket:
        with self.lock:
            if len(self.tickets) >= self.SIZE:
                self.tickets.pop(next(iter(self.tickets)))
            self.tickets[key] = ticket
        return ticket

    @staticmethod
    def _compute(plan: ReferencePlan, disk_key: str, ticket: Ticket, memory_mb: int) -> None:
        comp = compile_pool.compilers()
        started = time.monotonic()
        deadline = started + REFERENCE_TIMEOUT_S
        try:
            with _host_lock(comp.cache.root, disk_key, deadline):
                cached = comp.cache.get(disk_key)
                if cached is not None:
                    ticket.future.set_result({**cached, "cached": True, "final": True})
                    return
                found, verdict, why = reference_estimate(plan, deadline,
                                                         reference_memory_mb(memory_mb),
                                                         kind="reference")
                record = make_record(plan, found, verdict, why, time.monotonic() - started)
                final = _keep(record, why)
                if final:
                    comp.cache.put(disk_key, record)
            ticket.future.set_result({**record, "cached": False, "final": final})
        except BaseException as exc:  # a harness bug: the candidates go on without it
            ticket.future.set_result({
                "estimate": None, "chip": plan.chip, "compile": None,
                "why": f"the XLA reference's estimate failed: {type(exc).__name__}: {exc}"[:400],
                "roofline": roofline(plan.cost, plan.chip),
                "flops": plan.cost.get("flops"), "io_bytes": plan.cost.get("io_bytes")})


BOOK = ReferenceBook()
