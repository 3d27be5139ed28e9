"""How fast a new candidate gets its production verdict and its ranking number.

Per task, at the task's own production size, a started ``WorkerPool`` with an empty
compile cache evaluates one candidate first (it also works out the XLA reference's
record, once for the task), then ``--reps`` distinct candidates (other block sizes:
each a different program, so no compile is a cache hit). Printed per candidate: the
production verdict's time (from the start of the production part of the evaluation to
the compiler's answer: compiles or not), the verdict and estimate together, the whole
evaluation; and per task the medians against the targets (verdict <= 3 s, verdict +
estimate <= 10 s with the reference known).

Tasks (each skipped when it cannot be had):

- ``guide``: a bf16 4096x4096x4096 matmul brought in as a user would (``tilewright new``
  from ``jnp.dot``), candidates jax's own Pallas TPU matmul
  (``jax.experimental.pallas.ops.tpu.matmul``) with the Pallas guide's block sizes;
- ``41k``: JAXBench's Gemm_Add_ReLU (x f32[4096,8192] @ w f32[8192,8192] + b) at its
  own size, candidates a tiled matmul with the bias and ReLU fused, several blockings
  (``--jaxbench DIR``: a checkout of the public accelerator-agents repository's
  ``JAXBench/benchmark``);
- ``small``: the bundled gelu at a small check shape: our warm evaluation (correctness
  trials, TPU compile and estimate at its production shape) against a fresh Python
  process per candidate that imports JAX, runs the kernel in plain interpret mode,
  checks it once and times it (MaxKernel's local harness), in the same run; and a cold
  ``tilewright eval`` (every process started afresh) against the same script.

    python benchmarks/host_speed/production_speed.py [--jaxbench DIR] [--tasks guide 41k small]
                                          [--reps 4] [--chip v5e] [--smoke]

``--smoke``: the small task only, one repetition, no TPU compile (that it runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository

from tilewright.kernels.pool.workers import EvalOptions, WorkerPool  # noqa: E402
from tilewright.kernels.source.printable import one_line  # noqa: E402
from tilewright.kernels.tasks.loaders import load_task  # noqa: E402
from tilewright.profiling.chips import DEFAULT_TPU  # noqa: E402

VERDICT_TARGET_S = 3.0
ESTIMATE_TARGET_S = 10.0

GUIDE_MODEL = """
import jax.numpy as jnp

def mm(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)
"""
GUIDE_KERNEL = """
from jax.experimental.pallas.ops.tpu import matmul as pallas_matmul

def kernel(x, y):
    return pallas_matmul.matmul(x, y, block_shape=({bm}, {bn}), block_k={bk})
"""
# the Pallas TPU matmul guide's block sizes (bm, bn, bk), first the one that finds the
# reference
GUIDE_BLOCKS = [(512, 512, 512), (512, 1024, 512), (256, 512, 512), (512, 512, 256),
                (1024, 512, 512), (256, 256, 512), (512, 256, 512)]

GEMM_EPILOGUE = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM, BN, BK = {bm}, {bn}, {bk}

def _body(x_ref, w_ref, b_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)
    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = jnp.maximum(acc_ref[...] + b_ref[...], 0.0).astype(o_ref.dtype)

def workload(x, weight, bias):
    m, k = x.shape
    n = weight.shape[1]
    bm, bn, bk = min(BM, m), min(BN, n), min(BK, k)
    return pl.pallas_call(
        _body, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, l: (i, l)),
                  pl.BlockSpec((bk, bn), lambda i, j, l: (l, j)),
                  pl.BlockSpec((1, bn), lambda i, j, l: (0, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, l: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, weight, bias.reshape(1, n))
"""
GEMM_BLOCKS = [(512, 512, 512), (256, 512, 512), (512, 256, 512), (256, 256, 512),
               (512, 512, 256), (256, 512, 256), (128, 512, 512)]


def _guide_task(work: Path) -> tuple[Any, list[str]] | None:
    work.mkdir(parents=True, exist_ok=True)
    (work / "model.py").write_text(GUIDE_MODEL)
    bm, bn, bk = GUIDE_BLOCKS[0]
    (work / "mine.py").write_text(GUIDE_KERNEL.format(bm=bm, bn=bn, bk=bk))
    made = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "new", "guide", "--from",
                           "model.py:mm", "--shape", "x=bf16[4096,4096]", "--shape",
                           "y=bf16[4096,4096]", "--kernel", "mine.py:kernel", "--force"],
                          cwd=work, capture_output=True, text=True, timeout=600)
    if made.returncode != 0:
        print(f"guide: `tilewright new` failed:\n{made.stdout}{made.stderr}")
        return None
    # Every candidate's blocks fit the check shapes at x_0=1024.
    task = load_task(str(work / "guide"), {"x_0": "1024"})
    return task, [GUIDE_KERNEL.format(bm=a, bn=b, bk=c) for a, b, c in GUIDE_BLOCKS]


def _gemm_task(jaxbench: str | None) -> tuple[Any, list[str]] | None:
    if not jaxbench:
        print("41k: skipped (no --jaxbench checkout)")
        return None
    root = Path(jaxbench) / "41k_Gemm_Add_ReLU"
    if not root.is_dir():
        print(f"41k: skipped ({root} not found)")
        return None
    # correctness at 256x512x512 (the production shape stays 4096x8192x8192)
    task = load_task(str(root), {"batch_size": "256", "in_features": "512",
                                 "out_features": "512"})
    return task, [GEMM_EPILOGUE.format(bm=a, bn=b, bk=c) for a, b, c in GEMM_BLOCKS]


async def _candidates(name: str, task: Any, sources: list[str], reps: int, chip: str,
                      cache: str) -> list[dict[str, Any]]:
    options = EvalOptions(trials=3, timeout_s=900.0, chip=chip, timing=False)
    rows = []
    env = {"TILEWRIGHT_CACHE_DIR": cache}
    async with WorkerPool(size=1, env_overrides=env) as pool:
        for i, source in enumerate(sources[:reps + 1]):
            start = time.perf_counter()
            result = await pool.evaluate(task, source, options, filename=f"{name}_{i}.py")
            wall = time.perf_counter() - start
            tpu = result.tpu or {}
            rank = result.rank
            row = {"task": name, "i": i, "status": result.status, "wall_s": wall,
                   "verdict_s": tpu.get("verdict_s"), "verdict_by": tpu.get("verdict_by"),
                   "compile_s": tpu.get("compile_s"),
                   "cached": tpu.get("cached"), "compile": tpu.get("compile"),
                   "rank": rank.words(short=True), "cycles": (tpu.get("estimate") or {}
                                                              ).get("cycles"),
                   "reference": tpu.get("reference_record"),
                   "why": tpu.get("estimate_unavailable")}
            rows.append(row)
            first = " (first: works out the reference)" if i == 0 else ""
            print(f"  {name} #{i}: {row['status']:<13} verdict {_s(row['verdict_s'])} "
                  f"({row['verdict_by'] or '-'}) "
                  f"verdict+estimate {_s(row['compile_s'])} eval {wall:6.1f} s  "
                  f"{row['rank']:<14} {row['cycles'] or '-':>10} cycles{first}"
                  + (f"  [{row['why']}]" if row["why"] and not rank.compiler else ""))
            if result.error is not None:
                print(f"    {result.error.kind}: {one_line(result.error.message)[:300]}")
    return rows


def _s(value: float | None) -> str:
    return "     -" if value is None else f"{value:5.1f} s"


def _summary(name: str, rows: list[dict[str, Any]]) -> None:
    later = [r for r in rows[1:] if r["compile"] == "ok" and not r["cached"]]
    if not later:
        print(f"  {name}: no uncached candidate with a verdict to summarize")
        return
    verdict = statistics.median(r["verdict_s"] for r in later if r["verdict_s"] is not None)
    both = statistics.median(r["compile_s"] for r in later if r["compile_s"] is not None)
    ref = (rows[0].get("reference") or {}).get("computed_s")
    print(f"  {name}: {len(later)} distinct candidates, reference known: median verdict "
          f"{verdict:.2f} s ({verdict / VERDICT_TARGET_S:.2f} of the 3 s target), verdict + "
          f"estimate {both:.2f} s ({both / ESTIMATE_TARGET_S:.2f} of the 10 s target); the "
          f"reference's record took {ref if ref is not None else '?'} s once")


SCRIPT = Path(__file__).resolve().parent / "eval_overhead.py"


def _small(args: argparse.Namespace, cache: str) -> None:
    """Our warm evaluation of distinct gelu kernels and a cold CLI eval, against a fresh
    script per candidate."""
    sys.path.insert(0, str(SCRIPT.parent))
    from eval_overhead import script_path  # the MaxKernel-style harness

    overrides = {"rows": "64", "cols": "256"}
    task = load_task("gelu", overrides)
    base = task.starting_source()
    # distinct programs: other block shapes (at the production shape, 8192x8192)
    blocks = [(64, 256), (32, 256), (128, 256), (64, 512), (16, 256), (256, 512), (8, 256)]
    sources = [base.replace("BLOCK_ROWS = 64\nBLOCK_COLS = 256",
                            f"BLOCK_ROWS = {r}\nBLOCK_COLS = {c}")
               for r, c in blocks[:args.reps + 1]]
    assert len(set(sources)) == len(sources), "the candidates must differ"
    options = EvalOptions(trials=3, timeout_s=600.0, chip=args.chip,
                          lowering=not args.smoke)

    async def warm() -> list[float]:
        walls = []
        async with WorkerPool(size=1, env_overrides={"TILEWRIGHT_CACHE_DIR": cache}) as pool:
            for source in sources:
                start = time.perf_counter()
                result = await pool.evaluate(task, source, options, filename="gelu.py")
                walls.append(time.perf_counter() - start)
                assert result.status == "correct", (result.status, result.error)
        return walls

    walls = asyncio.run(warm())
    script = script_path(task, base, "small", max(1, args.reps))["wall_s"]
    ours = statistics.median(walls[1:]) if len(walls) > 1 else walls[0]
    print(f"  small (gelu 64x256): warm evaluation {ours:.2f} s per candidate (first "
          f"{walls[0]:.2f} s), script per candidate {script:.2f} s: script/ours "
          f"{script / ours:.1f}x")
    if args.smoke:
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gelu.py"
        path.write_text(base)
        env = {**os.environ, "TILEWRIGHT_CACHE_DIR": cache, "JAX_PLATFORMS": "cpu"}
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "eval", "--task", "gelu",
                               "--set", "rows=64", "--set", "cols=256", "--kernel", str(path),
                               "--json", "--chip", args.chip], capture_output=True,
                              text=True, cwd=ROOT, env=env, timeout=600)
        cold = time.perf_counter() - start
    status = json.loads(done.stdout).get("status") if done.stdout.strip() else done.stderr[-300:]
    print(f"  small: cold `tilewright eval` {cold:.2f} s ({status}; every process started "
          f"afresh) vs script {script:.2f} s: cold/script {cold / script:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jaxbench", default=None, help="JAXBench/benchmark of a checkout")
    parser.add_argument("--tasks", nargs="+", default=["guide", "41k", "small"])
    parser.add_argument("--reps", type=int, default=4, help="distinct candidates after the first")
    parser.add_argument("--chip", default=DEFAULT_TPU)
    parser.add_argument("--smoke", action="store_true", help="the small task, once, no compile")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.smoke:
        args.tasks, args.reps = ["small"], 1
    print(f"production speed: chip {args.chip}, {args.reps} distinct candidates after the "
          f"first, {os.cpu_count()} CPUs, empty compile cache")
    with tempfile.TemporaryDirectory(prefix="tw-speed-") as tmp:
        cache = str(Path(tmp) / "cache")
        for name in args.tasks:
            made = (_guide_task(Path(tmp) / "guide") if name == "guide" else
                    _gemm_task(args.jaxbench) if name == "41k" else None)
            if name == "small":
                _small(args, cache)
                continue
            if made is None:
                continue
            task, sources = made
            rows = asyncio.run(_candidates(name, task, sources, args.reps, args.chip, cache))
            _summary(name, rows)
    print(textwrap.fill(
        "verdict: from the start of the production part of an evaluation to the TPU "
        "compiler's answer at the production shape (compiles or not), and which compile "
        "gave it (estimator: its compile of the whole program answered both; verdict: the "
        "verdict compiler's); verdict + estimate: "
        "to the compiler's cycle estimate of the candidate and the ranking number (the "
        "reference's record known); eval: the whole evaluation (correctness trials in TPU "
        "interpret mode at the check shapes included).", 100))
    return 0


if __name__ == "__main__":
    sys.exit(main())
