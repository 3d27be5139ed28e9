"""Subcommands of the sessions layer: ``auto``, ``sessions``, ``report`` (``search``
lives in ``sessions.cli.search``).

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
    auto.add_argument("--target", type=float, metavar="X",
                      help="stop once the best kernel's speedup reaches X (measured, or the "
                           "TPU compiler's estimate; never a roofline bound or a host "
                           "simulation ratio)")
    auto.add_argument("--trials", type=int, default=None,
                      help="correctness trials per shape (default: [eval] trials, else 3)")
    auto.add_argument("--timeout", type=float, default=None, metavar="S",
                      help="each evaluation phase's deadline (reference, trials per "
                           "shape, timing), seconds (default: [eval] timeout_s, else 120); "
                           "a phase that ends renews it; the compiles at the "
                           "production shape may take longer for a big program, as the "
                           "judge states (tpu.deadline_s)")
    auto.add_argument("--time-budget", type=float, default=None, metavar="S",
                      help="timing budget per evaluation, seconds (default: [eval] "
                           "time_budget_s, else 1)")
    auto.add_argument("--chip", default=None, metavar="CHIP",
                      help="the TPU generation to judge and reason for (default: the "
                           "config's [eval] or [backend] chip, else this host's own, else "
                           "v5e)")
    auto.add_argument("--set", dest="set", action="append", default=[], metavar="KEY=VALUE",
                      help="shape override, e.g. --set rows=128 (repeatable)")
    _session_dir(auto)
    auto.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    auto.set_defaults(handler=_auto)

    ls = sub.add_parser("sessions", help="list saved sessions")
    _session_dir(ls)
    ls.add_argument("--json", action="store_true", help="print a JSON list")
    ls.set_defaults(handler=_sessions)

    export = sub.add_parser(
        "export", help="write a version of a session as a module for your code (+ a test)",
        description="Write a version (default: the best) as a clean Python module you can "
                    "drop into your code: a header with the task, chip, shape and what its "
                    "number is, the offline templates' plumbing taken out where the task "
                    "does not need it (each simplification judged correct again in a "
                    "worker), and optionally a pytest file checking it against the task's "
                    "reference.")
    export.add_argument("session", metavar="SESSION", help="session directory, id or prefix")
    export.add_argument("which", nargs="?", metavar="VERSION", default=None,
                        help="best (default), current, or vN")
    export.add_argument("--version", dest="version_opt", metavar="N|best", default=None,
                        help="the same as VERSION")
    export.add_argument("-o", "--output", metavar="FILE.py",
                        help="where to write it (default: ./<task>_kernel.py)")
    export.add_argument("--test", nargs="?", const="", default=None, metavar="TEST_FILE",
                        help="also write a pytest file (default: test_<module>.py beside it)")
    export.add_argument("--no-verify", action="store_true",
                        help="write the version as it ran, without simplifying it (no worker)")
    export.add_argument("--force", action="store_true", help="overwrite existing files")
    _session_dir(export)
    export.set_defaults(handler=_export)

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
    from tilewright.sessions.cli.headless import run_auto
    from tilewright.sessions.log import SessionError
    from tilewright.sessions.opening import OpenError, parse_set

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
    from tilewright.sessions.log import SessionError, default_sessions_dir, list_session_dirs, load
    from tilewright.sessions.state import fold

    base = Path(args.session_dir).expanduser() if args.session_dir else default_sessions_dir()
    rows: list[dict[str, Any]] = []
    for path in list_session_dirs(base):
        try:
            loaded = load(path)
        except SessionError as exc:
            rows.append({"id": path.name, "error": str(exc)})
            continue
        state = fold(loaded.header, loaded.events)
        best = state.versions.get(state.best) if state.best is not None else None
        rank = best.rank if best is not None else None
        shape = None  # the production shape the compiler's figure is for ("4096x4096")
        if best is not None and rank is not None and rank.compiler:
            shape = rank.shape or best.production_shape
            if shape is None and best.result_blob:  # a log older than recorded shapes
                from tilewright.sessions.log import read_json_blob

                try:
                    tpu = (read_json_blob(path, best.result_blob) or {}).get("tpu") or {}
                except (OSError, ValueError, SessionError):
                    tpu = {}
                shape = tpu.get("shape_label") or tpu.get("shape")
        rows.append({"id": path.name, "task": (loaded.header.get("task") or {}).get("name"),
                     "started": loaded.header.get("created"),
                     # a step: a decision on a proposal or an evaluation (user or agent)
                     "steps": len(state.decisions) + state.spent.runs,
                     "versions": len(state.versions), "evaluations": state.spent.runs, "best_version": state.best,
                     # what ranks the best version (kernels.judge.rank.Rank as JSON), in words
                     "best_rank": rank.to_json() if rank else None,
                     "best_words": rank.words() if rank else None,
                     "best_shape": shape,
                     "ended": state.ended,
                     "path": str(path)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    # Sessions in which nothing was done (opened and closed: no decision, no
    # evaluation) are not listed as text; --json still has them.
    empty = [r for r in rows if "error" not in r and not r["steps"]]
    rows = [r for r in rows if "error" in r or r["steps"]]
    if not rows:
        print(f"no sessions in {base}" + (f" ({len(empty)} with no steps; --json lists them)"
                                          if empty else ""))
        return 0
    from tilewright.kernels.judge.rank import Rank

    print(f"{'SESSION':<36} {'TASK':<18} {'STARTED':<20} {'STEPS':>5} {'EVALS':>5} "
          f"{'BEST':>22}  {'EST. FOR':<12} STATE")
    chips: dict[str, set[str]] = {}
    for r in rows:
        if "error" in r:
            print(f"{r['id']:<36} unreadable: {r['error']}")
            continue
        rank = Rank.from_json(r["best_rank"])
        best = f"{rank.words(short=True)} v{r['best_version']}" \
            if rank is not None and r["best_version"] is not None else "-"
        if rank is not None and rank.compiler and rank.value is not None:
            chips.setdefault(rank.source, set()).add(rank.chip or "?")
        started = (r["started"] or "")[:19].replace("T", " ")
        print(f"{r['id']:<36} {(r['task'] or '?')[:18]:<18} {started:<20} {r['steps']:>5} "
              f"{r['evaluations']:>5} {best:>22}  {(r['best_shape'] or '-')[:12]:<12} "
              f"{r['ended'] or 'resumable'}")
    if empty:
        print(f"({len(empty)} session{'s' if len(empty) != 1 else ''} with no steps not "
              "listed; --json lists them)")
    if "tpu_estimate" in chips:
        print(f"est.: the TPU compiler's estimated speedup over the XLA reference on "
              f"{', '.join(sorted(chips['tpu_estimate']))}, for the task's shape named under "
              "EST. FOR (not a measurement)")
    if "roofline" in chips:
        print(f"≥ roofline: the kernel's TPU compiler estimate against the XLA reference's "
              f"roofline on {', '.join(sorted(chips['roofline']))} (the reference has no "
              "estimate): a lower bound of the speedup, not a measurement")
    return 0


def _report(args: argparse.Namespace) -> int:
    from tilewright.sessions.log import SessionError, load, resolve
    from tilewright.sessions.recorded import report
    from tilewright.sessions.state import fold

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
        elif out.suffix.lower() == ".py":
            return _fail("report", f"{out}: a report is Markdown or HTML; to get a version "
                         "as Python, export it",
                         f"tilewright export {loaded.header.get('id')} best -o {out} --test")
        else:
            return _fail("report", f"{out}: unknown format (use .md or .html)")
        from tilewright.kernels.source.printable import printable

        text = printable(text)  # a log's text, without control characters
    except SessionError as exc:
        return _fail("report", str(exc))
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    return 0


def _export(args: argparse.Namespace) -> int:
    from tilewright.sessions.log import SessionError, load, resolve
    from tilewright.sessions.recorded import export as ex
    from tilewright.sessions.state import fold

    try:
        loaded = load(resolve(args.session, args.session_dir))
    except SessionError as exc:
        return _fail("export", str(exc))
    state = fold(loaded.header, loaded.events)
    which = args.version_opt or args.which
    task_name = (loaded.header.get("task") or {}).get("name") or "kernel"
    try:
        number = ex.pick_version(state, which)
    except ex.ExportError as exc:
        return _fail("export", str(exc), exc.next_step or None)
    out = Path(args.output or f"{_slug(task_name)}_kernel.py").expanduser()
    if out.suffix != ".py":
        return _fail("export", f"{out}: the module must be a .py file")
    test = None
    if args.test is not None:
        test = Path(args.test).expanduser() if args.test else out.with_name(f"test_{out.stem}.py")
    if not out.stem.isidentifier():
        return _fail("export", f"{out.name}: the name must be importable (letters, digits, _)",
                     f"e.g. -o {_slug(task_name)}_kernel.py")
    existing = [p for p in (out, test) if p is not None and p.exists()]
    if existing and not args.force:
        return _fail("export", f"{existing[0]} exists", "pass --force to overwrite it")
    try:
        exported = asyncio.run(_export_async(loaded, state, number, out.stem,
                                             test is not None, not args.no_verify))
    except ex.ExportError as exc:
        return _fail("export", str(exc), exc.next_step or None)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = ex.write(exported, out, test)
    v = state.versions[number]
    said = v.rank.words() if v.rank is not None and v.rank.ranked else None
    print(f"wrote {out} (v{number}: {said or v.status or 'not evaluated'})")
    if exported.simplified:
        print(f"  simplified: {', '.join(exported.simplified)} taken out; "
              f"{exported.verified}")
    else:
        print(f"  {exported.verified}")
    for note in exported.notes:
        print(f"  note: {note}")
    if test is not None and test in written:
        print(f"wrote {test}: run it with `pytest {test}` (CPU: Pallas TPU interpret mode)")
    return 0


def _slug(name: str) -> str:
    import re

    slug = re.sub(r"\W+", "_", name).strip("_") or "kernel"
    return slug if not slug[0].isdigit() else f"k_{slug}"


async def _export_async(loaded: Any, state: Any, number: int, module: str, with_test: bool,
                        verify: bool) -> Any:
    from tilewright.kernels.tasks.task import TaskError
    from tilewright.sessions.recorded import export as ex
    from tilewright.sessions.tasks import task_for_header

    try:
        task = task_for_header(loaded.header)
    except TaskError as exc:
        if with_test or verify:
            raise ex.ExportError(f"the session's task cannot be loaded here: {exc}",
                                 "export with --no-verify (no test), or run from where the "
                                 "task is") from exc
        task = None
    if not verify:
        return await ex.export(loaded, state, number, module, task=task, with_test=with_test)
    from tilewright.kernels.pool.workers import EvalOptions, WorkerPool, WorkerStartError

    recorded = {k: v for k, v in (loaded.header.get("eval_options") or {}).items()
                if k in EvalOptions.__dataclass_fields__}
    options = EvalOptions(**{**recorded, "timing": False})
    try:
        async with WorkerPool(size=1) as pool:
            return await ex.export(loaded, state, number, module, task=task,
                                   evaluate=lambda src: pool.evaluate(task, src, options),
                                   with_test=with_test)
    except WorkerStartError as exc:
        raise ex.ExportError(f"could not start a JAX worker to check the module: {exc}",
                             "export with --no-verify to write the version as it ran") from exc


# -- replay --headless (registered by tui.commands) -------------------------------------

def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``replay`` that the headless path understands."""
    parser.add_argument("--verify", action="store_true",
                        help="no screen: re-evaluate every version and check that "
                             "statuses, correctness and timings reproduce (exit 1 if not)")
    parser.add_argument("--json", action="store_true",
                        help="no screen: print the state (and checks) as JSON")


def run_headless_replay(args: argparse.Namespace) -> int:
    from tilewright.sessions.log import SessionError, load, resolve
    from tilewright.sessions.recorded.replay import print_session
    from tilewright.sessions.state import fold

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
    from tilewright.sessions.recorded.replay import audit

    problems = audit(loaded, state)
    for problem in problems:
        print(f"tampered: {problem}", file=out)
    try:
        checks = asyncio.run(_verify(loaded, state, out))
    except Exception as exc:
        from tilewright.kernels.tasks.task import TaskError

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
    from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
    from tilewright.sessions.recorded.replay import verify
    from tilewright.sessions.tasks import task_for_header

    task = task_for_header(loaded.header)
    options = EvalOptions(**(loaded.header.get("eval_options") or {}))
    async with WorkerPool() as pool:
        return await verify(loaded, state, lambda src: pool.evaluate(task, src, options), out)
