"""Subcommands of the sessions layer: ``auto``, ``sessions``, ``report`` (``search``
lives in ``sessions.cli_search``).

``replay`` belongs to the TUI (``tui.commands``), which opens the replay screen; for
``replay --headless`` it calls ``add_replay_arguments`` and ``run_headless_replay``
from here. Handlers import workers, agents and loaders lazily. Exit codes: 0 success,
1 a run or verification that did not succeed, 2 bad usage or input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    auto = sub.add_parser(
        "auto", help="headless autonomous run on a task (one progress line per step)",
        description="Run the agent autonomously on a task until a budget or stop rule ends "
                    "it. Ctrl-C stops cleanly; the session is saved and --resume continues it.")
    auto.add_argument("--task", metavar="DIR|NAME", help="task directory or bundled task name")
    auto.add_argument("--resume", metavar="SESSION", help="continue a saved session instead")
    auto.add_argument("--agent", choices=("offline", "anthropic", "openai", "auto"),
                      default=None,
                      help="who proposes (default: the config's agent.kind)")
    auto.add_argument("--budget", type=int, metavar="N", help="iterations (new kernel versions)")
    auto.add_argument("--target", type=float, metavar="X", help="stop at this speedup")
    auto.add_argument("--trials", type=int, default=None,
                      help="correctness trials per shape (default: [eval] trials, else 3)")
    auto.add_argument("--time-budget", type=float, default=None, metavar="S",
                      help="timing budget per evaluation, seconds (default: [eval] "
                           "time_budget_s, else 1)")
    auto.add_argument("--set", dest="set", action="append", default=[], metavar="KEY=VALUE",
                      help="shape override, e.g. --set rows=128 (repeatable)")
    _session_dir(auto)
    auto.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    auto.set_defaults(handler=_auto)

    ls = sub.add_parser("sessions", help="list saved sessions")
    _session_dir(ls)
    ls.add_argument("--json", action="store_true", help="print a JSON list")
    ls.set_defaults(handler=_sessions)

    report = sub.add_parser("report", help="write a Markdown or HTML report of a session")
    report.add_argument("session", metavar="SESSION", help="session directory, id or prefix")
    report.add_argument("-o", "--output", metavar="FILE.md|FILE.html",
                        help="write here (format from the suffix); default: Markdown on stdout")
    _session_dir(report)
    report.set_defaults(handler=_report)


def _session_dir(parser: argparse.ArgumentParser) -> None:
    if not any("--session-dir" in a.option_strings for a in parser._actions):
        parser.add_argument("--session-dir", metavar="DIR",
                            help="where sessions live (default: the user data dir)")


def _fail(command: str, message: str, hint: str | None = None, code: int = 2) -> int:
    print(f"tilewright {command}: {message}", file=sys.stderr)
    if hint:
        print(f"  {hint}", file=sys.stderr)
    return code


def _auto(args: argparse.Namespace) -> int:
    from sessions.headless import run_auto
    from sessions.log import SessionError
    from sessions.opening import OpenError, parse_set

    if bool(args.task) == bool(args.resume):
        return _fail("auto", "give --task DIR|NAME (a new session) or --resume SESSION")
    try:
        args.overrides = parse_set(args.set)
        return asyncio.run(run_auto(args, getattr(args, "config", None) or {}))
    except OpenError as exc:
        return _fail("auto", str(exc), exc.next_step or None)
    except SessionError as exc:  # the session directory cannot be written
        return _fail("auto", str(exc))


def _sessions(args: argparse.Namespace) -> int:
    from sessions.log import SessionError, default_sessions_dir, list_session_dirs, load
    from sessions.state import fold

    base = Path(args.session_dir).expanduser() if args.session_dir else default_sessions_dir()
    rows: list[dict[str, Any]] = []
    for path in list_session_dirs(base):
        try:
            loaded = load(path)
        except SessionError as exc:
            rows.append({"id": path.name, "error": str(exc)})
            continue
        state = fold(loaded.header, loaded.events)
        rows.append({"id": path.name, "task": (loaded.header.get("task") or {}).get("name"),
                     "started": loaded.header.get("created"),
                     # a step: a decision on a proposal or an evaluation (user or agent)
                     "steps": len(state.decisions) + state.spent.runs,
                     "versions": len(state.versions), "evaluations": state.spent.runs, "best_version": state.best,
                     "best_speedup": state.best_speedup, "ended": state.ended,
                     "path": str(path)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no sessions in {base}")
        return 0
    print(f"{'SESSION':<36} {'TASK':<18} {'STARTED':<20} {'STEPS':>5} {'EVALS':>5} "
          f"{'BEST':>12}  STATE")
    for r in rows:
        if "error" in r:
            print(f"{r['id']:<36} unreadable: {r['error']}")
            continue
        best = f"{r['best_speedup']:.3f}x v{r['best_version']}" \
            if r["best_speedup"] is not None else "-"
        started = (r["started"] or "")[:19].replace("T", " ")
        print(f"{r['id']:<36} {(r['task'] or '?')[:18]:<18} {started:<20} {r['steps']:>5} "
              f"{r['evaluations']:>5} {best:>12}  {r['ended'] or 'resumable'}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from sessions import report
    from sessions.log import SessionError, load, resolve
    from sessions.state import fold

    try:
        loaded = load(resolve(args.session, args.session_dir))
        state = fold(loaded.header, loaded.events)
        for warning in loaded.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        out = Path(args.output) if args.output else None
        if out is not None and out.suffix.lower() in (".html", ".htm"):
            text = report.html_report(loaded, state)
        elif out is None or out.suffix.lower() in (".md", ".markdown"):
            text = report.markdown(loaded, state)
        else:
            return _fail("report", f"{out}: unknown format (use .md or .html)")
    except SessionError as exc:
        return _fail("report", str(exc))
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    return 0


# -- replay --headless (registered by tui.commands) -------------------------------------

def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``replay`` that the headless path understands."""
    parser.add_argument("--verify", action="store_true",
                        help="with --headless: re-evaluate every version and check that "
                             "statuses, correctness and timings reproduce (exit 1 if not)")
    parser.add_argument("--json", action="store_true",
                        help="with --headless: print the state (and checks) as JSON")


def run_headless_replay(args: argparse.Namespace) -> int:
    from sessions.log import SessionError, load, resolve
    from sessions.replay import print_session
    from sessions.state import fold

    try:
        loaded = load(resolve(args.session, getattr(args, "session_dir", None)))
    except SessionError as exc:
        return _fail("replay", str(exc))
    for warning in loaded.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    state = fold(loaded.header, loaded.events)
    as_json = getattr(args, "json", False)
    out = sys.stderr if as_json else sys.stdout
    print_session(loaded, state, out)
    if not getattr(args, "verify", False):
        if as_json:
            print(json.dumps({"session": str(loaded.path), "state": state.snapshot()},
                             default=str))
        return 0
    from sessions.replay import audit

    problems = audit(loaded, state)
    for problem in problems:
        print(f"tampered: {problem}", file=out)
    try:
        checks = asyncio.run(_verify(loaded, state, out))
    except Exception as exc:
        from kernels.task import TaskError

        if isinstance(exc, TaskError | SessionError):
            return _fail("replay", str(exc))
        raise
    ok = bool(checks) and all(c.ok for c in checks) and not problems
    verdict = ("reproduced" if ok else "nothing to verify (no evaluated versions)"
               if not checks and not problems else "did NOT reproduce")
    print(f"verify: {sum(c.ok for c in checks)}/{len(checks)} versions agree, "
          f"{len(problems)} log problem(s); session {verdict}", file=out)
    if as_json:
        print(json.dumps({"session": str(loaded.path), "ok": ok, "problems": problems,
                          "checks": [c.to_json() for c in checks]}, default=str))
    return 0 if ok else 1


async def _verify(loaded: Any, state: Any, out: Any) -> list[Any]:
    from kernels.workers import EvalOptions, WorkerPool
    from sessions.replay import verify
    from sessions.tasks import task_for_header

    task = task_for_header(loaded.header)
    options = EvalOptions(**(loaded.header.get("eval_options") or {}))
    async with WorkerPool() as pool:
        return await verify(loaded, state, lambda src: pool.evaluate(task, src, options), out)
