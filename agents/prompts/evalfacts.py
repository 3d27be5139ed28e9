"""The numbers of one evaluation, read once from its eval JSON, for prompts and tables.

Everything a prompt says about an evaluated version's performance comes from
``version_numbers(result)``: what ranks it (``rank``: ``kernels.judge.rank.ranking``'s
``Rank``; ``rank_of`` returns it), the TPU compiler's estimate and the XLA
reference's in cycles and seconds, the reference's roofline, the per-op breakdown of
both (the Pallas kernel against the XLA ops around it), VMEM used against the chip's
scoped limit, grid steps, the production shape the estimate is for, the estimate's
fidelity, the tolerance as enforced, and the host simulation times (which rank
nothing). This module is the one reader of the ``tpu`` section: fields that newer
harnesses add (``shape_label``, ``input_shapes``, ``estimate.ops``, ``estimate.method``,
``grid_steps``, ``kernels`` (their grids), ``floor``, ``fidelity``, ``reference_roofline``,
``kernel_time_s``) are read here with ``.get`` and fall back to what older eval JSON has, so a change of that
section is a change here only. Pure data: no JAX.
"""

from __future__ import annotations

from typing import Any

from tilewright.kernels.judge.rank import Rank, ranking
from tilewright.kernels.judge.result import array_text, is_interpret
from tilewright.kernels.judge.trust import speedup_words
from tilewright.kernels.source.printable import printable


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _cycles(estimate: Any) -> float | None:
    return _num(estimate.get("cycles")) if isinstance(estimate, dict) else None


def _seconds(estimate: Any) -> float | None:
    return _num(estimate.get("seconds")) if isinstance(estimate, dict) else None


def _roofline(found: Any) -> dict[str, Any] | None:
    """``tpu.reference_roofline``: the reference's FLOPs at the chip's peak and its
    compulsory bytes at the HBM bandwidth (``{seconds, flops, bytes, compute_s,
    memory_s, bound_by, dtype}``)."""
    if not isinstance(found, dict) or _num(found.get("seconds")) is None:
        return None
    out: dict[str, Any] = {k: float(found[k]) for k in ("seconds", "flops", "bytes",
                                                        "compute_s", "memory_s")
                           if _num(found.get(k)) is not None}
    out.update({k: str(found[k]) for k in ("bound_by", "dtype")
                if isinstance(found.get(k), str)})
    return out


def _grids(kernels: Any) -> list[list[int]] | None:
    """``tpu.kernels[].grid``: each pallas_call's grid at the production shape, or None
    where one is not all whole numbers."""
    if not isinstance(kernels, list) or not kernels:
        return None
    grids = [k.get("grid") if isinstance(k, dict) else None for k in kernels]
    if not all(isinstance(g, list) and all(type(x) is int for x in g) for g in grids):
        return None
    return [list(g) for g in grids]


def rank_of(numbers: dict[str, Any] | None) -> Rank | None:
    """The ``Rank`` ``version_numbers`` recorded (None for none)."""
    rank = (numbers or {}).get("rank")
    return rank if isinstance(rank, Rank) else None


def _ops(estimate: Any) -> list[dict[str, Any]]:
    """``estimate.ops``: ``[{name, kind: pallas|xla, cycles, count}]``, largest first."""
    ops = estimate.get("ops") if isinstance(estimate, dict) else None
    out = []
    for op in ops if isinstance(ops, list) else []:
        if not isinstance(op, dict) or _num(op.get("cycles")) is None:
            continue
        out.append({"name": str(op.get("name") or "?"),
                    "kind": "pallas" if op.get("kind") == "pallas" else "xla",
                    "cycles": float(op["cycles"]),
                    "count": int(op["count"]) if isinstance(op.get("count"), int) else 1})
    return sorted(out, key=lambda o: -o["cycles"] * o["count"])


def _method(estimate: Any) -> str | None:
    """``estimate.method`` ("full", "scaled") with its ``detail`` (how it was derived)."""
    if not isinstance(estimate, dict) or not isinstance(estimate.get("method"), str):
        return None
    detail = estimate.get("detail")
    return f"{estimate['method']}: {detail}" if detail else estimate["method"]


def _floor(tpu: dict[str, Any]) -> dict[str, float] | None:
    """``tpu.floor``: the memory floor in seconds of the kernel's program and of the
    reference (``{kernel_s, reference_s, kernel_bytes, reference_bytes}``)."""
    floor = tpu.get("floor")
    if not isinstance(floor, dict) or _num(floor.get("kernel_s")) is None:
        return None
    return {k: float(floor[k]) for k in ("kernel_s", "reference_s", "kernel_bytes",
                                         "reference_bytes", "efficiency")
            if _num(floor.get(k)) is not None}


def _arrays(items: Any) -> list[str]:
    """``tpu.input_shapes``: ``["f32[4096,8192]", ...]`` (pairs ``[shape, dtype]`` too)."""
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list | tuple) and len(item) == 2:
            out.append(array_text(item[0], item[1]))
    return out


def version_numbers(result: dict[str, Any] | None) -> dict[str, Any]:
    """The numbers of one evaluation (an empty dict for none)."""
    if not result:
        return {}
    tpu = result.get("tpu") or {}
    timing = result.get("timing") or {}
    corr = result.get("correctness") or {}
    estimate, reference = tpu.get("estimate"), tpu.get("reference_estimate")
    rank = ranking(result)
    ops = _ops(estimate)
    pallas = [o for o in ops if o["kind"] == "pallas"]
    fidelity = tpu.get("fidelity") if isinstance(tpu.get("fidelity"), dict) else None
    numbers: dict[str, Any] = {
        "status": result.get("status"),
        "rank": rank,
        "chip": tpu.get("chip") or rank.chip,
        "compile": tpu.get("compile"),
        "shape": tpu.get("shape") if isinstance(tpu.get("shape"), str) else None,
        "shape_label": tpu.get("shape_label") if isinstance(tpu.get("shape_label"), str)
        else None,
        "input_shapes": _arrays(tpu.get("input_shapes")),
        "output_shapes": _arrays(tpu.get("output_shapes")),
        "cycles": _cycles(estimate),
        "ref_cycles": _cycles(reference),
        "seconds": _seconds(estimate),
        "ref_seconds": _seconds(reference),
        "kernel_time_s": _num(tpu.get("kernel_time_s")),
        "roofline": _roofline(tpu.get("reference_roofline")),
        "method": _method(estimate), "ref_method": _method(reference),
        "ops": ops, "ref_ops": _ops(reference),
        "pallas_cycles": sum(o["cycles"] * o["count"] for o in pallas) if pallas else None,
        "outside_cycles": sum(o["cycles"] * o["count"] for o in ops if o["kind"] == "xla")
        if ops else None,
        "vmem_bytes": _num(tpu.get("vmem_bytes")),
        "vmem_limit_bytes": _num(tpu.get("vmem_limit_bytes")),
        "grid_steps": int(tpu["grid_steps"]) if isinstance(tpu.get("grid_steps"), int)
        else None,
        "grids": _grids(tpu.get("kernels")),
        "floor": _floor(tpu),
        # the reference's cycles over the kernel's, the compiler's alone (no floor)
        "compiler_ratio": _num(tpu.get("compiler_speedup")),
        "basis": tpu.get("basis") if isinstance(tpu.get("basis"), str) else None,
        "fidelity": fidelity,
        "estimate_unavailable": tpu.get("estimate_unavailable")
        if isinstance(tpu.get("estimate_unavailable"), str) else None,
        # why the estimate is not ranked on (a loop of run-time length; below its work)
        "unpriced": printable(tpu["unpriced"]) if isinstance(tpu.get("unpriced"), str)
        else None,
        "implausible": printable(tpu["implausible"]) if isinstance(tpu.get("implausible"), str)
        else None,
        "tpu_message": tpu.get("message") if isinstance(tpu.get("message"), str) else None,
        "atol": _num(corr.get("atol")), "rtol": _num(corr.get("rtol")),
        "atol_effective": _num(corr.get("atol_effective")),
        "max_abs_diff": _num(corr.get("max_abs_diff")),
        "max_rel_diff": _num(corr.get("max_rel_diff")),
        "interpret": is_interpret(result.get("backend") or {}),
        "host_ms": _num(timing.get("median_ms")),
        "host_ref_ms": _num(timing.get("baseline_median_ms")),
        "flags": list((result.get("integrity") or {}).get("flags") or []),
    }
    return numbers


def fidelity_text(fidelity: dict[str, Any] | None) -> str | None:
    """``tpu.fidelity`` in one line: how far the estimate can be trusted here."""
    if not fidelity:
        return None
    parts = []
    if fidelity.get("class"):
        parts.append(f"program class {fidelity['class']}")
    if _num(fidelity.get("median_ratio")) is not None:
        parts.append(f"median estimate/measured {fidelity['median_ratio']:.2f}")
    if _num(fidelity.get("within_2x")) is not None:
        share = float(fidelity["within_2x"])
        parts.append(f"{share:.0%} within 2x" if share <= 1 else f"{share:g} within 2x")
    if fidelity.get("rows"):
        parts.append(f"over {fidelity['rows']} measured programs")
    speedups = speedup_words(fidelity.get("speedups"))
    if speedups:
        parts.append(speedups)
    if fidelity.get("source"):
        parts.append(f"source: {fidelity['source']}")
    return "; ".join(parts) or None
