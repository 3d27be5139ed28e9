"""Static analysis of every ``pallas_call`` in a candidate (worker-side: imports jax lazily).

From the candidate's jaxpr alone, per ``pallas_call``: the grid and its dimension
semantics, each operand's block shape, dtype and memory space, the HBM bytes it moves
(a block is fetched again only when its block index changes between consecutive grid
steps: we evaluate the index maps over the grid in iteration order), the VMEM
footprint (pipelined blocks times their buffer count, padded to TPU tiles, plus
scratch), the alignment of the last two block dims, the dots and whether they suit
the MXU, flops and arithmetic intensity, and warnings that each carry a concrete fix.
The JAX internals read here (``GridMapping``, ``BlockMapping``) are those of jax 0.10.2
(``jax/_src/pallas/core.py``, ``pallas_call.py``). One BlockSpec over its grid lives in
``static_blocks``, jaxpr walking in ``static_walk``, the warnings in ``static_rules``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

from tilewright.profiling.chips import Chip, device_facts
from tilewright.profiling.static_blocks import (
    SUBLANES,
    alignment,
    block_dim,
    count_fetches,
    padded_bytes,
)
from tilewright.profiling.static_rules import kernel_warnings
from tilewright.profiling.static_walk import count_kernel_work, prefetch_values


def analyze_callable(fn: Callable[..., Any], dynamic: tuple, static: tuple = (), *,
                     chip: Chip, task_flops: float | None = None) -> dict[str, Any]:
    """Trace ``fn(*dynamic, *static)`` to a jaxpr and analyze each ``pallas_call`` in it.

    Tracing errors (the candidate's) propagate; ``dynamic`` may hold
    ``jax.ShapeDtypeStruct``s, so nothing is allocated or run. Off a TPU, tracing runs
    under an abstract mesh whose device is ``chip``, so kernels that ask for the TPU's
    tiling (``pltpu.emit_pipeline``) trace as they would on that chip.
    """
    import jax

    with tpu_context(chip):
        closed = jax.make_jaxpr(lambda *d: fn(*d, *static))(*dynamic)
    concrete = all(isinstance(d, jax.Array) for d in dynamic)
    return analyze_jaxpr(closed, chip=chip, task_flops=task_flops,
                         args=list(dynamic) if concrete else None)


@contextlib.contextmanager
def tpu_context(chip: Chip) -> Iterator[None]:
    """Off a TPU: an abstract mesh whose device is ``chip`` (what TPU-only APIs consult)."""
    import jax

    facts = device_facts(chip.name)  # the device kind and its cores: profiling.chips
    if facts is None or jax.default_backend() == "tpu":
        yield
        return
    from jax._src.mesh import AbstractDevice
    from jax.sharding import AbstractMesh, use_abstract_mesh

    kind, cores = facts
    mesh = AbstractMesh((1,), ("tilewright",), abstract_device=AbstractDevice(
        device_kind=kind, num_cores=cores, platform="tpu"))
    with use_abstract_mesh(mesh):
        yield


def analyze_jaxpr(closed: Any, *, chip: Chip, task_flops: float | None = None,
                  args: list[Any] | None = None) -> dict[str, Any]:
    """Analyze every pallas_call; one that this analysis cannot read gets ``analysis_error``.

    With concrete ``args`` (the program's inputs), scalar-prefetch operands are computed
    so index maps that read them are evaluated exactly.
    """
    calls = list(find_pallas_calls(closed.jaxpr))
    prefetch: dict[int, list[Any]] = {}
    if args is not None and any(e.params["grid_mapping"].num_index_operands for e, _, _ in calls):
        try:
            prefetch = prefetch_values(closed, args)
        except Exception:  # anything unusual around the kernel: fall back to upper bounds
            prefetch = {}
    kernels = []
    for index, (eqn, times, where) in enumerate(calls):
        flops = task_flops if (task_flops and len(calls) == 1) else None
        try:
            kernels.append(analyze_pallas_call(eqn, chip=chip, task_flops=flops, index=index,
                                               times=times, where=where,
                                               prefetch=prefetch.get(id(eqn))))
        except Exception as exc:  # a JAX internal we do not know yet: say so, keep the rest
            kernels.append(_unreadable(eqn, index, times, where, exc))
    totals = {
        "kernels": len(kernels),
        "bytes_total": sum(k["bytes_total"] * k["calls"] for k in kernels),
        "flops": sum((k["flops"] or 0) * k["calls"] for k in kernels),
        "vmem_bytes_max": max((k["vmem_bytes"] for k in kernels), default=0),
    }
    return {"chip": chip.name, "kernels": kernels, "totals": totals}


def find_pallas_calls(jaxpr: Any, times: int = 1, where: str = "") -> Iterator[tuple[Any, int, str]]:
    """Every pallas_call eqn, with how many times it runs per call (scan lengths multiply)."""
    from jax.extend import core as jcore

    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn, times, where
            continue
        inner_times = times
        if eqn.primitive.name == "scan":
            inner_times = times * int(eqn.params.get("length", 1))
        for value in eqn.params.values():
            for sub in _sub_jaxprs(value, jcore):
                yield from find_pallas_calls(sub, inner_times, f"{where}/{eqn.primitive.name}")


def _sub_jaxprs(value: Any, jcore: Any) -> Iterator[Any]:
    if isinstance(value, jcore.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jcore.Jaxpr):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _sub_jaxprs(item, jcore)


def analyze_pallas_call(eqn: Any, *, chip: Chip, task_flops: float | None = None, index: int = 0,
                        times: int = 1, where: str = "",
                        prefetch: list[Any] | None = None) -> dict[str, Any]:
    params = eqn.params
    gm = params["grid_mapping"]
    kernel_jaxpr = params["jaxpr"]
    grid = [int(g) if isinstance(g, int) else None for g in gm.grid]
    static_grid = all(g is not None for g in grid)
    steps = math.prod(grid) if static_grid else None
    compiler = params.get("compiler_params")
    semantics = _dimension_semantics(compiler, len(grid))
    vmem_limit = getattr(compiler, "vmem_limit_bytes", None) if compiler is not None else None
    aliases = dict(params.get("input_output_aliases") or ())

    operands = []
    notes: list[str] = []
    # The kernel's own parameter names (x_ref, o_ref, ...) after the scalar-prefetch ones.
    arg_names = list(getattr(kernel_jaxpr.debug_info, "arg_names", None) or [])
    for i, bm in enumerate(gm.block_mappings):
        is_input = i < gm.num_inputs
        operand = _operand(bm, is_input, i if is_input else i - gm.num_inputs, grid, steps,
                           gm.num_index_operands, notes, prefetch)
        j = gm.num_index_operands + i
        operand["name"] = arg_names[j] if j < len(arg_names) and arg_names[j] else operand["origin"]
        operands.append(operand)
    for in_idx, out_idx in aliases.items():
        if out_idx + gm.num_inputs < len(operands):
            operands[out_idx + gm.num_inputs]["aliases_input"] = int(in_idx)

    work = count_kernel_work(kernel_jaxpr, grid if static_grid else None)
    scratch = [_scratch(aval) for aval in gm.scratch_avals]
    # Buffers the body allocates itself (pl.run_scoped, emit_pipeline): counted as if
    # they were all live at once, an upper bound when scopes follow one another.
    scratch += [{**_scratch(aval), "scoped": True} for aval in work["scoped_avals"]]
    # Footprint as kernel authors count it (buffers x block bytes + scratch), and as
    # Mosaic allocates it (each block padded to whole (8·packing, 128) tiles).
    vmem_blocks = sum(o["vmem_bytes"] for o in operands)
    vmem_scratch = sum(s["bytes"] for s in scratch if s["memory_space"] == "vmem")
    vmem_bytes = vmem_blocks + vmem_scratch
    vmem_padded = (sum(o["vmem_padded_bytes"] for o in operands)
                   + sum(s["padded_bytes"] for s in scratch if s["memory_space"] == "vmem"))
    bytes_total = sum(o["bytes_total"] or 0 for o in operands)

    grid_steps = steps or 1
    dot_flops = work["dot_flops"] * grid_steps
    if task_flops:
        flops, flops_source = float(task_flops), "task"
    elif dot_flops:
        flops, flops_source = float(dot_flops), "dots"
    else:
        flops, flops_source = float(work["elementwise_flops"] * grid_steps), "elementwise"
    notes.extend(work["notes"])
    dots = [_dot_fit(d, chip) for d in work["dots"]]

    info = kernel_jaxpr.debug_info
    src = getattr(info, "func_src_info", "") or ""
    name = params.get("name") or (src.split(" at ")[0] if src else f"pallas_call_{index}")
    kernel = {
        "index": index,
        "name": name,
        "source": src,
        "calls": times,
        "where": where or "top",
        "grid": grid,
        "steps": steps,
        "dimension_semantics": semantics,
        "operands": operands,
        "scratch": scratch,
        "vmem_bytes": vmem_bytes,
        "vmem_padded_bytes": vmem_padded,
        "vmem_blocks_bytes": vmem_blocks,
        "vmem_scratch_bytes": vmem_scratch,
        "vmem_limit_bytes": vmem_limit,
        "vmem_budget_bytes": vmem_limit or chip.scoped_vmem_bytes,
        "vmem_physical_bytes": chip.vmem_bytes,
        "bytes_total": bytes_total,
        "bytes_per_step": (bytes_total / steps) if steps else None,
        "flops": flops,
        "flops_source": flops_source,
        "dot_flops": dot_flops,
        "transcendentals": work["transcendentals"] * grid_steps,
        "intensity": (flops / bytes_total) if bytes_total else None,
        "dots": dots,
        "notes": notes,
    }
    kernel["warnings"] = kernel_warnings(kernel, chip)
    return kernel


def _unreadable(eqn: Any, index: int, times: int, where: str, exc: Exception) -> dict[str, Any]:
    gm = eqn.params.get("grid_mapping")
    grid = [g if isinstance(g, int) else None for g in getattr(gm, "grid", ())]
    return {"index": index, "name": str(eqn.params.get("name") or f"pallas_call_{index}"),
            "source": "", "calls": times, "where": where or "top", "grid": grid,
            "steps": math.prod(grid) if grid and None not in grid else None,
            "dimension_semantics": None, "operands": [], "scratch": [], "vmem_bytes": 0,
            "vmem_padded_bytes": 0,
            "vmem_blocks_bytes": 0, "vmem_scratch_bytes": 0, "vmem_limit_bytes": None,
            "vmem_budget_bytes": 0, "vmem_physical_bytes": 0, "bytes_total": 0,
            "bytes_per_step": None, "flops": None, "flops_source": None, "dot_flops": 0,
            "transcendentals": 0, "intensity": None, "dots": [], "notes": [],
            "warnings": [], "analysis_error": f"{type(exc).__name__}: {exc}"}


def _dimension_semantics(compiler: Any, rank: int) -> list[str] | None:
    sem = getattr(compiler, "dimension_semantics", None) if compiler is not None else None
    if sem is None:
        return None
    out = []
    for s in sem:
        text = str(getattr(s, "name", s)).lower()
        out.append(text.replace("dimensionsemantics.", ""))
    return out[:rank]


def _memory_space(ms: Any) -> str:
    text = str(ms).lower() if ms is not None else "default"
    if "smem" in text:
        return "smem"
    if "sem" in text:
        return "semaphore"
    if "any" in text or "hbm" in text:
        return "hbm"
    return "vmem"  # DEFAULT and VMEM: Pallas TPU pipelines these blocks through VMEM


def _operand(bm: Any, is_input: bool, idx: int, grid: list[int | None], steps: int | None,
             num_prefetch: int, notes: list[str], prefetch: list[Any] | None = None
             ) -> dict[str, Any]:
    import numpy as np

    array_shape = [int(d) for d in bm.array_aval.shape]
    dtype = np.dtype(bm.array_aval.dtype)
    block = [block_dim(b) for b in bm.block_shape]  # None for squeezed dims
    ref_shape = [int(d) for d in bm.transformed_block_aval.shape]
    memory_space = _memory_space(bm.transformed_block_aval.memory_space)
    itemsize = dtype.itemsize
    block_elems = math.prod(b if b is not None else 1 for b in block)
    block_bytes = block_elems * itemsize
    buffers = 2
    pm = bm.pipeline_mode
    if pm is not None and getattr(pm, "buffer_count", None):
        buffers = int(pm.buffer_count)

    fetches: int | None = None
    exact = True
    oob: list[dict[str, Any]] = []
    coverage: dict[str, Any] = {}
    if memory_space == "hbm":
        # The kernel copies by hand (make_async_copy); we cannot see how much.
        bytes_total: float | None = float(math.prod(array_shape) * itemsize)
        exact = False
        vmem = padded = 0
        buffers = 0
    else:
        if steps is not None:
            fetches, exact = count_fetches(bm, grid, steps, num_prefetch, oob, coverage,
                                            prefetch)
        bytes_total = float(fetches * block_bytes) if fetches is not None else None
        in_vmem = memory_space == "vmem"
        vmem = buffers * block_bytes if in_vmem else 0
        padded = buffers * padded_bytes(ref_shape, dtype) if in_vmem else 0
    role = "input" if is_input else "output"
    origin = str(bm.origin)
    if not exact:
        notes.append(
            f"{origin}: manual DMA from HBM/ANY memory: bytes estimated as the whole array once"
            if memory_space == "hbm" else
            f"{origin}: bytes are an upper bound (the index map reads scalar-prefetch values)")
    return {
        "role": role,
        "index": idx,
        "origin": origin,
        "shape": array_shape,
        "dtype": dtype.name,
        "block": block,
        "block_ref_shape": ref_shape,
        "memory_space": memory_space,
        "buffers": buffers,
        "block_bytes": block_bytes,
        "vmem_bytes": vmem,
        "vmem_padded_bytes": padded,
        "fetches": fetches,
        "bytes_total": bytes_total,
        "bytes_exact": exact,
        "traffic_factor": (bytes_total / (math.prod(array_shape) * itemsize)
                           if bytes_total and math.prod(array_shape) else None),
        "bytes_kind": "exact" if exact else ("estimate" if memory_space == "hbm"
                                             else "upper_bound"),
        "out_of_bounds": oob,
        "coverage": coverage or None,
        "index_map": str(bm.index_map_jaxpr.jaxpr).replace("\n", " "),
        "index_map_source": _src(bm.index_map_jaxpr.jaxpr),
        "line": _line(_src(bm.index_map_jaxpr.jaxpr)),
        "alignment": alignment(block, array_shape, dtype, memory_space),
    }


def _src(jaxpr: Any) -> str:
    return getattr(getattr(jaxpr, "debug_info", None), "func_src_info", "") or ""


def _line(src: str) -> int | None:
    """'<lambda> at kernel.py:17' -> 17 (where the BlockSpec's index map is written)."""
    tail = src.rsplit(":", 1)[-1] if ":" in src else ""
    return int(tail) if tail.isdigit() else None


def _dot_fit(dot: dict[str, Any], chip: Chip) -> dict[str, Any]:
    """Whether a dot's (M, K) x (K, N) suits the MXU (128 wide; 256 on v6e/v7x)."""
    m, k, n = dot["m"], dot["k"], dot["n"]
    width = 256 if chip.name in ("v6e", "v7x") else 128
    problems = []
    if k % 128 or n % 128:
        problems.append(f"K={k}, N={n} not multiples of 128: the MXU runs part-empty")
    elif (k % width or n % width) and chip.kind == "tpu":
        problems.append(f"K={k}, N={n}: {chip.label}'s MXU is {width} wide; multiples of {width} fill it")
    if m % SUBLANES:
        problems.append(f"M={m} not a multiple of 8 sublanes")
    if dot["lhs_dtype"] == "float32" or dot["rhs_dtype"] == "float32":
        problems.append("f32 operands run as several bf16 passes; bf16 inputs with "
                        "preferred_element_type=f32 are up to 3-6x faster where tolerance allows")
    return {**dot, "mxu_width": width, "mxu_ok": not problems, "problems": problems}


def _scratch(aval: Any) -> dict[str, Any]:
    import numpy as np

    shape = [int(d) for d in getattr(aval, "shape", ())]
    memory_space = _memory_space(getattr(aval, "memory_space", None))
    try:
        dtype = np.dtype(aval.dtype)
    except TypeError:  # semaphore and other non-numeric scratch
        return {"shape": shape, "dtype": str(getattr(aval, "dtype", "?")),
                "memory_space": "semaphore", "bytes": 0, "padded_bytes": 0}
    size = math.prod(shape) * dtype.itemsize
    padded = padded_bytes(shape, dtype) if memory_space == "vmem" else size
    return {"shape": shape, "dtype": dtype.name, "memory_space": memory_space, "bytes": size,
            "padded_bytes": padded}
