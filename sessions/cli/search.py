"""``tilewright search``: graph search over every task of a suite directory.

Each task gets its own session (under ``--session-dir``); a task whose search session
there is unfinished is resumed, a finished one is reported as it stands, so rerunning
the same command after an interruption continues where it stopped. Results: a table
(best status and rank, evaluations, tokens per task), ``--json`` (schema
``tilewright.search/1``, a ``tasks`` list) and ``--md FILE``. Exit 0 when every task
ended with a correct kernel, 1 when one did not (or could not be loaded), 2 for bad
usage. Heavy imports (agents, workers, ray) happen inside the handler.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tilewright.kernels.cli import subcommand
from tilewright.kernels.judge.judgement import Judgement
from tilewright.kernels.judge.rank import Rank, times
from tilewright.sessions import events as ev
from tilewright.sessions.core.log_open import backend_json

SCHEMA = "tilewright.search/1"


def register(sub: argparse._SubParsersAction) -> None:
    p = subcommand(
        sub, "search", "graph search (beam or parallel runs) over every task in a suite", _handler)
    p.add_argument("--suite", required=True, metavar="DIR",
                   help="folder of task directories (any layout), or `bundled`")
    p.add_argument("--agent", choices=("offline", "anthropic", "openai", "auto"),
                   default="offline",
                   help="who proposes children (default offline: templates, fixes, tuner)")
    p.add_argument("--budget", type=int, default=8, metavar="N",
                   help="kernel versions the search may create per task (default 8)")
    p.add_argument("--tokens", type=int, default=None, metavar="N",
                   help="token budget per task")
    p.add_argument("--cost", type=float, default=None, metavar="USD",
                   help="cost budget per task")
    p.add_argument("--wall", type=float, default=None, metavar="S",
                   help="wall-clock budget per task, seconds")
    p.add_argument("--mode", choices=("beam", "runs"), default="beam",
                   help="one beam, or several independent greedy runs")
    p.add_argument("--beam-width", type=int, default=2, metavar="N",
                   help="correct versions kept per round (default 2)")
    p.add_argument("--branching", type=int, default=2, metavar="N",
                   help="children per beam node (default 2)")
    p.add_argument("--runs", type=int, default=2, metavar="N",
                   help="independent runs (--mode runs)")
    p.add_argument("--rounds", type=int, default=3, metavar="N",
                   help="maximum rounds (tree depth, default 3)")
    p.add_argument("--executor", choices=("local", "ray"), default="local",
                   help="local worker processes, or Ray tasks (local instance or --address)")
    p.add_argument("--address", default=None, metavar="ADDR",
                   help="Ray cluster address, e.g. 10.0.0.2:6379 (--executor ray)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="evaluations at once (default: cores, and chips on a TPU host)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="[TASK:]KEY=VALUE",
                   help="shape override for every task that has KEY (or only TASK)")
    p.add_argument("--chip", default=None, metavar="CHIP",
                   help="the TPU generation every kernel is compiled, estimated and ranked "
                        "for (default: the config's [eval] or [backend] chip, else this "
                        "host's own, else v5e)")
    p.add_argument("--trials", type=int, default=None, metavar="N",
                   help="correctness trials per shape (default: [eval] trials, else 3)")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="timing budget per evaluation, seconds (default: [eval] "
                        "time_budget_s, else 3)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="each evaluation phase's deadline, seconds (default: [eval] "
                        "timeout_s, else 120); a big program's compiles at the production "
                        "shape may take longer, as the judge states (tpu.deadline_s)")
    p.add_argument("--session-dir", default=None, metavar="DIR",
                   help="where the per-task sessions live (default: the user data dir)")
    p.add_argument("--fresh", action="store_true",
                   help="start new searches even where a session for the task exists")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--md", default=None, metavar="FILE", help="also write a Markdown report")


def search_options(args: argparse.Namespace, chip: str | None) -> Any:
    """The evaluation options of every task's search: the config's ``[eval]`` table under
    the flags given, as ``auto`` and the workbench read it (a search once ignored the
    table, and its production deadline said "--timeout raises it" of a flag it lacked)."""
    from tilewright.sessions.opening import eval_options

    explicit = {k: v for k, v in (("trials", args.trials), ("time_budget_s", args.time_budget),
                                  ("timeout_s", args.timeout), ("chip", chip)) if v is not None}
    return eval_options(getattr(args, "config", None), None, explicit,
                        {"trials": 3, "time_budget_s": 3.0})


def _handler(args: argparse.Namespace) -> int:
    """Search over kernel versions for every task under --suite (native, JAXBench and MaxKernel
    layouts), evaluating on local worker processes or a Ray cluster. Rerun the same command
    to resume."""
    from tilewright.kernels.pool import ExecutorError
    from tilewright.sessions.opening import OpenError

    try:
        overrides = _parse_overrides(args.overrides)
        _check_args(args)
    except ValueError as exc:
        print(f"tilewright search: {exc}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(_search_suite(args, overrides))
    except ExecutorError as exc:
        print(f"tilewright search: {exc}", file=sys.stderr)
        return 2
    except _UsageError as exc:
        print(f"tilewright search: {exc}", file=sys.stderr)
        return 2
    except OpenError as exc:  # a session it would resume is locked or unreadable
        print(f"tilewright search: {exc}\n  next: {exc.next_step}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: every finished step is saved; rerun the same command to "
              "continue", file=sys.stderr)
        return 130
    report["totals"] = suite_totals(report)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)
    if args.md:
        Path(args.md).write_text(markdown(report))
    ok = report["tasks"] and all(t["best_status"] == "correct" for t in report["tasks"])
    return 0 if ok and not report["errors"] else 1


class _UsageError(Exception):
    pass


def _check_args(args: argparse.Namespace) -> None:
    for name in ("budget", "beam_width", "branching", "runs", "rounds", "trials"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("time_budget", "timeout"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be more than 0 seconds")
    if args.address and args.executor != "ray":
        raise ValueError("--address needs --executor ray")
    if args.suite == "bundled" and not Path(args.suite).is_dir():
        from tilewright.kernels.tasks.loaders import BUNDLED_DIR

        args.suite = str(BUNDLED_DIR)
    if not Path(args.suite).is_dir():
        raise ValueError(f"--suite {args.suite}: no such directory "
                         "(`--suite bundled` searches the bundled tasks)")


def _parse_overrides(items: list[str]) -> dict[str | None, dict[str, str]]:
    """``[TASK:]KEY=VALUE`` pairs, grouped by task (None: every task)."""
    from tilewright.kernels.tasks.loaders import parse_overrides

    out: dict[str | None, dict[str, str]] = {}
    for item in items:
        head, sep, value = item.partition("=")
        if not sep or not head:
            raise ValueError(f"--set {item!r}: expected [TASK:]KEY=VALUE")
        task, _, key = head.rpartition(":")
        out.setdefault(task or None, {}).update(parse_overrides([f"{key}={value}"]))
    return out


def _load(root: Path, overrides: dict[str | None, dict[str, str]]) -> tuple[Any, list[str]]:
    """The task with the overrides that apply to it (a shared key it lacks is skipped)."""
    from tilewright.kernels.tasks.loaders import load_task, load_with_shared

    name = load_task(root).name
    return load_with_shared(root, overrides.get(None), overrides.get(name))


def _find_session(base: Path, task: Any) -> Path | None:
    """The latest search session in ``base`` for this task (same root and overrides)."""
    from tilewright.sessions.log import list_session_dirs

    found = None
    for path in list_session_dirs(base):
        try:
            with open(path / "events.jsonl") as fh:
                header = json.loads(fh.readline())
        except (OSError, json.JSONDecodeError):
            continue
        info = header.get("search") or {}
        if not isinstance(info, dict):
            continue
        if (header.get("task", {}).get("root") == str(task.root)
                and info.get("overrides") == task.meta.get("overrides", {})):
            found = path
    return found


async def _search_suite(args: argparse.Namespace,
                        overrides: dict[str | None, dict[str, str]]) -> dict[str, Any]:
    from tilewright.agents import make_agent
    from tilewright.agents.errors import NoApiKey
    from tilewright.kernels.pool import make_executor
    from tilewright.kernels.tasks.loaders import find_tasks
    from tilewright.kernels.tasks.task import TaskError
    from tilewright.sessions.log import default_sessions_dir, load
    from tilewright.sessions.search import summarize
    from tilewright.sessions.search.graph import Budget, SearchConfig, fold_search

    try:
        agent = make_agent(args.agent, getattr(args, "config", None) or {})
    except NoApiKey as exc:
        raise _UsageError(str(exc)) from exc
    base = Path(args.session_dir) if args.session_dir else default_sessions_dir()
    base.mkdir(parents=True, exist_ok=True)
    from tilewright.agents.config import coerce

    controller = coerce(getattr(args, "config", None)).controller
    config = SearchConfig(
        mode=args.mode, beam_width=args.beam_width, branching=args.branching, runs=args.runs,
        max_rounds=args.rounds, profile_best=controller.profile_best,
        profile_every=controller.profile_every,
        budget=Budget(nodes=args.budget, tokens=args.tokens, cost_usd=args.cost,
                      wall_s=args.wall))
    from tilewright.kernels.judge.options import configured_chip

    chip = args.chip or configured_chip(coerce(getattr(args, "config", None)))
    if chip:
        from tilewright.profiling.chips import get_chip

        try:
            chip = get_chip(str(chip)).name
        except KeyError as exc:
            raise _UsageError(f"--chip {chip}: {exc.args[0]}") from None
    options = search_options(args, chip)
    report: dict[str, Any] = {"schema": SCHEMA, "suite": str(Path(args.suite).resolve()),
                              "executor": args.executor, "agent": agent.name,
                              "session_dir": str(base), "tasks": [], "errors": []}
    found = find_tasks(args.suite)
    if not found:
        raise _UsageError(f"--suite {args.suite}: no task directories found (looked for "
                          "task.toml, baseline.py and kernel_task.yaml)")
    tasks = []
    for item in found:
        if isinstance(item, TaskError):
            report["errors"].append({"path": item.path, "message": str(item)})
            _say(f"skipped {item.path}: {item}")
            continue
        try:
            task, skipped = _load(Path(item.root).resolve(), overrides)
            if skipped:
                _say(f"{task.name}: --set {', '.join(skipped)} does not apply; left out")
        except TaskError as exc:
            report["errors"].append({"path": str(item.root), "message": str(exc)})
            _say(f"skipped {item.root}: {exc}")
            continue
        tasks.append(task)
    plans = []
    for task in tasks:
        existing = None if args.fresh else _find_session(base, task)
        if existing is not None:
            loaded = load(existing)
            state = fold_search(loaded.header, loaded.events)
            if state.ended is not None and not _budget_grew(state, config):
                # finished earlier: report it, run nothing
                plans.append((task, existing, summarize(state, existing, task.name)))
                continue
        plans.append((task, existing, None))
    executor = make_executor(args.executor, workers=args.workers, address=args.address)
    async with contextlib.AsyncExitStack() as stack:
        backend = None
        if any(summary is None for _t, _e, summary in plans):
            await stack.enter_async_context(executor)  # workers only when there is work
            runs_on = await executor.backend()
            where = f" · {runs_on.label()}" if runs_on else ""
            backend = backend_json(runs_on)
            _say(f"{len(tasks)} task(s), {executor.describe()}{where}, agent {agent.label}")
        for task, existing, summary in plans:
            if summary is None:
                summary = await _run_one(task, existing, base, agent, executor, config,
                                         options, backend)
            else:
                _say(f"{task.name}: finished earlier ({summary.reason}), {existing}")
            entry = summary.to_json()
            entry["layout"] = task.layout
            report["tasks"].append(entry)
    return report


async def _run_one(task: Any, existing: Path | None, base: Path, agent: Any, executor: Any,
                   config: Any, options: Any, backend: dict[str, Any] | None) -> Any:
    from tilewright.sessions.opening import open_task_search

    search = await open_task_search(task, agent, executor, config, sessions_dir=base,
                                    existing=existing, options=options, backend=backend,
                                    meta={"overrides": task.meta.get("overrides", {})})
    _say(f"{task.name}: resuming {existing.name}" if existing is not None
         else f"{task.name}: new search {search.log.path.name}")
    search.subscribe(lambda e: _progress(task.name, e))
    try:
        return await search.run()
    finally:
        search.close()


def _budget_grew(state: Any, config: Any) -> bool:
    """A search that stopped on a budget continues when this command allows more."""
    from tilewright.sessions.search.planner import budget_reason

    if not (state.ended or "").startswith("budget:") or state.config is None:
        return False
    recorded = state.config
    state.config = replace(recorded, budget=config.budget)
    try:
        return budget_reason(state) is None
    finally:
        state.config = recorded


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _progress(task: str, event: ev.AnyEvent) -> None:
    """One line on stderr for the search's milestones in ``task``."""
    line = _MILESTONES.get(event["type"])
    said = line(event) if line is not None else None
    if said:
        _say(f"{task}: {said}")


def _run_start(e: ev.RunStart) -> str:
    return f"v{e['version']} evaluating ({e['run']})"


def _run_result(e: ev.RunResult) -> str | None:
    if e.get("cancelled"):
        return None
    rank = Judgement.from_event(e).rank
    tail = f" {rank.words(short=True)}" if rank is not None and rank.ranked else ""
    return f"v{e['version']} {e['status']}{tail}"


def _search_round(e: ev.SearchRound) -> str:
    beam = ", ".join(f"v{v}" for v in e.get("beam") or []) or "(empty)"
    return f"round {e['round']} beam {beam}"


def _search_end(e: ev.SearchEnd) -> str:
    return f"done ({e.get('reason')})"


# The search's milestones, filed by the event each reads (``ev.by_kind``).
_MILESTONES: dict[str, Callable[[Any], str | None]] = ev.by_kind(
    _run_start, _run_result, _search_round, _search_end)


FAST_P = (1.0, 1.5)
# The sources whose values are speedups the suite's figures count: measured on a TPU,
# or the TPU compiler's estimate against the XLA reference's estimate.
COUNTED_SOURCES = ("device_time", "tpu_estimate")


def _best_rank(task: dict[str, Any]) -> Rank | None:
    return Rank.from_json(task.get("best_rank"))


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in values) / len(values)) if values else None


def suite_totals(report: dict[str, Any]) -> dict[str, Any]:
    """The figures the field reports for a suite (KernelBench's fast_p, JAXBench's
    geometric mean): tasks, correct ones and their share, the geometric mean of the
    correct tasks' speedups, and fast_p for p in FAST_P (the share of *all* tasks that
    are correct and at least p times faster). A task counts as correct only with a
    crowned version (correct and free of disqualifying integrity flags); tasks that did
    not load count as failures.

    The geometric mean and fast_p count only a best rank whose value is a speedup
    (``COUNTED_SOURCES``: measured on a TPU, or the TPU compiler's estimate);
    ``counted`` says how many, ``counted_sources`` of which kind. A roofline rank (the
    reference had no estimate) is a lower bound: ``roofline_counted`` and
    ``roofline_geomean`` report those apart, never mixed in. A task ranked only by host
    simulation is correct but has no speedup to count (``host_simulation``)."""
    tasks = report.get("tasks") or []
    total = len(tasks) + len(report.get("errors") or [])
    correct = [t for t in tasks if t.get("best_status") == "correct"
               and t.get("best_version") is not None]
    ranks = [r for t in correct if (r := _best_rank(t)) is not None and r.value is not None
             and r.value > 0]
    counted = [r for r in ranks if r.source in COUNTED_SOURCES]
    speeds = [float(r.value) for r in counted if r.value is not None]
    bounds = [float(r.value) for r in ranks if r.is_roofline and r.value is not None]
    fast = {f"fast_{p:g}": (sum(1 for x in speeds if x >= p) / total if total else 0.0)
            for p in FAST_P}
    kinds = {source: sum(1 for r in counted if r.source == source)
             for source in COUNTED_SOURCES}
    return {"tasks": total, "correct": len(correct),
            "correct_rate": len(correct) / total if total else 0.0,
            "geomean": _geomean(speeds), "counted": len(speeds),
            "counted_sources": {k: n for k, n in kinds.items() if n},
            "roofline_geomean": _geomean(bounds), "roofline_counted": len(bounds),
            "host_simulation": sum(1 for r in ranks if r.simulated),
            **fast}


def _counted_words(totals: dict[str, Any]) -> str:
    """What the geometric mean is over: "3 estimated", "2 measured, 1 estimated"."""
    kinds = totals.get("counted_sources") or {}
    said = [f"{kinds[s]} {w}" for s, w in (("device_time", "measured"),
                                           ("tpu_estimate", "estimated")) if kinds.get(s)]
    return ", ".join(said) or "none"


def _totals_line(totals: dict[str, Any]) -> str:
    geo = totals["geomean"]
    fast = " · ".join(f"fast_{p:g} {totals[f'fast_{p:g}']:.0%}" for p in FAST_P)
    line = (f"{totals['correct']}/{totals['tasks']} correct ({totals['correct_rate']:.0%}) · "
            f"geomean speedup {'-' if geo is None else times(geo)} over "
            f"{totals['counted']} task(s) ({_counted_words(totals)}) · {fast}")
    if totals.get("roofline_counted"):
        line += (f" · apart: {totals['roofline_counted']} ranked against XLA's roofline "
                 f"only (lower bounds, geomean ≥{times(totals['roofline_geomean'])})")
    if totals.get("host_simulation"):
        line += (f" · {totals['host_simulation']} with no TPU estimate (host simulation "
                 "only: not counted)")
    return line


def _speed_column(report: dict[str, Any]) -> str:
    """The rank column's title says what the numbers are: the TPU compiler's estimate
    for a chip off-TPU, a measurement on a TPU."""
    sources = {r.source for t in report["tasks"] if (r := _best_rank(t)) and r.ranked}
    sources -= {"host_simulation"}  # shown as "no TPU estimate", not as a number
    chips = sorted({t.get("chip") for t in report["tasks"] if t.get("chip")})
    if sources == {"tpu_estimate"}:
        return f"est. speedup at production shape ({', '.join(chips) or 'TPU'}, compiler)"
    if sources <= {"tpu_estimate", "roofline"} and sources:
        return (f"est. speedup at production shape ({', '.join(chips) or 'TPU'}, compiler; "
                "≥: against XLA's roofline)")
    if sources == {"device_time"}:
        return "measured speedup"
    return "rank"


def _rank_cell(rank: Rank | None, shape: bool = True) -> str:
    """A rank in a table (``Rank.words(short=True)``), with the production shape it is
    for; a host-simulation ratio is not TPU performance."""
    if rank is None or not rank.ranked:
        return "-"
    if rank.simulated:
        return "no TPU estimate"
    words = rank.words(short=True)
    return f"{words} at {rank.shape}" if shape and rank.shape else words


def _task_speed(task: dict[str, Any]) -> str:
    return _rank_cell(_best_rank(task))


def _fmt_version(value: Any) -> str:
    return f"v{value}" if value else "-"


def _print_table(report: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"search · {report['suite']} · executor {report['executor']} · "
                  f"agent {report['agent']}", highlight=False)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                  collapse_padding=True)
    for col, right in (("task", False), ("layout", False), ("best", False),
                       (_speed_column(report), True), ("ver", True), ("evals", True), ("tokens", True),
                       ("flags", False), ("ended", False)):
        table.add_column(col, justify="right" if right else "left", no_wrap=col != "task",
                         overflow="fold")
    for t in report["tasks"]:
        status = t["best_status"] or "-"
        style = "green" if status == "correct" else "red"
        table.add_row(t["task"], t["layout"], f"[{style}]{status}[/]",
                      _task_speed(t), _fmt_version(t["best_version"]),
                      str(t["evaluations"]), str(t["tokens"]),
                      ", ".join(t.get("flags") or []) or "-", t["reason"])
    console.print(table)
    if report.get("totals"):
        console.print(_totals_line(report["totals"]), highlight=False)
    for t in report["tasks"]:
        if t.get("note"):
            console.print(f"[yellow]{t['task']}[/]: {t['note']}", highlight=False)
    for err in report["errors"]:
        console.print(f"[red]not loaded[/] {err['message']}", markup=True, highlight=False)
    console.print(f"sessions in {report['session_dir']} (rerun the same command to resume); "
                  "ranks: off a TPU, the TPU compiler's static estimate for the chip "
                  "against the XLA reference compiled for it (est.: a prediction, not a "
                  "measurement; ≥ roofline: against the reference's roofline where it has no "
                  "estimate, a lower bound); on a TPU, measured device time; interpret-mode "
                  "time on a CPU host ranks nothing while a compiler figure exists",
                  style="dim", highlight=False)


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Search results: {report['suite']}", "",
             f"Executor `{report['executor']}`, agent `{report['agent']}`.", "",
             f"| task | layout | best status | best {_speed_column(report)} | start | "
             "version | "
             "evaluations | tokens | flags | ended | session |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    for t in report["tasks"]:
        lines.append(
            f"| {t['task']} | {t['layout']} | {t['best_status'] or '-'} | "
            f"{_task_speed(t)} | {_rank_cell(Rank.from_json(t.get('start_rank')), False)} | "
            f"{_fmt_version(t['best_version'])} | "
            f"{t['evaluations']} | {t['tokens']} | {', '.join(t.get('flags') or []) or '-'} | "
            f"{t['reason']} | `{t['session']}` |")
    if report.get("totals"):
        lines += ["", "**Totals:** " + _totals_line(report["totals"])]
    notes = [t for t in report["tasks"] if t.get("note")]
    if notes:
        lines += ["", "## Why tasks failed", ""]
        for t in notes:
            lines.append(f"- **{t['task']}**")
            lines += [f"  - {line}" for line in str(t["note"]).splitlines()]
    if report["errors"]:
        lines += ["", "## Not loaded", ""]
        lines += [f"- `{e['path']}`: {e['message']}" for e in report["errors"]]
    return "\n".join(lines) + "\n"
