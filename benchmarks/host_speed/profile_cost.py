"""What a profile costs: the profiled run against the plain timed run of one candidate.

For each task (default: the bundled gelu, softmax and matmul_bias_gelu at their first
small shape) the task's starting kernel is jitted and warmed up once, then, in the
same process and on the same inputs, alternately:

(a) plain: ``iters`` timed calls (``kernels.worker.evaluation.timing.measure``, fixed count,
    one warm-up call, as the eval harness times a candidate);
(b) profiled: the same warm-up + ``iters`` calls under ``jax.profiler.trace``
    (``profiling.capture``), then xprof's conversion into our Timeline with the op
    table and Pallas share (``profiling.convert``), plus the static analysis of every
    pallas_call (``profiling.static``).

Printed per task: both wall times (median of --reps), their ratio, and the profiled
run's phases. On a CPU host the kernels run in TPU interpret mode: the absolute
times are a simulator's, the ratio is what the profiling machinery adds.

    python benchmarks/host_speed/profile_cost.py [--tasks gelu softmax] [--reps 3] [--iters 3] [--smoke]

``--smoke``: gelu, one repetition of one iteration: that it runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["gelu", "softmax", "matmul_bias_gelu"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="that it runs: tiny sizes, one repetition (tests/test_benchmarks.py)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tasks, args.reps, args.iters = ["gelu"], 1, 1

    import jax
    from jax.experimental.pallas import tpu as pltpu

    from tilewright.kernels.tasks.loaders import load_task
    from tilewright.kernels.worker.backend import backend_info
    from tilewright.kernels.worker.evaluation import timing
    from tilewright.kernels.worker.runtime import load_runtime
    from tilewright.profiling import convert
    from tilewright.profiling.capture import capture
    from tilewright.profiling.chips import DEFAULT_TPU, get_chip
    from tilewright.profiling.static import analyze_callable

    backend = backend_info()
    interpret = backend["mode"] == "tpu-interpret"
    print(f"backend: {backend['platform']} ({backend['mode']}), jax {backend['jax_version']}, "
          f"iters={args.iters}, reps={args.reps}")
    print(f"{'task':<18} {'plain ms':>10} {'profiled ms':>12} {'ratio':>7}   "
          "profiled phases (median ms): static / capture / convert")
    mode = pltpu.force_tpu_interpret_mode() if interpret else _null()
    with mode:
        for name in args.tasks:
            task = load_task(name)
            runtime = load_runtime(task.to_spec())
            config = runtime.configs_for(backend["platform"])[0]
            dyn, static = runtime.make_inputs(config, jax.random.PRNGKey(0))
            entry = runtime.load_candidate(task.starting_source(), "kernel.py")
            argnums = tuple(range(len(dyn), len(dyn) + len(static))) or None
            fn = jax.jit(entry, static_argnums=argnums)
            call_args = (*dyn, *static)
            jax.block_until_ready(fn(*call_args))  # compile outside both measurements
            plain, profiled = [], []
            phases: dict[str, list[float]] = {"static": [], "capture": [], "convert": []}
            for _ in range(args.reps):
                t0 = time.perf_counter()
                timing.measure(fn, call_args, budget_s=0.0, iters=args.iters, warmup=1)
                plain.append(time.perf_counter() - t0)

                t0 = time.perf_counter()
                analyze_callable(entry, tuple(dyn), tuple(static), chip=get_chip(DEFAULT_TPU))
                t1 = time.perf_counter()
                with tempfile.TemporaryDirectory() as logdir:
                    cap = capture(fn, call_args, logdir, iters=args.iters, warmup=1)
                    t2 = time.perf_counter()
                    trace, _log = convert.trace_events(cap["xplane"][0])
                    timeline = convert.timeline_from_trace(trace)
                    convert.top_ops(timeline)
                    convert.pallas_share(timeline)
                    t3 = time.perf_counter()
                profiled.append(t3 - t0)
                phases["static"].append(t1 - t0)
                phases["capture"].append(t2 - t1)
                phases["convert"].append(t3 - t2)
            p, q = statistics.median(plain) * 1e3, statistics.median(profiled) * 1e3
            ph = " / ".join(f"{statistics.median(v) * 1e3:.0f}" for v in phases.values())
            print(f"{name:<18} {p:>10.1f} {q:>12.1f} {q / p:>6.2f}x   {ph}")
    return 0


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
