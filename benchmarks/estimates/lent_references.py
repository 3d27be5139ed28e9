"""The XLA references measured on a lent chip, estimated again by the judge as it is now:
how far the reference's estimate (the denominator of every estimated speedup) is from
its device time, program by program.

Reads ``measure_on_chip.py`` rows (``--out`` JSON lines: every row's ``reference_ms`` is
the task's XLA reference timed on the chip, at the task's production shape, in the
row's dtype), takes the median per task, shape and dtype, and asks a worker's
``reference_estimate`` op for each (the record every evaluation ranks against:
compiled whole, or at two smaller sizes and scaled). Prints measured, estimated, their
ratio and how the estimate was made; ``--write`` stores the figures as ``v5e_lent``
rows of ``benchmarks/data/estimate_fidelity_rows.json`` (an XLA row already there is
replaced: the rows hold what the estimator says now), and ``estimate_fidelity.py --rows
benchmarks/data/estimate_fidelity_rows.json --write`` recomputes the shipped figures.

    python benchmarks/estimates/lent_references.py benchmarks/data/v5e_*_2026-12-06.jsonl \\
        --tasks DIR [--only 20k 31k] [--write]

``--tasks``: the directory holding the measured tasks (JAXBench's ``benchmark/`` layout,
one directory per task); a row whose task is not there is skipped and said so.
``--smoke``: the bundled softmax's reference, measured on the chip in
``v5e_measured_2026-12-06.jsonl``, estimated at its production shape; nothing written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository
ROWS = ROOT / "benchmarks" / "data" / "estimate_fidelity_rows.json"
CHIPS = {"TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v6 lite": "v6e", "TPU v6e": "v6e"}


def measured_references(paths: list[Path]) -> dict[tuple[str, str, str, str], list[float]]:
    """(task, shape, dtype, chip) -> the reference's measured seconds, every row's."""
    found: dict[tuple[str, str, str, str], list[float]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("status") != "measured" or not row.get("reference_ms"):
                continue
            chip = CHIPS.get(row.get("chip", ""), row.get("chip"))
            key = (row["task"], row.get("shape") or "", row.get("dtype") or "", chip)
            found.setdefault(key, []).append(row["reference_ms"] / 1e3)
    return found


async def estimate_all(wanted: dict[tuple[str, str, str, str], list[float]], tasks: Path,
                       timeout: float) -> list[dict[str, Any]]:
    from tilewright.kernels.pool.workers import WorkerPool
    from tilewright.kernels.tasks.loaders import load_task

    rows: list[dict[str, Any]] = []
    async with WorkerPool(size=1, memory_limit_mb=12288) as pool:
        for (name, shape, dtype, chip), times in sorted(wanted.items()):
            directory = tasks / name
            if not directory.is_dir():
                print(f"  {name}: not under {tasks}, skipped")
                continue
            started = time.perf_counter()
            try:  # a JAXBench task in the dtype it was measured in
                task = load_task(str(directory), {"dtype": dtype} if dtype else None)
            except Exception:  # a native task: its own dtype
                task = load_task(str(directory))
            found = await pool.request("reference_estimate", {
                "task": task.to_spec(), "chip": chip, "timeout_s": timeout,
                "compile_memory_mb": 8192}, timeout=timeout + 60)
            estimate = found.get("estimate") or {}
            row = {"source": "v5e_lent", "program": f"{name} (XLA)", "chip": chip,
                   "workload": name, "variant": "baseline",
                   "measured_s": statistics.median(times),
                   "estimate_s": estimate.get("seconds"), "method": estimate.get("method"),
                   "bytes": (found.get("cost") or {}).get("bytes_accessed"), "flops": None,
                   "class": found.get("class"), "why": None if estimate else found.get("why"),
                   "incomplete": bool(estimate.get("incomplete")), "shape": shape,
                   "detail": estimate.get("detail"),
                   "wall_s": round(time.perf_counter() - started, 1)}
            rows.append(row)
            ratio = (f"{row['estimate_s'] / row['measured_s']:.3f}" if row["estimate_s"]
                     else "-")
            print(f"{name[:40]:<40} {dtype[:4]:<4} meas. {row['measured_s'] * 1e3:8.3f} ms "
                  f"est. {(row['estimate_s'] or 0) * 1e3:8.3f} ms  {ratio:>6}  "
                  f"{row['method'] or row['why']}  ({row['wall_s']} s)", flush=True)
            if row["detail"]:
                print(f"    {row['detail'][:160]}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measured", nargs="*", type=Path)
    parser.add_argument("--tasks", type=Path)
    parser.add_argument("--only", nargs="*", help="task name prefixes")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="the bundled softmax's reference only, nothing written")
    args = parser.parse_args(argv)
    if args.smoke:
        args.measured = [ROOT / "benchmarks" / "data" / "v5e_measured_2026-12-06.jsonl"]
        args.tasks, args.only, args.write = ROOT / "kernels" / "bundled", ["softmax"], False
    if not args.measured or args.tasks is None:
        parser.error("give MEASURED.jsonl ... and --tasks DIR (or --smoke)")
    wanted = {k: v for k, v in measured_references(args.measured).items()
              if not args.only or any(k[0].startswith(p) for p in args.only)}
    rows = asyncio.run(estimate_all(wanted, args.tasks, args.timeout))
    ratios = [r["estimate_s"] / r["measured_s"] for r in rows if r["estimate_s"]]
    if ratios:
        print(f"\n{len(ratios)} of {len(rows)} estimated: estimate / measured median "
              f"{statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}, "
              f"within 10% {sum(0.9 <= r <= 1.1 for r in ratios)}")
    if args.write:
        stored = json.loads(ROWS.read_text())
        mine = {(r["source"], r["workload"], r["variant"], r["chip"]) for r in rows
                if r["estimate_s"]}
        kept = [r for r in stored
                if (r["source"], r["workload"], r["variant"], r["chip"]) not in mine]
        ROWS.write_text(json.dumps(kept + [r for r in rows if r["estimate_s"]], indent=1)
                        + "\n")
        print(f"{len(mine)} XLA rows written to {ROWS.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
