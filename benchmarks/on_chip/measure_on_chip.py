"""Device times of a set of programs on this host's chip: the measured side of the
estimate's fidelity (``benchmarks/estimates/estimate_fidelity.py`` reads the rows).

Each program is the XLA reference of a task and one kernel for it, at the task's
production shape: the bundled tasks' starting kernels across their tunables
(``bundled:NAME``, up to ``--points`` points of each task's TUNABLES, the starting
point first), and task directories (``DIR`` or ``DIR:KERNEL.py``; a JAXBench task
without a kernel is its baseline run as the kernel, and ``DIR:optimized.py`` is
JAXBench's hand-tuned Pallas kernel). JAXBench tasks run in the dtype JAXBench
benchmarks them in (``--dtype``, bfloat16 by default). ``DIR:KERNEL.py@OTHER.py`` times
KERNEL against another kernel of the task instead of XLA's reference, its output checked
against that one's (a row with ``against``: where XLA's program does not fit the chip).

Timed by the judge's own device timing (``timing.time_on_device``): fresh input sets on
the chip, every set's output checked against the reference, then N calls of kernel and
reference under the profiler, each call's duration from the trace's device plane
(pipelined calls where no trace can be had: the row's ``method`` says which). This
process holds the chip and runs the kernels' Python itself: a benchmark of programs
we chose, not the judge (which never runs candidate Python on the chip).

    python benchmarks/on_chip/measure_on_chip.py bundled:gelu bundled:softmax DIR ... \
        --out rows.jsonl [--points 12] [--budget 2]

``--smoke``: a kernel that aborts its process (a ``crashed`` row), then the starting gelu
kernel with a 256x512 production shape, on whatever host this is (off a TPU: interpret
mode, pipelined calls, labelled): that it runs and carries on past a crash.

One JSON row per program is appended to ``--out`` as soon as it is measured, so a run
cut short keeps what it measured. A program that fails to compile (VMEM, HBM) or gives
a wrong answer is a row too, with its status and the compiler's words. The programs run
in a child process: one that aborts it (libtpu ends the process on some kernels:
JAXBench 1p's crowned kernel on the v5e) is a ``crashed`` row, and a new child carries
on with the next program.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from tilewright.kernels.source import tunables
from tilewright.kernels.tasks.loaders import load_task


def sweep(source: str, points: int) -> list[dict[str, Any]]:
    """The starting point, then up to ``points - 1`` others of TUNABLES' product, spread
    over it (every k-th point), in a fixed order."""
    table = tunables.read(source)
    if not table:
        return [{}]
    names = sorted(table)
    start = {n: table[n][0] for n in names}
    grid = [dict(zip(names, combo, strict=True))
            for combo in itertools.product(*(table[n][1] for n in names))]
    others = [p for p in grid if p != start]
    step = max(1, len(others) // max(points - 1, 1))
    return [start, *others[::step][:points - 1]]


def programs(items: list[str], points: int, dtype: str,
             sets: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """(task, kernel source, label, variant) for each program asked for; ``sets``: the
    loader's overrides (``production.KEY`` sizes the production shape)."""
    found = []
    for item in items:
        if item.startswith("bundled:"):
            task = load_task(item.split(":", 1)[1], sets)
            source = Path(task.kernel_path).read_text()
            for point in sweep(source, points):
                label = ",".join(f"{k}={v}" for k, v in sorted(point.items())) or "start"
                found.append({"task": task, "source": tunables.apply(source, point)
                              if point else source, "kernel": label, "variant": point})
            continue
        item, _, against = item.partition("@")
        directory, _, kernel = item.partition(":")
        task = load_task(directory, {**(sets or {}), **({"dtype": dtype}
                                                         if _is_jaxbench(directory) else {})})
        if kernel:
            path = Path(directory) / kernel
        elif _is_jaxbench(directory):  # the published program itself, as the kernel
            path = Path(directory) / "baseline.py"
        else:
            path = task.kernel_path
        found.append({"task": task, "source": Path(path).read_text(),
                      "kernel": Path(path).name, "variant": {},
                      "task_dtype": dtype if _is_jaxbench(directory) else None,
                      **({"against": against, "against_source": (
                          Path(directory) / against).read_text()} if against else {})})
    return found


def _is_jaxbench(directory: str) -> bool:
    return (Path(directory) / "baseline.py").is_file()


def error_rows(want: Any, got: Any, precise: Any, tolerance: tuple[float, float]
               ) -> dict[str, Any]:
    """A low-precision output's errors against the f32 reference (``--errors``): the
    written reference's and the kernel's (rms, 99.9th percentile and max, from at most
    4M evenly spaced values), the written one's worst in units of the tolerance, and the
    judge's verdict (``compare.judge_output``)."""
    import numpy as np

    from tilewright.kernels.worker.evaluation.compare import judge_output, worst_in_tolerances

    if precise is None:
        return {"errors": "no f32 reference: the output is not low precision"}
    w, g, p = want.leaves[0], got.leaves[0], precise.leaves[0]
    step = max(1, w.size // (1 << 22))

    def stats(error: np.ndarray) -> dict[str, float]:
        sample = np.sort(np.abs(error.reshape(-1)[::step]))
        return {"rms": float(np.sqrt(np.mean(np.square(sample, dtype=np.float64)))),
                "q999": float(sample[min(int(0.999 * sample.size), sample.size - 1)]),
                "max": float(np.abs(error).max())}

    verdict, against = judge_output(got, want, precise, *tolerance)
    return {"errors": {"written_vs_f32": stats(w - p), "kernel_vs_f32": stats(g - p),
                       "kernel_vs_written": stats(g - w),
                       "written_worst_in_tolerances": worst_in_tolerances(
                           np.abs(w - p), p, *tolerance),
                       "judged": [verdict.close, against, verdict.reason]}}


def measure(entry: dict[str, Any], budget_s: float, errors: bool = False) -> dict[str, Any]:
    import jax
    import numpy as np

    from tilewright.kernels.judge.result import shape_label
    from tilewright.kernels.worker.evaluation import timing
    from tilewright.kernels.worker.execution import execution_mode, jitted_reference
    from tilewright.kernels.worker.runtime import load_runtime

    task = entry["task"]
    production = task.production_task() or task
    runtime = load_runtime(production.to_spec())
    config = production.shapes[0]
    dyn, static = runtime.make_inputs(config, jax.random.PRNGKey(0))
    ref_fn = jitted_reference(runtime, len(dyn), len(static))
    if entry.get("against"):  # another kernel is the baseline (XLA's does not fit, say)
        base_fn = runtime.load_candidate(entry["against_source"], f"<{entry['against']}>")
        ref_fn = jax.jit(base_fn, static_argnums=tuple(range(len(dyn), len(dyn) + len(static))))
    out = jax.eval_shape(lambda *d: ref_fn(*d, *static), *dyn)
    kernel_fn = runtime.load_candidate(entry["source"], f"<{entry['kernel']}>")
    _leaves, treedef = jax.tree.flatten(tuple(dyn))

    def program(*flat: Any) -> Any:
        return kernel_fn(*jax.tree.unflatten(treedef, list(flat)), *static)

    row: dict[str, Any] = {
        **({"against": entry["against"]} if entry.get("against") else {}),
        "task": task.name, "family": task.family, "kernel": entry["kernel"],
        "variant": entry["variant"], "task_dtype": entry.get("task_dtype"),
        "shape": shape_label([(a.shape, a.dtype) for a in dyn]),
        "config": config.name, "dtype": str(jax.tree.leaves(out)[0].dtype)}
    interpret = jax.default_backend() == "cpu"
    tolerance = runtime.tolerance(config, jax.tree.leaves(out)[0].dtype)
    if errors:
        from tilewright.kernels.worker.evaluation.compare import (
            Host,
            precise_reference,
            to_host,
        )

        want = to_host(jax.block_until_ready(ref_fn(*dyn, *static)))
        with execution_mode(interpret):
            got = jax.block_until_ready(jax.jit(program)(*jax.tree.leaves(tuple(dyn))))
        got_host = Host([np.asarray(x, np.float32) for x in jax.tree.leaves(got)], want.tree,
                        want.dtype)
        precise = precise_reference(lambda *d: ref_fn(*d, *static), tuple(dyn), (), want,
                                    interpret)
        row.update(error_rows(want, got_host, precise, tolerance))
        del want, got, got_host, precise
    with tempfile.TemporaryDirectory(prefix="tw-measure-") as logdir, \
            execution_mode(interpret):
        found = timing.time_on_device(
            jax.jit(program), ref_fn, runtime, config, None,
            tolerance, static, iters=None,
            budget_s=budget_s, logdir=logdir)
    if found.kernel is None or found.baseline is None:
        return {**row, "status": "incorrect", "error": found.failure}
    return {**row, "status": "measured", "method": found.method, "device": found.device,
            "kernel_ms": found.kernel["median_ms"], "kernel_p10_ms": found.kernel["p10_ms"],
            "kernel_p90_ms": found.kernel["p90_ms"],
            "reference_ms": found.baseline["median_ms"],
            "reference_p10_ms": found.baseline["p10_ms"],
            "reference_p90_ms": found.baseline["p90_ms"],
            "speedup": found.baseline["median_ms"] / found.kernel["median_ms"],
            "pipelined": found.pipelined, "per_call_wall": found.per_call,
            "why_not_device_trace": found.why_not_trace}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="*", help="bundled:NAME, DIR or DIR:KERNEL.py")
    parser.add_argument("--out", help="JSON lines, appended (default: a temporary file)")
    parser.add_argument("--smoke", action="store_true", help="one small gelu: that it runs")
    parser.add_argument("--points", type=int, default=12, help="tunable points per task")
    parser.add_argument("--dtype", default="bfloat16", help="JAXBench tasks' dtype")
    parser.add_argument("--budget", type=float, default=2.0,
                        help="seconds of calls per program (10 to 200 calls)")
    parser.add_argument("--errors", action="store_true",
                        help="a low-precision output's errors against the f32 reference, "
                        "the written reference's beside the kernel's (one input set)")
    parser.add_argument("--input-sets", type=int, default=2,
                        help="fresh input sets per program (the judge uses up to 4)")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a loader override for every task (production.KEY=V sizes "
                        "the production shape; a test off a TPU)")
    args = parser.parse_args(argv)
    if args.smoke:  # a program that aborts its process, then gelu: the run goes on
        args.items, args.points = [f"{_aborting_task()}:abort.py", "bundled:gelu"], 1
        args.set += ["production.rows=256", "production.cols=512"]
        args.errors = True
    if not args.items:
        parser.error("name at least one program (bundled:NAME, DIR, DIR:KERNEL.py)")
    if not args.out:
        args.out = tempfile.mkstemp(prefix="measure-on-chip-", suffix=".jsonl")[1]
    if args.child is None:
        return _parent(argv if argv is not None else sys.argv[1:], args.out)
    import jax

    device = jax.devices()[0]
    chip = getattr(device, "device_kind", str(device))
    common = {"chip": chip, "platform": device.platform, "date":
              datetime.date.today().isoformat(), "jax": jax.__version__}
    from tilewright.kernels.worker.evaluation import timing

    timing.INPUT_SETS = max(1, args.input_sets)
    sets = dict(item.split("=", 1) for item in args.set)
    listed = programs(args.items, args.points, args.dtype, sets)
    print(f"measure_on_chip: {len(listed)} programs on {chip}", file=sys.stderr, flush=True)
    print(f"measure_on_chip: rows to {args.out}", file=sys.stderr, flush=True)
    with open(args.out, "a") as fh:
        for index, entry in enumerate(listed):
            if index < args.child:
                continue
            # the kernel's text by its hash: a session's blob of the same source has the
            # same name, so a row says which crowned kernel it timed
            sha = hashlib.sha256(entry["source"].encode()).hexdigest()
            Path(args.out + ".at").write_text(json.dumps(
                {"index": index, "task": entry["task"].name, "kernel": entry["kernel"],
                 "kernel_sha256": sha, "variant": entry["variant"], **common}))
            started = time.perf_counter()
            try:
                row = measure(entry, args.budget, args.errors)
            except Exception as exc:  # a compile refusal (VMEM, HBM) is a row too
                words = f"{type(exc).__name__}: {exc}"
                row = {"task": entry["task"].name, "family": entry["task"].family,
                       "kernel": entry["kernel"], "variant": entry["variant"],
                       "status": "failed", "error": words[:2000],
                       "where": traceback.format_exc(limit=-3)[-800:]}
            row.update(common, kernel_sha256=sha, seconds=round(time.perf_counter() - started, 2))
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(f"  {row['task']} {row['kernel']}: {row['status']} "
                  f"{row.get('against') or 'ref'} {row.get('reference_ms')} "
                  f"kernel {row.get('kernel_ms')} "
                  f"({row.get('method')}, {row['seconds']} s) {row.get('error', '')[:200]}",
                  file=sys.stderr, flush=True)
    return 0


def _parent(argv: list[str], out: str) -> int:
    """Run the programs in child processes, from the first not yet measured: a child that
    dies mid-program leaves a ``crashed`` row for it, and the next child goes on."""
    import subprocess

    start, marker = 0, Path(out + ".at")
    before = len(Path(out).read_text().splitlines()) if Path(out).is_file() else 0
    while True:
        marker.unlink(missing_ok=True)
        # the last --out wins: the child appends to the file resolved here
        code = subprocess.run([sys.executable, __file__, *argv, "--out", out,
                               "--child", str(start)]).returncode
        if code == 0:
            marker.unlink(missing_ok=True)
            _tally(out, before)
            return 0
        try:
            at = json.loads(marker.read_text())
        except (OSError, ValueError):
            return code  # it died before its first program (no chip, bad arguments)
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        row = {k: at.get(k) for k in ("task", "kernel", "kernel_sha256", "variant", "chip",
                                      "platform", "date", "jax")}
        row.update(status="crashed", error=f"the measuring process died ({how}) on this "
                   "program: its output above says why (libtpu aborts end the process)")
        with open(out, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(f"  {row['task']} {row['kernel']}: crashed ({how}); going on with the next",
              file=sys.stderr, flush=True)
        start = int(at["index"]) + 1


def _tally(out: str, skip: int) -> None:
    """This run's rows by status (the file's first ``skip`` rows are earlier runs')."""
    counts: dict[str, int] = {"measured": 0, "failed": 0, "crashed": 0}
    for line in Path(out).read_text().splitlines()[skip:]:
        status = json.loads(line).get("status")
        counts[status] = counts.get(status, 0) + 1
    print("measure_on_chip: " + ", ".join(f"{k} {v}" for k, v in counts.items()),
          file=sys.stderr, flush=True)


def _aborting_task() -> str:
    """A copy of the bundled gelu whose ``abort.py`` kernel ends its process (--smoke)."""
    import shutil

    here = Path(tempfile.gettempdir()) / "measure-on-chip-smoke-abort"
    if not (here / "abort.py").is_file():
        shutil.copytree(Path(__file__).resolve().parents[2] / "kernels" / "bundled" / "gelu",
                        here, dirs_exist_ok=True)
        (here / "abort.py").write_text("import os\n\n\ndef kernel(x):\n    os.abort()\n")
    return str(here)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(main())
