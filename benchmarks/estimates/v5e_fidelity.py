"""The off-TPU estimate against device times measured on a TPU v5e.

Reads the rows ``benchmarks/on_chip/measure_on_chip.py`` wrote on a v5e (shipped:
``benchmarks/data/v5e_measured_2026-12-06.jsonl``), rebuilds each program here (the
bundled task's kernel at the row's tunables, or the JAXBench task's file at the row's
dtype), and estimates it as every evaluation off a TPU does (a worker's ``estimate``
op for ``--chip v5e``: the production program compiled by the TPU compiler, the XLA
reference estimated beside it, the memory floor). Printed per program: measured and
estimated time of the kernel and of the reference, their ratios, and the speedup
measured and estimated (its side of 1.0); per task, Spearman's rank correlation of
estimated against measured kernel times over the task's measured tunings.

    python benchmarks/estimates/v5e_fidelity.py [--rows FILE] [--jaxbench DIR] [--only softmax]
        [--json OUT]

``--smoke``: the first measured softmax row, estimated with its production shape shrunk
to 256x4096 (its ratios then mean nothing): that it runs.

Rows the chip refused (VMEM at compile) are listed with whether the estimate refused
them too. Nothing is fitted here: the figures are the estimate's as it stands.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from tilewright.kernels.judge.options import EvalOptions
from tilewright.kernels.pool.workers import WorkerPool
from tilewright.kernels.source import tunables
from tilewright.kernels.tasks.loaders import bundled_names, load_task

BENCHMARKS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCHMARKS / "lib"))  # helpers, not benchmarks
from rank_stats import spearman  # noqa: E402

ROWS = BENCHMARKS / "data" / "v5e_measured_2026-12-06.jsonl"


def program(row: dict[str, Any], jaxbench: Path | None,
            sets: dict[str, Any] | None = None) -> tuple[Any, str] | None:
    """(task, kernel source) of a measured row, or None where it cannot be rebuilt;
    ``sets``: loader overrides for a bundled task (the smoke run's smaller size)."""
    if row["task"] in bundled_names():
        task = load_task(row["task"], sets)
        source = Path(task.kernel_path).read_text()
        return task, tunables.apply(source, row["variant"]) if row["variant"] else source
    if jaxbench is None or not (jaxbench / row["task"]).is_dir():
        return None
    directory = jaxbench / row["task"]
    # the dtype the task was loaded in (``dtype`` is the output's: 13p's loss is f32)
    task = load_task(str(directory), {"dtype": row.get("task_dtype") or "bfloat16"})
    return task, (directory / row["kernel"]).read_text()


def _ms(section: Any) -> float | None:
    if isinstance(section, dict) and isinstance(section.get("seconds"), int | float):
        return float(section["seconds"]) * 1e3
    return None


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=str(ROWS))
    parser.add_argument("--jaxbench", help="a checkout's JAXBench/benchmark directory")
    parser.add_argument("--only", nargs="*", help="these tasks only")
    parser.add_argument("--json", help="write the compared rows here")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--smoke", action="store_true", help="one small row: that it runs")
    args = parser.parse_args(argv)
    with open(args.rows) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    if args.only:
        rows = [r for r in rows if r["task"] in args.only]
    sets = None
    if args.smoke:
        rows = [r for r in rows if r["task"] == "softmax" and r["status"] == "measured"][:1]
        sets = {"production.rows": "256"}
    jaxbench = Path(args.jaxbench) if args.jaxbench else None
    out = []
    async with WorkerPool(size=1) as pool:
        for row in rows:
            built = program(row, jaxbench, sets)
            if built is None:
                print(f"  {row['task']}: not rebuilt (give --jaxbench)", file=sys.stderr)
                continue
            task, source = built
            reply = await pool.estimate(task, source, EvalOptions(chip="v5e",
                                                                  timeout_s=args.timeout))
            tpu = reply.get("tpu") or {}
            got = {**{k: row.get(k) for k in ("task", "kernel", "variant", "status", "method",
                                              "kernel_ms", "reference_ms", "shape")},
                   "estimate_status": reply.get("status"),
                   "kernel_est_ms": _ms(tpu.get("estimate")),
                   "reference_est_ms": _ms(tpu.get("reference_estimate")),
                   "estimated_speedup": tpu.get("estimated_speedup"),
                   "why": tpu.get("estimate_unavailable") or (reply.get("error") or {}).get(
                       "message")}
            out.append(got)
            print(f"  {got['task']} {got['kernel']}: {got['estimate_status']} "
                  f"est {got['kernel_est_ms']} / ref est {got['reference_est_ms']}",
                  file=sys.stderr, flush=True)
    print("v5e: measured on the chip (device plane, or pipelined where said) against the "
          "estimate made here for --chip v5e; ms per call")
    print("task | kernel | method | ref ms | ref est | est/meas | kernel ms | kernel est | "
          "est/meas | speedup | est. speedup")
    for r in out:
        def f(v: Any, d: int = 3) -> str:
            return "-" if v is None else f"{v:.{d}g}" if isinstance(v, float) else str(v)

        kr = r["kernel_est_ms"] / r["kernel_ms"] if r["kernel_est_ms"] and r["kernel_ms"] \
            else None
        rr = (r["reference_est_ms"] / r["reference_ms"]
              if r["reference_est_ms"] and r["reference_ms"] else None)
        sp = r["reference_ms"] / r["kernel_ms"] if r["reference_ms"] and r["kernel_ms"] else None
        r.update(kernel_est_over_measured=kr, reference_est_over_measured=rr,
                 speedup_measured=sp)
        print(" | ".join([r["task"], r["kernel"], f(r["method"]), f(r["reference_ms"]),
                          f(r["reference_est_ms"]), f(rr, 2), f(r["kernel_ms"]),
                          f(r["kernel_est_ms"]), f(kr, 2), f(sp, 2),
                          f(r["estimated_speedup"], 2)]))
        if r["status"] != "measured" or r["why"]:
            print(f"    chip: {r['status']}; estimate: {r['estimate_status']} {r['why'] or ''}"[:300])
    for task in sorted({r["task"] for r in out}):
        pairs = [(r["kernel_ms"], r["kernel_est_ms"]) for r in out
                 if r["task"] == task and r["kernel_ms"] and r["kernel_est_ms"]]
        sides = [(r["speedup_measured"] >= 1) == (r["estimated_speedup"] >= 1) for r in out
                 if r["task"] == task and r.get("speedup_measured") and r["estimated_speedup"]]
        rho = spearman([p[0] for p in pairs], [p[1] for p in pairs])
        ratios = [r["kernel_est_over_measured"] for r in out
                  if r["task"] == task and r.get("kernel_est_over_measured")]
        print(f"{task}: {len(pairs)} tunings estimated; Spearman "
              f"{'-' if rho is None else f'{rho:.2f}'}; speedup's side right "
              f"{sum(sides)}/{len(sides)}; kernel est/meas median "
              f"{statistics.median(ratios) if ratios else '-'}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(asyncio.run(main()))
