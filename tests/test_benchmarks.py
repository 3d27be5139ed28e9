"""Every benchmark keeps running: each one's ``--smoke`` run (tiny sizes, one
repetition) exits 0 and prints its table.

A smoke run measures nothing worth keeping; it is there so an API change that breaks a
benchmark fails the suite instead of the next person who measures. All of them start
at once (module fixture) and the tests read their results, so the file takes as long
as the slowest. What each smoke covers is in ``SMOKES`` (and in the benchmark's own
docstring): the benchmarks that need a public checkout run on the repository's own
fixtures or through a dry path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
TIMEOUT_S = 300

# script under benchmarks/ -> (what its smoke covers, a line its output must hold)
SMOKES = {
    "on_chip/chip_host_costs.py": (
        "4 MiB copied to and from the default device and compared on the host; gelu's first "
        "check shape: inputs, one reference call, its output to the host", "compared on the host"),
    "search_quality/autotune_efficiency.py": (
        "gelu replayed by the offline tuner from a copy of the shipped grid, plain and "
        "diagnosis-guided (cached diagnoses; nothing measured)", "all tasks:"),
    "host_speed/confinement_overhead.py": (
        "two real workers, confined and not, one evaluation each of an 8x128 gelu without "
        "the TPU compile; the descendant scan", "confined / unconfined:"),
    "estimates/estimate_fidelity.py": (
        "two of the guide's 1024^3 programs (XLA's, the 512-block kernel) estimated by the "
        "harness's compile processes; the JAXBench workloads skipped (they need a checkout)",
        "Pallas variants against XLA:"),
    "estimates/estimate_scaling.py": (
        "one small gelu through the harness's compile processes (verdict, estimate, the "
        "reference), compile cache shared when TILEWRIGHT_CACHE_DIR is set", "gelu 256x1024"),
    "host_speed/eval_overhead.py": (
        "an 8x128 gelu once through a warm worker and once in a fresh process, without the "
        "TPU compile", "fresh/warm"),
    "search_quality/jaxbench_offline.py": (
        "no checkout: the JAXBench and MaxKernel fixtures listed with `tilewright tasks "
        "--no-check`, the shared-size resolution, the table (no search, no re-check)",
        "inputs generate: 2/2"),
    "estimates/lent_references.py": (
        "the bundled softmax's XLA reference, measured on the lent v5e, estimated at its "
        "production shape by a worker's reference_estimate op; nothing written",
        "1 of 1 estimated"),
    "estimates/lent_rows.py": (
        "the kept v5e_searched rows beside the kept search JSON, printed; nothing written",
        "rows (not written)"),
    "on_chip/measure_on_chip.py": (
        "a kernel that aborts its process (a crashed row, a new child), then the starting "
        "gelu kernel at a 256x512 production shape timed by the judge's device timing (off "
        "a TPU: interpret mode, pipelined, labelled)", "measured 1, failed 0, crashed 1"),
    "on_chip/on_tpu.py": (
        "gelu with a 256x1024 production shape through one worker's estimate op; off a "
        "TPU the estimate alone, each measured column saying why it is empty", "est/meas"),
    "host_speed/process_start.py": (
        "one candidate process started as a fresh process and one as a fork of the "
        "judge's zygote", "fresh/fork:"),
    "host_speed/production_speed.py": (
        "the small task only: distinct gelu kernels through a warm worker without the TPU "
        "compile, against a fresh script per candidate", "script/ours"),
    "host_speed/profile_cost.py": (
        "gelu: one plain timed run and one profiled run (capture, xprof conversion, static "
        "analysis) in this process", "gelu"),
    "host_speed/search_throughput.py": (
        "one evaluation of an 8x128 gelu on one local worker through the judge protocol, "
        "without the TPU compile (no second worker, no Ray)", "local x1"),
    "host_speed/session_scale.py": (
        "a 200-event session written, loaded and folded", "load + fold:"),
    "estimates/v5e_fidelity.py": (
        "the first measured softmax row estimated with its production shape shrunk to "
        "256x4096 (ratios meaningless)", "softmax: 1 tunings estimated"),
    "estimates/unpriced_ops.py": (
        "one small layer normalization compiled for v5e, each op's cycles and DMA type",
        "v5e bf16[8, 128, 256] axis 0:"),
    "estimates/tokamax_v7x.py": (
        "no compile: whether this libtpu estimates v7x, and the kept run's table "
        "(benchmarks/data/tokamax_v7x.json)", "v7x estimates here:"),
    "host_speed/tui_latency.py": (
        "the real app and controller with a streaming agent, three key presses per phase, "
        "no worker started; one first paint of `tilewright` in a pty", "first paint"),
}


@pytest.fixture(scope="module")
def smoke_runs() -> dict[str, subprocess.CompletedProcess[str]]:
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    procs = {name: subprocess.Popen([sys.executable, str(BENCHMARKS / name), "--smoke"],
                                    cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
             for name in SMOKES}
    done = {}
    for name, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += f"\n[killed after {TIMEOUT_S} s]"
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
    return done


def benchmark_scripts() -> set[str]:
    """Every benchmark script, as its path under benchmarks/ (``lib/`` holds helpers)."""
    return {p.relative_to(BENCHMARKS).as_posix() for p in BENCHMARKS.rglob("*.py")
            if p.parent != BENCHMARKS / "lib"}


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = benchmark_scripts()
    assert scripts == set(SMOKES), f"benchmarks without a smoke entry: {scripts - set(SMOKES)}"
    for name in scripts:
        assert "--smoke" in (BENCHMARKS / name).read_text(), f"{name} has no --smoke flag"


@pytest.mark.parametrize("script", sorted(SMOKES))
def test_benchmark_runs_in_smoke_mode(smoke_runs, script: str) -> None:
    run = smoke_runs[script]
    tail = run.stdout[-4000:]
    assert run.returncode == 0, f"{script} --smoke exited {run.returncode}:\n{tail}"
    assert SMOKES[script][1] in run.stdout, f"{script} --smoke printed no table:\n{tail}"


def test_the_suite_report_merges_runs_and_puts_chip_rows_beside_estimates(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``jaxbench_offline.py --report A.json B.json --measured SUITE=ROWS``: a later run's
    row replaces an earlier one's for its task; each task's latest chip row for its
    crowned kernel is the measured column; the totals keep measured and estimated apart."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location(
        "jaxbench_offline", BENCHMARKS / "search_quality" / "jaxbench_offline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def row(task: str, estimate: float | None, correct: bool = True) -> dict:
        return {"task": task, "generates": True, "crowned": correct, "truly_correct": correct,
                "lowerable": True, "production_compile": "ok", "evaluations": 4,
                "production_estimate": estimate, "production_source": "tpu_estimate",
                "best_rank": None, "crowned_sha256": f"sha-{task}" if correct else None}

    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps([{"suite": "MaxKernel", "wall_s": 10, "rows": [
        row("1k_a", 0.5), row("2k_b", 1.2), row("3k_c", None, correct=False)]}]))
    second.write_text(json.dumps([{"suite": "MaxKernel", "wall_s": 5, "rows": [
        row("1k_a", 0.9)]}]))
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    chip = {"kernel": "crowned.py", "status": "measured", "chip": "TPU v5 lite"}
    old.write_text(json.dumps({**chip, "task": "1k_a", "speedup": 0.4}) + "\n"
                   + json.dumps({**chip, "task": "2k_b", "kernel": "other.py", "speedup": 9}))
    new.write_text(json.dumps({**chip, "task": "1k_a", "speedup": 1.1,
                               "kernel_sha256": "sha-of-an-older-1k_a"}) + "\n")
    [suite] = module.merged([first, second])
    assert [r["task"] for r in suite["rows"]] == ["1k_a", "2k_b", "3k_c"]
    assert suite["rows"][0]["production_estimate"] == 0.9 and suite["wall_s"] == 15
    measured = module.chip_rows([old, new])
    assert set(measured) == {"1k_a"} and measured["1k_a"]["speedup"] == 1.1
    module.print_suite(suite, measured)
    out = capsys.readouterr().out
    assert "1/2 correct tasks measured, geomean 1.1x, >= 1.0 on 1 (33% of 3)" in out
    # best evidence: 1k_a measured 1.1, 2k_b estimated 1.2
    assert "2 tasks, geomean 1.15x, >= 1.0 on 2 (67% of 3)" in out
    # the row names the kernel it timed by hash, not the one crowned now: marked
    assert " 1.10x~ " in out and "another kernel than the one crowned now" in out
    # A row of the crowned kernel itself, timed under another file name, is found by its
    # hash and wins over the name's older kernel.
    split = tmp_path / "split.jsonl"
    split.write_text(json.dumps({**chip, "task": "1k_a", "kernel": "split2.py",
                                 "speedup": 1.4, "kernel_sha256": "sha-1k_a"}) + "\n")
    found = module.chip_rows([old, split, new], {"1k_a": "sha-1k_a"})
    assert found["1k_a"]["speedup"] == 1.4 and found["1k_a"]["kernel"] == "split2.py"
    module.print_suite(suite, found)
    assert " 1.40x " in capsys.readouterr().out
    # The suites share task names: a JAXBench row (it names the dtype it ran its task in)
    # is no MaxKernel figure, and a MaxKernel row (its task_dtype None) no JAXBench one;
    # a row older than the field (1k_a's) may be either's.
    jaxbench, maxkernel = tmp_path / "jaxbench.jsonl", tmp_path / "maxkernel.jsonl"
    jaxbench.write_text(json.dumps({**chip, "task": "2k_b", "speedup": 2.0,
                                    "task_dtype": "bfloat16"}) + "\n")
    maxkernel.write_text(json.dumps({**chip, "task": "3k_c", "speedup": 3.0,
                                     "task_dtype": None}) + "\n")
    rows = [old, jaxbench, maxkernel]
    assert set(module.chip_rows(rows, suite="MaxKernel")) == {"1k_a", "3k_c"}
    assert set(module.chip_rows(rows, suite="JAXBench")) == {"1k_a", "2k_b"}


def test_measure_on_chip_can_time_a_kernel_against_another(tmp_path: Path) -> None:
    """``DIR:KERNEL.py@OTHER.py``: the program list carries the other kernel as the
    baseline, and the report never takes such a row for a figure against XLA."""
    import importlib.util
    import json

    def module(name: str) -> Any:
        spec = importlib.util.spec_from_file_location(name.replace("/", "_"),
                                                      BENCHMARKS / name)
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return loaded

    task = tmp_path / "double"
    task.mkdir()
    (task / "task.toml").write_text('name = "double"\n[shapes.small]\nrows = 8\ncols = 128\n')
    (task / "reference.py").write_text("def make_inputs(key, rows, cols):\n    import jax\n"
                                       "    return (jax.random.normal(key, (rows, cols)),)\n"
                                       "def reference(x):\n    return 2 * x\n")
    (task / "mine.py").write_text("def kernel(x):\n    return x + x\n")
    (task / "theirs.py").write_text("def kernel(x):\n    return 2 * x\n")
    [entry] = module("on_chip/measure_on_chip.py").programs(
        [f"{task}:mine.py@theirs.py"], 1, "bfloat16")
    assert entry["kernel"] == "mine.py" and entry["against"] == "theirs.py"
    assert entry["against_source"] == "def kernel(x):\n    return 2 * x\n"
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"task": "double", "kernel": "crowned.py", "against":
                                "theirs.py", "speedup": 3.0, "status": "measured"}) + "\n")
    assert module("search_quality/jaxbench_offline.py").chip_rows([rows]) == {}
