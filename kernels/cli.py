"""Subcommands of the kernels layer: ``tasks``, ``eval``, ``profile``.

Each lives in its own module (``cli_tasks``, ``cli_eval``, ``cli_profile``) exposing
``register(subparsers)``; their handlers import workers and loaders lazily.
"""

from __future__ import annotations

import argparse
import importlib

MODULES = ("kernels.cli_tasks", "kernels.cli_eval", "kernels.cli_profile")


def register(sub: argparse._SubParsersAction) -> None:
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
