"""The offline agent on real public tasks: JAXBench and MaxKernel, scaled with --set.

Point it at your own checkout of the public accelerator-agents repository (nothing of
it is vendored here):

    python benchmarks/search_quality/jaxbench_offline.py --jaxbench ~/accelerator-agents/JAXBench/benchmark \
        [--maxkernel ~/accelerator-agents/MaxKernel/evaluation/jaxbench_adapted_dataset] \
        [--budget 6] [--only NAME ...] [--set KEY=VALUE ...]

For each suite it
1. lists the tasks with ``tilewright tasks DIR --set ... --json``: those whose inputs
   generate at the scaled check shapes and at their production shapes (as written);
2. runs ``tilewright search --suite DIR --agent offline --budget N --json`` with the
   same ``--set`` (a copy of the chosen tasks when ``--only`` is given);
3. re-evaluates every crowned kernel with fresh inputs and 5 trials (``tilewright
   eval``): *truly correct* only when that is correct too, with no disqualifying flag;
4. counts the tasks whose operations Pallas TPU lowers (some version of the task passed
   the TPU lowering check), the denominator of the target.

Printed per task and in total: inputs generate, crowned, truly correct, lowerable,
rank (the TPU compiler's estimate at the production shape), wall time. ``--smoke`` needs
no checkout: the tasks of ``tests/fixtures/suite`` are listed (step 1, ``tilewright tasks
--no-check``, no worker) and the table printed from the listing; no search, no re-check.
Targets: all tasks generate inputs; no wrong kernel crowned; correct on at least two
thirds of the lowerable scaled tasks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository

# Sizes that make TPU-sized workloads run in TPU interpret mode on a CPU in seconds. A
# key a task lacks is skipped for that task; sizes two keys share are set together.
DEFAULT_SETS = [
    "batch_size=64", "in_features=256", "out_features=256", "input_size=256",
    "hidden_size=256", "output_size=256", "batch=2", "seq_len=128", "emb_dim=256",
    "mlp_dim=512", "M=256", "K=256", "N=256", "num_heads=2", "head_dim=128",
    "vocab_size=512", "batch_tokens=128", "hidden_dim=256", "num_query_heads=4",
    "num_kv_heads=2", "d_model=256", "moe_mlp_dim=256", "num_experts=4",
    "num_experts_per_tok=2", "in_channels=8", "out_channels=16", "kernel_size=3",
    # MaxKernel's 1p_Flash_Attention names its sizes B, S, H, D (no other task does)
    "B=2", "S=128", "H=2", "D=128",
]


def tw(*args: str, timeout: float = 7200.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    return subprocess.run([sys.executable, "-m", "tilewright.tui.cli", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


def sets_args(sets: list[str]) -> list[str]:
    return [x for s in sets for x in ("--set", s)]


def suite_dir(directory: Path, only: list[str] | None, scratch: Path) -> Path:
    if not only:
        return directory
    copy = scratch / directory.name
    copy.mkdir(parents=True, exist_ok=True)
    for name in only:
        if (directory / name).is_dir():
            shutil.copytree(directory / name, copy / name, dirs_exist_ok=True)
    return copy


def best_source(session: str | Path) -> str | None:
    """The source of a search session's best version (None: nothing crowned)."""
    from tilewright.sessions.log import load, read_text_blob
    from tilewright.sessions.search.graph import fold_search

    loaded = load(Path(session))
    state = fold_search(loaded.header, loaded.events)
    best = state.best()
    if best is None:
        return None
    return read_text_blob(loaded.path, state.session.versions[best].source_blob)


def write_crowned(kept: Path, out: Path) -> list[str]:
    """For every search session under ``kept`` (a run's ``--keep`` folder) whose best
    version is correct, ``out/<task folder>/``: a copy of the task's files and the crowned
    kernel as ``crowned.py``, the layout ``benchmarks/on_chip/measure_on_chip.py`` reads
    (``DIR:crowned.py``) to time it on a chip."""
    from tilewright.sessions.log import load, read_text_blob
    from tilewright.sessions.search.graph import fold_search

    written = []
    for events in sorted(kept.glob("sessions-*/*/events.jsonl")):
        loaded = load(events.parent)
        state = fold_search(loaded.header, loaded.events)
        best = state.best()
        root = Path((loaded.header.get("task") or {}).get("root") or "")
        if best is None or state.session.versions[best].status != "correct" or not root.is_dir():
            continue
        target = out / root.name
        shutil.copytree(root, target, dirs_exist_ok=True)
        (target / "crowned.py").write_text(
            read_text_blob(loaded.path, state.session.versions[best].source_blob))
        written.append(root.name)
    return written


def recheck(session: str, task_root: str, overrides: dict[str, str],
            chip: str, timeout: float | None = None) -> dict[str, Any]:
    """Re-evaluate a search session's best version with fresh inputs and five trials
    (``timeout``: the evaluation's deadline per phase, as the search had it)."""
    from tilewright.kernels.judge.rank import disqualifying_flags

    source = best_source(session)
    if source is None:
        return {"truly_correct": False}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(source)
    args = ["eval", "--task", task_root, "--kernel", handle.name, "--json", "--trials", "5",
            "--chip", chip]
    args += sets_args([f"{k}={v}" for k, v in overrides.items()])
    args += ["--timeout", str(timeout)] if timeout else []
    proc = tw(*args, timeout=max(600.0, 4 * (timeout or 0)))
    os.unlink(handle.name)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"truly_correct": False, "recheck": proc.stderr[-300:]}
    from tilewright.kernels.judge.rank import ranking

    ok = data.get("status") == "correct" and not disqualifying_flags(data)
    tpu = data.get("tpu") or {}
    rank = ranking(data)
    return {"truly_correct": ok, "recheck_status": data.get("status"),
            # the crowned kernel's text by its hash (measure_on_chip.py's rows carry
            # their kernel's): which chip row is of this very kernel
            "crowned_sha256": hashlib.sha256(source.encode()).hexdigest(),
            "recheck_flags": (data.get("integrity") or {}).get("flags"),
            # the production shape: the task's own size, as written (never --set)
            "production_compile": tpu.get("compile"), "production_shape": tpu.get("shape_label"),
            # the TPU compiler's estimated speedup (a roofline bound is not one)
            "production_estimate": rank.value if rank.is_estimate else None,
            "production_source": rank.source,
            "production_words": rank.words(), "estimate_s": tpu.get("compile_s"),
            "compile_peak_mb": tpu.get("compile_peak_mb"),
            "estimate_unavailable": tpu.get("estimate_unavailable")}


def estimate_crowned(crowned: Path, chip: str, timeout: float | None) -> list[dict]:
    """Each ``DIR/<task>/crowned.py`` (``--crowned-out``'s layout) estimated for ``chip`` at
    its task's production shape (``tilewright estimate``: no search, no correctness
    check), so a kernel crowned for one chip is priced on another."""
    from tilewright.kernels.judge.rank import ranking

    rows = []
    for kernel in sorted(crowned.glob("*/crowned.py")):
        args = ["estimate", "--task", str(kernel.parent), "--kernel", str(kernel), "--json",
                "--chip", chip, *(["--timeout", str(timeout)] if timeout else [])]
        try:
            data = json.loads(tw(*args, timeout=max(900.0, 4 * (timeout or 0))).stdout)
        except (json.JSONDecodeError, subprocess.TimeoutExpired):
            data = {"status": "crashed", "tpu": None}
        ok = data.get("status") == "ok"
        rank = ranking({"status": "correct" if ok else data.get("status"), "tpu": data.get("tpu")})
        rows.append({"task": kernel.parent.name, "chip": chip, "status": data.get("status"),
                     "kernel_sha256": hashlib.sha256(kernel.read_bytes()).hexdigest(),
                     "production_estimate": rank.value if rank.is_estimate else None,
                     "production_source": rank.source, "production_words": rank.words(),
                     "production_shape": (data.get("tpu") or {}).get("shape_label")})
        print(f"  {rows[-1]['task'][:44]:44} {rows[-1]['production_words']}"[:170], flush=True)
    return rows


def lowerable(session: str) -> bool:
    """Whether any version of the task passed the TPU lowering check."""
    from tilewright.sessions.log import load, read_json_blob

    loaded = load(Path(session))
    for event in loaded.events:
        if event.get("type") == "run.result" and event.get("result_blob"):
            try:
                result = read_json_blob(loaded.path, event["result_blob"])
            except Exception:
                continue
            if (result.get("lowering") or {}).get("tpu") == "ok":
                return True
    return False


def per_task_sets(suite: Path, sets: list[str]) -> list[str]:
    """``TASK:KEY=VALUE`` additions for tasks that refuse the preset because two keys
    share a hard-coded size (``batch_size`` = ``out_channels`` = 128): the partner key
    gets the same value, which is the only way the literal can be rewritten."""
    import re

    from tilewright.kernels.tasks.loaders import find_tasks, load_with_shared
    from tilewright.kernels.tasks.task import TaskError

    shared = dict(s.split("=", 1) for s in sets)
    extra: list[str] = []
    for item in find_tasks(suite):
        if isinstance(item, TaskError):
            continue
        own: dict[str, str] = {}
        for _ in range(4):
            try:
                load_with_shared(item.root, shared, own)
                break
            except TaskError as exc:
                clash = re.search(r"--set (\w+)=(\S+): the size (\S+) is hard-coded .* "
                                  r"also equals CONFIG\['(\w+)'\]", str(exc))
                if not clash:
                    break
                key, value, _size, partner = clash.groups()
                if partner in shared:  # both keys are in the preset: the smaller for both
                    value = str(min(int(value), int(shared[partner])))
                own[key] = own[partner] = value
        extra += [f"{item.name}:{k}={v}" for k, v in own.items()]
    return extra


def run_suite(label: str, directory: Path, args: argparse.Namespace, scratch: Path) -> dict:
    suite = suite_dir(directory, args.only, scratch)
    started = time.perf_counter()
    resolved = per_task_sets(suite, args.sets)
    if resolved:
        print(f"{label}: per-task overrides for shared sizes: {' '.join(resolved)}",
              file=sys.stderr)
    check = ["--no-check"] if args.smoke else []  # a smoke run starts no worker
    listing = json.loads(tw("tasks", str(suite), "--no-bundled", "--json", *check,
                            *sets_args(args.sets)).stdout)["tasks"]
    generates = {row["name"] or row["path"]: row["error"] is None for row in listing}
    if args.smoke:
        rows = [{"task": name, "generates": ok, "crowned": False, "truly_correct": False,
                 "lowerable": False, "best_rank": None, "evaluations": 0}
                for name, ok in generates.items()]
        return {"suite": label, "rows": rows, "totals": None,
                "wall_s": time.perf_counter() - started,
                "inputs_generate": sum(generates.values()), "tasks_listed": len(generates)}
    # Tasks that refused the preset (a size two keys share) are listed again with the
    # per-task values the search uses; a later --set wins over an earlier one.
    own: dict[str, list[str]] = {}
    for item in resolved:
        name, _, pair = item.partition(":")
        own.setdefault(name, []).append(pair)
    for name, pairs in own.items():
        if (suite / name).is_dir():
            again = json.loads(tw("tasks", str(suite / name), "--no-bundled", "--json",
                                  *sets_args(args.sets + pairs)).stdout)["tasks"]
            generates = {k: v for k, v in generates.items() if name not in k}
            generates.update({row["name"] or row["path"]: row["error"] is None
                              for row in again})
    search = tw("search", "--suite", str(suite), "--agent", "offline", "--budget",
                str(args.budget), "--json", "--fresh", "--workers", str(args.workers),
                "--chip", args.chip,
                *(("--timeout", str(args.timeout)) if args.timeout else ()),
                "--session-dir", str(scratch / f"sessions-{label}"),
                *sets_args(args.sets + resolved))
    try:
        report = json.loads(search.stdout)
    except json.JSONDecodeError:
        print(search.stderr[-2000:], file=sys.stderr)
        raise
    rows = []
    for task in report["tasks"]:
        from tilewright.kernels.tasks.loaders import load_task

        crowned = task["best_status"] == "correct" and task["best_version"] is not None
        root = next((str(Path(suite) / d.name) for d in Path(suite).iterdir()
                     if d.is_dir() and load_task(d).name == task["task"]), None)
        overrides = {}
        from tilewright.sessions.log import load

        overrides = (load(Path(task["session"])).header.get("task") or {}).get("overrides") or {}
        try:
            check = recheck(task["session"], root, overrides, args.chip, args.timeout) \
                if crowned and root else \
                {"truly_correct": False}
        except Exception as exc:  # a re-check that cannot run counts as not correct
            check = {"truly_correct": False, "recheck": f"{type(exc).__name__}: {exc}"}
        rows.append({"task": task["task"], "generates": generates.get(task["task"], True),
                     "crowned_sha256": None, "crowned": crowned, **check,
                     "lowerable": lowerable(task["session"]),
                     "best_rank": task.get("best_rank"),  # kernels.judge.rank.Rank as JSON
                     "evaluations": task["evaluations"]})
    for error in report["errors"]:
        rows.append({"task": Path(error["path"]).name, "generates": False, "crowned": False,
                     "truly_correct": False, "lowerable": False, "best_rank": None,
                     "evaluations": 0, "error": error["message"][:200]})
    return {"suite": label, "rows": rows, "totals": report.get("totals"),
            "wall_s": time.perf_counter() - started,
            "inputs_generate": sum(generates.values()), "tasks_listed": len(generates)}


def handtuned_v6e() -> dict[str, float]:
    """JAXBench's own hand-tuned Pallas kernels, measured on TPU v6e against its XLA
    baselines (``benchmarks/data/jaxbench_v6e.csv``: baseline median / optimized median
    per workload that has both)."""
    import csv

    medians: dict[tuple[str, str], float] = {}
    with open(ROOT / "benchmarks" / "data" / "jaxbench_v6e.csv") as handle:
        lines = [line for line in handle if not line.startswith("#")]
    for row in csv.DictReader(lines):
        if row.get("status") == "success" and row.get("median_ms"):
            medians[(row["workload"], row["variant"])] = float(row["median_ms"])
    return {name: base / medians[(name, "optimized")]
            for (name, variant), base in medians.items()
            if variant == "baseline" and (name, "optimized") in medians}


def merged(files: list[Path]) -> list[dict]:
    """The suites of several runs' --json files as one run each: a later file's row
    replaces an earlier one's for the same task (a task searched again after a fix),
    in the first file's order; the search's own totals are dropped (they counted one
    run), the wall times summed."""
    suites: dict[str, dict] = {}
    for path in files:
        for result in json.loads(path.read_text()):
            into = suites.setdefault(result["suite"], {
                "suite": result["suite"], "rows": [], "totals": None, "wall_s": 0.0,
                "listed": {}})
            into["wall_s"] += result.get("wall_s") or 0.0
            for row in result["rows"]:
                at = next((i for i, r in enumerate(into["rows"]) if r["task"] == row["task"]),
                          None)
                if at is None:
                    into["rows"].append(row)
                else:
                    into["rows"][at] = row
    for into in suites.values():
        into["tasks_listed"] = len(into["rows"])
        into["inputs_generate"] = sum(bool(r["generates"]) for r in into["rows"])
        del into["listed"]
    return list(suites.values())


def chip_rows(files: list[Path], crowned: dict[str, str] | None = None,
              suite: str | None = None) -> dict[str, dict]:
    """Each task's latest ``measure_on_chip.py`` row for its crowned kernel, from files
    oldest first (device times against XLA's on the chip the row names): known by its hash
    where both sides say it (``crowned``: task -> ``crowned_sha256``; a row's
    ``kernel_sha256``), which wins over the name ``crowned.py`` alone. ``suite``: not the
    other's rows (the suites share names; a JAXBench row's ``task_dtype`` is set)."""
    by_name: dict[str, dict] = {}
    by_hash: dict[str, dict] = {}
    for path in files:
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else None
            if not row or "task" not in row or row.get("against") or (suite and "task_dtype"
                    in row and bool(row["task_dtype"]) != (suite == "JAXBench")):
                continue  # (timed against another kernel than XLA's; the other suite's)
            want = (crowned or {}).get(row["task"])
            if want and row.get("kernel_sha256") == want:
                by_hash[row["task"]] = row
            elif row.get("kernel") == "crowned.py":
                by_name[row["task"]] = row
    return {**by_name, **by_hash}


def _number(rank: Any) -> str:
    """A crowned kernel's ranking number at the production shape, as the table shows it:
    the estimate ("1.07x") or the bound against XLA's roofline (">=0.88x")."""
    if not isinstance(rank, dict) or rank.get("value") is None:
        return "-"
    value = float(rank["value"])
    return f">={value:.2g}x" if rank.get("source") == "roofline" else f"{value:.3g}x"


def print_suite(result: dict, chip: dict[str, dict] | None = None) -> None:
    import math
    import statistics

    rows = result["rows"]
    tuned = handtuned_v6e()
    chip = chip or {}
    print(f"\n== {result['suite']}: {len(rows)} tasks, {result['wall_s']:.0f} s")
    print(f"{'task':<44} gen crown true lower prod  est.@prod    bound  JB-tuned  "
          f"{'  meas.' if chip else ''}shape / why no estimate")
    for r in rows:
        speed = (f"{r['production_estimate']:.3g}x"
                 if isinstance(r.get("production_estimate"), int | float) else "-")
        bound = _number(r.get("best_rank")) if r.get("production_source") == "roofline" \
            and r.get("truly_correct") else "-"
        hand = next((f"{v:.2f}x" for k, v in tuned.items() if r["task"].startswith(k)), "-")
        prod = {"ok": "y", "error": "FAIL", "unavailable": "?"}.get(
            r.get("production_compile") or "", "-")
        note = r.get("production_shape") or ""
        if r.get("estimate_unavailable") and r.get("production_compile") == "ok":
            note = f"{note} · {str(r['estimate_unavailable'])[:60]}"
        print(f"{r['task'][:44]:<44} {'y' if r['generates'] else 'N':>3} "
              f"{'y' if r['crowned'] else '-':>5} {'y' if r['truly_correct'] else '-':>4} "
              f"{'y' if r['lowerable'] else '-':>5} {prod:>4} {speed:>10}  {bound:>7} "
              f"{hand:>9}  {_measured(chip.get(r['task']), r) + ' ' if chip else ''}"
              f"{note[:70]}")
    print("est.@prod: the TPU compiler's estimated speedup over XLA at the production shape; "
          "bound: a lower bound against XLA's roofline where XLA has no estimate; JB-tuned: "
          "JAXBench's own hand-tuned Pallas kernel, measured on v6e against its XLA "
          "baseline (benchmarks/data/jaxbench_v6e.csv)")
    crowned = sum(r["crowned"] for r in rows)
    true = sum(r["truly_correct"] for r in rows)
    low = sum(r["lowerable"] for r in rows)
    true_low = sum(r["truly_correct"] and r["lowerable"] for r in rows)
    # a re-check that ran out of time says nothing about the kernel (a loaded machine)
    unchecked = sum(r["crowned"] and not r["truly_correct"]
                    and r.get("recheck_status") == "timeout" for r in rows)
    wrong = crowned - true - unchecked
    print(f"inputs generate: {result['inputs_generate']}/{result['tasks_listed']} · crowned "
          f"{crowned} · truly correct {true} (wrong kernels crowned: {wrong}"
          f"{f'; re-check timed out: {unchecked}' if unchecked else ''}) · "
          f"lowerable {low} · correct on lowerable {true_low}/{low} "
          f"({(true_low / low if low else 0):.0%}, target >= 67%)")
    # at the production shape: what the crowned bests are worth at the size users run
    fails = sum(r["crowned"] and r.get("production_compile") == "error" for r in rows)
    compiles = sum(r["crowned"] and r.get("production_compile") == "ok" for r in rows)
    ranked = [r["production_estimate"] for r in rows
              if r["truly_correct"] and isinstance(r.get("production_estimate"), int | float)]
    geo = math.exp(statistics.fmean(math.log(x) for x in ranked)) if ranked else None
    n = len(rows) or 1
    fast1 = sum(x >= 1.0 for x in ranked) / n
    fast15 = sum(x >= 1.5 for x in ranked) / n
    # a ranking number for every correct task: the compiler's (estimate, or the kernel's
    # estimate against the reference's roofline), never host simulation
    correct = [r for r in rows if r["truly_correct"]]
    by_compiler = [r for r in correct if r.get("production_source") in ("tpu_estimate",
                                                                         "roofline")]
    roofline = sum(r.get("production_source") == "roofline" for r in correct)
    print(f"ranking number at the production shape: {len(by_compiler)}/{len(correct)} "
          f"correct tasks ranked by the TPU compiler ({len(by_compiler) - roofline} "
          f"estimated against XLA, {roofline} against XLA's roofline); without one:")
    for r in correct:
        if r not in by_compiler:
            print(f"  {r['task'][:44]}: {r.get('production_words') or '-'}"[:160])
    times = [r["estimate_s"] for r in rows if isinstance(r.get("estimate_s"), int | float)]
    peaks = [r["compile_peak_mb"] for r in rows
             if isinstance(r.get("compile_peak_mb"), int | float)]
    print(f"at the production shape: crowned bests that compile {compiles}/{crowned}, that "
          f"fail {fails} (target 0); correct and estimated {len(ranked)}/{len(rows)}; "
          f"geomean est. {'-' if geo is None else f'{geo:.3g}x'}; fast_1 {fast1:.0%}, "
          f"fast_1.5 {fast15:.0%}; production verdict + estimate per re-check: median "
          f"{statistics.median(times) if times else float('nan'):.1f} s (target 10 s); "
          f"compile processes' peak {max(peaks) if peaks else float('nan'):.0f} MB "
          f"(target < 4096)")
    if chip:
        print_measured(rows, chip)
    if result.get("totals"):
        t = result["totals"]
        geo = t["geomean"]
        print(f"suite totals (search): correct rate {t['correct_rate']:.0%}, geomean "
              f"{'-' if geo is None else f'{geo:.3g}x'} over {t['counted']} estimated or "
              f"measured, fast_1 {t['fast_1']:.0%}, fast_1.5 {t['fast_1.5']:.0%}")


def _measured(row: dict | None, crowned: dict | None = None) -> str:
    """A task's chip figure; marked "~" when the row names the kernel it timed by hash
    and that is not the kernel the task's row crowned (one searched again since)."""
    if row is None:
        return "      -"
    figure = f"{row['speedup']:5.2f}x" if row.get("speedup") else f"{row['status'][:6]:>6}"
    return figure + ("~" if _another(row, crowned) else " ")


def _another(row: dict, crowned: dict | None) -> bool:
    """Whether a chip row is known to be of another kernel than the one crowned."""
    have, want = row.get("kernel_sha256"), (crowned or {}).get("crowned_sha256")
    return bool(have and want and have != want)


def print_measured(rows: list[dict], chip: dict[str, dict]) -> None:
    """Totals of the crowned kernels' device times on the chip, beside the estimates';
    and one figure per task by its best evidence (measured where measured, else the
    estimate), labelled as such: never a figure of one kind called the other."""
    import math

    def geo(xs: list[float]) -> str:
        return f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3g}x" if xs else "-"

    correct = [r for r in rows if r["truly_correct"]]
    timed = [(r, chip[r["task"]]) for r in correct if chip.get(r["task"], {}).get("speedup")]
    chips = sorted({m.get("chip") or "?" for _, m in timed})
    failed = [r["task"] for r in correct
              if r["task"] in chip and not chip[r["task"]].get("speedup")]
    ratios = [m["speedup"] for _, m in timed]
    n = len(rows) or 1
    print(f"measured on {', '.join(chips) or 'no chip'} (meas.: device time of XLA over the "
          f"crowned kernel's, each at its production shape and dtype): {len(timed)}/"
          f"{len(correct)} correct tasks measured, geomean {geo(ratios)}, >= 1.0 on "
          f"{sum(x >= 1.0 for x in ratios)} ({sum(x >= 1.0 for x in ratios) / n:.0%} of "
          f"{len(rows)}), >= 1.5 on {sum(x >= 1.5 for x in ratios)}"
          + (f"; not measured: {', '.join(failed)} ({', '.join(chip[t]['status'] for t in failed)})"
             if failed else ""))
    best = [chip[r["task"]]["speedup"] if chip.get(r["task"], {}).get("speedup")
            else r["production_estimate"] for r in correct
            if chip.get(r["task"], {}).get("speedup")
            or isinstance(r.get("production_estimate"), int | float)]
    other = [r["task"] for r, m in timed if _another(m, r)]
    if other:
        print(f"~: measured, but another kernel than the one crowned now (searched again "
              f"since): {', '.join(other)}")
    print(f"by the best evidence (measured where measured, else the compiler's estimate): "
          f"{len(best)} tasks, geomean {geo(best)}, >= 1.0 on {sum(x >= 1.0 for x in best)} "
          f"({sum(x >= 1.0 for x in best) / n:.0%} of {len(rows)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jaxbench", type=Path, help="JAXBench/benchmark folder")
    parser.add_argument("--maxkernel", type=Path,
                        help="MaxKernel/evaluation/jaxbench_adapted_dataset folder")
    parser.add_argument("--budget", type=int, default=6, help="versions per task (default 6)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes of the search (default 1)")
    parser.add_argument("--chip", default="v5e",
                        help="the TPU generation kernels are compiled, estimated and ranked "
                             "for (default v5e)")
    parser.add_argument("--only", nargs="*", help="task folder names to run (default: all)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="the search's evaluation deadline per phase (`tilewright search "
                             "--timeout`): a slow host's production compiles may need more")
    parser.add_argument("--set", dest="sets", action="append", default=None,
                        metavar="KEY=VALUE", help="scaling override (default: a preset)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep the search sessions here (default: a temporary folder)")
    parser.add_argument("--crowned-out", type=Path, metavar="DIR",
                        help="write each crowned kernel beside a copy of its task "
                             "(DIR/<task>/crowned.py, for measure_on_chip.py); with --keep "
                             "alone, from that kept run without searching again")
    parser.add_argument("--estimate-crowned", type=Path, metavar="DIR",
                        help="no search: estimate every DIR/<task>/crowned.py for --chip "
                             "(rows as --json)")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="print the tables again from runs' --json files (no run); a "
                             "later file's row replaces an earlier one's for its task")
    parser.add_argument("--measured", action="append", default=[], metavar="SUITE=ROWS",
                        help="with --report: measure_on_chip.py rows of that suite's crowned "
                             "kernels (repeatable, oldest first), a column and totals beside "
                             "the estimates")
    parser.add_argument("--smoke", action="store_true",
                        help="no checkout needed: list the fixture suite's tasks and print "
                             "the table (tests/test_benchmarks.py)")
    args = parser.parse_args(argv)
    args.sets = args.sets or DEFAULT_SETS
    if args.report:
        measured: dict[str, list[Path]] = {}
        for item in args.measured:
            suite, sep, rows = item.partition("=")
            if not sep:
                parser.error(f"--measured {item!r}: give JAXBench=ROWS or MaxKernel=ROWS")
            measured.setdefault(suite, []).append(Path(rows))
        for result in merged(args.report):
            hashes = {r["task"]: r["crowned_sha256"] for r in result["rows"]
                      if r.get("crowned_sha256")}
            print_suite(result, chip_rows(measured.get(result["suite"], []), hashes, result["suite"]))
        return 0
    if args.estimate_crowned:
        rows = estimate_crowned(args.estimate_crowned, args.chip, args.timeout)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return 0
    if args.crowned_out and args.keep and not (args.jaxbench or args.maxkernel):
        names = write_crowned(args.keep, args.crowned_out)
        print(f"{len(names)} crowned kernels written under {args.crowned_out}: {' '.join(names)}")
        return 0
    if args.smoke:
        fixtures = ROOT / "tests" / "fixtures" / "suite"
        args.jaxbench, args.maxkernel = fixtures, None
        args.only = ["jaxbench_silu", "maxkernel_add_relu"]
        print("smoke: the public JAXBench and MaxKernel checkouts are not read (step 1 runs on "
              "tests/fixtures/suite); the search and the re-check are skipped, so crowned, "
              "correct and lowerable below are not measured")
    if not args.jaxbench and not args.maxkernel:
        parser.error("give --jaxbench and/or --maxkernel (your checkout of the public "
                     "accelerator-agents repository)")
    results = []
    with tempfile.TemporaryDirectory(prefix="tw-jaxbench-") as scratch:
        if args.keep:  # sessions (and copied tasks) kept for report/replay afterwards
            scratch = str(args.keep)
            args.keep.mkdir(parents=True, exist_ok=True)
        for label, directory in (("JAXBench", args.jaxbench), ("MaxKernel", args.maxkernel)):
            if directory:
                results.append(run_suite(label, directory.expanduser(), args, Path(scratch)))
                print_suite(results[-1])
        if args.crowned_out:
            write_crowned(Path(scratch), args.crowned_out)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
