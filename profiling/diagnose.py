"""What limits a kernel, with the numbers that say so: one diagnosis per profile.

``diagnose(profile, eval_result)`` reads the profile JSON (``tilewright.profile/1``: the
static ``pallas_call`` analysis for the target chip, the roofline placement, the trace's
top ops) and, where the evaluation has them, the TPU compiler's figures (the eval JSON's
``tpu`` section: VMEM bytes, estimated cycles/seconds, estimated speedup), and names
the main limit:

- ``vmem_pressure``: the padded VMEM footprint is at least 75% of the scoped budget
  (or the compiler's own VMEM figure is): larger blocks would not fit;
- ``per_step_overhead``: the fixed ~0.35 us per grid step is at least 25% of the time
  the blocking needs (few bytes per step): larger blocks, fewer steps;
- ``mxu_shape``: a dot leaves the MXU part-empty (K or N not a multiple of its width);
- ``memory_bound`` / ``compute_bound``: otherwise, arithmetic intensity against the
  chip's ridge point for the dtype the work runs in (the ridge is named with its dtype:
  f32's is a third of bf16's).

Every finding that holds is listed with its evidence; the first in that order is the
diagnosis. ``check_with_estimates(diagnosis, versions)`` then holds a diagnosis against
the TPU compiler's estimates of the versions measured since: a heuristic the estimator
contradicts (per-step overhead, when a version with fewer grid steps is estimated
slower) is marked ``contradicted`` with the numbers, and no longer leads the diagnosis.
Pure data in, data out: no JAX, any layer may call it.
"""

from __future__ import annotations

from typing import Any, Protocol

from tilewright.profiling.static_rules import STEP_OVERHEAD_S

VMEM_PRESSURE = 0.75
OVERHEAD_SHARE = 0.25

ADVICE = {
    "vmem_pressure": "use smaller blocks (or fewer buffers / less scratch); larger ones "
                     "will not fit VMEM",
    "per_step_overhead": "use larger blocks so the grid has fewer steps, each moving more "
                         "bytes",
    "mxu_shape": "pick block sizes whose K and N are multiples of the MXU width (and M of 8)",
    "memory_bound": "cut HBM traffic: fuse, avoid re-reading operands (larger reused "
                    "blocks), keep data in VMEM across steps",
    "compute_bound": "cut or cheapen the arithmetic: bf16 MXU inputs with f32 "
                     "accumulation, fewer transcendentals, skip masked work",
}


def diagnose(profile: dict[str, Any], eval_result: dict[str, Any] | None = None
             ) -> dict[str, Any] | None:
    """The diagnosis dict (``kind``, ``summary``, ``evidence``, ``findings``, ``advice``),
    or None when the profile has nothing to judge (no analyzed kernel, no roofline)."""
    kernels = [k for k in (profile.get("analysis") or {}).get("kernels") or []
               if not k.get("analysis_error")]
    roof = profile.get("roofline") or {}
    chip = profile.get("chip") or {}
    tpu = (eval_result or {}).get("tpu") or {}
    if not kernels and not roof:
        return None
    evidence: dict[str, Any] = {"chip": chip.get("name") or roof.get("chip")}
    findings: list[dict[str, Any]] = []
    main = max(kernels, key=lambda k: (k.get("bytes_total") or 0) * (k.get("calls") or 1),
               default=None)
    if main is not None:
        evidence.update(_kernel_evidence(main, chip))
    _compiler_evidence(evidence, tpu)
    _roofline_evidence(evidence, roof)

    budget = evidence.get("vmem_budget_bytes")
    vmem_fraction = evidence.get("vmem_fraction") or 0.0
    pressure = f"VMEM {vmem_fraction:.0%} of the {(budget or 0) / 2**20:.0f} MiB scoped budget"
    room, said = _compiler_room(tpu, budget)
    if room and (tpu.get("vmem_bytes") or 0) / room > vmem_fraction:
        vmem_fraction = tpu["vmem_bytes"] / room
        pressure = f"VMEM {vmem_fraction:.0%} of {said} at the production shape (the TPU compiler's figure)"
    codes = {w.get("code") for k in kernels for w in k.get("warnings") or []}
    if vmem_fraction >= VMEM_PRESSURE or codes & {"vmem_over_scoped", "vmem_over_physical"}:
        findings.append(_finding("vmem_pressure", pressure))
    share = evidence.get("step_overhead_share")
    if ((share is not None and share >= OVERHEAD_SHARE and (evidence.get("steps") or 0) >= 2)
            or "per_step_overhead" in codes):
        findings.append(_finding(
            "per_step_overhead",
            f"{evidence.get('steps')} grid steps of "
            f"{(evidence.get('bytes_per_step') or 0) / 1024:.1f} KiB: fixed step cost is "
            f"~{(share or 0):.0%} of the kernel's time"))
    mxu = [w for k in kernels for w in k.get("warnings") or [] if w.get("code") == "mxu_shape"]
    if mxu:
        findings.append(_finding("mxu_shape", mxu[0].get("message", "a dot misses the MXU")))
    intensity, ridge = evidence.get("intensity"), evidence.get("ridge_intensity")
    bound = evidence.get("bound_by") or (
        None if intensity is None or ridge is None else
        "compute" if intensity >= ridge else "memory")
    if bound in ("memory", "compute"):
        dtype = evidence.get("ridge_dtype")
        findings.append(_finding(
            f"{bound}_bound",
            f"intensity {_num(intensity)} FLOP/B vs the {dtype + ' ' if dtype else ''}ridge "
            f"{_num(ridge)} FLOP/B"
            + (f"; roofline bound {roof['bound_ms'] * 1e3:.2f} us" if roof.get("bound_ms")
               else "")))
    if not findings:
        return None
    first = findings[0]
    where = shape_words(profile.get("shape"))
    if where:
        evidence["shape"] = where
    return {"kind": first["kind"],
            "summary": (f"{where}: " if where else "")
                       + f"{first['kind'].replace('_', ' ')}: {first['reason']}; "
                       f"next: {ADVICE[first['kind']]}",
            "evidence": evidence, "findings": findings, "advice": ADVICE[first["kind"]],
            "sources": [s for s, present in (("static", main is not None),
                                             ("roofline", bool(roof)),
                                             ("trace", bool(profile.get("top_ops"))),
                                             ("tpu_compiler", bool(tpu))) if present]}


def shape_words(shape: dict[str, Any] | None) -> str | None:
    """Which shape a profile's numbers are for: "at the production shape (4096x4096)",
    "at the check shape small (256x512)"; None when the profile does not say."""
    if not isinstance(shape, dict) or not shape.get("name"):
        return None
    dims = ", ".join("x".join(str(d) for d in item[0]) for item in shape.get("inputs") or []
                     if isinstance(item, list | tuple) and item and item[0])
    at = f" ({dims})" if dims else ""
    if shape.get("production"):
        return f"at the production shape{at}"
    return f"at the check shape {shape['name']}{at}"


def _finding(kind: str, reason: str) -> dict[str, Any]:
    return {"kind": kind, "reason": reason}


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _kernel_evidence(k: dict[str, Any], chip: dict[str, Any]) -> dict[str, Any]:
    steps = k.get("steps") or 0
    total = k.get("bytes_total") or 0
    flops = k.get("flops") or 0.0
    hbm = chip.get("hbm_bytes_per_s") or 0
    peak = chip.get("bf16_flops") or 0
    work_s = max(total / hbm if hbm else 0.0, flops / peak if peak else 0.0)
    overhead_s = steps * STEP_OVERHEAD_S
    budget = k.get("vmem_budget_bytes")
    padded = k.get("vmem_padded_bytes")
    return {
        "kernel": k.get("name"), "grid": k.get("grid"), "steps": steps,
        "blocks": {o.get("name", o.get("origin")): o.get("block") for o in k.get("operands") or []},
        "bytes_total": total, "bytes_per_step": k.get("bytes_per_step"),
        "flops": flops, "intensity": k.get("intensity"),
        "vmem_padded_bytes": padded, "vmem_budget_bytes": budget,
        "vmem_fraction": (padded / budget) if padded and budget else None,
        "work_us": work_s * 1e6, "step_overhead_us": overhead_s * 1e6,
        "step_overhead_share": (overhead_s / (overhead_s + work_s)) if steps and work_s else None,
        "warnings": [w.get("code") for w in k.get("warnings") or []],
    }


def _compiler_room(tpu: dict[str, Any], budget: float | None) -> tuple[float | None, str]:
    """The VMEM the compiler's figure (``tpu.vmem_bytes``, at the production shape) is
    measured against, and its words: a kernel that sets its own ``vmem_limit_bytes`` may
    ask for more, up to the core's VMEM (a template asks for its blocks' need plus a
    quarter, so its own limit is always nearly full: on a v5e that read as "pressure"
    and shrank blocks XLA-level tilings needed); otherwise the scoped limit it compiled
    under (the chip's default), else the static analysis's budget."""
    capacity = tpu.get("vmem_capacity_bytes")
    limit = tpu.get("vmem_limit_bytes")
    own = str(tpu.get("vmem_limit_source") or "").startswith("the kernel's")
    if own and isinstance(capacity, int | float) and capacity > 0:
        return float(capacity), f"the core's {capacity / 2**20:.0f} MiB (the kernel sets its own limit)"
    if isinstance(limit, int | float) and limit > 0:
        return float(limit), f"the {limit / 2**20:.0f} MiB scoped limit"
    if budget:
        return float(budget), f"the {budget / 2**20:.0f} MiB scoped budget"
    return None, ""


def _compiler_evidence(evidence: dict[str, Any], tpu: dict[str, Any]) -> None:
    if not tpu:
        return
    estimate = tpu.get("estimate") or {}
    evidence.update({k: v for k, v in {
        "compiler_vmem_bytes": tpu.get("vmem_bytes"),
        "compiler_estimate_s": estimate.get("seconds"),
        "compiler_estimate_cycles": estimate.get("cycles"),
        "compiler_estimated_speedup": tpu.get("estimated_speedup"),
    }.items() if v is not None})


def _roofline_evidence(evidence: dict[str, Any], roof: dict[str, Any]) -> None:
    if not roof:
        return
    evidence.setdefault("intensity", roof.get("intensity"))
    if evidence.get("intensity") is None:
        evidence["intensity"] = roof.get("intensity")
    evidence.update({"ridge_intensity": roof.get("ridge_intensity"),
                     "ridge_dtype": roof.get("dtype"),
                     "bound_by": roof.get("bound_by"), "bound_us": _us(roof.get("bound_ms")),
                     "estimate_us": _us(roof.get("estimate_ms")),
                     "roofline_fraction": roof.get("fraction")})


def _us(ms: float | None) -> float | None:
    return None if ms is None else ms * 1e3


# -- against the estimator ---------------------------------------------------------------

class MeasuredVersion(Protocol):
    """What ``check_with_estimates`` reads of each version (``agents.base.VersionRow``)."""

    version: int
    status: str | None
    steps: int | None
    steps_source: str | None
    tunables: dict[str, Any] | None
    numbers: dict[str, Any]


def check_with_estimates(diagnosis: dict[str, Any], versions: Any) -> dict[str, Any]:
    """``diagnosis`` (of one version) held against the TPU compiler's estimates of the
    versions measured so far (``MeasuredVersion`` rows: ``steps`` with ``steps_source``,
    ``numbers["cycles"]``, ``tunables``).

    Comparable versions share the diagnosed one's tunable names (the same kernel with
    other block sizes) and count grid steps the same way. ``evidence.estimator_steps``
    lists the compiler's cycles by grid-step count; the ``per_step_overhead`` finding
    (fewer, larger steps would be faster) is marked ``contradicted`` when a comparable
    version with fewer steps is estimated slower. A contradicted finding no longer
    leads: ``kind``, ``summary`` and ``advice`` come from the first one that stands (or
    say that none does). Returns a new dict; the recorded event is not changed."""
    rows: list[MeasuredVersion] = list(versions or [])
    number = diagnosis.get("version")
    own = next((r for r in rows if r.version == number), None)
    out = dict(diagnosis)
    if own is None or own.steps is None:
        return out
    cycles = own.numbers.get("cycles")
    names = set((own.tunables or {}).keys())
    same = [r for r in rows if r.status == "correct"
            and set((r.tunables or {}).keys()) == names
            and r.steps_source == own.steps_source and r.steps is not None
            and isinstance(r.numbers.get("cycles"), int | float)]
    by_steps: dict[int, tuple[float, int]] = {}
    for r in same:
        c = float(r.numbers["cycles"])
        if r.steps not in by_steps or c < by_steps[r.steps][0]:
            by_steps[r.steps] = (c, int(r.version))
    evidence = dict(out.get("evidence") or {})
    if len(by_steps) >= 2:
        evidence["estimator_steps"] = [
            {"steps": k, "cycles": c, "version": v} for k, (c, v) in sorted(by_steps.items())]
        evidence["estimator_steps_at"] = ("the estimate's shape" if own.steps_source
                                          == "tpu" else "the first check shape")
    out["evidence"] = evidence
    findings = [dict(f) for f in out.get("findings") or []]
    if isinstance(cycles, int | float):
        fewer = [r for r in same if (r.steps or 0) < own.steps
                 and float(r.numbers["cycles"]) > float(cycles)]
        for f in findings:
            if f.get("kind") == "per_step_overhead" and fewer:
                r = min(fewer, key=lambda x: x.steps or 0)
                f["contradicted"] = (
                    f"the TPU compiler estimates v{r.version}, with fewer grid steps "
                    f"({r.steps} vs {own.steps}), slower: "
                    f"{float(r.numbers['cycles']):,.0f} vs {float(cycles):,.0f} cycles")
    out["findings"] = findings
    standing = [f for f in findings if not f.get("contradicted")]
    if len(standing) == len(findings):
        return out
    out["contradicted"] = [f["kind"] for f in findings if f.get("contradicted")]
    if standing:
        first = standing[0]
        out.update(kind=first["kind"], advice=ADVICE.get(first["kind"], ""),
                   summary=f"{first['kind'].replace('_', ' ')}: {first['reason']}; next: "
                           f"{ADVICE.get(first['kind'], '')}")
    else:
        out.update(kind="none", advice="",
                   summary="no finding stands: the estimator contradicts "
                           + ", ".join(out["contradicted"]))
    return out
