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

    python benchmarks/host_speed/eval_overhead.py [--tasks gelu softmax] [--set rows=64 --set cols=256]
                                       [--reps 3] [--iters 10] [--smoke]

Then, for each task at its own check shapes, a fresh worker's first evaluation with the
programs an earlier judge kept on disk against none kept (``TILEWRIGHT_KEEP_PROGRAMS=0``),
alternated: the judge's own CPU and the wall time.

``--smoke``: an 8x128 gelu, one repetition, one timed iteration, no TPU compile: that
both paths (and, with ``--script-per-candidate``, the third) run; not the kept programs.

Targets: warm >= 5x faster than fresh for small kernels; overhead < 10%.

With ``--script-per-candidate`` it also runs (c), a harness built the way MaxKernel's
local evaluator works: a fresh Python process per candidate that imports JAX, builds
the inputs, runs the candidate with plain ``interpret=True`` (``pl.pallas_call`` forced
to interpret), checks it once against the reference, then times 5 warm-ups + 20 timed
runs of candidate and reference. Our warm evaluation for that comparison uses the
default options (adaptive: a few host-simulation iterations off-TPU) and includes the
TPU compile and the compiler's estimate for ``--chip``. Targets (issue 12): warm
evaluation, TPU compile and estimate included, <= 0.8 s for a small task and >= 4x
faster than the script-per-candidate harness in the same run.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository

from tilewright.kernels.judge.result import EvalResult  # noqa: E402
from tilewright.kernels.pool.env import worker_environment  # noqa: E402
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool  # noqa: E402
from tilewright.kernels.tasks.loaders import load_task  # noqa: E402
from tilewright.profiling.chips import DEFAULT_TPU  # noqa: E402

KERNEL_PHASES = ("trace_lower_s", "kernel_run_s", "kernel_timing_s")

FRESH_SCRIPT = (
    "import json, sys\n"
    "from tilewright.kernels.worker.evaluation.evaluate import evaluate_request\n"
    "print(json.dumps(evaluate_request(json.load(sys.stdin))))\n"
)


SCRIPT_PER_CANDIDATE = """
import json, sys, time
import numpy as np
spec = json.load(sys.stdin)
import jax
from jax.experimental import pallas as pl
_original = pl.pallas_call
def _interpret(*a, **k):
    k["interpret"] = True  # plain interpret mode, as a MaxKernel candidate runs off-TPU
    return _original(*a, **k)
pl.pallas_call = _interpret
from tilewright.kernels.worker.runtime import load_runtime
runtime = load_runtime(spec["task"])
config = [c for c in runtime.configs() if c.name == spec["shape"]][0]
dyn, static = runtime.make_inputs(config, jax.random.PRNGKey(0))
entry = runtime.load_candidate(spec["source"], spec["filename"])
kernel = jax.jit(entry, static_argnums=tuple(range(len(dyn), len(dyn) + len(static))) or None)
ref = jax.jit(runtime.reference, static_argnums=tuple(range(len(dyn), len(dyn) + len(static))) or None)
out = np.asarray(jax.block_until_ready(kernel(*dyn, *static)))
expected = np.asarray(jax.block_until_ready(ref(*dyn, *static)))
ok = bool(np.allclose(out, expected, atol=1e-2, rtol=1e-2))
def bench(fn):
    for _ in range(5):
        jax.block_until_ready(fn(*dyn, *static))
    times = []
    for _ in range(20):
        t = time.perf_counter(); jax.block_until_ready(fn(*dyn, *static))
        times.append(time.perf_counter() - t)
    return float(np.median(times))
print(json.dumps({"correct": ok, "kernel_s": bench(kernel), "reference_s": bench(ref)}))
"""


def script_path(task, source: str, shape: str, reps: int) -> dict:
    """(c): a fresh process per candidate, plain interpret=True, 5 warm-ups + 20 runs."""
    payload = json.dumps({"task": task.to_spec(), "source": source, "shape": shape,
                          "filename": str(task.kernel_path)})
    env = worker_environment()
    walls = []
    for _ in range(reps):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", SCRIPT_PER_CANDIDATE], input=payload,
                              env=env, capture_output=True, text=True, cwd=ROOT)
        walls.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"script-per-candidate process failed:\n{proc.stderr[-3000:]}")
        assert json.loads(proc.stdout.strip().splitlines()[-1])["correct"]
    return {"wall_s": statistics.median(walls)}


# How the warm path's candidates arrive (set by --candidates and --gap): "distinct" is a
# session's case, each a different source judged in a process no candidate ran in (the
# spare started after the last one); "same" re-evaluates one source in its own process.
CANDIDATES = {"kind": "distinct", "gap_s": 2.0}


async def warm_runs(task, source: str, options: EvalOptions, reps: int
                    ) -> tuple[float, list[tuple[float, EvalResult]]]:
    """A started WorkerPool's first evaluation (it also compiles the task's reference)
    and ``reps`` more: (first wall time, [(wall time, result)]). Distinct candidates
    differ by a comment and come ``gap_s`` apart (the time an agent takes to answer)."""
    async with WorkerPool(size=1) as pool:
        first, runs = 0.0, []
        for rep in range(reps + 1):
            this = source
            if CANDIDATES["kind"] == "distinct":
                this = f"{source.rstrip()}\n# candidate {rep}\n"
                if rep:
                    await asyncio.sleep(CANDIDATES["gap_s"])
            start = time.perf_counter()
            result = await pool.evaluate(task, this, options, filename=str(task.kernel_path))
            wall = time.perf_counter() - start
            assert result.status == "correct", (result.status, result.error)
            if rep == 0:
                first = wall
            else:
                runs.append((wall, result))
    return first, runs


async def ours_path(task, source: str, options: EvalOptions, reps: int) -> dict:
    """Our warm evaluation with default timing (host simulation: a few iterations) and
    the TPU compile + estimate for options.chip."""
    first, runs = await warm_runs(task, source, options, reps)
    return {"wall_s": statistics.median(wall for wall, _ in runs), "first_s": first,
            "tpu": runs[-1][1].tpu}


def _table(header: str) -> None:
    print(header)
    print("-" * len(header))


def _tasks(names: list[str], overrides: dict) -> list[tuple[str, Any, str]]:
    """(name, task, starting source) of each task that has a starting kernel."""
    found = []
    for name in names:
        task = load_task(name, overrides)
        source = task.starting_source()
        if source is None:
            print(f"{name}: no starting kernel, skipped")
            continue
        found.append((name, task, source))
    return found


def compare_script(args: argparse.Namespace, overrides: dict) -> None:
    options = EvalOptions(trials=args.trials, shapes=[args.shape], timeout_s=600.0,
                          chip=args.chip, lowering=not args.smoke)
    print(f"\nours vs script-per-candidate (MaxKernel-style): chip {args.chip}, trials "
          f"{args.trials}, median of {args.reps}")
    _table(f"{'task':<10} {'ours s':>7} {'(first)':>8} {'script s':>9} {'script/ours':>11} "
           f"{'TPU compile':>12} {'estimate':>22}")
    for name, task, source in _tasks(args.tasks, overrides):
        ours = asyncio.run(ours_path(task, source, options, args.reps))
        script = script_path(task, source, args.shape, args.reps)
        tpu = ours["tpu"] or {}
        est = (f"est. {tpu['estimated_speedup']:.2f}x on {tpu['chip']}"
               if tpu.get("estimated_speedup") else str(tpu.get("estimate_unavailable")))
        print(f"{name:<10} {ours['wall_s']:>7.3f} {ours['first_s']:>8.3f} "
              f"{script['wall_s']:>9.3f} {script['wall_s'] / ours['wall_s']:>10.1f}x "
              f"{tpu.get('compile')!s:>12} {est:>22}")
    print("ours: a warm WorkerPool evaluation (correctness trials on the shape, TPU compile "
          "and the compiler's static estimate for the chip, host simulation timing); "
          "script: a fresh python per candidate, plain interpret=True, one correctness "
          "check, 5 warm-ups + 20 timed runs of candidate and reference.")


def split(result_json: dict, wall: float) -> dict:
    phases = result_json["extra"]["phases"]
    kernel = sum(phases.get(name, 0.0) for name in KERNEL_PHASES)
    handler = phases["worker_s"]
    return {"wall": wall, "kernel": kernel, "harness": handler - kernel,
            "transport": wall - handler}


async def warm_path(task, source: str, options: EvalOptions, reps: int) -> dict:
    first, done = await warm_runs(task, source, options, reps)
    runs = [split(result.to_json(), wall) for wall, result in done]
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    return {"first_s": first, **median}


def fresh_path(task, source: str, options: EvalOptions, reps: int) -> dict:
    payload = json.dumps({"task": task.to_spec(), "source": source,
                          "filename": str(task.kernel_path), "options": options.to_json()})
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


def _cpu_s(pid: int) -> float:
    """A process's own CPU time so far (Linux /proc), seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def first_evaluation(task, source: str, options: EvalOptions, cache: str,
                           keep: bool) -> dict:
    """A fresh worker's first evaluation of ``task``: its wall time and the judge's own
    CPU (inputs, reference, comparisons, timing programs: compiled, or loaded from the
    programs earlier judges kept in ``cache``)."""
    env = {"TILEWRIGHT_CACHE_DIR": cache, "TILEWRIGHT_KEEP_PROGRAMS": "1" if keep else "0"}
    async with WorkerPool(size=1, env_overrides=env) as pool:
        await pool.request("hello", {})
        judge = pool.pids[0]
        before = _cpu_s(judge)
        start = time.perf_counter()
        result = await pool.evaluate(task, source, options, filename=str(task.kernel_path))
        wall = time.perf_counter() - start
        cpu = _cpu_s(judge) - before
    assert result.status == "correct", (result.status, result.error)
    return {"wall": wall, "cpu": cpu}


def kept_programs(args: argparse.Namespace) -> None:
    """The judge's compiled programs kept on disk: a fresh worker's first evaluation of
    each task at its own check shapes, the folder warm against none kept, alternated."""
    import tempfile

    options = EvalOptions(trials=args.trials, iters=args.iters, timeout_s=600.0,
                          chip=args.chip)
    print(f"\na fresh worker's first evaluation, the task's own check shapes: the judge's "
          f"programs kept on disk (warm) or not (TILEWRIGHT_KEEP_PROGRAMS=0), median of "
          f"{args.reps}")
    _table(f"{'task':<10} {'judge CPU s':>12} {'kept':>6} {'ratio':>6} "
           f"{'wall s':>7} {'kept':>6}")
    for name, task, source in _tasks(args.tasks, {}):
        with tempfile.TemporaryDirectory(prefix="tw-kept-") as cache:
            asyncio.run(first_evaluation(task, source, options, cache, True))  # fills it
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(args.reps):
                for keep in (False, True):
                    runs[keep].append(asyncio.run(first_evaluation(task, source, options,
                                                                   cache, keep)))
        med = {k: {m: statistics.median(r[m] for r in v) for m in ("cpu", "wall")}
               for k, v in runs.items()}
        print(f"{name:<10} {med[False]['cpu']:>12.2f} {med[True]['cpu']:>6.2f} "
              f"{med[False]['cpu'] / max(med[True]['cpu'], 1e-9):>5.1f}x "
              f"{med[False]['wall']:>7.2f} {med[True]['wall']:>6.2f}")
    print("judge CPU: the worker process's own CPU during the evaluation (the candidate "
          "and compile processes are others); kept: with the programs an earlier judge "
          "kept (where Landlock confines writes; elsewhere both columns compile).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["gelu", "softmax"])
    parser.add_argument("--shape", default="small", help="shape configuration to evaluate")
    parser.add_argument("--set", dest="overrides", action="append", default=None,
                        metavar="KEY=VALUE", help="shape overrides (default rows=64, cols=256)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10, help="fixed timing iterations")
    parser.add_argument("--script-per-candidate", action="store_true",
                        help="also compare with a MaxKernel-style script-per-candidate harness")
    parser.add_argument("--only-script", action="store_true",
                        help="run only that comparison")
    parser.add_argument("--chip", default=DEFAULT_TPU, help="TPU chip our evaluation compiles for")
    parser.add_argument("--candidates", choices=("distinct", "same"), default="distinct",
                        help="warm path: a different source each time (a session's case, "
                        "each in a fresh candidate process) or the same one again")
    parser.add_argument("--gap", type=float, default=2.0,
                        help="seconds between distinct candidates (an agent's answer time)")
    parser.add_argument("--smoke", action="store_true",
                        help="that it runs: tiny sizes, one repetition (tests/test_benchmarks.py)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tasks, args.reps, args.iters = args.tasks[:1], 1, 1
        args.overrides = args.overrides or ["rows=8", "cols=128"]
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    CANDIDATES.update(kind=args.candidates, gap_s=0.0 if args.smoke else args.gap)
    options = EvalOptions(trials=args.trials, iters=args.iters, shapes=[args.shape],
                          timeout_s=600.0, lowering=not args.smoke)
    overrides = dict(o.split("=", 1) for o in (args.overrides or ["rows=64", "cols=256"]))
    if args.only_script:
        compare_script(args, overrides)
        return 0
    print(f"eval overhead: trials={args.trials}, timing iters={args.iters}, shape "
          f"{args.shape!r} with {overrides}, median of {args.reps}, JAX_PLATFORMS={os.environ['JAX_PLATFORMS']}, "
          f"{os.cpu_count()} CPUs; warm candidates: {args.candidates}"
          + (f", {args.gap:g} s apart" if args.candidates == "distinct" else ""))
    _table(f"{'task':<10} {'warm s':>7} {'(first)':>8} {'fresh s':>8} {'fresh/warm':>10} "
           f"{'kernel s':>9} {'overhead':>9} {'harness s':>10} {'transport s':>12}")
    for name, task, source in _tasks(args.tasks, overrides):
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
    if args.smoke:
        print("the judge's kept programs: measured in the full run only")
    else:
        kept_programs(args)
    if args.script_per_candidate:
        compare_script(args, overrides)
    return 0


if __name__ == "__main__":
    sys.exit(main())
