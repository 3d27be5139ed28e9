"""How close is a scaled estimate to the full one, and what does each cost?

The TPU compiler's estimator simulates every grid step: at production sizes it is too
slow and too hungry to run whole (minutes and many GB for a 2,048-step matmul). The
harness therefore estimates a candidate from two shortened grids and scales the
kernel's cycles to the production grid (``kernels.worker.candidate.production`` /
``kernels.worker.tpu.estimates``), and an XLA reference that is too costly from two
smaller values of a batch-like size (``kernels.worker.tpu.shrink``). This benchmark runs
both ways on cases where the full estimate is still affordable here and prints, per
case, the full and the derived cycles, their ratio, and the wall time of each.

    python benchmarks/estimates/estimate_scaling.py [--chip v5e] [--only NAME ...] [--smoke]

It uses the harness's own compile processes (memory- and time-bounded) and a fresh
on-disk cache, so every figure is a real compile. Run it on an idle machine: the
times are wall clock. ``--smoke``: one small gelu whose grid needs no scaling, with
``$TILEWRIGHT_CACHE_DIR``'s compile cache when set (a repeated smoke run compiles
nothing): that it runs.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# The bundled matmul_bias_gelu kernel (a tiled matmul, bias + GELU fused) with 512 blocks.
TILED_MATMUL = {"BLOCK_M": 512, "BLOCK_N": 512, "BLOCK_K": 512}

# (name, bundled task, production sizes, tunables set in the task's own kernel, or None)
CASES = [
    ("softmax 4096x4096 (32-row blocks)", "softmax", {"rows": 4096, "cols": 4096}, None),
    ("gelu 2048x2048 (64x256 blocks)", "gelu", {"rows": 2048, "cols": 2048}, None),
    ("rmsnorm 8192x4096", "rmsnorm", {"rows": 8192, "cols": 4096}, None),
    ("matmul+gelu 1024x4096x4096 (512 blocks)", "matmul_bias_gelu",
     {"m": 1024, "k": 4096, "n": 4096}, TILED_MATMUL),
    ("matmul+gelu 2048x2048x2048 (512 blocks)", "matmul_bias_gelu",
     {"m": 2048, "k": 2048, "n": 2048}, TILED_MATMUL),
]
SMOKE_CASE = ("gelu 256x1024 (64x256 blocks, smoke)", "gelu", {"rows": 256, "cols": 1024}, None)


def main(argv: list[str] | None = None) -> int:
    from tilewright.kernels.pool.env import ESTIMATE_CACHE
    from tilewright.profiling.chips import DEFAULT_TPU

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", default=DEFAULT_TPU)
    parser.add_argument("--only", nargs="*", help="case name prefixes")
    parser.add_argument("--memory-mb", type=int, default=8192,
                        help="limit of each compile process (the full estimates need more "
                             "than the harness's 4096 MB on the larger cases)")
    parser.add_argument("--smoke", action="store_true",
                        help="that it runs: tiny sizes, one repetition (tests/test_benchmarks.py)")
    args = parser.parse_args(argv)
    shared = os.environ.get("TILEWRIGHT_CACHE_DIR") if args.smoke else None
    if shared:
        cache = os.path.join(shared, "estimates")
    else:
        cache = tempfile.mkdtemp(prefix="tilewright-bench-cache-")
        atexit.register(shutil.rmtree, cache, ignore_errors=True)
    os.makedirs(cache, exist_ok=True)
    os.environ[ESTIMATE_CACHE] = cache
    cases = [SMOKE_CASE] if args.smoke else CASES

    from tilewright.kernels.worker.tpu import tpu_compile

    tpu_compile.prepare_environment(estimates=False)
    import jax

    from tilewright.kernels.source import tunables
    from tilewright.kernels.tasks.loaders import PRODUCTION_PREFIX, load_task
    from tilewright.kernels.worker.candidate import production
    from tilewright.kernels.worker.execution import task_runtime
    from tilewright.kernels.worker.tpu import compile_pool, estimates, reference, shrink
    from tilewright.kernels.worker.tpu.reference_programs import export_spec

    chip = args.chip
    comp = compile_pool.compilers()
    print(f"chip {chip}; libtpu {comp.libtpu}; compile processes limited to "
          f"{args.memory_mb} MB; cache {cache} ({'shared' if shared else 'fresh'})")
    print(f"{'case':<42} {'what':<9} {'steps':>6} {'full cycles':>12} {'derived':>12} "
          f"{'ratio':>6} {'full s':>7} {'derived s':>9}")
    ratios = []
    for name, task_name, sizes, blocks in cases:
        if args.only and not any(name.startswith(p) for p in args.only):
            continue
        task = load_task(task_name, {PRODUCTION_PREFIX + k: str(v) for k, v in sizes.items()})
        ptask = task.production_task()
        spec = ptask.to_spec()
        runtime = task_runtime(spec)
        own = task.starting_source() or ""
        entry = runtime.load_candidate(tunables.apply(own, blocks) if blocks else own,
                                       "kernel.py")
        dyn, static, _ = runtime.input_signature(ptask.shapes[0])
        with tpu_compile.abstract_device(chip):
            closed = jax.jit(entry).trace(*dyn, *static).jaxpr
        plans = production.plan(closed)
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in dyn]
        programs = {"full": production.export(production.variant(closed, plans, None),
                                              avals, chip)}
        if production.any_scaled(plans):
            for i in (0, 1):
                programs[f"scaled{i}"] = production.export(
                    production.variant(closed, plans, i), avals, chip)
        deadline = time.monotonic() + 900
        t = time.perf_counter()
        derived = estimates.candidate_estimate(programs, [p.to_json() for p in plans], chip,
                                               deadline, args.memory_mb)
        derived_s = time.perf_counter() - t
        t = time.perf_counter()
        whole = comp.compile(programs["full"], chip, "estimate", deadline, args.memory_mb)
        full_s = time.perf_counter() - t
        steps = sum(p.steps for p in plans)
        d = (derived.get("estimate") or {}).get("cycles")
        f = (estimates.estimate_of(whole["records"], chip)["cycles"]
             if whole.get("records") is not None else None)
        ratio = d / f if d and f else None
        if ratio:
            ratios.append(ratio)
        print(f"{name:<42} {'kernel':<9} {steps:>6} {f or '—':>12} {d or '—':>12} "
              f"{f'{ratio:.3f}' if ratio else '—':>6} {full_s:>7.1f} {derived_s:>9.1f}"
              + ("" if f else f"   full: {whole.get('message')}"))
        # the reference: whole, and from two smaller sizes of its batch-like parameter
        config = ptask.shapes[0]
        choice = shrink.batch_parameter(ptask, config)
        if choice is None:
            continue
        param, value = choice
        t = time.perf_counter()
        full_ref = export_spec(spec, chip)
        answer = comp.compile(full_ref.blob, chip, "estimate", deadline, args.memory_mb)
        full_s = time.perf_counter() - t
        f = (estimates.estimate_of(answer["records"], chip)["cycles"]
             if answer.get("records") is not None else None)
        t = time.perf_counter()
        totals = []
        for n in (value // 4, value // 2):
            sized = shrink.with_size(ptask, config, param, n).to_spec()
            blob = export_spec(sized, chip).blob
            got = comp.compile(blob, chip, "estimate", deadline, args.memory_mb)
            if got.get("records") is None:
                break
            totals.append(sum(r["cycles"] * r["count"] for r in got["records"]))
        derived_s = time.perf_counter() - t
        d, line = (reference.scale_reference(totals[0], totals[1], value // 4, value // 2,
                                             value)[:2] if len(totals) == 2 else (None, None))
        ratio = d / f if d and f else None
        if ratio:
            ratios.append(ratio)
        line_ratio = f"; a line through both: {line / f:.3f}" if line and f else ""
        print(f"{'':<42} {'XLA ref':<9} {param + '=' + str(value):>6} {f or '—':>12} "
              f"{d or '—':>12} {f'{ratio:.3f}' if ratio else '—':>6} {full_s:>7.1f} "
              f"{derived_s:>9.1f}   (per unit at {param}={value // 2}{line_ratio})")
    if ratios:
        worst = max(abs(r - 1) for r in ratios)
        print(f"\nderived/full over {len(ratios)} figures: min {min(ratios):.3f}, max "
              f"{max(ratios):.3f}; worst |ratio - 1| = {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
