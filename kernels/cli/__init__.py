"""Subcommands of the kernels layer: ``tasks``, ``eval``, ``estimate``, ``profile``,
``calibrate``, ``new`` and ``chips``.

Each lives in its own module (``kernels.cli.tasks``, ``.eval``, ...; ``MODULES``)
exposing ``register(subparsers)``; its handler's docstring is the command's ``--help``
text (``subcommand``). Handlers import loaders lazily and reach worker processes only
through a judge (``kernels.pool``). What they share is here: the task, kernel and
``--set`` arguments, and reading the candidate they name (a bad one is exit status 2).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

EXIT_USAGE = 2

MODULES = (
    "tilewright.kernels.cli.tasks",
    "tilewright.kernels.cli.eval",
    "tilewright.kernels.cli.estimate",
    "tilewright.kernels.cli.profile",
    "tilewright.kernels.cli.calibrate",
    "tilewright.kernels.cli.new",
    "tilewright.kernels.cli.chips",
)


def register(sub: argparse._SubParsersAction) -> None:
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)


def subcommand(sub: argparse._SubParsersAction, name: str, summary: str,
               handler: Any) -> argparse.ArgumentParser:
    """``tilewright NAME``: its parser (``summary`` in the command list, the handler's
    docstring as its help), dispatching to ``handler(args) -> exit status``. The
    handler is what the command does, so its docstring is what ``--help`` says."""
    parser = sub.add_parser(name, help=summary, description=inspect.getdoc(handler))
    parser.set_defaults(handler=handler)
    return parser


def configured_chip(args: argparse.Namespace) -> str | None:
    """The chip the config file names (``tui.cli`` puts the loaded config on ``args``),
    by the one rule (``kernels.judge.options.configured_chip``); a flag still wins."""
    from tilewright.kernels.judge.options import configured_chip as from_config

    return from_config(getattr(args, "config", None))


def kernel_command(sub: argparse._SubParsersAction, name: str, summary: str,
                   handler: Any, *, json_help: str,
                   task_help: str | None = None, kernel_help: str | None = None,
                   set_help: str | None = None, **task_options: object
                   ) -> argparse.ArgumentParser:
    """A command about one task and one candidate (``eval``, ``estimate``, ``profile``,
    ``calibrate``): ``--task``, ``--kernel``, ``--json`` (what it prints) and ``--set``."""
    parser = subcommand(sub, name, summary, handler)
    task_argument(parser, task_help, **task_options)
    if kernel_help is None:
        kernel_argument(parser)
    else:
        kernel_argument(parser, kernel_help)
    parser.add_argument("--json", action="store_true", help=json_help)
    overrides_argument(parser, set_help)
    return parser


def task_argument(parser: argparse.ArgumentParser, help: str | None = None,
                  **kwargs: object) -> None:
    """``--task DIR|NAME`` (required unless ``kwargs`` say otherwise)."""
    options: dict[str, object] = {"required": True, "metavar": "DIR|NAME", **kwargs}
    if help is not None:
        options["help"] = help
    parser.add_argument("--task", **options)  # type: ignore[arg-type]


def kernel_argument(parser: argparse.ArgumentParser,
                    help: str = "candidate source file (default: the task's kernel.py)"
                    ) -> None:
    parser.add_argument("--kernel", metavar="FILE", help=help)


def overrides_argument(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--set KEY=VALUE`` (repeatable), into ``args.overrides``; the help says how the
    production size is set (``production.KEY=VALUE``)."""
    said = help or "override a parameter (repeatable)"
    said += ("; KEY=VALUE sizes the check shapes, production.KEY=VALUE the production "
             "shape (what verdicts, estimates and rankings are for)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help=said)


def usage_error(command: str, message: str) -> int:
    print(f"tilewright {command}: {message}", file=sys.stderr)
    return EXIT_USAGE


def named_candidate(command: str, args: argparse.Namespace) -> tuple[Any, Path, str] | int:
    """``task_and_candidate`` for ``args.task``, ``args.overrides`` and ``args.kernel``;
    a bad one is printed for ``tilewright COMMAND`` and becomes exit status 2."""
    try:
        return task_and_candidate(args.task, args.overrides, args.kernel)
    except ValueError as exc:
        return usage_error(command, str(exc))


def task_and_candidate(task_spec: str, overrides: list[str] | None,
                       kernel: str | None) -> tuple[Any, Path, str]:
    """The task (with ``--set`` overrides) and the candidate's path and source.

    Without ``--kernel`` the task's own ``kernel.py`` is the candidate. Raises
    ``ValueError`` with a message fit for the user (bad task, unreadable kernel).
    """
    from tilewright.kernels.tasks.loaders import load_task, parse_overrides
    from tilewright.kernels.tasks.task import TaskError

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
    from tilewright.kernels.source.files import read_kernel_file

    # The task's own kernel.py must stay inside the task (a symlink out is refused); a
    # --kernel FILE may link within its own directory. Both are size-limited.
    roots = (task.root,) if not kernel else ()
    source = read_kernel_file(path, roots)  # KernelFileError is a ValueError
    return task, path, source
