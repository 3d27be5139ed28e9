"""Evaluation overhead: a warm worker against a fresh Python process per candidate.

For each task (default: the bundled gelu and softmax, their ``small`` configuration
shrunk to 64x256 with ``--set``: a small kernel), the task's starting kernel is
evaluated

(a) through a warm ``WorkerPool`` (started once, outside the measurement), and
(b) in a fresh ``python`` process per candidate that imports JAX, loads the task and
    runs the same evaluation code, as script-per-candidate harnesses do.

Both paths do identical work (same options: trials, fixed timing iterations, one shape
configuration). Printed per task: the wall time per candidate for each path (median of
--reps; the warm path's first evaluation, which also compiles the reference, is shown
apart), their ratio, and the warm path's overhead beyond the kernel's own compile +
run. The kernel's own compile + run is measured inside the worker: tracing and TPU
lowering of the candidate, its trial calls (the first one compiles) and its timed
calls. Everything else in the warm wall time is overhead, shown in two parts: the
harness's own work in the worker (inputs, reference outputs, comparisons, timing the
XLA reference, integrity checks) and transport (socket, JSON, scheduling, stderr
capture) = wall time minus the worker's handler time.

    python benchmarks/eval_overhead.py [--tasks gelu softmax] [--set rows=64 --set cols=256]
                                       [--reps 3] [--iters 10]

Targets: warm >= 5x faster than fresh for small kernels; overhead < 10%.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels.loaders import load_task  # noqa: E402
from kernels.worker_env import worker_environment  # noqa: E402
from kernels.workers import EvalOptions, WorkerPool  # noqa: E402

KERNEL_PHASES = ("trace_lower_s", "kernel_run_s", "kernel_timing_s")

FRESH_SCRIPT = (
    "import json, sys\n"
    "from kernels.harness.evaluate import evaluate_request\n"
    "print(json.dumps(evaluate_request(json.load(sys.stdin))))\n"
)


def split(result_json: dict, wall: float) -> dict:
    phases = result_json["extra"]["phases"]
    kernel = sum(phases.get(name, 0.0) for name in KERNEL_PHASES)
    handler = phases["worker_s"]
    return {"wall": wall, "kernel": kernel, "harness": handler - kernel,
            "transport": wall - handler}


async def warm_path(task, source: str, options: EvalOptions, reps: int) -> dict:
    async with WorkerPool(size=1) as pool:
        first = None
        runs = []
        for rep in range(reps + 1):
            start = time.perf_counter()
            result = await pool.evaluate(task, source, options, filename=str(task.kernel_path))
            wall = time.perf_counter() - start
            assert result.status == "correct", (result.status, result.error)
            if rep == 0:
                first = wall
                continue
            runs.append(split(result.to_json(), wall))
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    return {"first_s": first, **median}


def fresh_path(task, source: str, options: EvalOptions, reps: int) -> dict:
    payload = json.dumps({"task": task.to_spec(), "source": source,
                          "filename": str(task.kernel_path), "options": asdict(options)})
    env = worker_environment()
    walls = []
    for _ in range(reps):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", FRESH_SCRIPT], input=payload, env=env,
                              capture_output=True, text=True, cwd=ROOT)
        walls.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"fresh process failed:\n{proc.stderr[-3000:]}")
        status = json.loads(proc.stdout.strip().splitlines()[-1])["status"]
        assert status == "correct", status
    return {"wall_s": statistics.median(walls)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["gelu", "softmax"])
    parser.add_argument("--shape", default="small", help="shape configuration to evaluate")
    parser.add_argument("--set", dest="overrides", action="append", default=None,
                        metavar="KEY=VALUE", help="shape overrides (default rows=64, cols=256)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10, help="fixed timing iterations")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    options = EvalOptions(trials=args.trials, iters=args.iters, shapes=[args.shape],
                          timeout_s=600.0)
    overrides = dict(o.split("=", 1) for o in (args.overrides or ["rows=64", "cols=256"]))
    print(f"eval overhead: trials={args.trials}, timing iters={args.iters}, shape "
          f"{args.shape!r} with {overrides}, median of {args.reps}, JAX_PLATFORMS={os.environ['JAX_PLATFORMS']}, "
          f"{os.cpu_count()} CPUs")
    header = (f"{'task':<10} {'warm s':>7} {'(first)':>8} {'fresh s':>8} {'fresh/warm':>10} "
              f"{'kernel s':>9} {'overhead':>9} {'harness s':>10} {'transport s':>12}")
    print(header)
    print("-" * len(header))
    for name in args.tasks:
        task = load_task(name, overrides)
        source = task.starting_source()
        if source is None:
            print(f"{name}: no starting kernel, skipped")
            continue
        warm = asyncio.run(warm_path(task, source, options, args.reps))
        fresh = fresh_path(task, source, options, args.reps)
        ratio = fresh["wall_s"] / warm["wall"]
        overhead = 100 * (warm["wall"] - warm["kernel"]) / warm["wall"]
        print(f"{name:<10} {warm['wall']:>7.3f} {warm['first_s']:>8.3f} "
              f"{fresh['wall_s']:>8.3f} {ratio:>9.1f}x {warm['kernel']:>9.3f} "
              f"{overhead:>8.1f}% {warm['harness']:>10.3f} {warm['transport']:>12.4f}")
    print("warm: wall time per candidate through a started WorkerPool ((first): its first "
          "evaluation, which also compiles the task's reference); fresh: a new python process "
          "per candidate; kernel: the candidate's own trace + lowering + compile + runs, "
          "measured in the worker; overhead: share of the warm wall time that is not kernel "
          "(harness: inputs, reference, comparisons, reference timing, checks; transport: "
          "socket, JSON, scheduling).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
