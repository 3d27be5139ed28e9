"""One BlockSpec over its grid (worker-side: numpy, and jax only through ``static_walk``).

For one operand of a ``pallas_call``: how many times its block is fetched (or written
back), evaluating the index map over every grid step in iteration order; blocks whose
index lands outside the array; which blocks are visited and along which grid axes the
block moves; the alignment rule of the TPU lowering for its last two dims; and the
bytes a block occupies in VMEM once padded to tiles.
"""

from __future__ import annotations

import math
from typing import Any

from tilewright.profiling.chips import LANE as LANES
from tilewright.profiling.chips import SUBLANE as SUBLANES
from tilewright.profiling.chips import misaligned
from tilewright.profiling.chips import tile_rows as _tile_rows
from tilewright.profiling.static_walk import evaluate_index_map

MAX_STEPS = 1 << 20  # grids longer than this are sampled, and the total extrapolated


def block_dim(b: Any) -> int | None:
    cls = type(b).__name__
    if cls == "Squeezed":
        return None
    size = getattr(b, "block_size", b)
    return int(size) if size is not None else None


def count_fetches(bm: Any, grid: list[int | None], steps: int, num_prefetch: int,
                   oob: list[dict[str, Any]], coverage: dict[str, Any],
                   prefetch: list[Any] | None = None) -> tuple[int, bool]:
    """How many times the block index changes along the grid (first step included).

    Blocks that start outside the array (a whole block out of bounds, not the padded
    tail of a partial last block) are appended to ``oob``.
    """
    import numpy as np

    sample = min(steps, MAX_STEPS)
    if grid:
        idx = np.unravel_index(np.arange(sample, dtype=np.int64), [g or 1 for g in grid])
        grid_indices = [np.asarray(a, dtype=np.int32) for a in idx]
    else:  # no grid: one step, index maps take no arguments
        grid_indices = []
    blocks = evaluate_index_map(bm.index_map_jaxpr, grid_indices, num_prefetch, prefetch)
    if blocks is None:  # depends on runtime values: assume a new block every step
        return steps, False
    stacked = np.stack([np.broadcast_to(np.asarray(b), (sample,)) for b in blocks], axis=1) \
        if blocks else np.zeros((sample, 0), np.int32)
    out_of_bounds(bm, stacked, grid_indices, oob)
    if sample == steps and all(type(b).__name__ in ("Blocked", "Squeezed") for b in bm.block_shape):
        # Distinct blocks visited against the blocks that tile the array.
        sizes = [(block_dim(b) or 1) for b in bm.block_shape]
        coverage["total"] = math.prod(-(-int(d) // s) for d, s in zip(bm.array_aval.shape, sizes,
                                                                       strict=False))
        coverage["visited"] = len(np.unique(stacked, axis=0)) if stacked.size else 1
        # For each grid axis: does the block index change when only that axis moves?
        dims = [g or 1 for g in grid]
        strides = [math.prod(dims[a + 1:]) for a in range(len(dims))]
        coverage["depends_on_axes"] = []
        for a, stride in enumerate(strides):
            if dims[a] < 2:
                coverage["depends_on_axes"].append(False)
                continue
            movable = np.nonzero(grid_indices[a] < dims[a] - 1)[0]
            varies = bool(np.any(stacked[movable] != stacked[movable + stride])) \
                if stacked.size else False
            coverage["depends_on_axes"].append(varies)
    changed = 1 + int(np.any(stacked[1:] != stacked[:-1], axis=1).sum()) if sample else 0
    if sample < steps:  # extrapolate from the sampled prefix
        return round(changed * steps / sample), False
    return changed, True


def out_of_bounds(bm: Any, stacked: Any, grid_indices: list[Any],
                   oob: list[dict[str, Any]]) -> None:
    import numpy as np

    for axis, (b, dim) in enumerate(zip(bm.block_shape, bm.array_aval.shape, strict=False)):
        if type(b).__name__ not in ("Blocked", "Squeezed") or axis >= stacked.shape[1]:
            continue  # Element / BoundedSlice index maps give element offsets
        size = block_dim(b) or 1
        start = stacked[:, axis].astype(np.int64) * size
        bad = np.nonzero((start < 0) | (start >= int(dim)))[0]
        if bad.size:
            step = int(bad[0])
            oob.append({"axis": axis, "block_index": int(stacked[step, axis]),
                        "block": size, "array": int(dim), "steps": int(bad.size),
                        "first_step": [int(g[step]) for g in grid_indices]})


def tile_rows(dtype: Any) -> int:
    return _tile_rows(dtype.itemsize)


def padded_bytes(ref_shape: list[int], dtype: Any) -> int:
    """Bytes a block occupies in VMEM once padded to (8·packing, 128) tiles."""
    if not ref_shape:
        return dtype.itemsize
    dims = list(ref_shape)
    dims[-1] = -(-dims[-1] // LANES) * LANES
    if len(dims) >= 2:
        rows = tile_rows(dtype)
        dims[-2] = -(-dims[-2] // rows) * rows
    return math.prod(dims) * dtype.itemsize


def alignment(block: list[int | None], shape: list[int], dtype: Any, memory_space: str
               ) -> dict[str, Any]:
    """The TPU lowering's rule: last two block dims divisible by (8, 128) or equal to the array's."""
    out: dict[str, Any] = {"ok": True, "problems": [], "suggest": None}
    if memory_space != "vmem" or not block:
        return out
    dims = [(b if b is not None else 1) for b in block]
    if len(dims) == 1:
        return alignment_rank1(dims[0], shape[0], dtype, out)
    for axis, b, full, unit in misaligned(dims, list(shape)):
        out["ok"] = False
        out["problems"].append({"axis": axis, "block": b, "array": full, "unit": unit})
    if out["problems"]:
        fixed = list(dims)
        for p in out["problems"]:
            unit = p["unit"]
            up = -(-p["block"] // unit) * unit
            fixed[p["axis"]] = p["array"] if up >= p["array"] else up
        out["suggest"] = fixed
    rows = tile_rows(dtype)
    if len(dims) >= 2 and rows > SUBLANES and dims[-2] != shape[-2] and dims[-2] % rows:
        out["packing"] = f"{dtype.name} packs {rows} rows per tile; {dims[-2]} rows leave tiles part-filled"
    return out


def alignment_rank1(b: int, full: int, dtype: Any, out: dict[str, Any]) -> dict[str, Any]:
    """Rank-1 blocks (the lowering's rule): the full dim, a multiple of 8x128, or a power
    of two of at least 128 x packing."""
    min_tiling = LANES * max(1, 4 // max(1, dtype.itemsize))
    chunk = SUBLANES * LANES
    if b == full or b % chunk == 0 or (b >= min_tiling and b & (b - 1) == 0):
        return out
    out["ok"] = False
    out["problems"].append({"axis": 0, "block": b, "array": full, "unit": chunk,
                            "rule": f"rank-1: full dim, multiple of {chunk}, or a power of 2 "
                                    f">= {min_tiling}"})
    up = max(min_tiling, 1 << (b - 1).bit_length())
    out["suggest"] = [full if up >= full else up]
    return out
