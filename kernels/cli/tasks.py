"""``tilewright tasks [DIR] [--set K=V ...]``: list the bundled tasks and every task under DIR.

DIR is searched recursively for all three layouts (native ``task.toml``, JAXBench
``baseline.py``, MaxKernel ``kernel_task.yaml``). Each task's input generation is then
tried in a worker at its check shapes (``--set`` applies to every task that knows the
key) and at its production shape (the size verdicts and rankings are for; ``--set``
never changes it), abstractly, so TPU sizes cost nothing: the inputs' shapes are listed, and a task whose inputs cannot be generated is
listed as broken with the task file's line. ``--no-check`` skips the worker. A task
that fails to load or to generate inputs is listed with its error instead of stopping
the listing; the exit status is then 1. Held-out shapes are counted but their
parameters and inputs are never printed. App side: no JAX here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from tilewright.kernels.cli import overrides_argument, subcommand

SCHEMA = "tilewright.tasks/1"
SUMMARY = "list bundled tasks and the tasks found under DIR"


def register(sub: argparse._SubParsersAction) -> None:
    parser = subcommand(sub, "tasks", SUMMARY, run)
    parser.add_argument("directory", nargs="?", metavar="DIR",
                        help="folder to search for tasks (default: bundled tasks only)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-bundled", action="store_true", help="leave out the bundled tasks")
    overrides_argument(parser, "shape override applied to every task that has KEY (repeatable)")
    parser.add_argument("--no-check", action="store_true",
                        help="do not try each task's input generation in a worker")


def run(args: argparse.Namespace) -> int:
    """List the bundled tasks and every task under DIR (searched recursively; native, JAXBench
    and MaxKernel layouts). Broken tasks are listed with their error; the exit status is
    then 1."""
    from tilewright.kernels.tasks.loaders import BUNDLED_DIR, find_tasks, parse_overrides
    from tilewright.kernels.tasks.task import Task, TaskError

    try:
        overrides = parse_overrides(args.overrides)
    except ValueError as exc:
        _error(str(exc), args.json)
        return 2
    entries: list[tuple[str, Task | TaskError]] = []
    if not args.no_bundled and BUNDLED_DIR.is_dir():
        # find_tasks, not bundled_tasks: one broken bundled task must not hide the others
        entries += [("bundled", t) for t in find_tasks(BUNDLED_DIR, overrides)]
    if args.directory:
        try:
            entries += [("found", t) for t in find_tasks(args.directory, overrides)]
        except TaskError as exc:
            _error(str(exc), args.json)
            return 2
    rows = [_row(origin, item) for origin, item in entries]
    if not args.no_check:
        tasks = [(row, item) for row, (_, item) in zip(rows, entries, strict=True)
                 if isinstance(item, Task)]
        try:
            checks = asyncio.run(_check_inputs([t for _, t in tasks]))
        except Exception as exc:  # no worker: list what the loaders know, say why
            _error(f"could not start a JAX worker to try input generation ({exc}); "
                   "listing without the check (--no-check skips it)", args.json)
            checks = [None] * len(tasks)
        for (row, _), check in zip(tasks, checks, strict=True):
            _merge_check(row, check)
    try:
        if args.json:
            print(json.dumps({"schema": SCHEMA, "tasks": rows}, indent=2), flush=True)
        else:
            _table(rows, args.directory)
    except BrokenPipeError:  # `tilewright tasks --json | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    return 1 if any(r["error"] for r in rows) else 0


def _row(origin: str, item: Any) -> dict[str, Any]:
    from tilewright.kernels.tasks.task import TaskError

    if isinstance(item, TaskError):
        return {"origin": origin, "name": None, "layout": None, "family": None,
                "path": _display(Path(item.path)), "shapes": None, "error": str(item),
                "line": item.line}
    shapes = item.shapes
    return {
        "origin": origin, "name": item.name, "layout": item.layout, "family": item.family,
        "path": _display(item.root), "description": item.description,
        "shapes": {
            "small": sum(s.size == "small" and not s.held_out for s in shapes),
            "large": sum(s.size == "large" and not s.held_out for s in shapes),
            "held_out": sum(s.held_out for s in shapes),
            "visible": [{"name": s.name, "size": s.size, "params": s.params}
                        for s in item.visible_shapes()],
        },
        "production": ({"name": item.production.name, "size": item.production.size,
                        "params": item.production.params,
                        "is_check_shape": item.production_is_check_shape()}
                       if item.production else None),
        "starting_kernel": _display(item.kernel_path) if item.kernel_path else None,
        "warnings": list(item.meta.get("warnings", [])),
        "error": None,
    }


async def _check_inputs(tasks: list[Any]) -> list[dict[str, Any] | None]:
    """Ask one worker for every task's input signature (``kernels.worker.requests.inputs_op``)."""
    from tilewright.kernels.pool import LocalExecutor
    from tilewright.kernels.pool.workers import WorkerFailure, WorkerOpError

    results: list[dict[str, Any] | None] = []
    async with LocalExecutor(workers=1) as judge:
        for task in tasks:
            try:
                found = await judge.inputs(task)
                production = task.production_task()
                if production is not None and not found.get("error"):
                    at = await judge.inputs(production)
                    if at.get("error"):
                        at["error"]["message"] = ("at the production shape: "
                                                  + at["error"]["message"])
                        found = at
                    else:
                        found["production"] = (at.get("configs") or [None])[0]
                results.append(found)
            except (WorkerFailure, WorkerOpError) as exc:
                results.append({"error": {"message": f"input generation failed: {exc}",
                                          "file": None, "line": None}})
    return results


def _merge_check(row: dict[str, Any], check: dict[str, Any] | None) -> None:
    """Fold a worker's answer into a listing row: input shapes, or the task's error."""
    if check is None:
        row["inputs_checked"] = False
        return
    row["inputs_checked"] = True
    error = check.get("error")
    if error:
        row["error"] = error["message"]
        row["line"] = error.get("line")
        return
    shown = {s["name"] for s in row["shapes"]["visible"]}
    row["inputs"] = {c["name"]: {"inputs": c["inputs"], "static": c["static"], "how": c["how"]}
                     for c in check.get("configs", []) if c["name"] in shown}
    at = check.get("production")
    if at and row.get("production") is not None:
        row["production"]["inputs"] = at["inputs"]
        row["production"]["static"] = at["static"]


def _display(path: Path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    return rel if not rel.startswith("..") else str(path)


def _table(rows: list[dict[str, Any]], directory: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if console.width < STACK_BELOW and rows:
        # A narrow terminal: one block per task, values wrapped at spaces (a table's
        # eight columns would cut names and shapes into 7-character pieces).
        for line in stacked(rows, console.width):
            console.print(line, highlight=False, markup=False, soft_wrap=True)
        _notes(console, rows, directory)
        return
    table = Table(title="tilewright tasks", title_justify="left", expand=False)
    for column in ("name", "layout", "family", "shapes", "check inputs", "production",
                   "kernel", "path"):
        table.add_column(column, overflow="fold")
    for row in rows:
        if row["error"]:
            table.add_row(f"[red]✗ {row['name'] or 'broken'}[/]", row["layout"] or "—", "—",
                          "—", "—", "—", "—", row["path"])
            continue
        s = row["shapes"]
        shapes = " · ".join(f"{n} {label}" for n, label in (
            (s["small"], "small"), (s["large"], "large"), (s["held_out"], "held-out")) if n)
        inputs = _inputs_text(row.get("inputs")) or ("—" if row.get("inputs_checked") is None
                                                     else "")
        table.add_row(f"[bold]{row['name']}[/]", row["layout"], row["family"] or "—", shapes,
                      inputs, _production_text(row.get("production")),
                      "✓" if row["starting_kernel"] else "—", row["path"])
    if rows:
        console.print(table)
    elif not directory:
        console.print("no tasks")
    _notes(console, rows, directory)


# Below this many columns ``tilewright tasks`` prints one block per task, not a table.
STACK_BELOW = 120


def stacked(rows: list[dict[str, Any]], width: int) -> list[str]:
    """Each task as a block of lines no wider than ``width``: its name with layout,
    family and whether it has a starting kernel, then labelled values wrapped at spaces
    (a shape such as ``f32[4,32,4096,128]`` is never cut)."""
    import textwrap

    width = max(40, width)
    out: list[str] = []
    for row in rows:
        if row["error"]:
            out += textwrap.wrap(f"✗ {row['name'] or 'broken'} ({row['layout'] or '—'}): "
                                 f"{row['path']}", width, break_long_words=False,
                                 break_on_hyphens=False, subsequent_indent="    ")
            out.append("")
            continue
        s = row["shapes"]
        shapes = " · ".join(f"{n} {label}" for n, label in (
            (s["small"], "small"), (s["large"], "large"), (s["held_out"], "held-out")) if n)
        head = (f"{row['name']}  ({row['layout']}, {row['family'] or 'no family'}, "
                f"{'starting kernel' if row['starting_kernel'] else 'no starting kernel'})")
        out += textwrap.wrap(head, width, break_long_words=False, break_on_hyphens=False,
                             subsequent_indent="    ")
        inputs = _inputs_text(row.get("inputs"))
        fields = [("shapes", shapes or "—")]
        for i, line in enumerate(inputs.splitlines() or (["—"] if row.get("inputs_checked")
                                                          is None else [])):
            fields.append(("inputs" if i == 0 else "", line))
        fields += [("production", _production_text(row.get("production"))),
                   ("path", row["path"])]
        for label, value in fields:
            first = f"  {label:<11} "
            out += textwrap.wrap(value, width, initial_indent=first,
                                 subsequent_indent=" " * (len(first) + 2), break_long_words=False,
                                 break_on_hyphens=False) or [first.rstrip()]
        out.append("")
    return out


def _notes(console: Any, rows: list[dict[str, Any]], directory: str | None) -> None:
    for row in rows:
        if row["error"]:
            console.print(f"[red]✗[/] {row['error']}", highlight=False)
        for warning in row.get("warnings") or []:
            console.print(f"[yellow]![/] {row['name']}: {warning}", highlight=False)
    if directory and not any(r["origin"] == "found" for r in rows):
        console.print(f"no task directories under {directory} (looked for task.toml, "
                      "baseline.py, kernel_task.yaml)")


def _production_text(production: dict[str, Any] | None) -> str:
    """``tpu_4k: f32[4096,4096]``: the production configuration and its inputs."""
    if not production:
        return "—"
    from tilewright.kernels.judge.result import array_text

    arrays = " ".join(array_text(s, d) for s, d in production.get("inputs") or [])
    return f"{production['name']}: {arrays}" if arrays else production["name"]


def _inputs_text(inputs: dict[str, Any] | None) -> str:
    """``config_0: bf16[2,64,256] bf16[256]`` lines: the effective input shapes."""
    if not inputs:
        return ""
    from tilewright.kernels.judge.result import array_text

    lines = []
    for name, info in inputs.items():
        arrays = " ".join(array_text(s, d) for s, d in info["inputs"])
        lines.append(f"{name}: {arrays}" if len(inputs) > 1 else arrays)
    return "\n".join(lines)


def _error(message: str, as_json: bool) -> None:
    import sys

    if as_json:
        print(json.dumps({"schema": SCHEMA, "error": message}))
    else:
        print(f"tilewright tasks: {message}", file=sys.stderr)
