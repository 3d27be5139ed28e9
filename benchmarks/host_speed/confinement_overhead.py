"""Cost of worker confinement: a small task's warm evaluation, confined and not.

Two warm ``WorkerPool``s run side by side: one with the default confinement
(namespaces, Landlock, rlimits: whatever this host allows, printed), one with
``TILEWRIGHT_CONFINE=off`` (rlimits and the after-request cleanup only, the cheapest
setting the app offers). Requests alternate between the two so machine load hits
both alike. Printed: the median and spread of the wall time per evaluation for each,
their ratio, and the median cost of the after-request descendant scan (measured in
this process over /proc, the same code the worker runs). Also the start-up time of a
worker in each mode.

    python benchmarks/host_speed/confinement_overhead.py [--task gelu] [--set rows=64 --set cols=256]
                                              [--reps 15] [--timing] [--smoke]

``--smoke``: an 8x128 gelu, one repetition, no TPU compile: that it runs.

Target (issue 13): confined evaluation within 15% of unconfined.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from tilewright.kernels.confinement import descendants
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.tasks.loaders import load_task, parse_overrides


async def main(args: argparse.Namespace) -> None:
    task = load_task(args.task, parse_overrides(args.set))
    source = task.starting_source()
    options = EvalOptions(trials=3, timeout_s=120, timing=args.timing, time_budget_s=0.3,
                          iters=10 if args.timing else None, shapes=["small"],
                          lowering=not args.smoke)
    pools = {}
    for mode, env in (("confined", None), ("unconfined", {"TILEWRIGHT_CONFINE": "off"})):
        started = time.perf_counter()
        pool = WorkerPool(size=1, env_overrides=env)
        await pool.start()
        print(f"{mode:<11} start {time.perf_counter() - started:6.2f} s  "
              f"{(pool.confinement or {}).get('summary')}", flush=True)
        pools[mode] = pool
    try:
        for pool in pools.values():  # first evaluation compiles the reference: not counted
            if not args.smoke:
                await pool.evaluate(task, source, options)
        walls: dict[str, list[float]] = {m: [] for m in pools}
        for _ in range(args.reps):
            for mode, pool in pools.items():
                t = time.perf_counter()
                result = await pool.evaluate(task, source, options)
                walls[mode].append(time.perf_counter() - t)
                assert result.status == "correct", result.error
        for mode, values in walls.items():
            q = statistics.quantiles(values, n=10) if len(values) > 1 else values
            print(f"{mode:<11} eval median {statistics.median(values) * 1000:8.1f} ms  "
                  f"p10 {q[0] * 1000:8.1f}  p90 {q[-1] * 1000:8.1f}  (n={len(values)})")
        ratio = statistics.median(walls["confined"]) / statistics.median(walls["unconfined"])
        print(f"confined / unconfined: {ratio:.3f} ({(ratio - 1) * 100:+.1f}%)")
    finally:
        for pool in pools.values():
            await pool.close()
    scans = []
    for _ in range(2 if args.smoke else 20):
        t = time.perf_counter()
        descendants(os.getpid())
        scans.append(time.perf_counter() - t)
    print(f"descendant scan of /proc ({len(os.listdir('/proc'))} entries): median "
          f"{statistics.median(scans) * 1000:.2f} ms per request")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="gelu")
    parser.add_argument("--set", action="append", default=None, metavar="KEY=VALUE")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--timing", action="store_true",
                        help="include timing (10 fixed iterations) in each evaluation")
    parser.add_argument("--smoke", action="store_true", help="that it runs: tiny sizes, one repetition (tests/test_benchmarks.py)")
    args = parser.parse_args()
    args.set = args.set or (["rows=8", "cols=128"] if args.smoke else ["rows=64", "cols=256"])
    if args.smoke:
        args.reps = 1
    asyncio.run(main(args))
