"""The figures of ``benchmarks/estimates/estimate_fidelity.py`` from its rows: estimate over
measured per chip and class (median, middle half, shares within 1.5x and 2x, Spearman),
with and without the memory floor; whether each Pallas variant's estimated speedup
points the measured way; the fitted HBM efficiency. Pure functions of the rows."""

from __future__ import annotations

import statistics
from typing import Any

from rank_stats import spearman


def with_floor(row: dict[str, Any], efficiency: float = 1.0) -> float | None:
    """The estimate with the memory floor: max(compiler, bytes / bandwidth)."""
    from tilewright.profiling.chips import get_chip

    est = row.get("estimate_s")
    if not est:
        return None
    if row.get("variant") == "optimized":
        floor = row.get("floor_s") or 0.0
        floor = floor / efficiency if floor else 0.0
    else:
        moved = row.get("bytes") or 0.0
        floor = moved / (get_chip(row["chip"]).hbm_bytes_per_s * efficiency)
    return max(est, floor)


def summarize(ratios: list[float]) -> dict[str, Any]:
    ratios = sorted(ratios)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 4 else [ratios[0], ratios[-1]] * 2
    return {"rows": len(ratios), "median_ratio": round(statistics.median(ratios), 3),
            "middle_half": [round(q[0], 3), round(q[-1], 3)],
            "within_1_5x": round(sum(1 / 1.5 <= r <= 1.5 for r in ratios) / len(ratios), 3),
            "within_2x": round(sum(0.5 <= r <= 2 for r in ratios) / len(ratios), 3)}


def report(rows: list[dict[str, Any]], efficiency: float = 1.0) -> dict[str, Any]:
    """Per chip: per class and overall, compiler-only and with the floor."""
    out: dict[str, Any] = {}
    for chip in sorted({r["chip"] for r in rows}):
        mine = [r for r in rows if r["chip"] == chip and r.get("measured_s")
                and r.get("estimate_s")]
        entry: dict[str, Any] = {"compiler": {}, "with_floor": {}}
        for key, value in (("compiler", lambda r: r["estimate_s"]),
                           ("with_floor", lambda r: with_floor(r, efficiency))):
            classes: dict[str, list[float]] = {}
            for r in mine:
                classes.setdefault(r.get("class") or "unknown", []).append(
                    value(r) / r["measured_s"])
            entry[key] = {k: summarize(v) for k, v in sorted(classes.items())}
            entry[key]["all"] = summarize([value(r) / r["measured_s"] for r in mine]) \
                if mine else {}
            if mine:
                rho = spearman([value(r) for r in mine], [r["measured_s"] for r in mine])
                entry[key]["all"]["spearman"] = round(rho, 3) if rho is not None else None
        out[chip] = entry
    return out


def directions(rows: list[dict[str, Any]]) -> list[str]:
    """For each Pallas variant: does the estimated speedup over XLA point the way the
    measured one does?"""
    lines = []
    base = {(r["source"], r["workload"], r["chip"]): r for r in rows
            if r.get("variant") == "baseline"}
    for r in rows:
        if r.get("variant") != "optimized":
            continue
        b = base.get((r["source"], r["workload"], r["chip"]))
        if not b or not b.get("measured_s") or not r.get("measured_s"):
            continue
        measured = b["measured_s"] / r["measured_s"]
        for label, est in (("compiler", r.get("compiler_speedup")),
                           ("with floor", r.get("estimated_speedup"))):
            if est is None:
                lines.append(f"  {r['program'][:50]:<50} {label:<10} measured {measured:5.2f}x,"
                             f" no estimate ({str(r.get('why'))[:60]})")
                continue
            same = (measured >= 1) == (est >= 1)
            lines.append(f"  {r['program'][:50]:<50} {label:<10} measured {measured:5.2f}x, "
                         f"estimated {est:5.2f}x: {'same direction' if same else 'WRONG WAY'}")
    return lines


def fit_efficiency(rows: list[dict[str, Any]]
                   ) -> tuple[float | None, list[dict[str, Any]], list[dict[str, Any]]]:
    """The share of HBM bandwidth memory-bound programs achieve, as the median of bytes /
    (bandwidth x measured), fitted on the memory-bound baselines the estimator could not
    price (their bytes and measured times are all the fit needs) and checked on the ones
    it priced, which the fit never saw. Returns it, the rows it was fitted on and the
    rows it is checked on."""
    from tilewright.profiling.chips import get_chip

    memory = sorted((r for r in rows if r.get("class") == "memory_bound"
                     and r.get("measured_s") and r.get("bytes")
                     and r.get("variant") == "baseline"), key=lambda r: r["program"])
    train = [r for r in memory if not r.get("estimate_s")]
    test = [r for r in memory if r.get("estimate_s")]
    if not train:
        return None, train, test
    shares = [r["bytes"] / (get_chip(r["chip"]).hbm_bytes_per_s * r["measured_s"])
              for r in train]
    return min(statistics.median(shares), 1.0), train, test
