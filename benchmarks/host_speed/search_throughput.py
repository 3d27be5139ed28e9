"""Evaluations per minute with 1 and 2 local workers, and Ray's overhead per evaluation.

What a search can afford depends on how many candidates its executor evaluates per
minute. This script submits the same batch of candidates (tuning variants of a task's
starting kernel, all distinct sources) to:

- ``LocalExecutor(workers=1)`` and ``LocalExecutor(workers=2)``: throughput and the
  speed-up of the second worker;
- ``RayExecutor(workers=2)`` on a local Ray instance: throughput against local with
  the same number of workers, and the overhead per evaluation measured on one-at-a-time
  evaluations (Ray latency minus local latency, both on warm workers).

Start-up (JAX import in the workers, Ray's own start) is reported apart from the timed
batch. On a CPU host the kernels run in TPU interpret mode: the figures describe the
evaluation pipeline on this machine, not TPU performance.

    JAX_PLATFORMS=cpu python benchmarks/host_speed/search_throughput.py [--task gelu] [--evals 8] [--smoke]

``--smoke``: an 8x128 gelu, one evaluation on one local worker, no TPU compile, no Ray:
that it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from tilewright.kernels.pool import LocalExecutor, RayExecutor, usable_cores
from tilewright.kernels.pool.workers import EvalOptions
from tilewright.kernels.source import tunables
from tilewright.kernels.tasks.loaders import load_task


def candidates(source: str, count: int) -> list[str]:
    """Distinct legal tuning variants of the starting kernel (cycled if too few)."""
    legal = tunables.legal_choices(source)
    variants = [source]
    for name, values in legal.items():
        for value in values:
            new = tunables.apply(source, {name: value})
            if new not in variants:
                variants.append(new)
    return [variants[i % len(variants)] for i in range(count)]


async def batch(executor, task, sources, options) -> tuple[float, list[str]]:
    started = time.perf_counter()
    results = await asyncio.gather(*(executor.evaluate(task, s, options) for s in sources))
    wall = time.perf_counter() - started
    return wall, [r.status if r.correct else f"{r.status}: {r.error and r.error.message}"
                  for r in results]


async def sequential(executor, task, sources, options) -> list[tuple[float, float]]:
    """(latency, overhead) per evaluation: overhead is the latency minus the time the
    JAX worker spent evaluating, i.e. what the executor adds (transport, scheduling)."""
    out = []
    for source in sources:
        started = time.perf_counter()
        result = await executor.evaluate(task, source, options)
        latency = time.perf_counter() - started
        worker_s = (result.extra.get("phases") or {}).get("worker_s") or 0.0
        out.append((latency, latency - worker_s))
    return out


async def measure(name: str, executor, task, sources, options, seq: list[str]) -> dict:
    started = time.perf_counter()
    await executor.start()
    startup = time.perf_counter() - started
    try:
        # warm every worker (Ray starts its worker processes on first use)
        await asyncio.gather(*(executor.evaluate(task, sources[0], options)
                               for _ in range(executor.capacity)))
        wall, statuses = await batch(executor, task, sources, options)
        latencies = await sequential(executor, task, seq, options) if seq else []
    finally:
        await executor.close()
    bad = sorted({s for s in statuses if s != "correct"})
    row = {"name": name, "capacity": executor.capacity, "startup_s": startup, "wall_s": wall,
           "evals": len(sources), "per_min": 60.0 * len(sources) / wall,
           "latency_s": statistics.median(x for x, _ in latencies) if latencies else None,
           "overhead_s": statistics.median(o for _, o in latencies) if latencies else None,
           "failed": bad}
    print(f"{name:<10} capacity {executor.capacity}  start-up {startup:6.1f} s  "
          f"{len(sources)} evals in {wall:6.1f} s = {row['per_min']:6.1f} evals/min"
          + (f"  one at a time: median {row['latency_s']:.2f} s, of which "
             f"{row['overhead_s'] * 1000:.0f} ms outside the JAX worker" if latencies else "")
          + (f"  NOT CORRECT: {bad}" if bad else ""), flush=True)
    return row


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="gelu")
    parser.add_argument("--set", dest="overrides", action="append",
                        default=["rows=64", "cols=256"], metavar="KEY=VALUE")
    parser.add_argument("--evals", type=int, default=8, help="evaluations per batch")
    parser.add_argument("--sequential", type=int, default=6,
                        help="one-at-a-time evaluations for the latency comparison")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="that it runs: tiny sizes, one repetition (tests/test_benchmarks.py)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.overrides = ["rows=8", "cols=128"]
        args.evals, args.sequential, args.no_ray = 1, 1, True
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    overrides = dict(item.split("=", 1) for item in args.overrides)
    task = load_task(args.task, overrides)
    sources = candidates(task.starting_source() or "", args.evals)
    seq = sources[: args.sequential]
    options = EvalOptions(trials=1, time_budget_s=0.3, lowering=not args.smoke)
    print(f"task {task.name} {overrides}, {args.evals} evaluations per batch "
          f"({len(set(sources))} distinct sources), {usable_cores()} usable cores, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    one = await measure("local x1", LocalExecutor(1), task, sources, options, seq)
    if args.smoke:
        return
    two = await measure("local x2", LocalExecutor(2), task, sources, options, [])
    print(f"second local worker: {two['per_min'] / one['per_min']:.2f}x the evaluations "
          "per minute of one")
    if args.no_ray:
        return
    ray = await measure("ray x2", RayExecutor(workers=2, num_cpus=2), task, sources, options,
                        seq)
    print(f"ray x2 vs local x2 throughput: {ray['per_min'] / two['per_min']:.2f}x")
    extra = ray["overhead_s"] - one["overhead_s"]
    print(f"ray overhead per evaluation against local (time outside the JAX worker, warm "
          f"workers, one at a time): {extra * 1000:+.0f} ms ({ray['overhead_s'] * 1000:.0f} ms "
          f"vs {one['overhead_s'] * 1000:.0f} ms); as a share of a local evaluation's "
          f"latency: {extra / one['latency_s'] * 100:+.1f}%")


if __name__ == "__main__":
    asyncio.run(main())
