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

from tilewright.kernels.cli import (
    configured_chip,
    kernel_command,
    named_candidate,
)
from tilewright.profiling.chips import DEFAULT_TPU


def register(sub: argparse._SubParsersAction) -> None:
    parser = kernel_command(
        sub, "estimate",
        "compile a kernel at the production shape and estimate it (no correctness check)", run,
        json_help="print tilewright.estimate/1",
        set_help="production.KEY=VALUE sets the production shape (repeatable)")
    parser.add_argument("--chip", default=None, metavar="CHIP",
                        help=f"TPU generation (default {DEFAULT_TPU} off-TPU; a TPU host's "
                             "own chip)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS")


def run(args: argparse.Namespace) -> int:
    """Compile a candidate at its task's production shape with the real TPU compiler and
    estimate it against the XLA reference, without checking correctness (tilewright eval
    does both). Exit 0 when it compiles."""
    from tilewright.kernels.judge.options import EvalOptions
    from tilewright.kernels.pool import LocalExecutor
    from tilewright.kernels.pool.workers import WorkerStartError

    found = named_candidate("estimate", args)
    if isinstance(found, int):
        return found
    task, path, source = found

    async def go() -> dict[str, Any]:
        async with LocalExecutor(workers=1) as judge:
            return await judge.estimate(task, source, EvalOptions(
                timeout_s=args.timeout, chip=args.chip or configured_chip(args)),
                filename=str(path.resolve()))

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
    tpu = found.get("tpu") or {}
    where = (f"{tpu.get('chip')} at production shape {tpu.get('shape')} "
             f"({' '.join(tpu.get('input_shapes') or [])})") if tpu else "—"
    print(f"status     {found.get('status')}")
    print(f"compile    {where}: {tpu.get('compile', '—')}")
    error = found.get("error") or {}
    if error.get("message"):
        print(f"error      {error['message'].splitlines()[0][:300]}")
    for label, text in estimate_rows(tpu):
        print(f"{label:<10} {text}")


def _ms(seconds: float | None) -> str:
    if not seconds:
        return "?"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.3g} us"


def _mib(count: float | None) -> str:
    return f"{count / (1 << 20):.1f} MiB" if count else "?"


def estimate_rows(tpu: dict[str, Any], rank: Any = None) -> list[tuple[str, str]]:
    """The TPU compiler's figures at the production shape, as (label, text) rows for
    ``eval`` and ``estimate``: the rank in its words (``Rank.words``; ``rank``, or the
    compiler's figure when the evaluation ranks by none), the kernel's and the
    reference's cycles with their time (``Rank.time_words``), the memory floor, how far
    such figures are trusted (``Rank.trust_words``); or why there is no estimate."""
    from tilewright.kernels.judge.rank import ranking

    figure = ranking({"status": "correct", "tpu": tpu, "integrity": {}})
    shown = rank if rank is not None and (rank.compiler or rank.on_chip) \
        else figure
    if not (shown.compiler or shown.on_chip):
        why = tpu.get("estimate_unavailable")
        cycles = (tpu.get("estimate") or {}).get("cycles")
        rows = [("estimate", f"unavailable: {why}")] if why else []
        if isinstance(cycles, int) and figure.time_words():
            rows.append(("kernel", f"{figure.time_words()}"))
        return rows
    said = shown.words()
    if shown.compiler:
        said += "; a static estimate, not a measurement"
    if rank is not None and shown is not rank:  # the evaluation itself ranks by none
        said += f" ({rank.words()})" if rank.disqualified \
            else f" (not ranked: {rank.words()})"
    rows = [("rank" if shown is rank else "estimate", said)]
    kernel, ref = tpu.get("estimate") or {}, tpu.get("reference_estimate") or {}
    if shown.time_words():
        rows.append(("kernel", shown.time_words() or ""))
    if isinstance(ref.get("cycles"), int):
        rows.append(("XLA ref.", f"{ref['cycles']:,} cycles = {_ms(ref.get('seconds'))}"))
    roof = tpu.get("reference_roofline") or {}
    if roof.get("seconds") and (shown.is_roofline or shown.basis == "roofline"):
        parts = [f"{roof['bound_by']}-bound"] if roof.get("bound_by") else []
        if roof.get("flops"):
            parts.append(f"{float(roof['flops']):.3g} FLOPs")
        if roof.get("bytes"):
            parts.append(_mib(roof["bytes"]))
        rows.append(("roofline", f"XLA reference {_ms(roof['seconds'])}"
                                 + (f" ({', '.join(parts)})" if parts else "")
                                 + "; no program computing it is faster"
                                 + (f" (above XLA's estimate, {_ms(ref.get('seconds'))}: "
                                    "it decided the estimate)"
                                    if shown.basis == "roofline" and ref else "")))
    floor = tpu.get("floor") or {}
    if floor.get("kernel_s"):
        decided = " (it decided the estimate)" if shown.basis == "memory_floor" else ""
        ref_floor = (f", reference {_ms(floor['reference_s'])} ({_mib(floor.get('reference_bytes'))})"
                     if floor.get("reference_s") else "")
        rows.append(("floor", f"memory floor: kernel {_ms(floor['kernel_s'])} "
                              f"({_mib(floor.get('kernel_bytes'))}){ref_floor} at "
                              f"{float(floor.get('bandwidth_bytes_per_s') or 0) / 1e9:.0f} "
                              f"GB/s{decided}"))
    trust = shown.trust_words()
    if trust:
        rows.append(("trust", trust))
    for what, found in (("kernel", kernel), ("XLA ref.", ref)):
        if found.get("method") == "scaled" and found.get("detail"):
            rows.append(("", f"{what}: {found['detail']}"))
    return rows
