"""Where a judge's host time goes on a chip: the primitives an evaluation repeats at
TPU sizes, each timed alone on the default device.

    python benchmarks/on_chip/chip_host_costs.py [--mib 256] [--task matmul_bias_gelu] [--smoke]

Prints one JSON line: device-to-host and host-to-device copies of an f32 array of
``--mib`` MiB (the judge takes every reference and every candidate output to the host),
the comparison (``judge_output``) by the host's numpy rules and with the clear pass
decided on the device (``compare.on_device``, the judge's way on a TPU), and for ``--task``
at its production shape: building the inputs, one reference call, and that call with its
output taken to the host. Measured, not asserted: run it on a TPU host (the v5e under
gVisor copies at its own speed) and beside an evaluation's ``extra.phases``. ``--smoke``:
4 MiB and gelu's first check shape instead of its production shape (the suite's run).
"""

from __future__ import annotations

import argparse
import json
import time


def _best(fn, repeat=3):
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    import jax
    import numpy as np

    from tilewright.kernels.tasks.loaders import load_task
    from tilewright.kernels.worker.evaluation.compare import judge_output, to_host
    from tilewright.kernels.worker.execution import jitted_reference, task_runtime

    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--task", default="matmul_bias_gelu")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.mib, args.task = 4, "gelu"
    n = args.mib * 2**20 // 4
    x = jax.block_until_ready(jax.random.normal(jax.random.PRNGKey(0), (n // 1024, 1024)))
    host = np.asarray(x)
    out: dict = {"device": str(jax.devices()[0]), "mib": args.mib}
    out["d2h_s"] = _best(lambda: np.asarray(x + 0.0))
    out["add_only_s"] = _best(lambda: jax.block_until_ready(x + 0.0))
    out["h2d_s"] = _best(lambda: jax.block_until_ready(jax.device_put(host)))
    ref = to_host(x)
    noisy = to_host(x + 1e-7)
    from tilewright.kernels.worker.evaluation import compare

    compare.DEVICE_COMPARE = False  # the host's numpy rules
    out["compare_host_s"] = _best(lambda: judge_output(noisy, ref, None, 1e-4, 1e-3), 2)
    compare.DEVICE_COMPARE = True  # the clear pass decided on the device (the judge's way)
    judge_output(noisy, ref, None, 1e-4, 1e-3)  # compiled once
    out["compare_device_s"] = _best(lambda: judge_output(noisy, ref, None, 1e-4, 1e-3), 2)
    compare.DEVICE_COMPARE = None

    task = load_task(args.task)
    production = task if args.smoke else task.production_task()
    runtime = task_runtime(production.to_spec())
    config = production.shapes[0]
    out["task"] = {"name": task.name, "shape": config.name}
    out["task"]["inputs_s"] = _best(lambda: jax.block_until_ready(
        runtime.make_inputs(config, jax.random.PRNGKey(1))[0]))
    dyn, static = runtime.make_inputs(config, jax.random.PRNGKey(1))
    fn = jitted_reference(runtime, len(dyn), len(static))
    started = time.perf_counter()
    jax.block_until_ready(fn(*dyn, *static))
    out["task"]["reference_first_call_s"] = time.perf_counter() - started
    out["task"]["reference_call_s"] = _best(lambda: jax.block_until_ready(fn(*dyn, *static)))
    out["task"]["reference_to_host_s"] = _best(lambda: to_host(fn(*dyn, *static)), 2)
    out["task"]["output_mib"] = sum(int(np.prod(a.shape)) * 4 for a in
                                    jax.tree.leaves(fn(*dyn, *static))) / 2**20
    print(f"{out['device']}: {args.mib} MiB off the device {out['d2h_s']:.3f} s, onto it "
          f"{out['h2d_s']:.3f} s, compared on the host {out['compare_host_s']:.3f} s, "
          f"on the device {out['compare_device_s']:.3f} s; "
          f"{task.name} at {config.name}: inputs {out['task']['inputs_s']:.3f} s, reference "
          f"{out['task']['reference_call_s']:.4f} s, with its output to the host "
          f"{out['task']['reference_to_host_s']:.4f} s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
