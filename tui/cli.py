"""The ``tilewright`` command line.

Each layer owns its subcommands in its own ``cli`` module (``kernels.cli``,
``sessions.cli``, ``tui.commands``) with a ``register(subparsers)`` function; handlers
import their heavy dependencies lazily, so ``tilewright eval`` never loads textual and
nothing here ever loads jax. With no subcommand, the TUI opens on a bundled task.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tilewright.agents import config as settings

SUBCOMMAND_MODULES = ("tilewright.kernels.cli", "tilewright.agents.cli", "tilewright.sessions.cli", "tilewright.sessions.cli.search",
                      "tilewright.tui.commands")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilewright",
        description="Design and optimize JAX/Pallas kernels with an agent, step by step.",
    )
    parser.add_argument("--version", action="version", version=f"tilewright {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import importlib

    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a layer not built yet must not break the rest
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tilewright")
    except PackageNotFoundError:
        return "0+unknown"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # No subcommand (or only TUI options) opens the TUI.
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["open", *argv]
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        args.config = settings.load()
    except settings.ConfigError as exc:  # before any subcommand runs: a typo is not a default
        print(f"tilewright: {exc}\n  next: {exc.next_step}", file=sys.stderr)
        return 2
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
