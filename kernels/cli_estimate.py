"""``tilewright estimate``: compile a kernel at its task's production shape and estimate it.

``tilewright estimate --task DIR|NAME --kernel FILE [--chip CHIP] [--json] [--set K=V]``
runs no correctness check: the candidate is traced once at the production shape (the
size the user runs; ``--set production.KEY=VALUE`` changes it, ``--set KEY=VALUE``
only the check shapes, which this command does not use), compiled by the real TPU
compiler for the chip, and estimated against the XLA reference compiled the same way.
``--json`` prints ``tilewright.estimate/1`` (``status``: ok | compile_error | ...,
``tpu`` as in the eval JSON). Exit 0 when it compiles, 1 otherwise, 2 for bad usage.
App side: no JAX here; a worker runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from kernels.cli import kernel_command, named_candidate, overrides_argument
from profiling.chips import DEFAULT_TPU


def register(sub: argparse._SubParsersAction) -> None:
    parser = kernel_command(
        sub, "estimate",
        "compile a kernel at the production shape and estimate it (no correctness check)",
        "Compile a candidate at its task's production shape with the real TPU "
        "compiler and estimate it against the XLA reference, without checking "
        "correctness (tilewright eval does both). Exit 0 when it compiles.", run,
        json_help="print tilewright.estimate/1")
    parser.add_argument("--chip", default=None, metavar="CHIP",
                        help=f"TPU generation (default {DEFAULT_TPU} off-TPU; a TPU host's "
                             "own chip)")
    overrides_argument(parser, "production.KEY=VALUE sets the production shape (repeatable)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS")


def run(args: argparse.Namespace) -> int:
    from kernels.executors import LocalExecutor
    from kernels.options import EvalOptions
    from kernels.workers import WorkerStartError

    found = named_candidate("estimate", args)
    if isinstance(found, int):
        return found
    task, path, source = found

    async def go() -> dict[str, Any]:
        async with LocalExecutor(workers=1) as judge:
            return await judge.estimate(task, source, EvalOptions(
                timeout_s=args.timeout, chip=args.chip), filename=str(path.resolve()))

    try:
        answer = asyncio.run(go())
    except WorkerStartError as exc:
        print(f"tilewright estimate: could not start a JAX worker: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({k: v for k, v in answer.items() if k != "stderr"}, indent=2))
    else:
        _print(answer)
    return 0 if answer.get("status") == "ok" else 1


def _print(found: dict[str, Any]) -> None:
    from kernels.result import ranking

    tpu = found.get("tpu") or {}
    where = (f"{tpu.get('chip')} at production shape {tpu.get('shape')} "
             f"({' '.join(tpu.get('input_shapes') or [])})") if tpu else "—"
    print(f"status     {found.get('status')}")
    print(f"compile    {where}: {tpu.get('compile', '—')}")
    error = found.get("error") or {}
    if error.get("message"):
        print(f"error      {error['message'].splitlines()[0][:300]}")
    if tpu.get("estimated_speedup"):
        rank = ranking({"status": "correct", "tpu": tpu, "integrity": {}})
        print(f"estimate   {rank.label}")
        for what in ("estimate", "reference_estimate"):
            one = tpu.get(what) or {}
            seconds = one.get("seconds")
            print(f"  {'kernel' if what == 'estimate' else 'XLA ref.':<9}"
                  f"{one.get('cycles', 0):>14,} cycles"
                  + (f" = {seconds * 1e3:.3f} ms" if seconds else "")
                  + (f"  ({one.get('detail')})" if one.get("method") == "scaled" else ""))
    elif tpu.get("estimate_unavailable"):
        print(f"estimate   unavailable: {tpu['estimate_unavailable']}")
