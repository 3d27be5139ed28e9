"""Subcommands of the kernels layer: ``tasks``, ``eval``, ``estimate``, ``profile``.

Each lives in its own module (``cli_tasks``, ``cli_eval``, ``cli_profile``) exposing
``register(subparsers)``; their handlers import workers and loaders lazily.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

MODULES = ("kernels.cli_tasks", "kernels.cli_eval", "kernels.cli_estimate", "kernels.cli_profile",
           "kernels.cli_calibrate", "kernels.cli_new")


def register(sub: argparse._SubParsersAction) -> None:
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)


def task_and_candidate(task_spec: str, overrides: list[str] | None,
                       kernel: str | None) -> tuple[Any, Path, str]:
    """The task (with ``--set`` overrides) and the candidate's path and source.

    Without ``--kernel`` the task's own ``kernel.py`` is the candidate. Raises
    ``ValueError`` with a message fit for the user (bad task, unreadable kernel).
    """
    from kernels.loaders import load_task, parse_overrides
    from kernels.task import TaskError

    try:
        task = load_task(task_spec, parse_overrides(overrides))
    except TaskError as exc:
        raise ValueError(str(exc)) from exc
    if kernel:
        path = Path(kernel).expanduser()
    elif task.kernel_path is not None:
        path = task.kernel_path
    else:
        raise ValueError(f"task {task.name} has no kernel.py; pass --kernel FILE")
    from kernels.source_files import read_kernel_file

    # The task's own kernel.py must stay inside the task (a symlink out is refused); a
    # --kernel FILE may link within its own directory. Both are size-limited.
    roots = (task.root,) if not kernel else ()
    source = read_kernel_file(path, roots)  # KernelFileError is a ValueError
    return task, path, source
