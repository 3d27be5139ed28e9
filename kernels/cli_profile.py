"""``tilewright profile``: where a candidate's time goes, and why, in a worker process.

``tilewright profile --task DIR|NAME --kernel FILE [--json] [--chip NAME] [--set K=V]
[--shape NAME] [--iters N] [--logdir DIR] [--trace-out FILE] [--static-only]`` runs the worker op ``profile``: static
analysis of every pallas_call for the target chip, a profiler trace of the timed
iterations (the raw logdir is kept, openable with ``xprof --logdir``), the op table,
the timeline summary and the roofline. ``--json`` prints the ``tilewright.profile/1``
object; without it, ``profiling.report`` renders a kernel author's report. Exit 0 when
the profile was taken, 1 when the candidate failed, 2 for bad usage. No JAX here.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernels import cli

if TYPE_CHECKING:
    from kernels.executors import Judge
    from kernels.options import ProfileOptions
    from kernels.task import Task

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def register(sub: argparse._SubParsersAction) -> None:
    from profiling.chips import CHIPS

    parser = cli.subcommand(
        sub, "profile", "profile a kernel: trace, op table, static pallas_call analysis, roofline",
        "Profile a candidate kernel in an isolated worker: analyze every "
        "pallas_call (grid, blocks, VMEM, alignment, flops, warnings with fixes) "
        "for the target chip, trace its timed iterations with the JAX profiler "
        "and summarize the trace.", run)
    cli.task_argument(parser, "task directory or a bundled task name")
    cli.kernel_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the profile JSON")
    parser.add_argument("--chip", choices=sorted(CHIPS), default=None,
                        help="chip to analyze for (default: the device's own chip; v5e on a "
                             "CPU host)")
    cli.overrides_argument(parser, "override a shape parameter (repeatable)")
    parser.add_argument("--shape", default=None, metavar="NAME",
                        help="shape configuration to profile (default: the first small one)")
    parser.add_argument("--iters", type=int, default=None,
                        help="traced iterations (default 3 in interpret mode, 20 native)")
    parser.add_argument("--logdir", default=None, metavar="DIR",
                        help="where the raw profile goes (default: a new temporary directory)")
    parser.add_argument("--static-only", action="store_true",
                        help="only the static pallas_call analysis and the roofline bound: "
                             "nothing runs (fast; for big kernels in interpret mode)")
    parser.add_argument("--python-tracer", action="store_true",
                        help="also record every Python call (large traces; off by default)")
    parser.add_argument("--trace-out", default=None, metavar="FILE",
                        help="also write the timeline as Chrome/Perfetto trace JSON to FILE")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                        help="kill the profile after this long (default 300)")


_usage_error = functools.partial(cli.usage_error, "profile")


def run(args: argparse.Namespace) -> int:
    found = cli.named_candidate("profile", args)  # an int: bad usage, already said
    return found if isinstance(found, int) else _profile_candidate(args, *found)


def _profile_candidate(args: argparse.Namespace, task: Task, path: Path, source: str) -> int:
    if args.shape and args.shape not in {s.name for s in task.shapes}:
        return _usage_error(f"unknown --shape {args.shape!r}; task {task.name} has "
                            + ", ".join(s.name for s in task.shapes))
    if args.iters is not None and args.iters < 1:
        return _usage_error("--iters must be at least 1")
    logdir = Path(args.logdir).expanduser().resolve() if args.logdir else None
    from kernels.options import ProfileOptions

    options = ProfileOptions(chip=args.chip, iters=args.iters, shape=args.shape,
                             python_tracer=args.python_tracer, static_only=args.static_only,
                             timeout_s=args.timeout, stderr=True)

    from kernels.workers import WorkerFailure, WorkerOpError, WorkerStartError

    try:
        result = asyncio.run(profile(task, source, str(path.resolve()), options, logdir))
    except WorkerStartError as exc:
        print(f"tilewright profile: could not start a JAX worker: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except WorkerFailure as exc:
        result = _failure("worker", f"the worker died while profiling: {exc}")
    except WorkerOpError as exc:
        error = getattr(exc, "error", {}) or {}
        result = _failure(error.get("kind", "internal"), error.get("message", str(exc)))
        result["error"]["traceback"] = error.get("traceback")
    result["task"] = task.name
    result["kernel"] = str(path)
    result["stderr"] = result.pop("stderr", "")  # the worker's captured stderr (XLA, xprof)
    result.pop("_handler_s", None)
    if args.trace_out and (result.get("timeline") or {}).get("chrome_trace"):
        import shutil

        try:
            shutil.copyfile(result["timeline"]["chrome_trace"], args.trace_out)
        except OSError as exc:
            print(f"tilewright profile: cannot write {args.trace_out}: {exc.strerror or exc}",
                  file=sys.stderr)
            return EXIT_USAGE
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        from profiling.report import print_report

        print_report(result)
    return EXIT_OK if result.get("status") == "ok" else EXIT_FAILED


async def profile(task: Task, source: str, filename: str, options: ProfileOptions,
                  logdir: Path | None = None, judge: Judge | None = None) -> dict[str, Any]:
    """Profile through ``judge`` (a started one; else a one-off local worker): the
    profile JSON, its trace under ``logdir`` (None: the worker's scratch)."""
    if judge is not None:
        return await judge.profile(task, source, logdir, options, filename=filename)
    from kernels.executors import LocalExecutor

    async with LocalExecutor(workers=1) as own:
        return await own.profile(task, source, logdir, options, filename=filename)


def _failure(kind: str, message: str) -> dict[str, Any]:
    from profiling import SCHEMA

    return {"schema": SCHEMA, "status": "error", "backend": None,
            "error": {"kind": kind, "message": message, "line": None, "traceback": None,
                      "hint": None}}
