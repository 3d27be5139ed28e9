"""The TUI's subcommands: ``open`` (the default), ``replay``, ``review`` and ``config``.

``tilewright [--task DIR|NAME] [--set KEY=VALUE] [--resume SESSION] [--session-dir DIR]
[--agent KIND]``
opens the workbench; ``tilewright replay SESSION`` opens a recorded session in the
replay screen (``--headless`` re-runs it without a screen, through ``sessions.cli``);
``tilewright config`` prints where the config file is and what is in effect. textual
is imported only by the handlers that open a screen.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    open_ = subparsers.add_parser("open", help="open the workbench (the default command)")
    open_.add_argument("--task", help="task directory or bundled task name (default: softmax)")
    open_.add_argument("--resume", metavar="SESSION", help="resume a session (id or path)")
    open_.add_argument("--session-dir", metavar="DIR", help="where sessions are kept")
    open_.add_argument("--agent", choices=("offline", "anthropic", "openai", "auto"),
                       help="who proposes (default: the config's agent.kind, auto); openai: "
                            "any OpenAI-compatible endpoint ([agent] base_url)")
    open_.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE",
                       help="shape override for a new session, e.g. --set rows=256 "
                            "(repeatable; a resumed session keeps its own)")
    open_.set_defaults(handler=_open)

    replay = subparsers.add_parser("replay", help="replay a recorded session")
    replay.add_argument("session", metavar="SESSION", help="session id, prefix or directory")
    replay.add_argument("--session-dir", metavar="DIR", help="where sessions are kept")
    replay.add_argument("--headless", action="store_true",
                        help="no screen: re-fold (and with --verify re-run) the session")
    _headless_arguments(replay)
    replay.set_defaults(handler=_replay)

    _review_arguments(subparsers)

    config = subparsers.add_parser("config", help="print the config file path and values")
    config.add_argument("--json", action="store_true", help="print the values as JSON")
    config.set_defaults(handler=_config)


def _review_arguments(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "review", help="human-in-the-loop graph search (or a recorded search's tree)")
    p.add_argument("session", nargs="?", metavar="SESSION",
                   help="a recorded session (id, prefix or directory) to view read-only")
    p.add_argument("--task", help="task directory or bundled name: start a reviewed search")
    p.add_argument("--agent", choices=("offline", "anthropic", "openai", "auto"),
                   default="auto")
    p.add_argument("--budget", type=int, default=8, metavar="N", help="nodes to evaluate")
    p.add_argument("--beam-width", type=int, default=2, metavar="N")
    p.add_argument("--branching", type=int, default=2, metavar="N")
    p.add_argument("--rounds", type=int, default=3, metavar="N")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="shape override (repeatable)")
    p.add_argument("--session-dir", metavar="DIR", help="where sessions are kept")
    p.set_defaults(handler=_review)


def _review(args: argparse.Namespace) -> int:
    from tilewright.tui.review import run

    return run(args)


def _headless_arguments(parser: argparse.ArgumentParser) -> None:
    from tilewright.sessions.cli import add_replay_arguments

    add_replay_arguments(parser)


def _open(args: argparse.Namespace) -> int:
    from tilewright.sessions.opening import OpenError, parse_set
    from tilewright.tui.app import run_app
    from tilewright.tui.launch import LaunchOptions

    try:
        overrides = parse_set(args.overrides)
    except OpenError as exc:
        print(f"tilewright: {exc}\n  next: {exc.next_step}", file=sys.stderr)
        return 2
    if overrides and args.resume:
        print("tilewright: --set applies to a new session; a resumed session keeps the "
              "shapes it was recorded with", file=sys.stderr)
        return 2
    options = LaunchOptions(task=args.task, resume=args.resume,
                            session_dir=args.session_dir, agent=args.agent,
                            overrides=overrides)
    return run_app(options, args.config)


def _replay(args: argparse.Namespace) -> int:
    if args.headless or args.verify or args.json:  # --verify and --json answer: no screen
        from tilewright.sessions.cli import run_headless_replay

        return int(run_headless_replay(args) or 0)
    from tilewright.sessions.log import SessionError, resolve

    try:
        path = resolve(args.session, args.session_dir)
    except SessionError as exc:
        print(f"tilewright replay: {exc}", file=sys.stderr)
        return 2
    from tilewright.tui.replay_app import run_replay

    return run_replay(path, args.config, session_dir=args.session_dir)


def _config(args: argparse.Namespace) -> int:
    from tilewright.agents.config import coerce, config_path
    from tilewright.sessions.opening import agent_in_effect
    from tilewright.tui import keymap

    loaded = coerce(args.config)
    path = loaded.path or str(config_path())
    config = loaded.to_dict()

    keys = {bid: keys for bid, (keys, *_rest) in keymap.ACTIONS.items()}
    keys.update(config.get("keys") or {})
    config["keys"] = keys
    agent = agent_in_effect(loaded)
    if args.json:
        print(json.dumps({"path": path, "config": config, "agent": agent}, indent=2,
                         default=str))
        return 0
    exists = "exists" if config_path().exists() else "not created yet; defaults in effect"
    print(f"# config file: {path} ({exists})")
    if "error" in agent:
        print(f"# agent: {agent['error']}")
    elif agent.get("provider") == "offline":
        print(f"# agent in effect: offline (kind {agent['kind']}; no model, no key)")
    else:
        print(f"# agent in effect: {agent['provider']}, model {agent['model']}, "
              f"endpoint {agent['endpoint']}")
        key = agent["key"]
        print(f"# key: {'from ' + key if key.isupper() else key}")
    print("# effective values (defaults merged with the file):")
    for section in ("budgets", "controller"):  # an unset limit is written as TOML's false
        config[section] = {k: False if v is None else v for k, v in config[section].items()}
    print(_toml(config))
    return 0


def _toml(data: dict[str, Any], prefix: str = "") -> str:
    """A small TOML writer for the effective config (unset values become comments)."""
    lines: list[str] = []
    for key, value in data.items():
        if isinstance(value, dict):
            continue
        lines.append(f"# {_key(key)} = (unset)" if value is None
                     else f"{_key(key)} = {_value(value)}")
    out = "\n".join(lines)
    for key, value in data.items():
        if isinstance(value, dict):
            name = f"{prefix}.{_key(key)}" if prefix else _key(key)
            out += f"\n\n[{name}]\n" + _toml(value, name)
    return out.strip("\n")


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(str(value))
