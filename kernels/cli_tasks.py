"""``tilewright tasks [DIR]``: list the bundled tasks and every task found under DIR.

DIR is searched recursively for all three layouts (native ``task.toml``, JAXBench
``baseline.py``, MaxKernel ``kernel_task.yaml``). A task that fails to load is listed
with its error instead of stopping the listing; the exit status is then 1. Held-out
shapes are counted but their parameters are never printed. App side: no JAX here.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

SCHEMA = "tilewright.tasks/1"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "tasks", help="list bundled tasks and the tasks found under DIR",
        description="List the bundled tasks and every task under DIR (searched recursively; "
                    "native, JAXBench and MaxKernel layouts). Broken tasks are listed with "
                    "their error; the exit status is then 1.")
    parser.add_argument("directory", nargs="?", metavar="DIR",
                        help="folder to search for tasks (default: bundled tasks only)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-bundled", action="store_true", help="leave out the bundled tasks")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kernels.loaders import BUNDLED_DIR, find_tasks
    from kernels.task import Task, TaskError

    entries: list[tuple[str, Task | TaskError]] = []
    if not args.no_bundled and BUNDLED_DIR.is_dir():
        # find_tasks, not bundled_tasks: one broken bundled task must not hide the others
        entries += [("bundled", t) for t in find_tasks(BUNDLED_DIR)]
    if args.directory:
        try:
            entries += [("found", t) for t in find_tasks(args.directory)]
        except TaskError as exc:
            _error(str(exc), args.json)
            return 2
    rows = [_row(origin, item) for origin, item in entries]
    try:
        if args.json:
            print(json.dumps({"schema": SCHEMA, "tasks": rows}, indent=2), flush=True)
        else:
            _table(rows, args.directory)
    except BrokenPipeError:  # `tilewright tasks --json | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    return 1 if any(r["error"] for r in rows) else 0


def _row(origin: str, item: Any) -> dict[str, Any]:
    from kernels.task import TaskError

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
        "starting_kernel": _display(item.kernel_path) if item.kernel_path else None,
        "warnings": list(item.meta.get("warnings", [])),
        "error": None,
    }


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
    table = Table(title="tilewright tasks", title_justify="left", expand=False)
    for column in ("name", "layout", "family", "shapes", "kernel", "path"):
        table.add_column(column, overflow="fold")
    for row in rows:
        if row["error"]:
            table.add_row("[red]✗ broken[/]", "—", "—", "—", "—", row["path"])
            continue
        s = row["shapes"]
        shapes = f"{s['small']} small · {s['large']} large"
        if s["held_out"]:
            shapes += f" · {s['held_out']} held-out"
        table.add_row(f"[bold]{row['name']}[/]", row["layout"], row["family"] or "—", shapes,
                      "✓" if row["starting_kernel"] else "—", row["path"])
    if rows:
        console.print(table)
    elif not directory:
        console.print("no tasks")
    for row in rows:
        if row["error"]:
            console.print(f"[red]✗[/] {row['error']}", highlight=False)
        for warning in row.get("warnings") or []:
            console.print(f"[yellow]![/] {row['name']}: {warning}", highlight=False)
    if directory and not any(r["origin"] == "found" for r in rows):
        console.print(f"no task directories under {directory} (looked for task.toml, "
                      "baseline.py, kernel_task.yaml)")


def _error(message: str, as_json: bool) -> None:
    import sys

    if as_json:
        print(json.dumps({"schema": SCHEMA, "error": message}))
    else:
        print(f"tilewright tasks: {message}", file=sys.stderr)
