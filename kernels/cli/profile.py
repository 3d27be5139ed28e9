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

from tilewright.kernels import cli

if TYPE_CHECKING:
    from tilewright.kernels.judge.options import ProfileOptions
    from tilewright.kernels.pool import Judge
    from tilewright.kernels.tasks.task import Task

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def register(sub: argparse._SubParsersAction) -> None:
    from tilewright.profiling.chips import CHIPS

    parser = cli.kernel_command(
        sub, "profile", "profile a kernel: trace, op table, static pallas_call analysis, roofline",
        run, json_help="print the profile JSON",
        set_help="override a shape parameter (repeatable)",
        task_help="task directory or a bundled task name")
    parser.add_argument("--chip", choices=sorted(CHIPS), default=None,
                        help="chip to analyze for (default: the device's own chip; v5e on a "
                             "CPU host)")
    parser.add_argument("--shape", default=None, metavar="NAME",
                        help="shape configuration to profile (default: the first small one)")
    parser.add_argument("--iters", type=int, default=None,
                        help="traced iterations (default 3 in interpret mode, 20 native)")
    parser.add_argument("--logdir", default=None, metavar="DIR",
                        help="where the trace is kept (default: a new directory under the "
                             "user data dir's profiles/); printed, and every path in the "
                             "JSON points there")
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
    """Profile a candidate kernel in an isolated worker: analyze every pallas_call (grid,
    blocks, VMEM, alignment, flops, warnings with fixes) for the target chip, trace its
    timed iterations with the JAX profiler and summarize the trace."""
    found = cli.named_candidate("profile", args)  # an int: bad usage, already said
    return found if isinstance(found, int) else _profile_candidate(args, *found)


def _profile_candidate(args: argparse.Namespace, task: Task, path: Path, source: str) -> int:
    if args.shape and args.shape not in {s.name for s in task.shapes}:
        return _usage_error(f"unknown --shape {args.shape!r}; task {task.name} has "
                            + ", ".join(s.name for s in task.shapes))
    if args.iters is not None and args.iters < 1:
        return _usage_error("--iters must be at least 1")
    keep = Path(args.logdir).expanduser().resolve() if args.logdir else \
        default_profile_dir(task.name)
    try:
        keep.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _usage_error(f"cannot create the profile directory {keep}: "
                            f"{exc.strerror or exc}")
    from tilewright.kernels.judge.options import ProfileOptions

    # The worker writes the trace in its own scratch (a confined candidate may not write
    # elsewhere); it is copied to ``keep`` before the worker, and its scratch, go away.
    options = ProfileOptions(chip=args.chip or cli.configured_chip(args), iters=args.iters,
                             shape=args.shape,
                             python_tracer=args.python_tracer, static_only=args.static_only,
                             timeout_s=args.timeout, stderr=True)

    from tilewright.kernels.pool.workers import WorkerFailure, WorkerOpError, WorkerStartError

    try:
        result = asyncio.run(profile(task, source, str(path.resolve()), options, keep=keep))
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
    if args.json:  # the JSON's logdir, run_dir, perfetto say where: stdout stays one object
        print(json.dumps(result, indent=2, default=str))
        _remove_if_empty(keep)
        return EXIT_OK if result.get("status") == "ok" else EXIT_FAILED
    from tilewright.profiling.report import print_report

    print_report(result)
    if result.get("logdir"):
        print(f"\ntrace kept in {result['logdir']}\n  open it with `xprof --logdir "
              f"{result['logdir']}` or TensorBoard")
    elif result.get("status") == "ok" and not args.static_only:
        print("\nno trace was written (see above); nothing kept")
    _remove_if_empty(keep)
    return EXIT_OK if result.get("status") == "ok" else EXIT_FAILED


def default_profile_dir(task_name: str) -> Path:
    """``<user data dir>/profiles/<task>-<time>``: the data dir honours
    ``TILEWRIGHT_DATA_DIR`` as sessions and lessons do."""
    import os
    import re
    import time

    env = os.environ.get("TILEWRIGHT_DATA_DIR")
    if env:
        base = Path(env).expanduser()
    else:
        from platformdirs import user_data_dir

        base = Path(user_data_dir("tilewright"))
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", task_name).strip("-")[:40] or "task"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = base / "profiles" / f"{slug}-{stamp}", 2
    while target.exists():
        target, n = base / "profiles" / f"{slug}-{stamp}-{n}", n + 1
    return target


def _remove_if_empty(path: Path) -> None:
    try:
        path.rmdir()  # only when nothing was kept
    except OSError:
        pass


async def profile(task: Task, source: str, filename: str, options: ProfileOptions,
                  judge: Judge | None = None, keep: Path | None = None) -> dict[str, Any]:
    """Profile through ``judge`` (a started one; else a one-off local worker): the
    profile JSON. With ``keep``, the trace files (written in the worker's scratch) are
    copied there while the worker still holds them, and every path in the result is
    moved with them."""
    if judge is not None:
        result = await judge.profile(task, source, None, options, filename=filename)
        return keep_trace(result, keep) if keep is not None else result
    from tilewright.kernels.pool import LocalExecutor

    async with LocalExecutor(workers=1) as own:
        result = await own.profile(task, source, None, options, filename=filename)
        return keep_trace(result, keep) if keep is not None else result


def keep_trace(result: dict[str, Any], keep: Path) -> dict[str, Any]:
    """Copy the result's ``logdir`` (under the worker's scratch) into ``keep`` and move
    every path in the result that pointed into it; paths that already point into
    ``keep`` stay. A path whose file is gone by now is dropped (set to None) rather
    than left pointing nowhere."""
    import shutil

    logdir = result.get("logdir")
    if not logdir:
        return result
    src = Path(logdir)
    if src.resolve() == keep.resolve() or keep.resolve() in src.resolve().parents:
        return result
    if src.is_dir():
        shutil.copytree(src, keep, dirs_exist_ok=True)
    return _relocate(result, str(src), str(keep))


def _relocate(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {k: _relocate(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_relocate(v, old, new) for v in value]
    if isinstance(value, str) and (value == old or value.startswith(old + "/")):
        moved = new + value[len(old):]
        return moved if Path(moved).exists() else None
    return value


def _failure(kind: str, message: str) -> dict[str, Any]:
    from tilewright.profiling import SCHEMA

    return {"schema": SCHEMA, "status": "error", "backend": None,
            "error": {"kind": kind, "message": message, "line": None, "traceback": None,
                      "hint": None}}
