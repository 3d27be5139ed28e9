"""Comparing a candidate's output with the reference's, in float32.

Outputs are flattened to lists of host float32 arrays (pytrees allowed). NaN or Inf
where the reference is finite is never close (uninitialised output blocks read as NaN
in TPU interpret mode). Beyond that, an output leaf is correct only when all of these
hold (docs/EVALUATION.md states the rule for users):

1. Element-wise, ``|out - ref| <= min(atol, ELEMENT_SCALE * S) + rtol * |ref|`` where
   ``S = max|ref|``: the task's tolerance, but its absolute part never larger than 5%
   of the output's own scale. A loose ``atol = 1e-2`` on softmax outputs of 0.004
   would otherwise accept anything, zeros included.
2. In aggregate, ``rms(out - ref) <= SPREAD_SHARE * std(ref) + rtol * rms(ref)``: the
   error is not a large share of the reference's own spread (a kernel that normalizes
   over the wrong tile is off everywhere by a little).
3. Not constant where the reference varies by more than the tolerance (a kernel that
   returns zeros or a cached constant).

``max_rel_diff`` is ``max |out - ref| / |ref|`` over the elements whose reference is
not negligible (``|ref| > 1e-6 * S``): the number a user reads, never 0.0 for outputs
that are off by 2x.

Low-precision references (bf16, f16 outputs) are imprecise themselves: a kernel that
keeps its statistics in f32 can differ from a bf16 layer norm by more than the task's
tolerance while being closer to the truth. So such outputs are also judged against the
reference computed from the same inputs in f32 (``precise``), with the bf16 reference's
own error allowed (``judge_output``): value by value, the tolerance widened by its worst
error in units of the tolerance; as a whole, at most twice its rms error. A kernel is
correct when it is close to the reference as written, or to the f32 one as the written
one is. A kernel that forgets a term is far from both. ``judge_output`` also returns
which reference decided (``AS_WRITTEN`` or ``PRECISE``).
"""

from __future__ import annotations

import functools
import math
import os
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
    return Host([np.asarray(leaf, dtype=np.float32) for leaf in leaves], str(treedef), dtype)


ELEMENT_SCALE = 0.05  # the absolute tolerance never exceeds 5% of max|ref|
SPREAD_SHARE = 0.1  # rms error at most 10% of std(ref) (plus rtol of rms(ref))
NEGLIGIBLE = 1e-6  # |ref| below this share of max|ref| has no meaningful relative error


@dataclass
class Comparison:
    close: bool
    max_abs_diff: float | None
    max_rel_diff: float | None
    reason: str | None = None


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/Inf: report them as null (the reason says what happened)."""
    return value if value is not None and math.isfinite(value) else None


def capped_atol(atol: float, scale: float) -> float:
    """Rule 1's absolute tolerance for an output whose largest magnitude is ``scale``."""
    return min(atol, ELEMENT_SCALE * scale) if scale > 0 else atol


def effective_atol(expected: Host, atol: float) -> float:
    """The absolute tolerance rule 1 applies to this reference: ``min(atol, 5% of
    max|ref|)``, the smallest over the output's arrays (what a prompt should quote)."""
    caps = []
    for r in expected.leaves:
        peak = float(np.abs(r).max()) if r.size else 0.0
        if math.isfinite(peak):  # all finite (the common case): no masked copy
            caps.append(capped_atol(atol, peak))
            continue
        finite = np.abs(r[np.isfinite(r)]) if r.size else r
        scale = float(finite.max()) if finite.size else 0.0
        caps.append(capped_atol(atol, scale))
    return min(caps, default=atol)


LOW_PRECISION = ("bfloat16", "float16")
AS_WRITTEN = "the reference as written"
PRECISE = ("the reference computed in f32 from the same inputs, the written (low-precision) "
           "reference's own error allowed (its worst, in units of the tolerance, at every value; "
           "at most twice its rms error as a whole)")


def is_low_precision(dtype: Any) -> bool:
    return str(dtype) in LOW_PRECISION


def judge_output(output: Host, expected: Host, precise: Host | None, atol: float,
                 rtol: float) -> tuple[Comparison, str]:
    """``compare`` against the reference as written, else (a low-precision output with a
    ``precise`` f32 reference) against that one as the written reference is close to it:
    value by value within the tolerance widened by the written reference's worst error in
    units of the tolerance (``worst_in_tolerances``), and as a whole no further than
    ``RMS_SHARE`` times its rms error; the comparison that decided, and what it was
    against."""
    usable = precise is not None and len(precise.leaves) == len(expected.leaves) \
        and all(p.shape == e.shape for p, e in zip(precise.leaves, expected.leaves,
                                                   strict=True))
    if usable and len(output.leaves) == len(expected.leaves) and output.tree == expected.tree:
        # the clear cases on the accelerator first: the host passes below are slow
        for basis, check in ((AS_WRITTEN, lambda o, e, p: on_device(o, e, atol, rtol, None)),
                             (PRECISE, lambda o, e, p: precise_on_device(o, e, p, atol, rtol))):
            quick = [check(o, e, p) for o, e, p in zip(output.leaves, expected.leaves,
                                                       precise.leaves, strict=True)]
            if quick and all(q is not None for q in quick):
                return Comparison(True, max(q[0] for q in quick),
                                  max(q[1] for q in quick)), basis
    found = compare(output, expected, atol, rtol)
    if found.close or not usable:
        return found, AS_WRITTEN
    errors = [np.where(np.isfinite(e) & np.isfinite(p), np.abs(e - p), 0.0)
              for e, p in zip(expected.leaves, precise.leaves, strict=True)]
    widen = [worst_in_tolerances(err, p, atol, rtol)
             for err, p in zip(errors, precise.leaves, strict=True)]
    against = compare(output, precise, atol, rtol, errors, widen)
    if not against.close:
        return found, AS_WRITTEN
    for o, p, err in zip(output.leaves, precise.leaves, errors, strict=True):
        finite = np.isfinite(p)
        own = math.sqrt(_mean_square(err))
        if math.sqrt(_mean_square(np.where(finite, o - p, 0.0))) > RMS_SHARE * own:
            return found, AS_WRITTEN
    return against, PRECISE


# Against the f32 reference, a low-precision output's rms error may be at most this many
# times the written reference's own.
RMS_SHARE = 2.0


def worst_in_tolerances(error: np.ndarray, precise: np.ndarray, atol: float,
                        rtol: float) -> float:
    """The written (low-precision) reference's largest error from the f32 one, in units
    of the tolerance at each element (``min(atol, 5% of max|ref|) + rtol * |ref|``).
    Why the worst over the output and not the error element by element: a kernel that
    rounds an intermediate to bf16 as the written program does, but sums in another
    order, makes the same errors at other elements. On the v5e (2026-12-07), 22k's conv
    kernel and XLA's program were each 0.0026 rms and 0.012 at the 99.9th percentile from
    the f32 answer, yet 0.12% of the kernel's values were outside the tolerance of XLA's,
    and with XLA's error allowed only at the element where XLA made it the kernel failed
    against the f32 answer too (on a CPU, XLA rounds where the kernel does)."""
    if error.size == 0:
        return 0.0
    magnitude = np.abs(np.where(np.isfinite(precise), precise, 0.0))
    scale = float(magnitude.max())
    abs_tol = capped_atol(atol, scale)
    if abs_tol <= 0 and rtol <= 0:
        return 0.0
    tolerance = abs_tol + rtol * magnitude
    return float(np.max(error / np.where(tolerance > 0, tolerance, np.inf)))


def precise_reference(fn: Any, dyn: tuple, static: tuple, expected: Host,
                      interpret: bool) -> Host | None:
    """The reference computed from the same inputs in f32 where its output is low
    precision (bf16, f16) and some input is too: its low-precision float inputs upcast,
    the task's own code run again (casts it writes itself still apply). None otherwise
    (nothing to compare with), or when the reference does not take f32 inputs."""
    import jax.numpy as jnp

    from tilewright.kernels.worker.execution import execution_mode, reset_interpret_state

    if not is_low_precision(expected.dtype):
        return None
    raised = tuple(a.astype(jnp.float32) if is_low_precision(getattr(a, "dtype", None))
                   else a for a in dyn)
    if all(r is a for r, a in zip(raised, dyn, strict=True)):
        return None
    try:
        with execution_mode(interpret):
            return to_host(fn(*raised, *static))
    except Exception:  # a reference that insists on its dtypes: judged as written
        if interpret:
            reset_interpret_state()
        return None


def compare(output: Host, expected: Host, atol: float, rtol: float,
            allowance: list[np.ndarray] | None = None,
            widen: list[float] | None = None) -> Comparison:
    """``allowance``: per output leaf, an error allowed at each element on top of the
    tolerance (the written reference's own error, ``judge_output``; rule 2 allows its
    rms); ``widen``: per leaf, rule 1's tolerance at each element is multiplied by one
    plus this (never less than the tolerance plus the allowance there)."""
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
        wider = widen[index] if widen is not None else 0.0
        quick = on_device(o, r, atol, rtol,
                          allowance[index] if allowance is not None else None, wider)
        if quick is not None:  # within the tolerance by a margin: nothing more to see
            max_abs, max_rel = max(max_abs, quick[0]), max(max_rel, quick[1])
            continue
        ref_finite = np.isfinite(r)
        everywhere = bool(ref_finite.all())  # the common case: no masking, no copies
        bad = ~np.isfinite(o) if everywhere else ~np.isfinite(o) & ref_finite
        if bad.any():
            count = int(bad.sum())
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            kind = "NaN" if np.isnan(o[bad]).any() else "Inf"
            return Comparison(False, None, None, f"{kind} in {count} of {o.size} values{where}, "
                              f"first at index {first}, where the reference is finite "
                              "(an output block never written reads as NaN)")
        if not everywhere:
            mismatch_special = ~ref_finite & ~((o == r) | (np.isnan(o) & np.isnan(r)))
            if mismatch_special.any():
                return Comparison(False, None, None, f"the reference has NaN/Inf{where} that "
                                  "the output does not reproduce")
        diff = np.abs(o - r) if everywhere else np.where(ref_finite, np.abs(o - r), 0.0)
        ref_abs = np.abs(r) if everywhere else np.abs(np.where(ref_finite, r, 0.0))
        scale = float(ref_abs.max())
        max_abs = max(max_abs, float(diff.max()))
        significant = ref_abs > NEGLIGIBLE * scale
        if significant.any():
            max_rel = max(max_rel, float((diff[significant] / ref_abs[significant]).max()))
        if reason is not None:
            continue
        abs_tol = capped_atol(atol, scale)
        extra = allowance[index] if allowance is not None else 0.0
        tolerance = abs_tol + rtol * ref_abs
        bad = diff > (np.maximum(tolerance * (1 + wider), tolerance + extra) if wider
                      else tolerance + extra)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            scaled = (f" (atol capped at {abs_tol:.3g}, {ELEMENT_SCALE:.0%} of the output's "
                      f"largest magnitude {scale:.3g})" if abs_tol < atol else "")
            reason = (f"{int(bad.sum())} of {o.size} values{where} outside atol={atol:g}, "
                      f"rtol={rtol:g}{scaled}; first at index {first}: got "
                      f"{float(o[first]):.6g}, expected {float(r[first]):.6g}")
            continue
        reason = _spread_reason(o, r, ref_finite, atol, rtol, where,
                                allowance[index] if allowance is not None else None)
    return Comparison(reason is None, max_abs, max_rel, reason)


# Outputs at least this large are compared on the accelerator when the judge holds one
# (``DEVICE_COMPARE``; None: only on a TPU). On the v5e host the comparison of one
# 256 MiB output took 6.6 s in numpy, 24-37 s of each evaluation's 55-116 s
# (2026-12-06), against ~0.1 s to copy it there and back.
# TILEWRIGHT_COMPARE_ON_DEVICE=N: from N elements on any backend (the CPU's, to test it;
# read at each comparison: the judge imports this before a pool's environment is known).
DEVICE_COMPARE_MIN = 1 << 20  # elements
DEVICE_COMPARE: bool | None = None
# The device decides only the clear passes: every element within (1 - MARGIN) of its
# bound, the rms error within (1 - MARGIN) of rule 2's, nothing non-finite, an output
# that varies. Anything else, and any failure, is judged by the host code above, which
# alone writes the reasons: the device cannot pass what the host would fail (its f32
# sums and rounding differ from numpy's by far less than the margin).
MARGIN = 1e-3


def on_device(o: np.ndarray, r: np.ndarray, atol: float, rtol: float,
              extra: np.ndarray | None, widen: float = 0.0) -> tuple[float, float] | None:
    """(max_abs, max_rel) of one output leaf when the accelerator finds it clearly within
    the tolerance (rules 1-3), else None (the host judges it)."""
    if not _device_wanted(o.size) or o.shape != r.shape or (
            extra is not None and extra.shape != o.shape):
        return None
    import jax

    try:
        stats = jax.device_get(_leaf_stats()(
            o, r, np.float32(atol), np.float32(rtol),
            np.zeros((), np.float32) if extra is None else extra, np.float32(widen)))
    except Exception:  # no room on the chip for two more copies (HBM): the host judges
        return None
    clear, max_abs, max_rel = bool(stats[0]), float(stats[1]), float(stats[2])
    return (max_abs, max_rel) if clear else None


def precise_on_device(o: np.ndarray, w: np.ndarray, p: np.ndarray, atol: float,
                      rtol: float) -> tuple[float, float] | None:
    """(max_abs, max_rel) against the f32 reference ``p`` when the accelerator finds the
    leaf clearly as close to it as the written reference ``w`` is (``judge_output``'s
    rules), else None (the host judges it): on the v5e host, numpy took seconds per
    pass over a 260M-value output, and this comparison makes about ten."""
    if not _device_wanted(o.size) or not o.shape == w.shape == p.shape:
        return None
    import jax

    try:
        stats = jax.device_get(_precise_stats()(o, w, p, np.float32(atol), np.float32(rtol)))
    except Exception:  # no room on the chip for three copies: the host judges
        return None
    clear, max_abs, max_rel = bool(stats[0]), float(stats[1]), float(stats[2])
    return (max_abs, max_rel) if clear else None


def _device_wanted(size: int) -> bool:
    """Whether an output leaf of ``size`` values is compared on the accelerator."""
    forced = os.environ.get("TILEWRIGHT_COMPARE_ON_DEVICE", "")
    least = int(forced) if forced.isdigit() else DEVICE_COMPARE_MIN
    if size < least:
        return False
    try:
        import jax
    except ImportError:
        return False
    return (True if forced.isdigit() else DEVICE_COMPARE if DEVICE_COMPARE is not None
            else jax.default_backend() == "tpu")


@functools.cache  # (no module global rebound: the judge checks its modules are unchanged)
def _leaf_stats() -> Any:
    """The jitted per-leaf statistics (compiled once per shape)."""
    import jax

    return jax.jit(lambda *args: _rules(*args)[:3])


@functools.cache
def _precise_stats() -> Any:
    """The jitted per-leaf statistics against the f32 reference (``judge_output``'s second
    comparison), the written reference's error and its worst in tolerances computed on
    the device too."""
    import jax
    import jax.numpy as jnp

    def stats(o: Any, w: Any, p: Any, atol: Any, rtol: Any) -> Any:
        error = jnp.where(jnp.isfinite(w) & jnp.isfinite(p), jnp.abs(w - p), 0.0)
        tolerance = _device_tolerance(p, atol, rtol)
        widen = jnp.max(error / jnp.where(tolerance > 0, tolerance, jnp.inf))
        clear, max_abs, max_rel, rms, own = _rules(o, p, atol, rtol, error, widen)
        return clear & (rms <= RMS_SHARE * own * (1 - MARGIN)), max_abs, max_rel

    return jax.jit(stats)


def _device_tolerance(r: Any, atol: Any, rtol: Any) -> Any:
    """Rule 1's tolerance at each element, on the device (as ``capped_atol`` + rtol)."""
    import jax.numpy as jnp

    scale = jnp.max(jnp.abs(r))
    return jnp.where(scale > 0, jnp.minimum(atol, ELEMENT_SCALE * scale), atol) \
        + rtol * jnp.abs(r)


def _device_mean_square(x: Any) -> Any:  # scaled first, as _mean_square
    import jax.numpy as jnp

    peak = jnp.max(jnp.abs(x))
    safe = jnp.where(peak > 0, peak, 1.0)
    return jnp.mean(jnp.square(x / safe)) * safe * safe


def _rules(o: Any, r: Any, atol: Any, rtol: Any, extra: Any, widen: Any) -> Any:
    """Rules 1-3 on the device (traced): whether the leaf is clearly within them, its
    max_abs and max_rel, its rms error and the rms of ``extra``."""
    import jax.numpy as jnp

    finite = jnp.all(jnp.isfinite(o)) & jnp.all(jnp.isfinite(r))
    diff = jnp.abs(o - r)
    ref_abs = jnp.abs(r)
    scale = jnp.max(ref_abs)
    significant = ref_abs > NEGLIGIBLE * scale
    rel = jnp.where(significant, diff / jnp.where(significant, ref_abs, 1.0), 0.0)
    tolerance = _device_tolerance(r, atol, rtol)
    bound = jnp.maximum(tolerance * (1 + widen), tolerance + extra)
    rule1 = jnp.all(diff <= bound * (1 - MARGIN))
    varies = jnp.max(o) > jnp.min(o)
    std = jnp.sqrt(_device_mean_square(r - jnp.mean(r)))
    allowed = jnp.sqrt(_device_mean_square(jnp.broadcast_to(extra, r.shape)))
    err = jnp.sqrt(_device_mean_square(o - r))
    rule2 = err <= (SPREAD_SHARE * std + rtol * jnp.sqrt(_device_mean_square(r)) + allowed) \
        * (1 - MARGIN)
    return finite & rule1 & varies & rule2, jnp.max(diff), jnp.max(rel), err, allowed


def _mean_square(x: np.ndarray) -> float:
    """mean(x**2) summed in float64 without a float64 copy of ``x``: scaled by max|x|
    first, so a float32 square cannot overflow (|x| above 1.8e19)."""
    if x.size == 0:
        return 0.0
    peak = float(np.abs(x).max())
    if peak == 0.0 or not math.isfinite(peak):
        return peak * peak
    scaled = x / np.asarray(peak, dtype=x.dtype)
    return float(np.mean(np.square(scaled), dtype=np.float64)) * peak * peak


def _spread_reason(o: np.ndarray, r: np.ndarray, finite: np.ndarray, atol: float,
                   rtol: float, where: str, allowance: np.ndarray | None = None
                   ) -> str | None:
    """Rules 2 and 3 of the module docstring, on the finite part of the reference (with
    ``allowance``, its rms allowed on top of rule 2's bound)."""
    if finite.sum() < 2:
        return None
    # float32 values, float64 sums (an 8192x8192 output: 0.4 s here, 1.9 s with float64
    # copies; the judge on a TPU compares several such outputs per evaluation)
    everywhere = bool(finite.all())
    of, rf = (o, r) if everywhere else (o[finite], r[finite])
    allowed = 0.0
    if allowance is not None:
        af = allowance if everywhere else allowance[finite]
        allowed = math.sqrt(_mean_square(af))
    spread = float(rf.max()) - float(rf.min())
    magnitude = float(np.abs(rf).max())
    if float(of.max()) - float(of.min()) == 0.0 and spread > atol + rtol * magnitude:
        return (f"the output{where} is constant ({float(of.flat[0]):.6g}) where the reference "
                f"varies over {spread:.3g} (a kernel that ignores its inputs)")
    err = math.sqrt(_mean_square(of - rf))
    std = float(rf.std(dtype=np.float64))
    rms = math.sqrt(_mean_square(rf))
    if err > SPREAD_SHARE * std + rtol * rms + allowed:
        share = err / std if std > 0 else float("inf")
        return (f"the error{where} is {share:.0%} of the reference's spread (rms error "
                f"{err:.3g}, reference std {std:.3g}): within atol={atol:g} value by value, "
                "but wrong as a whole")
    return None
