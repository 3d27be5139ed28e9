"""Comparing a candidate's output with the reference's, in float32.

Outputs are flattened to lists of host float32 arrays (pytrees allowed). A value is
close when ``|out - ref| <= atol + rtol * |ref|``; NaN or Inf where the reference is
finite is never close (uninitialised output blocks read as NaN in TPU interpret mode).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Host:
    """An output on the host: float32 leaves, its tree structure, its original dtype."""

    leaves: list[np.ndarray]
    tree: str
    dtype: Any


def to_host(tree: Any) -> Host:
    import jax

    leaves, treedef = jax.tree.flatten(tree)
    dtype = getattr(leaves[0], "dtype", None) if leaves else None
    return Host([np.asarray(leaf).astype(np.float32) for leaf in leaves], str(treedef), dtype)


@dataclass
class Comparison:
    close: bool
    max_abs_diff: float | None
    max_rel_diff: float | None
    reason: str | None = None


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/Inf: report them as null (the reason says what happened)."""
    return value if value is not None and math.isfinite(value) else None


def compare(output: Host, expected: Host, atol: float, rtol: float) -> Comparison:
    out, ref = output.leaves, expected.leaves
    if len(out) != len(ref) or output.tree != expected.tree:
        return Comparison(False, None, None, f"output structure {output.tree} does not match "
                          f"the reference's {expected.tree}")
    max_abs = 0.0
    max_rel = 0.0
    reason = None
    for index, (o, r) in enumerate(zip(out, ref, strict=True)):
        where = f" (output {index})" if len(out) > 1 else ""
        if o.shape != r.shape:
            return Comparison(False, None, None, f"output shape {o.shape}{where} differs from "
                              f"the reference's {r.shape}")
        if o.size == 0:
            continue
        ref_finite = np.isfinite(r)
        bad = ~np.isfinite(o) & ref_finite
        if bad.any():
            count = int(bad.sum())
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            kind = "NaN" if np.isnan(o[bad]).any() else "Inf"
            return Comparison(False, None, None, f"{kind} in {count} of {o.size} values{where}, "
                              f"first at index {first}, where the reference is finite "
                              "(an output block never written reads as NaN)")
        mismatch_special = ~ref_finite & ~((o == r) | (np.isnan(o) & np.isnan(r)))
        if mismatch_special.any():
            return Comparison(False, None, None, f"the reference has NaN/Inf{where} that the "
                              "output does not reproduce")
        diff = np.where(ref_finite, np.abs(o - r), 0.0)
        rel = diff / np.maximum(np.abs(r), np.finfo(np.float32).tiny)
        max_abs = max(max_abs, float(diff.max()))
        # Relative error only where the reference is not tiny: 0/0 says nothing.
        significant = np.abs(r) > atol
        if significant.any():
            max_rel = max(max_rel, float(rel[significant].max()))
        bad = diff > atol + rtol * np.abs(np.where(ref_finite, r, 0.0))
        if bad.any() and reason is None:
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            reason = (f"{int(bad.sum())} of {o.size} values{where} outside atol={atol:g}, "
                      f"rtol={rtol:g}; first at index {first}: got {float(o[first]):.6g}, "
                      f"expected {float(r[first]):.6g}")
    return Comparison(reason is None, max_abs, max_rel, reason)
