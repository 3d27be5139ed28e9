"""The candidate at its production shape, in the candidate process: trace once, export.

Correctness is checked at the small check shapes; verdicts, estimates and rankings are
for the production shape (the size the user runs). Nothing of that size is ever
allocated: the candidate's entry is traced once at the production shape from abstract
inputs (``jax.ShapeDtypeStruct``), and what the TPU compiler is asked about is built
from that one jaxpr, with no more candidate Python:

- ``full``: the program exactly as traced, exported for TPU (``jax.export``, StableHLO
  with the Mosaic kernels inside). Compiled *without* the estimate flag it gives the
  verdict at the production shape: scoped-VMEM overflow, Mosaic refusals.
- ``scaled``: the same program with every ``pallas_call``'s grid shortened along one
  axis (two lengths, ``n1 < n2``), for the estimate. The TPU compiler's estimator
  simulates every grid step (its time and memory grow with the grid: 58 ms and ~5 MB
  per 512-block f32 matmul step measured here), while a kernel's cost is linear in
  the number of repeats of its inner sweep; two short grids give the fixed and the
  per-repeat cost, scaled to the production grid by ``kernels.worker.tpu.estimates``.
  Blocks, index maps, the kernel body and every operand's full size are untouched, so
  the per-step work and the ops outside the kernels are the production ones.

Every ``pallas_call`` is renamed ``tw_pallas_<i>`` in what is exported: libtpu names
its estimate dump files after the kernel and aborts the process on a name longer than
the file system allows; the short name also says which record belongs to which kernel.
The user's names are kept in the plan for display.

Worker-side (imports JAX); runs in the confined candidate process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

SHORT_NAME = "tw_pallas_{}"
STEP_BUDGET = 32  # grid steps per kernel in the longer of the two scaled compiles
# A kernel whose work differs from one repeat of its grid to the next (``pl.when`` on a
# grid position the shortened grids drop: a causal mask, work on one step) is shortened
# along an outer axis whose repeats are alike, with up to this many steps in the longer
# grid; else estimated on its whole grid up to FULL_GRID_BUDGET steps; else not at all.
UNEVEN_STEP_BUDGET = 2048
FULL_GRID_BUDGET = 1024
# Work that a shortened grid's extrapolation may miss before the kernel is estimated
# whole (relative to the work of the whole grid).
UNEVEN_TOLERANCE = 0.01
# Primitives whose presence depends on shapes only (a reshape to the same shape is no
# eqn at all): left out of the structure compared between check and production traces.
_SHAPE_ONLY = frozenset({"reshape", "broadcast_in_dim", "squeeze", "expand_dims",
                         "convert_element_type", "copy", "copy_p", "transpose"})


@dataclass
class KernelPlan:
    """One ``pallas_call`` of the production program and how its grid is shortened."""

    index: int
    name: str  # the user's (the ``name=`` given, else the kernel function's)
    grid: tuple[int, ...]
    semantics: tuple[str, ...] | None
    axis: int | None = None  # shortened axis (outer axes set to 1); None: compiled whole
    units_full: int = 1  # repeats of the inner sweep in the production grid
    units: tuple[int, int] = (1, 1)  # repeats in the two scaled compiles
    blocks: list[dict[str, Any]] = field(default_factory=list)
    data_dependent: bool = False  # scalar prefetch / manual DMA: traffic not static
    declared_bytes: float | None = None  # the kernel's own pl.CostEstimate, if it gave one
    scratch_bytes: int = 0  # its scratch_shapes (VMEM accumulators and the like)
    vmem_limit: int | None = None  # CompilerParams(vmem_limit_bytes=...), when it sets one
    # Of each output the grid writes through blocks: the distinct blocks its index map
    # visits over the whole grid against the blocks that tile the array (None: unknown,
    # e.g. a data-dependent index map or an output aliased to an input).
    coverage: list[dict[str, Any]] = field(default_factory=list)
    # The body's work over the whole grid (``profiling.static_walk``: dot FLOPs, with
    # each ``pl.when`` evaluated on the steps where it runs), and whether the two
    # shortened grids, extrapolated, reach it (``uneven``: why not).
    dot_flops: float | None = None
    work_exact: bool = False  # no run-time data decided what the body does
    uneven: str | None = None
    unpriceable: str | None = None  # too long to estimate whole, too uneven to shorten
    # ``while`` loops in the body (a fori_loop of run-time length, an emit_pipeline over
    # a grid read from SMEM): the estimator cannot see their trip counts
    run_time_loops: int = 0

    def vmem_at_least(self) -> int:
        """VMEM the kernel needs at the very least: every VMEM block once (the pipeline
        double-buffers them, so the compiler asks for more) and its scratch."""
        return sum(int(b["block_bytes"]) for b in self.blocks if not b.get("manual")) \
            + self.scratch_bytes

    @property
    def short(self) -> str:
        return SHORT_NAME.format(self.index)

    @property
    def steps(self) -> int:
        return math.prod(self.grid) if self.grid else 1

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "short": self.short,
                "grid": list(self.grid), "steps": self.steps,
                "semantics": list(self.semantics) if self.semantics else None,
                "axis": self.axis, "units_full": self.units_full, "units": list(self.units),
                "blocks": self.blocks, "data_dependent": self.data_dependent,
                "declared_bytes": self.declared_bytes, "scratch_bytes": self.scratch_bytes,
                "vmem_limit": self.vmem_limit, "vmem_at_least": self.vmem_at_least(),
                "coverage": self.coverage, "dot_flops": self.dot_flops,
                "work_exact": self.work_exact, "uneven": self.uneven,
                "unpriceable": self.unpriceable, "run_time_loops": self.run_time_loops}


# -- walking jaxprs --------------------------------------------------------------------

def sub_jaxprs(params: dict[str, Any]) -> list[tuple[str, Any]]:
    """(param name, closed or open jaxpr) of an eqn's nested programs."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    found = []
    for key, value in params.items():
        if isinstance(value, ClosedJaxpr | Jaxpr) or (
                isinstance(value, tuple) and value
                and all(isinstance(v, ClosedJaxpr | Jaxpr) for v in value)):
            found.append((key, value))
    return found


def while_loops(jaxpr: Any) -> int:
    """``while`` eqns in a program, nested programs included: loops whose trip count is
    a run-time value (a fori_loop with static bounds traces to ``scan``)."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "while"
        for _, sub in sub_jaxprs(eqn.params):
            for one in sub if isinstance(sub, tuple) else (sub,):
                count += while_loops(getattr(one, "jaxpr", one))
    return count


def pallas_eqns(jaxpr: Any) -> list[Any]:
    """Every ``pallas_call`` eqn, nested programs included, in program order."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append(eqn)
            continue
        for _, sub in sub_jaxprs(eqn.params):
            for one in sub if isinstance(sub, tuple) else (sub,):
                found += pallas_eqns(getattr(one, "jaxpr", one))
    return found


def _rewrite(jaxpr: Any, change: Any, counter: list[int]) -> Any:
    """``jaxpr`` with ``change(index, eqn) -> params`` applied to every pallas_call."""
    from jax.extend.core import ClosedJaxpr

    eqns = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            eqn = eqn.replace(params=change(counter[0], eqn))
            counter[0] += 1
        else:
            subs = sub_jaxprs(eqn.params)
            if subs:
                params = dict(eqn.params)
                for key, sub in subs:
                    def one(j: Any) -> Any:
                        if isinstance(j, ClosedJaxpr):
                            return ClosedJaxpr(_rewrite(j.jaxpr, change, counter), j.consts)
                        return _rewrite(j, change, counter)
                    params[key] = tuple(one(j) for j in sub) if isinstance(sub, tuple) \
                        else one(sub)
                eqn = eqn.replace(params=params)
        eqns.append(eqn)
    return jaxpr.replace(eqns=eqns)


def _primitives(jaxpr: Any, names: list[str]) -> None:
    for inner in jaxpr.eqns:
        if inner.primitive.name not in _SHAPE_ONLY:
            names.append(inner.primitive.name)
        for _, sub in sub_jaxprs(inner.params):
            for one in sub if isinstance(sub, tuple) else (sub,):
                _primitives(getattr(one, "jaxpr", one), names)


def structure(closed: Any) -> list[list[str]]:
    """What the kernels compute, shapes aside: per ``pallas_call`` (program order) the
    sorted primitive names of its body. A candidate whose kernels at the production
    shape are not the kernels checked at the check shapes is caught by comparing this."""
    out = []
    for eqn in pallas_eqns(closed.jaxpr):
        names: list[str] = []
        _primitives(getattr(eqn.params["jaxpr"], "jaxpr", eqn.params["jaxpr"]), names)
        out.append(sorted(names))
    return out


# -- the plan ----------------------------------------------------------------------------

def kernel_name(eqn: Any) -> str:
    name = eqn.params.get("name")
    if isinstance(name, str) and name:
        return name
    info = getattr(eqn.params.get("jaxpr"), "debug_info", None)
    src = getattr(info, "func_src_info", None) or ""
    return src.split(" at ")[0] or "kernel"


def _semantics(eqn: Any) -> tuple[str, ...] | None:
    params = eqn.params.get("compiler_params")
    found = getattr(params, "dimension_semantics", None)
    if found is None and isinstance(params, dict):
        inner = params.get("mosaic") or params.get("mosaic_tpu")
        found = getattr(inner, "dimension_semantics", None) or (
            inner.get("dimension_semantics") if isinstance(inner, dict) else None)
    if not found:
        return None
    return tuple(str(getattr(s, "value", s)).lower().split(".")[-1] for s in found)


def _blocks(gm: Any) -> tuple[list[dict[str, Any]], bool]:
    """Per operand: block shape and bytes, the grid axes its block index follows and the
    memory space; whether any index map reads scalar-prefetch data (then which blocks
    move is data-dependent)."""
    import numpy as np

    blocks = []
    data_dependent = gm.num_index_operands > 0
    grid = tuple(gm.grid)
    for mapping in gm.block_mappings:
        aval = mapping.array_aval
        dims = []
        for size in mapping.block_shape:
            value = getattr(size, "block_size", size)
            dims.append(int(value) if isinstance(value, int) else 1)
        itemsize = np.dtype(aval.dtype).itemsize
        space = str(getattr(mapping.transformed_block_aval, "memory_space", "") or "")
        manual = "any" in space.lower() or "hbm" in space.lower()
        follows: list[int] | None = []
        try:
            follows = _follows(mapping.index_map_jaxpr, grid, gm.num_index_operands)
        except Exception:  # an index map that cannot be probed statically
            follows = None
        blocks.append({
            "origin": str(mapping.origin), "array": [int(d) for d in aval.shape],
            "dtype": str(aval.dtype), "block": dims,
            "block_bytes": int(math.prod(dims) * itemsize),
            "array_bytes": int(math.prod(aval.shape) * itemsize),
            "follows": follows, "manual": manual,
        })
        data_dependent = data_dependent or manual
    return blocks, data_dependent


def _follows(index_map: Any, grid: tuple[int, ...], prefetch: int) -> list[int] | None:
    """The grid axes (extent > 1) a block index changes with, found by evaluating the
    index map at the origin and one step along each axis; None when it reads
    scalar-prefetch operands (data-dependent)."""
    import jax

    if prefetch:
        return None
    jaxpr = index_map.jaxpr if hasattr(index_map, "jaxpr") else index_map
    consts = getattr(index_map, "consts", ())

    def at(point: list[int]) -> tuple:
        return tuple(int(v) for v in jax.core.eval_jaxpr(jaxpr, consts, *point))

    base = at([0] * len(grid))
    found = []
    for axis, extent in enumerate(grid):
        if extent > 1:
            point = [0] * len(grid)
            point[axis] = 1
            if at(point) != base:
                found.append(axis)
    return found


def _scratch_bytes(gm: Any) -> int:
    """Bytes of the kernel's VMEM scratch buffers (semaphores and SMEM scalars aside)."""
    import numpy as np

    total = 0
    for aval in getattr(gm, "scratch_avals", ()) or ():
        inner = getattr(aval, "inner_aval", aval)
        shape, dtype = getattr(inner, "shape", None), getattr(inner, "dtype", None)
        space = str(getattr(aval, "memory_space", "") or "").lower()
        if shape is None or dtype is None or "smem" in space or "sem" in space:
            continue
        try:
            total += int(math.prod(shape) * np.dtype(dtype).itemsize)
        except TypeError:  # a semaphore type: not VMEM bytes
            continue
    return total


def _coverage(eqn: Any, grid: tuple[int, ...]) -> list[dict[str, Any]]:
    """Per output written through blocks: the distinct blocks the grid visits against
    the blocks that tile the array (``profiling.static_blocks.count_fetches``)."""
    from tilewright.profiling.static_blocks import MAX_STEPS, count_fetches

    gm = eqn.params["grid_mapping"]
    aliased = {int(o) for _, o in eqn.params.get("input_output_aliases") or ()}
    steps = math.prod(grid) if grid else 1
    found = []
    for j, bm in enumerate(gm.block_mappings_output):
        space = str(getattr(bm.transformed_block_aval, "memory_space", "") or "").lower()
        if j in aliased or "any" in space or "hbm" in space:
            continue  # aliased to an input (in-place update) or written by hand
        row: dict[str, Any] = {"output": j, "shape": [int(d) for d in bm.array_aval.shape]}
        if steps > MAX_STEPS or gm.num_index_operands:
            row["unknown"] = ("data-dependent index map" if gm.num_index_operands
                              else f"{steps} grid steps")
        else:
            cov: dict[str, Any] = {}
            try:
                count_fetches(bm, list(grid), steps, gm.num_index_operands, [], cov)
            except Exception as exc:  # an index map that cannot be evaluated here
                row["unknown"] = f"{type(exc).__name__}"
            if "total" in cov:
                row.update(visited=int(cov["visited"]), total=int(cov["total"]))
            else:
                row.setdefault("unknown", "not blocked (element offsets)")
        found.append(row)
    return found


def _total_work(body: Any, grid: tuple[int, ...]) -> tuple[float, bool] | None:
    """(FLOPs of the body over the whole ``grid``, whether no run-time data decided
    them): ``pl.when`` predicates on grid positions evaluated step by step."""
    from tilewright.profiling.static_walk import count_kernel_work

    try:
        work = count_kernel_work(body, list(grid))
    except Exception:
        return None
    steps = math.prod(grid) if grid else 1
    total = (work["dot_flops"] + work["elementwise_flops"] + work["transcendentals"]) * steps
    exact = not any("run-time" in n or "runtime" in n for n in work.get("notes") or [])
    return total, exact


def _shortenings(grid: tuple[int, ...], budget: int) -> list[tuple[int, int, tuple[int, int]]]:
    """(axis, repeats in the whole grid, (n1, n2) repeats in the two short grids) for
    every axis whose inner sweep fits the budget twice over, outermost first: outer axes
    are set to 1, the axis to ``n1`` and ``n2 = 2 n1``."""
    found = []
    for axis in range(len(grid)):
        inner = math.prod(grid[axis + 1:])
        if inner * 2 > budget and axis < len(grid) - 1:
            continue
        n2 = max(2, min(grid[axis], budget // max(inner, 1)))
        n1 = max(1, n2 // 2)
        if n1 == n2 or inner * n2 > max(budget, 2 * inner):
            continue
        found.append((axis, math.prod(grid[:axis + 1]), (n1, n2)))
    return found


def _extrapolated(body: Any, grid: tuple[int, ...], axis: int, units: tuple[int, int],
                  units_full: int) -> float | None:
    """The body's work at ``units_full`` repeats, extrapolated from the two short grids
    the way the estimate extrapolates their cycles."""
    sums = []
    for n in units:
        short = list(grid)
        for outer in range(axis):
            short[outer] = 1
        short[axis] = n
        found = _total_work(body, tuple(short))
        if found is None:
            return None
        sums.append(found[0])
    (u1, u2), (w1, w2) = units, sums
    return w1 + (w2 - w1) / (u2 - u1) * (units_full - u1) if u2 != u1 else w2


def _check_even(p: KernelPlan, body: Any) -> None:
    """Whether the shortened grids price what the whole grid does: their work,
    extrapolated as the estimate extrapolates cycles, must reach the whole grid's. A
    ``pl.when`` on a grid position the short grids never reach (step 40 of 48, the
    blocks below a causal diagonal) would otherwise go unpriced. An uneven kernel is
    shortened along an outer axis whose repeats are alike (``UNEVEN_STEP_BUDGET``),
    else estimated whole within ``FULL_GRID_BUDGET`` steps, else not at all
    (``unpriceable``)."""
    from tilewright.profiling.static_walk import count_kernel_work

    full = _total_work(body, p.grid)
    try:
        p.dot_flops = count_kernel_work(body, list(p.grid))["dot_flops"] * p.steps
    except Exception:
        p.dot_flops = None
    if full is None:
        return
    total, p.work_exact = full
    if p.axis is None or not p.work_exact:
        return

    def even(axis: int, units_full: int, units: tuple[int, int]) -> float | None:
        """None when the short grids extrapolate to the whole grid's work, else their
        extrapolation."""
        predicted = _extrapolated(body, p.grid, axis, units, units_full)
        if predicted is None or abs(predicted - total) <= UNEVEN_TOLERANCE * max(total, 1.0):
            return None
        return predicted

    predicted = even(p.axis, p.units_full, p.units)
    if predicted is None:
        return
    (u1, u2) = p.units
    p.uneven = (f"its work is not the same in every repeat of its grid: the whole grid "
                f"does {total:,.0f} FLOPs, the shortened grids ({u1} and {u2} of "
                f"{p.units_full} repeats) extrapolate to {predicted:,.0f} (a pl.when on a "
                "grid position they do not reach)")
    # The innermost axis whose repeats are alike, at one and two repeats: every step more
    # is the estimator's memory (causal_attention's 512-row blocks, 16 and 32 heads of 64
    # steps each, or 1 and 2 of its 4 batches of 1,024 steps: over its 8 GB; one and two
    # heads: priced, 0.97 of the device time)
    for axis, units_full, units in reversed(_shortenings(p.grid, UNEVEN_STEP_BUDGET)):
        units = (1, 2) if p.grid[axis] >= 2 else units
        if axis < (p.axis or 0) and even(axis, units_full, units) is None:
            p.axis, p.units_full, p.units = axis, units_full, units
            p.uneven += (f"; shortened along axis {axis} instead ({units[0]} and "
                         f"{units[1]} of its {units_full} repeats, each the whole sweep "
                         "inside it)")
            return
    if p.steps <= FULL_GRID_BUDGET:
        p.axis, p.units = None, (1, 1)  # estimated on its whole grid
        p.uneven += "; estimated on its whole grid"
    else:
        p.unpriceable = (f"{p.name}: {p.uneven}; no outer axis repeats alike within "
                         f"{UNEVEN_STEP_BUDGET} steps, and its {p.steps} grid steps are too "
                         f"many to estimate whole (at most {FULL_GRID_BUDGET})")


def plan(closed: Any, budget: int = STEP_BUDGET) -> list[KernelPlan]:
    """How each ``pallas_call`` of ``closed`` is shortened for the estimate.

    The grid runs in row-major order, so for any axis ``a`` the steps are
    ``prod(grid[:a+1])`` repeats of the sweep over the axes inside it. The axis chosen
    is the outermost one whose inner sweep fits half the budget: outer axes are set to
    1 and ``a`` to ``n1`` and ``n2 = 2 n1`` repeats (``n1`` = 2 on an inner axis, where
    the first and last steps of a reduction may differ), so that the cost of one
    repeat and the fixed cost can be told apart. A grid within the budget is compiled
    whole (``axis`` None)."""
    plans = []
    for index, eqn in enumerate(pallas_eqns(closed.jaxpr)):
        gm = eqn.params["grid_mapping"]
        grid = tuple(int(g) if isinstance(g, int) else -1 for g in gm.grid)
        blocks, data_dependent = _blocks(gm)
        declared = getattr(eqn.params.get("cost_estimate"), "bytes_accessed", None)
        limit = getattr(eqn.params.get("compiler_params"), "vmem_limit_bytes", None)
        p = KernelPlan(index, kernel_name(eqn), grid, _semantics(eqn), blocks=blocks,
                       data_dependent=data_dependent,
                       declared_bytes=float(declared) if isinstance(declared, int | float)
                       else None, scratch_bytes=_scratch_bytes(gm),
                       vmem_limit=int(limit) if isinstance(limit, int) else None)
        with contextlib.suppress(Exception):  # a body that cannot be walked: none seen
            body = eqn.params["jaxpr"]
            p.run_time_loops = while_loops(getattr(body, "jaxpr", body))
        if grid and min(grid) > 0 and p.steps > budget:
            found = _shortenings(grid, budget)
            if found:
                p.axis, p.units_full, p.units = found[0]
        if grid and min(grid) > 0:
            p.coverage = _coverage(eqn, grid)
            body = eqn.params["jaxpr"]
            _check_even(p, getattr(body, "jaxpr", body))
        plans.append(p)
    return plans


def variant(closed: Any, plans: list[KernelPlan], which: int | None) -> Any:
    """``closed`` with every pallas_call renamed; with ``which`` (0 or 1) also its grid
    shortened to the plan's ``units[which]`` repeats (outer axes at 1)."""
    from jax.extend.core import ClosedJaxpr

    by_index = {p.index: p for p in plans}

    def change(index: int, eqn: Any) -> dict[str, Any]:
        params = {**eqn.params, "name": SHORT_NAME.format(index)}
        p = by_index.get(index)
        if which is not None and p is not None and p.axis is not None:
            grid = list(p.grid)
            for axis in range(p.axis):
                grid[axis] = 1
            grid[p.axis] = p.units[which]
            params["grid_mapping"] = dataclasses.replace(params["grid_mapping"],
                                                         grid=tuple(grid))
        return params

    return ClosedJaxpr(_rewrite(closed.jaxpr, change, [0]), closed.consts)


def _named_evaluator(closed: Any) -> Any:
    """A function evaluating ``closed`` in which every top-level ``pallas_call`` (nested
    jits inlined) runs inside a jit of its own named after it: XLA names a custom call
    after its enclosing function, so the compiled program's op for kernel ``i`` is
    ``tw_pallas_<i>...`` and its estimator records can be told apart."""
    import jax

    from tilewright.kernels.worker.execution import bind_as_traced, rebound

    counter = [0]

    def bind(eqn: Any, invals: list[Any]) -> list[Any]:
        if eqn.primitive.name != "pallas_call":
            return bind_as_traced(eqn, invals)
        params = eqn.primitive.get_bind_params(eqn.params)
        prim = eqn.primitive

        def call(*xs: Any, _prim: Any = prim, _params: Any = params) -> Any:
            return _prim.bind(*xs, **_params)

        call.__name__ = call.__qualname__ = SHORT_NAME.format(counter[0])
        counter[0] += 1
        with eqn.ctx.manager:
            return jax.jit(call)(*invals)

    evaluate = rebound(closed, bind)

    def run(*args: Any) -> list[Any]:
        counter[0] = 0
        return evaluate(*args)

    return run


def export(closed: Any, avals: list[Any], chip: str) -> bytes:
    """The program serialized for TPU (``jax.export``): StableHLO with its Mosaic
    kernels, compiled elsewhere without running any Python of the candidate's."""
    import jax

    from tilewright.kernels.worker.tpu import tpu_compile

    fn = jax.jit(_named_evaluator(closed))
    with tpu_compile.abstract_device(chip):
        exported = jax.export.export(fn, platforms=("tpu",))(*avals)
    return bytes(exported.serialize())


def any_scaled(plans: list[KernelPlan]) -> bool:
    return any(p.axis is not None for p in plans)
