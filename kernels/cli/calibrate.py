"""``tilewright calibrate``: on a TPU host, measure what the estimate predicts.

``tilewright calibrate [--task T ...] [--kernel FILE] [--json]`` evaluates each task's
kernel (the bundled tasks' starting kernels by default) on the TPU itself at the
production shape and records, per program (the kernel and its XLA reference), the
TPU compiler's estimate next to the measured time, for that chip, in
``<user data dir>/calibration.jsonl``. Every later evaluation's ``tpu.fidelity`` then
carries the user's own figures for the chip and class of program beside the public
ones (``kernels.worker.tpu.fidelity``), and ``tilewright report`` shows both numbers for
every version measured on hardware.

Off-TPU it refuses (there is no device time to measure) and says so. The time
measured is the judge's timing of the candidate and the reference at the production
shape (``timing.method``, recorded with each pair). App side: no JAX here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from tilewright.kernels.cli import kernel_command
from tilewright.kernels.judge.calibration import calibration_path, pairs, record

__all__ = ["calibration_path", "pairs", "record", "register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    parser = kernel_command(
        sub, "calibrate", "on a TPU host: record the estimate against measured device time", run,
        json_help="print the recorded pairs",
        task_help="a task to calibrate on (default: the bundled tasks)",
        kernel_help="the kernel to time (default: each task's kernel.py)",
        required=False, action="append", default=[])
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS")


def run(args: argparse.Namespace) -> int:
    """Evaluate kernels on this TPU at their production shapes and record the TPU compiler's
    estimate beside the measured time, so tpu.fidelity reports how far the estimate is to be
    trusted on this chip."""
    from tilewright.kernels.cli import task_and_candidate
    from tilewright.kernels.judge.options import EvalOptions
    from tilewright.kernels.pool import LocalExecutor
    from tilewright.kernels.pool.workers import WorkerStartError
    from tilewright.kernels.tasks.loaders import bundled_names

    names = args.task or list(bundled_names())

    async def go() -> tuple[str | None, list[dict[str, Any]]]:
        rows: list[dict[str, Any]] = []
        async with LocalExecutor(workers=1) as judge:
            backend = await judge.backend()
            assert backend is not None  # a started local judge knows its backend
            if backend.platform != "tpu" or backend.is_interpret:
                return (f"this host runs kernels on {backend.label()}: calibrate measures "
                        "device time and needs a TPU host (the estimate's public fidelity "
                        "figures are in tpu.fidelity meanwhile)"), rows
            for name in names:
                try:
                    task, path, source = task_and_candidate(name, args.overrides, args.kernel)
                except ValueError as exc:
                    print(f"tilewright calibrate: {name}: {exc}", file=sys.stderr)
                    continue
                result = await judge.evaluate(task, source, EvalOptions(
                    timeout_s=args.timeout, estimate_on_tpu=True), filename=str(path))
                found = pairs(task.name, result.to_json())
                if not found:
                    print(f"tilewright calibrate: {task.name}: no pair ({result.status}; "
                          f"{(result.tpu or {}).get('estimate_unavailable') or 'no timing'})",
                          file=sys.stderr)
                rows += found
        return None, rows

    try:
        refusal, rows = asyncio.run(go())
    except WorkerStartError as exc:
        print(f"tilewright calibrate: could not start a JAX worker: {exc}", file=sys.stderr)
        return 1
    if refusal:
        print(f"tilewright calibrate: {refusal}", file=sys.stderr)
        return 1
    path = record(rows) if rows else calibration_path()
    if args.json:
        print(json.dumps({"schema": "tilewright.calibration/1", "file": str(path),
                          "pairs": rows}, indent=2))
    else:
        for row in rows:
            print(f"{row['task']:<22} {row['program']:<9} {row['chip']} at {row['shape']}: "
                  f"estimated {row['estimate_s'] * 1e3:.3f} ms, measured "
                  f"{row['measured_s'] * 1e3:.3f} ms ({row['ratio']:.2f}x)")
        print(f"{len(rows)} pair(s) recorded in {path}")
    return 0 if rows else 1
