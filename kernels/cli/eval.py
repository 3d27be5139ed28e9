"""``tilewright eval``: evaluate one candidate on one task, in a worker process.

``tilewright eval --task DIR|NAME --kernel FILE [--json] [--set K=V ...] [--trials N]
[--iters N] [--timeout SECONDS]`` prints the eval JSON contract (``--json``) or a
readable summary. Exit status: 0 only for ``correct``, 1 for any other status, 2 for
bad usage (missing file, malformed task, or a task whose own input builder or reference
fails when it runs: error kind ``task``, with the task's file and line). App side: no JAX here; the worker runs it.
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
from tilewright.kernels.judge.options import MIN_TRIALS, EvalOptions
from tilewright.kernels.judge.rank import times
from tilewright.profiling.chips import DEFAULT_TPU, TPU_INTERPRET

EXIT_CORRECT, EXIT_OTHER, EXIT_USAGE = 0, 1, 2
DEFAULTS = EvalOptions()  # the one home of the defaults the flags show

if TYPE_CHECKING:
    from tilewright.kernels.judge.result import EvalResult
    from tilewright.kernels.tasks.task import Task


def register(sub: argparse._SubParsersAction) -> None:
    parser = cli.kernel_command(
        sub, "eval", "evaluate a kernel on a task (correctness, TPU lowering, timing)", run,
        json_help="print the eval JSON contract",
        set_help="override a shape parameter (repeatable)",
        task_help="task directory (native, JAXBench or MaxKernel layout) or a bundled "
                  "task name")
    parser.add_argument("--trials", type=_at_least_3, default=DEFAULTS.trials,
                        help="correctness trials per shape configuration, each with fresh "
                             f"inputs (default and minimum {DEFAULTS.trials})")
    parser.add_argument("--iters", type=_positive_int, default=None,
                        help="timing iterations (default: adaptive within a time budget)")
    parser.add_argument("--timeout", type=_positive_float, default=DEFAULTS.timeout_s,
                        metavar="SECONDS",
                        help="kill the evaluation after this long without a finished phase "
                        f"(reference, trials per shape, timing; default {DEFAULTS.timeout_s:g})")
    parser.add_argument("--shape", dest="shapes", action="append", default=None,
                        metavar="NAME", help="only this shape configuration (repeatable)")
    parser.add_argument("--no-timing", action="store_true", help="skip timing")
    parser.add_argument("--estimate", action="store_true",
                        help="on a TPU host, also make the TPU compiler's estimate beside the "
                             "measured device time (off there by default: the chip's compile "
                             "is the verdict, the estimate costs about a minute)")
    parser.add_argument("--chip", default=None, metavar="CHIP",
                        help="TPU generation to compile for with the real TPU compiler, "
                             f"whose static estimate ranks kernels off-TPU: {DEFAULT_TPU} "
                             "(default off-TPU), v5p, v6e; v4 and v7x compile without an "
                             "estimate (`tilewright chips` says why); on a TPU host, its own "
                             "chip")
    parser.add_argument("--chips", default=None, metavar="LIST",
                        help="comma-separated generations (e.g. v5e,v6e,v5p): evaluate "
                             "once per chip and show which ones accept the kernel")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _at_least_3(text: str) -> int:
    value = int(text)
    if value < MIN_TRIALS:
        raise argparse.ArgumentTypeError(f"at least {MIN_TRIALS} (fewer trials cannot expose "
                                         "a kernel that caches or ignores its inputs)")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


_usage_error = functools.partial(cli.usage_error, "eval")


def run(args: argparse.Namespace) -> int:
    """Evaluate a candidate kernel in an isolated worker: several trials with fresh inputs on
    every shape configuration for this host, a TPU lowering check, integrity checks and
    timing against the XLA reference. Exit 0 only when the status is 'correct'."""
    found = cli.named_candidate("eval", args)  # an int: bad usage, already said
    return found if isinstance(found, int) else _evaluate_candidate(args, *found)


def _evaluate_candidate(args: argparse.Namespace, task: Task, path: Path, source: str) -> int:
    known = {s.name for s in task.shapes}
    unknown = [s for s in args.shapes or [] if s not in known]
    if unknown:
        return _usage_error(f"unknown --shape {unknown[0]!r}; task {task.name} has "
                            f"{', '.join(sorted(known))}")

    from tilewright.kernels.pool.workers import WorkerStartError

    try:
        chip = args.chip or cli.configured_chip(args)
        chips = _chips(args.chips) if args.chips else (_chips(chip) if chip else [None])
    except ValueError as exc:
        return _usage_error(str(exc))
    if args.chip and args.chips:
        return _usage_error("give --chip or --chips, not both")
    options = [EvalOptions(trials=args.trials, iters=args.iters, timeout_s=args.timeout,
                           timing=not args.no_timing, shapes=args.shapes, chip=chip,
                           estimate_on_tpu=args.estimate)
               for chip in chips]
    try:
        results = asyncio.run(_evaluate_all(task, source, options, str(path.resolve())))
    except WorkerStartError as exc:
        print(f"tilewright eval: could not start a JAX worker: {exc}", file=sys.stderr)
        return EXIT_OTHER
    if args.chips:
        return _print_chips(results, chips, args.json)
    result = results[0]
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print_summary(result, task.name, str(path))
    if result.error is not None and result.error.kind == "task":
        return EXIT_USAGE  # the task is broken (inputs or reference), not the candidate
    return EXIT_CORRECT if result.correct else EXIT_OTHER


async def _evaluate_all(task: Task, source: str, options: list[EvalOptions],
                        filename: str) -> list[EvalResult]:
    """One worker, one evaluation per options (per chip): a warm worker compiles each
    reference once."""
    from tilewright.kernels.pool import LocalExecutor

    async with LocalExecutor(workers=1) as judge:
        return [await judge.evaluate(task, source, o, filename=filename) for o in options]


def _chips(text: str) -> list[str]:
    from tilewright.profiling.chips import get_chip

    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise ValueError("--chips needs at least one chip, e.g. --chips v5e,v6e,v5p")
    out = []
    for name in names:
        try:
            chip = get_chip(name)
        except KeyError as exc:
            raise ValueError(str(exc.args[0])) from None
        if chip.kind != "tpu":
            raise ValueError(f"--chips takes TPU generations; {name!r} is a {chip.kind}")
        out.append(chip.name)
    return out


def _print_chips(results: list[Any], chips: list[str], as_json: bool) -> int:
    """Which generations accept the kernel: one line (or JSON object) per chip. Exit 0
    only when the kernel is correct on every chip asked for."""
    if as_json:
        print(json.dumps({"chips": {c: r.to_json() for c, r in zip(chips, results, strict=True)}},
                         indent=2))
    else:
        from rich.console import Console
        from rich.markup import escape

        console = Console(highlight=False)
        for chip, result in zip(chips, results, strict=True):
            tpu = result.tpu or {}
            accepted = {"ok": "[green]accepted[/]", "error": "[red]refused[/]"}.get(
                tpu.get("compile"), f"[yellow]{escape(str(tpu.get('compile')))}[/]")
            line = f"{chip:>4}  {accepted}  {result.status}"
            if tpu.get("vmem_bytes"):
                line += f" · VMEM {_mib(tpu['vmem_bytes'])} of {_mib(tpu.get('vmem_limit_bytes'))}"
            rank = result.rank
            if rank.compiler or rank.on_chip:
                line += f" · {escape(rank.words())}"
            elif tpu.get("estimate_unavailable"):
                line += f" · no estimate: {escape(tpu['estimate_unavailable'])}"
            console.print(line)
            if tpu.get("compile") != "ok" and tpu.get("message"):
                console.print(f"      [dim]{escape(tpu['message'].splitlines()[0][:160])}[/]")
    if any(r.error is not None and r.error.kind == "task" for r in results):
        return EXIT_USAGE
    return EXIT_CORRECT if all(r.correct for r in results) else EXIT_OTHER


def _mib(value: Any) -> str:
    return "?" if not value else f"{value / (1 << 20):.1f} MiB"


def print_summary(result: Any, task_name: str, kernel: str) -> None:
    """A readable summary: status, backend, lowering, correctness, timing, error."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(stderr=False, highlight=False)
    from tilewright.kernels.judge.result import STATUS_LOOKS

    mark, style = STATUS_LOOKS.get(result.status, ("?", "bold yellow"))
    backend = result.backend.label() if result.backend else "unknown backend"
    console.print(f"[{style}]{mark} {result.status.upper()}[/]  {escape(task_name)} · "
                  f"{escape(kernel)} · [bold]{escape(backend)}[/] · {result.duration_s:.1f} s")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim", no_wrap=True)
    table.add_column()
    lowering = result.lowering or {}
    table.add_row("TPU lowering", escape(f"{lowering.get('tpu')}"
                                         + (f": {lowering['message']}" if lowering.get("message")
                                            else "")))
    correctness = result.correctness
    if correctness:
        verdict = "pass" if correctness["correct"] else "FAIL"
        diff = correctness.get("max_abs_diff")
        table.add_row("correctness", escape(
            f"{verdict} · {correctness['trials']} trials per shape · max |diff| "
            f"{'n/a' if diff is None else f'{diff:.3g}'} (atol {correctness['atol']:g}, "
            f"rtol {correctness['rtol']:g})"))
        if correctness.get("reason"):
            table.add_row("", escape(correctness["reason"]))
        judged = correctness.get("judged_against")
        if judged and "f32" in judged:  # the bf16 reference was the imprecise side
            table.add_row("", escape(f"judged against {judged}"))
        for shape in result.extra.get("shapes", []):
            mark = "✓" if shape["correct"] else "✗"
            label = "held-out" if shape.get("held_out") else _params(shape.get("params"))
            table.add_row("", escape(f"{mark} {shape['name']} {label}"))
        held = result.extra.get("held_out") or {}
        for what in ("reason", "error", "output"):  # the person's: the agent never sees it
            if held.get(what):
                text = held[what]["message"] if isinstance(held[what], dict) else held[what]
                table.add_row("", escape(f"held-out {what} (withheld from the agent): "
                                         f"{' '.join(str(text).split())[:300]}"))
    tpu = result.tpu
    if tpu:
        verdict = {"ok": "compiles", "error": "REFUSED", "unavailable": "unavailable"}.get(
            tpu.get("compile"), str(tpu.get("compile")))
        vmem = (f" · VMEM {_mib(tpu['vmem_bytes'])} of {_mib(tpu.get('vmem_limit_bytes'))}"
                if tpu.get("vmem_bytes") else "")
        at = (f" at production shape {tpu.get('shape')} "
              f"({' '.join(tpu.get('input_shapes') or [])})" if tpu.get("shape") else "")
        table.add_row("TPU compile", escape(f"{tpu.get('chip')}{at}: {verdict}{vmem}"))
        if tpu.get("compile") != "ok" and tpu.get("message"):
            table.add_row("", escape(tpu["message"].splitlines()[0][:200]))
        from tilewright.kernels.cli.estimate import estimate_rows

        for label, text in estimate_rows(tpu, result.rank):
            table.add_row(label, escape(text))
    flags = (result.integrity or {}).get("flags") or []
    table.add_row("integrity", escape(", ".join(flags) if flags else "no flags"))
    timing = result.timing
    if timing:
        interpret = timing.get("mode") == TPU_INTERPRET
        label = "host simulation time: the CPU interpreting the kernel (not TPU " \
            "performance; never a speedup)" if interpret else f"{timing['method']}"
        if interpret:  # the host's ratio (an eval JSON before host_ratio: in speedup)
            host = timing.get("host_ratio") or timing.get("speedup")
            ratio = f" · host ratio {host:.3g} (not a speedup)" if host else ""
        else:
            speedup = timing.get("speedup")
            ratio = f" · speedup {'n/a' if speedup is None else times(speedup)}"
        table.add_row("host sim." if interpret else "timing", escape(
            f"{timing['median_ms']:.3f} ms median (p10 {timing['p10_ms']:.3f}, p90 "
            f"{timing['p90_ms']:.3f}; {timing['iters']} iters on {timing.get('shape')}) · "
            f"XLA reference {timing['baseline_median_ms']:.3f} ms{ratio}"))
        table.add_row("", f"[yellow]{escape(label)}[/]")
    error = result.error
    if error:
        where = f" at {Path(error.file or kernel).name}:{error.line}" if error.line else ""
        table.add_row("error", escape(f"{error.kind}{where}: {error.message}"))
        if error.hint:
            table.add_row("hint", escape(error.hint))
    console.print(table)
    if result.stderr.strip():
        tail = result.stderr.strip().splitlines()[-5:]
        console.print("[dim]worker stderr (last lines; --json has all):[/]")
        for line in tail:
            console.print(f"[dim]  {escape(line)}[/]")


def _params(params: dict[str, Any] | None) -> str:
    if not params:
        return ""
    return "(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
