"""Warnings for one analyzed ``pallas_call``, each with a concrete fix.

Pure functions over the dict ``profiling.static`` builds: misaligned blocks, VMEM over
the chip's scoped default or physical size, grids too short to keep both TensorCores
of a two-core chip busy, blocks so small that the fixed per-step cost dominates, and
dots that leave the MXU part-empty. Severity: ``error`` (the TPU compiler rejects it
or it cannot fit), ``warning`` (slow), ``info`` (worth knowing).
"""

from __future__ import annotations

import math
from typing import Any

from tilewright.profiling.chips import Chip, MiB

# Fixed cost of one grid step on a TensorCore (pipeline bookkeeping, DMA issue and
# wait), as measured in the Pallas TPU pipelining guide: about 0.35 us.
STEP_OVERHEAD_S = 0.35e-6


def kernel_warnings(k: dict[str, Any], chip: Chip) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    out += _bounds(k)
    out += _coverage(k)
    out += _revisits(k)
    out += _parallel_reduction(k, chip)
    out += _alignment(k)
    out += _vmem(k, chip)
    out += _cores(k, chip)
    out += _overhead(k, chip)
    out += _dots(k, chip)
    return out


def _w(code: str, severity: str, message: str, fix: str, operand: str | None = None,
       line: int | None = None) -> dict[str, Any]:
    """One warning; ``line`` is the candidate line it points at (a BlockSpec), if known."""
    return {"code": code, "severity": severity, "operand": operand, "message": message,
            "fix": fix, "line": line}


def _fmt_shape(dims: list[Any]) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in dims) + ")"


def _bounds(k: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for op in k["operands"]:
        for b in op.get("out_of_bounds") or []:
            start = b["block_index"] * b["block"]
            out.append(_w(
                "block_out_of_bounds", "error",
                f"{op['origin']}: at grid step {tuple(b['first_step'])} the index map asks for "
                f"block {b['block_index']} along axis {b['axis']}, which starts at {start}, "
                f"past the end of that axis (size {b['array']}; {b['steps']} step"
                f"{'s' if b['steps'] != 1 else ''} in all); a TPU reads or writes memory "
                "that is not this array's",
                f"keep the index map's axis-{b['axis']} result in 0..{-(-b['array'] // b['block']) - 1}"
                " (check for an off-by-one, e.g. `i + 1`)", op["origin"], op.get("line")))
    return out


def _coverage(k: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for op in k["operands"]:
        cov = op.get("coverage")
        if op["role"] != "output" or not cov or cov["visited"] >= cov["total"]:
            continue
        if op.get("aliases_input") is not None:
            continue  # an in-place update keeps the aliased input's other blocks
        out.append(_w(
            "output_not_covered", "error",
            f"{op['origin']}: the grid visits {cov['visited']} of the {cov['total']} blocks that "
            "tile this output; the rest is never written (garbage on a TPU, NaN in interpret "
            "mode)",
            "make the grid and the out_specs index map cover every output block (one grid "
            "step per block along each output axis)", op["origin"], op.get("line")))
    return out


def _revisits(k: dict[str, Any]) -> list[dict[str, Any]]:
    """An output block that comes back after other blocks were visited in between: it
    was written back meanwhile and is not read back, so accumulating into it loses work."""
    out = []
    for op in k["operands"]:
        cov = op.get("coverage")
        if op["role"] != "output" or not cov or not op.get("bytes_exact") or not op["fetches"]:
            continue
        if op["fetches"] <= cov["visited"]:
            continue
        out.append(_w(
            "output_revisited", "warning",
            f"{op['origin']}: {cov['visited']} output blocks are written back "
            f"{op['fetches']} times: the grid leaves a block and comes back to it later. "
            "Pallas writes a block back when its index changes and does not read it back, so "
            "accumulating across those visits loses work (and each visit costs a writeback)",
            "put the axis the output block does not depend on (the reduction) last in the grid "
            "so each block's steps are consecutive, and mark it 'arbitrary'", op["origin"],
            op.get("line")))
    return out


def _parallel_reduction(k: dict[str, Any], chip: Chip) -> list[dict[str, Any]]:
    """A grid axis marked parallel along which an output block stays put is a reduction:
    on two TensorCores both would write that block."""
    out = []
    sem = k.get("dimension_semantics") or []
    for op in k["operands"]:
        deps = (op.get("coverage") or {}).get("depends_on_axes")
        if op["role"] != "output" or deps is None:
            continue
        for axis, s in enumerate(sem):
            if "parallel" not in s or axis >= len(deps) or deps[axis] or (k["grid"][axis] or 1) < 2:
                continue
            fixed = tuple("arbitrary" if i == axis else x for i, x in enumerate(sem))
            out.append(_w(
                "parallel_reduction", "error" if chip.megacore else "warning",
                f"grid axis {axis} is marked '{s}' but {op['origin']}'s block does not move "
                f"along it: the {k['grid'][axis]} steps accumulate into the same output block"
                + (f", which {chip.label}'s two TensorCores would race on" if chip.megacore
                   else " (harmless on one core, wrong on a two-core chip)"),
                f"mark it 'arbitrary': dimension_semantics={fixed}", op["origin"]))
    return out


def _alignment(k: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for op in k["operands"]:
        al = op["alignment"]
        for p in al["problems"]:
            which = "last" if p["unit"] == 128 else "second-to-last"
            rule = p.get("rule") or (f"{which} dim {p['block']} is neither a multiple of "
                                     f"{p['unit']} nor the full {p['array']}")
            if p.get("rule"):
                rule = f"block dim {p['block']} breaks the {rule} rule"
            out.append(_w(
                "misaligned_block", "error",
                f"{op['origin']}: block {_fmt_shape(op['block'])} of {op['dtype']}"
                f"{_fmt_shape(op['shape'])}: {rule}; TPU lowering rejects it",
                f"use block {_fmt_shape(al['suggest'])} (multiples of (8, 128), or the full "
                f"array dim) and adjust the grid to match", op["origin"], op.get("line")))
        if al.get("packing"):
            out.append(_w("packed_rows", "info", f"{op['origin']}: {al['packing']}",
                          "make the second-to-last block dim a multiple of the packed tile rows",
                          op["origin"], op.get("line")))
    return out


def _vmem(k: dict[str, Any], chip: Chip) -> list[dict[str, Any]]:
    # Judge the padded footprint: that is what Mosaic must fit.
    used, budget, physical = k["vmem_padded_bytes"], k["vmem_budget_bytes"], chip.vmem_bytes
    if chip.kind != "tpu" or used <= budget:
        return []
    biggest = max(k["operands"], key=lambda o: o["vmem_padded_bytes"], default=None)
    shrink = ""
    if biggest and biggest["vmem_padded_bytes"]:
        factor = 2 ** math.ceil(math.log2(max(used / budget, 1.0001)))
        block = [b for b in biggest["block"]]
        axis = max((i for i, b in enumerate(block) if b), key=lambda i: block[i], default=None)
        if axis is not None and block[axis] // factor >= 8:
            block[axis] = block[axis] // factor
            shrink = (f"shrink {biggest['origin']} block {_fmt_shape(biggest['block'])} to "
                      f"{_fmt_shape(block)} (and the blocks that share that axis)")
    detail = (f"VMEM footprint {used / MiB:.1f} MiB padded to tiles "
              f"({k['vmem_blocks_bytes'] / MiB:.1f} MiB pipelined blocks x buffers + "
              f"{k['vmem_scratch_bytes'] / MiB:.1f} MiB scratch before padding)")
    if used > physical:
        return [_w("vmem_over_physical", "error",
                   f"{detail} exceeds the {physical / MiB:.0f} MiB VMEM of a {chip.label} core",
                   shrink or "use smaller blocks")]
    limit = min(physical, math.ceil(used * 1.25 / MiB) * MiB)
    scope = "the limit you set" if k["vmem_limit_bytes"] else "the default scoped limit"
    fix = (f"pass compiler_params=pltpu.CompilerParams(vmem_limit_bytes={limit // MiB} * 1024 * 1024)"
           f" (physical: {physical / MiB:.0f} MiB)")
    if shrink:
        fix += f", or {shrink}"
    return [_w("vmem_over_scoped", "warning",
               f"{detail} exceeds {scope} of {budget / MiB:.0f} MiB on {chip.label}", fix)]


def _cores(k: dict[str, Any], chip: Chip) -> list[dict[str, Any]]:
    if not chip.megacore or not k["steps"]:
        return []
    grid, sem = k["grid"], k["dimension_semantics"]
    parallel = [i for i, s in enumerate(sem or []) if "parallel" in s]
    steps = math.prod(grid[i] for i in parallel) if parallel else 1
    if steps >= 2 and (steps % 2 == 0 or steps >= 8):
        return []
    if not parallel:
        candidates = [i for i, g in enumerate(grid) if g and g >= 2]
        fix = ("mark independent grid axes parallel: compiler_params=pltpu.CompilerParams("
               f"dimension_semantics={tuple('parallel' if i in candidates[:1] else 'arbitrary' for i in range(len(grid)))})"
               if candidates else
               "split a non-reduction axis into at least 2 blocks (halve its block size) and mark it 'parallel'")
        msg = (f"no grid axis is marked 'parallel': {chip.label} has 2 TensorCores and the "
               "second one idles")
    elif steps < 2:
        fix = (f"halve the block along parallel axis {parallel[0]} so the grid has >= 2 "
               "(ideally an even number of) parallel steps")
        msg = f"only {steps} parallel grid step: one of {chip.label}'s 2 TensorCores idles"
    else:
        fix = "make the parallel step count even (or >= 8) so the two cores get equal work"
        msg = f"{steps} parallel steps split unevenly over {chip.label}'s 2 TensorCores"
    if chip.name == "v7x":
        # JAX's tpu_info: 7x does not fuse its TensorCores into one megacore device.
        fix += ("; on v7x JAX may expose each TensorCore as its own device, in which case "
                "shard the work over both devices (shard_map) instead")
    return [_w("cores_idle", "warning", msg, fix)]


def _overhead(k: dict[str, Any], chip: Chip) -> list[dict[str, Any]]:
    steps = k["steps"]
    if chip.kind != "tpu" or not steps or steps < 2 or not k["bytes_total"]:
        return []
    work_s = max(k["bytes_total"] / chip.hbm_bytes_per_s,
                 (k["flops"] or 0) / chip.peak_flops("bf16"))
    per_step_s = work_s / steps
    if per_step_s >= STEP_OVERHEAD_S:
        return []
    overhead = steps * STEP_OVERHEAD_S
    share = overhead / (overhead + work_s)
    target_bytes = STEP_OVERHEAD_S * chip.hbm_bytes_per_s * 2
    factor = 2 ** math.ceil(math.log2(max(target_bytes / max(k["bytes_per_step"], 1), 2)))
    msg = (f"{steps} grid steps moving {k['bytes_per_step'] / 1024:.1f} KiB each "
           f"({per_step_s * 1e6:.2f} us at HBM rate) against ~0.35 us fixed cost per step: "
           f"about {share:.0%} of the kernel would be step overhead on {chip.label}")
    cores = 2 if chip.megacore else 1
    severity = "warning"
    if factor * cores >= steps:
        # The problem itself is tiny (a test shape): worth knowing, not the kernel's fault.
        severity = "info"
        fix = (f"the whole call moves only {k['bytes_total'] / 1024:.0f} KiB: use the largest "
               f"blocks that fit VMEM ({cores} parallel step{'s' if cores > 1 else ''} at this "
               "size), or fuse this kernel with its neighbours")
    else:
        fix = (f"grow the blocks about {factor}x (aim for >= {target_bytes / 1024:.0f} KiB per "
               f"step) so the grid has ~{steps // factor} steps")
    return [_w("per_step_overhead", severity, msg, fix)]


def _dots(k: dict[str, Any], chip: Chip) -> list[dict[str, Any]]:
    out = []
    for d in k["dots"]:
        if d["mxu_ok"] or chip.kind != "tpu":
            continue
        shape = f"({d['m']}, {d['k']}) x ({d['k']}, {d['n']}) {d['lhs_dtype']}"
        for problem in d["problems"]:
            sev = "info" if problem.startswith("f32") else "warning"
            fix = ("cast the dot inputs to bf16 and keep preferred_element_type=jnp.float32"
                   if problem.startswith("f32") else
                   f"pick blocks whose K and N are multiples of {d['mxu_width']} and M of 8")
            out.append(_w("mxu_shape" if sev == "warning" else "mxu_f32", sev,
                          f"dot {shape}: {problem}", fix))
    return out
