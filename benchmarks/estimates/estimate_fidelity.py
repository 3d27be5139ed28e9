"""How far can the TPU compiler's estimate be trusted? Against public TPU measurements.

Two public sets of measured device times, kept as data in ``benchmarks/data/`` with
their sources (the programs are not vendored: point the script at the checkouts):

- upstream JAXBench (github.com/aryatschand/JAXBench, ``benchmark/results.csv`` at
  999e01e): 50 XLA baselines and 8 hand-tuned Pallas variants on TPU v6e-1 at their own
  shapes, device-profiled (5 warm-ups, 50 iterations; bf16 inputs where
  ``create_inputs`` takes a dtype). The workloads are read from ``--jaxbench`` (a git
  checkout of that repository) at the results' commit.
- the Pallas TPU matmul guide (github.com/jax-ml/jax ``docs/pallas/tpu/matmul.ipynb``):
  the guide's blocked bf16 matmul at two block sizes and XLA's, 1024^3 to 8192^3 on
  TPU v5e, wall clock over 100 calls. Its kernel is a standard blocked matmul written
  here from the guide's description.

- tokamax (``--tokamax``, read from the installed wheel by ``benchmarks/lib/tokamax_data.py``):
  Google's kernel library ships its autotuner's measured times per input spec; specs
  timed for a Pallas op and its XLA counterpart are a measured speedup. Its grouped
  matmul on v5e (16 pairs) is estimated with tokamax's own kernel at the fastest
  measured tiling against ``jax.lax.ragged_dot``; the v7x pairs (attention, its backward
  pass, the fused cross-entropy loss and its backward pass) are counted here and
  estimated by ``benchmarks/estimates/tokamax_v7x.py`` (libtpu 0.0.50 or newer, jax 0.12:
  the estimator of the TPU VM's libtpu 0.0.42 aborts on v7x, ``tilewright chips``).

Every program is estimated the way every evaluation estimates it (a worker's
``reference_estimate`` and ``estimate`` ops: production shape, shortened grids or a
scaled reference where the estimator would be too costly, the memory floor), then
printed per program (measured, estimated, ratio, with and without the floor) and per
class (compute-bound, memory-bound, Pallas with manual DMA, gather/scatter,
collectives): median ratio, middle half, share within 1.5x and 2x; Spearman over all;
for the Pallas variants, whether the estimated speedup over XLA points the measured
way. Programs that cannot be estimated are listed with the reason.

The floor is a stated model, not a fit: ``max(compiler, bytes / bandwidth)``, bytes as
the harness counts them and the chip's published HBM bandwidth. ``--fit-efficiency``
additionally fits the share of that bandwidth memory-bound programs achieve on half of
the memory-bound rows and reports the other half with it. ``--write`` stores the
per-class figures in ``kernels/data/fidelity.json`` (what ``tpu.fidelity`` reports).

    python benchmarks/estimates/estimate_fidelity.py --jaxbench ~/JAXBench [--only 12p 8p] \\
        [--skip-guide] [--fit-efficiency] [--write]

``--smoke``: two of the guide's 1024^3 rows (XLA's matmul and the 512-block kernel, each
estimated by the harness's compile processes; measured by wall clock that small, they
are left out of the figures); the JAXBench workloads, which need a checkout, are
skipped: that it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
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
sys.path.insert(0, str(ROOT / "benchmarks" / "lib"))  # helpers, not benchmarks
from fidelity_figures import directions, fit_efficiency, report, with_floor  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
JAXBENCH_COMMIT = "999e01e96c8b"
# The guide's times are wall clock per call: below this a call is dispatch-bound (its
# 1024^3 rows, XLA's and both Pallas variants, all take ~0.12 ms), not a device time.
DISPATCH_BOUND_S = 0.5e-3
SOURCES = {
    "jaxbench": "aryatschand/JAXBench@999e01e benchmark/results.csv (TPU v6e-1, device "
                "profiler, median of 50 after 5 warm-ups)",
    "guide": "jax-ml/jax@ee6cce5 docs/pallas/tpu/matmul.ipynb outputs (TPU v5e, wall clock, "
             "mean of 100 calls)",
    "v5e_lent": "tilewright's own runs on a lent TPU v5e (device profiler, 2026-12-06 and "
                "-07; benchmarks/data/v5e_*.jsonl), estimated on a CPU host by "
                "`tilewright estimate`",
    "tokamax": "tokamax wheel data/autotuning/<chip>/*.json evaluation_times_ms (its "
               "autotuner on TPU v5e and TPU7x; median of the fastest config's times)",
}


def read_csv(path: Path) -> list[dict[str, str]]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def materialize(checkout: Path, commit: str, into: Path) -> Path:
    """The upstream workloads at ``commit`` (git archive of ``benchmark/``)."""
    archive = subprocess.run(["git", "-C", str(checkout), "archive", commit, "benchmark"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "benchmark"


GUIDE_KERNEL = textwrap.dedent("""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    BM, BK, BN = {bm}, {bk}, {bn}

    def _mm(x_ref, y_ref, z_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)
        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            z_ref[...] = {epilogue}(acc_ref[...]).astype(z_ref.dtype)

    def kernel(x, y):
        m, k = x.shape
        n = y.shape[1]
        return pl.pallas_call(
            _mm, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
            grid=(m // BM, n // BN, k // BK),
            in_specs=[pl.BlockSpec((BM, BK), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((BK, BN), lambda i, j, kk: (kk, j))],
            out_specs=pl.BlockSpec((BM, BN), lambda i, j, kk: (i, j)),
            scratch_shapes=[pltpu.VMEM((BM, BN), jnp.float32)],
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "arbitrary")))(x, y)
""")
GUIDE_REFERENCE = textwrap.dedent("""
    import jax
    import jax.numpy as jnp

    def make_inputs(key, m, k, n):
        a, b = jax.random.split(key)
        return (jax.random.normal(a, (m, k), jnp.bfloat16),
                jax.random.normal(b, (k, n), jnp.bfloat16))

    def reference(x, y):
        return {epilogue}(jnp.matmul(x, y))
""")


def guide_task(root: Path, m: int, k: int, n: int, epilogue: str) -> Path:
    task = root / f"mm_{m}_{epilogue}"
    task.mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text(
        f'name = "{task.name}"\natol = 1e-1\nrtol = 1e-1\n[shapes.size]\nm = {m}\n'
        f'k = {k}\nn = {n}\nsize = "large"\nproduction = true\n')
    fn = "jax.nn.relu" if epilogue == "relu" else ""
    (task / "reference.py").write_text(GUIDE_REFERENCE.format(epilogue=fn))
    return task


RAGGED_REFERENCE = textwrap.dedent("""
    import jax
    import jax.numpy as jnp

    GROUP_SIZES = {sizes}  # tokamax's measured spec

    def make_inputs(key, m, k, n, groups):
        a, b = jax.random.split(key)
        return (jax.random.normal(a, (m, k), jnp.{dtype}),
                jax.random.normal(b, (groups, k, n), jnp.{dtype}),
                jnp.asarray(GROUP_SIZES, jnp.int32))

    def reference(lhs, rhs, group_sizes):
        return jax.lax.ragged_dot(lhs, rhs, group_sizes)
""")
# tokamax's own kernel, called as its op calls it (imported from the installed wheel).
RAGGED_KERNEL = textwrap.dedent("""
    import jax
    import jax.numpy as jnp
    from tokamax._src.ops.ragged_dot import pallas_mosaic_tpu_kernel as tk

    def kernel(lhs, rhs, group_sizes):
        return tk.gmm(lhs, rhs, group_sizes,
                      precision=(jax.lax.Precision.DEFAULT, jax.lax.Precision.DEFAULT),
                      out_dtype=lhs.dtype, tiling=({tm}, {tk}, {tn}),
                      input_buffer_count={buffers})
""")
_DTYPES = {"bf16": "bfloat16", "f32": "float32"}
# tokamax's ops by the class of program the fidelity record keeps for them
TOKAMAX_CLASSES = {"grouped matmul": "grouped_matmul", "attention": "attention",
                   "attention backward": "attention", "fused loss": "fused_loss",
                   "fused loss backward": "fused_loss"}


def ragged_task(root: Path, index: int, spec: dict[str, Any]) -> Path | None:
    """A task at one of tokamax's ragged-dot specs (its group sizes kept), or None for a
    spec this layout does not express (other dimension numbers, other dtypes)."""
    from tokamax_data import array

    lhs, rhs = array(spec.get("lhs")), array(spec.get("rhs"))
    dims = (spec.get("ragged_dot_dimension_numbers") or {})
    if not lhs or not rhs or len(lhs[1]) != 2 or len(rhs[1]) != 3 or lhs[0] != rhs[0] \
            or lhs[0] not in _DTYPES or dims.get("lhs_ragged_dimensions") != [0] \
            or dims.get("rhs_group_dimensions") != [0] \
            or dims.get("dot_dimension_numbers") != [[[1], [1]], [[], []]]:
        return None
    (m, k), (groups, _k, n) = lhs[1], rhs[1]
    task = root / f"ragged_{index}"
    task.mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text(
        f'name = "{task.name}"\natol = 5e-2\nrtol = 5e-2\n[shapes.spec]\nm = {m}\n'
        f'k = {k}\nn = {n}\ngroups = {groups}\nsize = "large"\nproduction = true\n')
    (task / "reference.py").write_text(RAGGED_REFERENCE.format(
        sizes=list(spec.get("group_sizes") or []), dtype=_DTYPES[lhs[0]]))
    return task


async def _estimate_into(row: dict[str, Any], pool: Any, args: argparse.Namespace,
                         chip: str, task: Any, kernel: Any, filename: str) -> None:
    """Into ``row``: the estimate of the task's XLA reference (``kernel()`` None) or of
    the kernel source ``kernel()`` returns, with its wall time; what stopped it (a task
    that cannot even be loaded or run) in ``row["why"]``. ``task`` loads the task."""
    from tilewright.kernels.pool.workers import EvalOptions

    started = time.perf_counter()
    try:
        loaded, source = task(), kernel()
        if source is None:
            found = await pool.request("reference_estimate", {
                "task": loaded.to_spec(), "chip": chip, "timeout_s": args.timeout,
                "compile_memory_mb": args.compile_memory_mb}, timeout=args.timeout + 60)
            row.update(_from_reference(found))
        else:
            found = await pool.estimate(loaded, source, EvalOptions(
                timeout_s=args.timeout, chip=chip, compile_memory_mb=args.compile_memory_mb),
                filename=filename)
            row.update(_from_candidate(found))
    except Exception as exc:  # a task that cannot even be loaded or run
        row["why"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    row["estimate_s_wall"] = time.perf_counter() - started


async def tokamax_rows(args: argparse.Namespace, pool: Any, scratch: Path
                       ) -> list[dict[str, Any]]:
    """tokamax's measured pairs: the v5e grouped matmul estimated (tokamax's kernel at its
    fastest measured tiling, XLA's ragged_dot), the rest listed with why not (a chip the
    estimator refuses: its rows are counted, never compiled)."""
    import tokamax_data

    from tilewright.profiling.chips import estimator_refusal

    root = args.tokamax if isinstance(args.tokamax, Path) else tokamax_data.find()
    if root is None:
        print("tokamax rows skipped: not installed (./dev setup tokamax) and no --tokamax DIR")
        return []
    found, problems = tokamax_data.pairs(root)
    for problem in problems:
        print(f"tokamax: {problem}")
    rows, done = [], 0
    for index, pair in enumerate(found):
        workload = f"{pair.what} {pair.spec.get('lhs')} x {pair.spec.get('rhs')}"
        common = {"source": "tokamax", "chip": pair.chip, "workload": workload,
                  "provenance": pair.provenance, "tokamax_op": pair.op}
        base = {**common, "variant": "baseline", "program": f"XLA {workload}",
                "measured_s": pair.xla.median_ms / 1e3}
        opt = {**common, "variant": "optimized", "program": f"tokamax {workload}",
               "measured_s": pair.pallas.median_ms / 1e3,
               "config": pair.pallas.config}
        refusal = estimator_refusal(pair.chip)
        task_dir = None
        if refusal is None and pair.op == "pallas_mosaic_tpu_ragged_dot":
            task_dir = ragged_task(scratch / "tokamax", index, pair.spec)
        limit = args.tokamax_limit is not None and done >= args.tokamax_limit
        skipped = bool(args.tokamax_only) and not any(x in workload
                                                      for x in args.tokamax_only)
        if refusal or task_dir is None or limit or skipped:
            why = (refusal or ("not run: --tokamax-limit reached" if limit else
                               "not run: not chosen by --tokamax-only" if skipped else
                               f"not run: no task layout here for {pair.op}'s spec"))
            base["why"] = opt["why"] = why
            rows += [base, opt]
            continue
        from tilewright.kernels.tasks.loaders import load_task

        task = load_task(task_dir)
        config = pair.pallas.config
        source = RAGGED_KERNEL.format(tm=config.get("tile_m"), tk=config.get("tile_k"),
                                      tn=config.get("tile_n"),
                                      buffers=config.get("input_buffer_count", 2))
        for row, run in ((base, None), (opt, source)):
            await _estimate_into(row, pool, args, pair.chip, lambda task=task: task,
                                 lambda run=run: run, str(task_dir / "tokamax_gmm.py"))
            row["class"] = TOKAMAX_CLASSES.get(pair.what, row.get("class"))
            rows.append(row)
            _print_row(row)
        done += 1
    counted: dict[tuple[str, str], int] = {}
    for row in rows:
        if row["variant"] == "optimized":
            key = (row["chip"], row["tokamax_op"])
            counted[key] = counted.get(key, 0) + 1
    for (chip, op), count in sorted(counted.items()):
        print(f"tokamax {op} on {chip}: {count} measured pairs")
    return rows


def clock(chip: str) -> float:
    from tilewright.profiling.chips import get_chip

    return get_chip(chip).clock_hz or float("nan")


async def estimate_rows(args: argparse.Namespace, scratch: Path) -> list[dict[str, Any]]:
    from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
    from tilewright.kernels.tasks.loaders import load_task

    rows: list[dict[str, Any]] = []
    async with WorkerPool(size=1, memory_limit_mb=args.worker_memory_mb) as pool:
        if args.jaxbench:
            workloads = materialize(args.jaxbench.expanduser(), args.commit, scratch)
            measured = read_csv(DATA / "jaxbench_v6e.csv")
            for row in measured:
                name, variant = row["workload"], row["variant"]
                if args.only and not any(name.startswith(p) for p in args.only):
                    continue
                out = {"source": "jaxbench", "program": f"{name} ({variant})", "chip": "v6e",
                       "workload": name, "variant": variant,
                       "measured_s": float(row["median_ms"]) / 1e3
                       if row.get("status") == "success" and row["median_ms"] else None}
                directory = workloads / name

                def load(directory: Path = directory) -> Any:
                    takes_dtype = "dtype" in (directory / "baseline.py").read_text().split(
                        "def create_inputs", 1)[-1].split(")", 1)[0]
                    return load_task(directory, {"dtype": "bfloat16"} if takes_dtype else None)

                def kernel(directory: Path = directory, variant: str = variant) -> str | None:
                    if variant == "baseline":
                        return None
                    return (directory / "optimized.py").read_text()

                await _estimate_into(out, pool, args, "v6e", load, kernel,
                                     str(directory / "optimized.py"))
                rows.append(out)
                _print_row(out)
        if args.tokamax:
            rows += await tokamax_rows(args, pool, scratch)
        if not args.skip_guide:
            for row in read_csv(DATA / "pallas_matmul_guide_v5e.csv"):
                m, k, n = int(row["m"]), int(row["k"]), int(row["n"])
                if args.only and not any(f"mm{m}".startswith(p) for p in args.only):
                    continue
                if args.smoke and (row["epilogue"] != "none" or row["bm"] not in ("", "512")):
                    continue  # a smoke run: XLA's and one blocked kernel's program
                blocks = f" ({row['bm']},{row['bk']},{row['bn']})" if row["bm"] else ""
                out = {"source": "guide", "chip": "v5e", "workload": f"matmul {m}^3",
                       "variant": "baseline" if row["program"] == "xla" else "optimized",
                       "program": f"{row['program']} matmul {m}^3{blocks} {row['epilogue']}",
                       "measured_s": float(row["measured_s"])}
                task = load_task(guide_task(scratch / "guide", m, k, n, row["epilogue"]))
                started = time.perf_counter()
                if row["program"] == "xla":
                    found = await pool.request("reference_estimate", {
                        "task": task.to_spec(), "chip": "v5e", "timeout_s": args.timeout,
                        "compile_memory_mb": args.compile_memory_mb}, timeout=args.timeout + 60)
                    out.update(_from_reference(found))
                else:
                    source = GUIDE_KERNEL.format(
                        bm=row["bm"], bk=row["bk"], bn=row["bn"],
                        epilogue="jax.nn.relu" if row["epilogue"] == "relu" else "")
                    found = await pool.estimate(task, source, EvalOptions(
                        timeout_s=args.timeout, chip="v5e",
                        compile_memory_mb=args.compile_memory_mb), filename="guide_matmul.py")
                    out.update(_from_candidate(found))
                out["estimate_s_wall"] = time.perf_counter() - started
                rows.append(out)
                _print_row(out)
    return rows


def _from_reference(found: dict[str, Any]) -> dict[str, Any]:
    estimate = found.get("estimate") or {}
    cost = found.get("cost") or {}
    return {"estimate_s": estimate.get("seconds"), "method": estimate.get("method"),
            "bytes": cost.get("bytes_accessed"), "flops": cost.get("flops"),
            "class": found.get("class"), "why": None if estimate else found.get("why"),
            "incomplete": bool(estimate.get("incomplete")), "peak_mb": found.get(
                "compile_peak_mb"), "shape": found.get("shape_label")}


def _from_candidate(found: dict[str, Any]) -> dict[str, Any]:
    tpu = found.get("tpu") or {}
    estimate = tpu.get("estimate") or {}
    floor = tpu.get("floor") or {}
    fid = tpu.get("fidelity") or {}
    why = None
    if not estimate:
        why = tpu.get("estimate_unavailable") or (found.get("error") or {}).get("message") \
            or found.get("status")
    return {"estimate_s": estimate.get("seconds"), "method": estimate.get("method"),
            "floor_s": floor.get("kernel_s"), "class": fid.get("class"),
            "reference_s": (tpu.get("reference_estimate") or {}).get("seconds"),
            "reference_floor_s": floor.get("reference_s"),
            "estimated_speedup": tpu.get("estimated_speedup"),
            "compiler_speedup": tpu.get("compiler_speedup"), "why": why,
            "incomplete": bool(estimate.get("incomplete")),
            "peak_mb": tpu.get("compile_peak_mb"), "shape": tpu.get("shape_label"),
            "kernel_bytes": floor.get("kernel_bytes")}


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:9.3f}" if seconds else f"{'-':>9}"


def _print_row(row: dict[str, Any]) -> None:
    m, e = row.get("measured_s"), row.get("estimate_s")
    f = with_floor(row)
    ratio = f"{e / m:6.2f}" if m and e else "     -"
    fratio = f"{f / m:6.2f}" if m and f else "     -"
    note = row.get("why") or (row.get("method") or "")
    print(f"{row['program'][:52]:<52} {row.get('class') or '-':<17} "
          f"{_ms(m)} {_ms(e)} {ratio} {fratio}  "
          f"{row.get('estimate_s_wall', 0):5.0f}s  {str(note)[:60]}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jaxbench", type=Path, help="a git checkout of aryatschand/JAXBench")
    parser.add_argument("--commit", default=JAXBENCH_COMMIT)
    parser.add_argument("--only", nargs="*", help="workload name prefixes (mm1024... for "
                                                  "the guide's rows)")
    parser.add_argument("--skip-guide", action="store_true")
    parser.add_argument("--tokamax", nargs="?", const=True, type=Path, default=None,
                        metavar="DIR", help="tokamax's measured TPU times (from the installed "
                        "package, or DIR: a tokamax package folder of an extracted wheel)")
    parser.add_argument("--tokamax-limit", type=int, default=None, metavar="N",
                        help="estimate at most N of tokamax's pairs (the rest are listed)")
    parser.add_argument("--tokamax-only", nargs="*", metavar="TEXT",
                        help="estimate only tokamax pairs whose workload contains TEXT "
                             "(e.g. 'bf16[131072,2048]')")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--compile-memory-mb", type=int, default=4096)
    parser.add_argument("--worker-memory-mb", type=int, default=12288)
    parser.add_argument("--fit-efficiency", action="store_true")
    parser.add_argument("--write", action="store_true",
                        help="store the per-class figures in kernels/data/fidelity.json")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument("--rows", type=Path,
                        help="report on rows a previous run wrote with --json (no compiles)")
    parser.add_argument("--smoke", action="store_true",
                        help="that it runs: two of the guide's 1024^3 rows, no JAXBench "
                             "(tests/test_benchmarks.py)")
    args = parser.parse_args(argv)
    if args.smoke:
        if args.write or args.fit_efficiency:
            parser.error("--smoke estimates two rows: never --write or --fit-efficiency")
        print("JAXBench workloads skipped: a smoke run reads no checkout"
              if args.jaxbench else "JAXBench workloads skipped: no checkout (--jaxbench DIR)")
        args.only, args.skip_guide, args.jaxbench = ["mm1024"], False, None
    if not args.jaxbench and args.skip_guide and not args.rows and not args.tokamax:
        parser.error("nothing to do: give --jaxbench and/or leave out --skip-guide")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    started = time.perf_counter()
    print(f"{'program':<52} {'class':<17} {'meas. ms':>9} {'est. ms':>9} {'ratio':>6} "
          f"{'floor':>6}  {'wall':>6}  method / why not")
    if args.rows:
        rows = json.loads(args.rows.read_text())
        for row in rows:
            _print_row(row)
    else:
        with tempfile.TemporaryDirectory(prefix="tw-fidelity-") as scratch:
            rows = asyncio.run(estimate_rows(args, Path(scratch)))
    for row in rows:  # tokamax's rows by the class of program they measure
        if row.get("source") == "tokamax" and row.get("tokamax_op"):
            import tokamax_data

            what = tokamax_data.OPS.get(row["tokamax_op"], (None, None))[1]
            row["class"] = TOKAMAX_CLASSES.get(what, row.get("class"))
    for row in rows:  # a wall clock this short is the host's dispatch, not the device's
        if row["source"] == "guide" and (row.get("measured_s") or 0) < DISPATCH_BOUND_S:
            row["excluded"] = (f"measured {row['measured_s'] * 1e6:.0f} us by wall clock: "
                               "host dispatch, not device time")
    kept = [r for r in rows if not r.get("excluded")]
    figures = report(kept)
    print(f"\nwall time {time.perf_counter() - started:.0f} s; "
          f"{sum(1 for r in rows if r.get('estimate_s'))}/{len(rows)} programs estimated")
    for chip, entry in figures.items():
        for key in ("compiler", "with_floor"):
            print(f"\n{chip}, {key.replace('_', ' ')}:")
            if not any(entry[key].values()):
                print("  no program estimated")
            for klass, s in entry[key].items():
                extra = f", Spearman {s['spearman']}" if "spearman" in s else ""
                if not s.get("rows"):
                    continue
                print(f"  {klass:<18} rows {s['rows']:>3}  median {s['median_ratio']:6.3f}  "
                      f"middle half {s['middle_half'][0]:.3f}-{s['middle_half'][1]:.3f}  "
                      f"within 1.5x {s['within_1_5x']:.0%}  within 2x {s['within_2x']:.0%}"
                      f"{extra}")
    print("\nPallas variants against XLA:")
    print("\n".join(directions(kept)) or "  none measured")
    for row in rows:
        if row.get("excluded"):
            print(f"  left out: {row['program']}: {row['excluded']}")
    failed = [r for r in rows if not r.get("estimate_s")]
    if failed:
        print("\nnot estimated:")
        by_why: dict[str, list[dict[str, Any]]] = {}
        for r in failed:
            by_why.setdefault(str(r.get("why")), []).append(r)
        for why, these in by_why.items():
            if len(these) <= 3:
                for r in these:
                    print(f"  {r['program']}: {why}")
            else:
                chips = ", ".join(sorted({r["chip"] for r in these}))
                print(f"  {len(these)} programs on {chips}: {why}")
    efficiency = None
    if args.fit_efficiency:
        efficiency, train, test = fit_efficiency(kept)
        if efficiency:
            held = [with_floor(r, efficiency) / r["measured_s"] for r in test if r.get(
                "estimate_s")]
            plain = [with_floor(r) / r["measured_s"] for r in test if r.get("estimate_s")]
            print(f"\nHBM efficiency fitted on {len(train)} memory-bound baselines the "
                  f"estimator could not price (bytes / bandwidth / measured, median): "
                  f"{efficiency:.3f}; on the {len(held)} "
                  f"estimated ones it was not fitted on, estimate with floor / measured: "
                  f"median {statistics.median(held):.3f} (at the spec bandwidth: "
                  f"{statistics.median(plain):.3f})" if held else "")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str))
    if args.write:
        path = ROOT / "kernels" / "data" / "fidelity.json"
        # merged into the shipped record: classes measured now replace theirs, the rest
        # (another source's rows, not run this time) stay
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = {}
        chips = old.get("chips") or {}
        for chip, entry in figures.items():
            for key, classes in entry.items():
                # "all" stands for every source's rows: replaced only from all of them
                # (--rows, the stored record) or for a chip not yet in the file
                mine = {k: v for k, v in classes.items()
                        if v and (k != "all" or args.rows or chip not in chips)}
                if mine:  # a chip with nothing estimated adds nothing
                    chips.setdefault(chip, {}).setdefault(key, {}).update(mine)
        # (a source's own text may hold "; ": found whole, never split)
        source = str(old.get("source") or "")
        for s in sorted({r["source"] for r in kept}):
            if SOURCES[s] not in source:
                source = f"{source}; {SOURCES[s]}" if source else SOURCES[s]
        table = {"schema": "tilewright.fidelity/1", "source": source,
                 "generated": time.strftime("%Y-%m-%d"),
                 "benchmark": "benchmarks/estimates/estimate_fidelity.py", "chips": chips}
        for kept_key in ("efficiency", "speedups"):  # speedups: benchmarks/estimates/tokamax_v7x.py
            if old.get(kept_key):
                table[kept_key] = old[kept_key]
        if efficiency:
            table["efficiency"] = {"v6e": round(efficiency, 3)}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(table, indent=2) + "\n")
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
