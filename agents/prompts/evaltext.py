"""One evaluation as the model reads it: status, error with its line, correctness, the
TPU compiler's verdict and numbers at the production shape, the memory floor, host times.

Every number comes from ``agents.prompts.evalfacts.version_numbers``; every piece of text that
came from the candidate (messages, tracebacks, compiler messages, stderr) is fenced as
untrusted (``agents.prompts.untrusted``) and bounded.
"""

from __future__ import annotations

import re
from typing import Any

from tilewright.agents.prompts.evalfacts import rank_of, version_numbers
from tilewright.agents.prompts.untrusted import bounded, defuse, fence, neutralize
from tilewright.kernels.judge.rank import Rank, times

_MAX_TRACEBACK_LINES = 20
_MAX_STDERR_LINES = 15
MAX_ERROR_CHARS = 4_000  # each message, traceback or output cut to this


def eval_text(result: dict[str, Any], source: str | None = None,
              visible: set[str] | None = None, version: int | None = None) -> str:
    """One evaluation, field by field: status, error with its line, the numbers.

    A correctness reason about a configuration the agent may not see is reworded so that
    neither its name nor array indices (which would hint at its shape) reach the prompt.
    Text that came from the candidate (messages, tracebacks, stderr) is fenced.
    """
    who = f"v{version}" if version is not None else "this version"
    lines = [f"## Evaluation of {who}: {result.get('status', '?')}"]
    n = version_numbers(result)
    backend = result.get("backend") or {}
    if backend and not n.get("interpret"):
        lines.append(f"Backend: {backend.get('platform')} {backend.get('device_kind', '')}")
    lowering = result.get("lowering") or {}
    if lowering.get("tpu") not in (None, "skipped"):
        lines.append(f"TPU lowering: {lowering.get('tpu')}")
        if lowering.get("message"):
            lines.append(fence(bounded(str(lowering["message"]), MAX_ERROR_CHARS),
                               f"TPU lowering message of {who}"))
    error = result.get("error")
    if error:
        where = f" at line {error['line']}" if error.get("line") else ""
        lines.append(f"Error ({error.get('kind')}){where}:")
        lines.append(fence(bounded(str(error.get("message")), MAX_ERROR_CHARS),
                           f"error message of {who}"))
        if error.get("line") and source:
            lines.append(_source_excerpt(source, int(error["line"])))
        if error.get("hint"):
            lines.append(f"Hint: {neutralize(str(error['hint']))}")
        tb = (error.get("traceback") or "").strip().splitlines()
        if tb:
            lines.append("Traceback (last lines):")
            lines.append(fence(bounded("\n".join(tb[-_MAX_TRACEBACK_LINES:]), MAX_ERROR_CHARS),
                               f"traceback of {who}"))
    lines.extend(_correctness_lines(result, n, visible))
    flags = n.get("flags") or []
    if flags:
        lines.append("Integrity flags: " + ", ".join(map(str, flags)))
        outside = (result.get("integrity") or {}).get("outside_compute") or []
        if outside:
            lines.append("Compute outside the kernel: " + "; ".join(
                f"{o.get('op', o.get('primitive', '?'))} at line {o.get('line')}"
                if isinstance(o, dict) else str(o) for o in outside[:5]))
    lines.extend(_compiler_lines(n, who))
    if n.get("host_ms") is not None:
        ref = f", XLA reference {n['host_ref_ms']:.3g} ms" if n.get("host_ref_ms") else ""
        what = ("TPU interpret mode on the CPU: checks correctness; not TPU time, not a "
                "speedup" if n.get("interpret") else "wall clock")
        lines.append(f"Host simulation time ({what}): kernel {n['host_ms']:.3g} ms{ref}.")
    stderr = str(result.get("stderr") or "").strip()
    if stderr and result.get("status") != "correct":
        tail = stderr.splitlines()[-_MAX_STDERR_LINES:]
        lines.append("Output the kernel printed (last lines of stdout/stderr):")
        lines.append(fence(bounded("\n".join(tail), MAX_ERROR_CHARS), f"stdout/stderr of {who}"))
    return "\n".join(lines)


def _correctness_lines(result: dict[str, Any], n: dict[str, Any],
                       visible: set[str] | None) -> list[str]:
    corr = dict(result.get("correctness") or {})
    if not corr:
        return []
    reason = str(corr.get("reason") or "")
    if visible is not None and ":" in reason and reason.split(":", 1)[0] not in visible:
        detail = re.sub(r"\(\d+(, ?\d+)*\)", "(…)", reason.split(":", 1)[1]).strip()
        reason = f"a shape configuration you cannot see failed: {detail}"
    verdict = "correct" if corr.get("correct") else "incorrect"
    diffs = []
    if n.get("max_abs_diff") is not None:
        diffs.append(f"max |out - ref| {n['max_abs_diff']:.3g}")
    if n.get("max_rel_diff") is not None:
        diffs.append(f"max relative {n['max_rel_diff']:.3g}")
    line = f"Correctness: {verdict} in {corr.get('trials')} trials per shape" + (
        f"; {', '.join(diffs)}" if diffs else "")
    atol, rtol = n.get("atol"), n.get("rtol")
    if atol is not None and rtol is not None:
        enforced = n.get("atol_effective")
        line += (f". Enforced: |out - ref| <= {enforced:.3g} + {rtol:g} * |ref| value by "
                 f"value (the task's atol {atol:g}, capped at 5% of max|ref|)"
                 if enforced is not None else
                 f". Enforced: |out - ref| <= min({atol:g}, 5% of max|ref|) + {rtol:g} * |ref|")
        line += ", and rms(out - ref) <= 10% of std(ref) + rtol * rms(ref)"
    lines = [line + "."]
    judged = corr.get("judged_against")
    if isinstance(judged, str) and "f32" in judged:
        lines.append("The task's reference is low precision (bf16/f16): this output was "
                     f"judged against {judged}.")
    if reason:
        # The harness's words, but they quote the output (its pytree's structure, its
        # values), which the candidate chose: fenced like the rest of its output.
        lines.append("Why:")
        lines.append(fence(bounded(reason, MAX_ERROR_CHARS), "correctness verdict"))
    return lines


def _compiler_lines(n: dict[str, Any], who: str) -> list[str]:
    """The TPU compiler's verdict and numbers for one evaluation."""
    if not n.get("chip") and n.get("compile") is None:
        return []
    chip = n.get("chip") or "?"
    lines = []
    at = n.get("shape_label") or (f"shape {n['shape']}" if n.get("shape") else None)
    where = f"TPU {chip}" + (f", at {at}" if at else "")
    if n.get("compile") and n["compile"] != "ok":
        lines.append(f"TPU compile ({where}): {n['compile']}")
        if n.get("tpu_message"):
            lines.append(fence(bounded(n["tpu_message"], MAX_ERROR_CHARS),
                               f"TPU compiler message of {who}"))
    rank = rank_of(n)
    if n.get("input_shapes") or n.get("output_shapes"):
        ins = ", ".join(n.get("input_shapes") or []) or "?"
        outs = ", ".join(n.get("output_shapes") or []) or "?"
        name = f" {n['shape']}" if n.get("shape") else ""
        lines.append(f"At the production shape{name}: inputs {ins} -> output {outs}.")
    cycles, ref = n.get("cycles"), n.get("ref_cycles")
    if cycles is not None or ref is not None:
        est = f" -> {rank.words(short=True)}" if rank is not None and rank.compiler else ""
        method = f"; {n['method']}" if n.get("method") else ""
        kernel = (rank.time_words() if rank is not None and rank.kernel_cycles is not None
                  else None) or f"{cycles_text(cycles)} cycles"
        reference = (f"{cycles_text(ref)} cycles" + (f" = {seconds_text(n['ref_seconds'])}"
                                                      if n.get("ref_seconds") else "")
                     if ref is not None else "not estimated")
        lines.append(f"TPU compiler estimate ({where}): kernel {kernel}, XLA reference "
                     f"{reference}{est}{method}.")
        if n.get("ops"):
            lines.append("  kernel's ops: " + _ops_text(n["ops"]))
        if n.get("ref_ops"):
            lines.append("  reference's ops: " + _ops_text(n["ref_ops"]))
        if ref is None:
            lines.append("  " + _no_reference_text(n, rank))
        if n.get("floor"):
            lines.append("  " + _floor_text(n))
    elif n.get("estimate_unavailable"):
        lines.append(f"TPU compiler estimate ({where}): unavailable: "
                     f"{neutralize(n['estimate_unavailable'])}")
    if rank is not None and rank.ranked:
        trust = rank.trust_words()
        lines.append(f"Ranking number: {rank.words()}."
                     + (f" How far such compiler figures hold, measured: {trust}." if trust
                        else ""))
    facts = []
    if n.get("vmem_bytes") is not None:
        limit = f" of the {n['vmem_limit_bytes'] / 2**20:.0f} MiB scoped limit" \
            if n.get("vmem_limit_bytes") else ""
        facts.append(f"VMEM {n['vmem_bytes'] / 2**20:.2f} MiB{limit} (compiler)")
    if n.get("grid_steps") is not None:
        facts.append(f"{n['grid_steps']} grid steps")
    if facts:
        lines.append("; ".join(facts) + ".")
    return lines


def _no_reference_text(n: dict[str, Any], rank: Rank | None) -> str:
    """Why the XLA reference has no compiler estimate, and what ranks instead: the
    kernel's own estimate against the reference's roofline (its FLOPs at the chip's
    peak, its compulsory bytes at the HBM bandwidth)."""
    why = n.get("estimate_unavailable") or "no reason given"
    text = f"No TPU compiler estimate for the XLA reference: {neutralize(why)}."
    roof = n.get("roofline")
    if rank is None or not rank.is_roofline or not roof:
        return text
    flops = f"{roof['flops'] / 1e9:,.3g} GFLOP" if roof.get("flops") else "its FLOPs"
    moved = f"{roof['bytes'] / 2**20:,.0f} MiB" if roof.get("bytes") else "its bytes"
    compute = f" = {seconds_text(roof['compute_s'])}" if roof.get("compute_s") else ""
    memory = f" = {seconds_text(roof['memory_s'])}" if roof.get("memory_s") else ""
    return (text + " So your kernel is ranked by its own compiler estimate against the "
            f"reference's roofline: its {flops} at the chip's peak{compute}, its compulsory "
            f"{moved} (inputs read and outputs written once) at the HBM bandwidth{memory}; "
            f"the larger, {seconds_text(roof['seconds'])}, is a time XLA cannot beat, so "
            "the ratio is a lower bound of the speedup.")


def _floor_text(n: dict[str, Any]) -> str:
    """The memory floor in a line: the bytes each program must move between HBM and the
    chip, at the chip's bandwidth, and how it stands against the compiler's figures:
    that it decided the ranking number only where the harness says so (``basis``), that
    it is below both only where it is below both, nothing where a figure is missing."""
    f, t = n["floor"], seconds_text
    parts = [f"kernel {t(f['kernel_s'])} ({f.get('kernel_bytes', 0) / 2**20:,.0f} MiB)"]
    if f.get("reference_s"):
        parts.append(f"XLA reference {t(f['reference_s'])} "
                     f"({f.get('reference_bytes', 0) / 2**20:,.0f} MiB)")
    text = "memory floor (bytes through HBM at the chip's bandwidth): " + ", ".join(parts) + "."
    k_floor, r_floor = f["kernel_s"], f.get("reference_s")
    k_est, r_est = n.get("seconds"), n.get("ref_seconds")
    sides = []  # (whose, floor, estimate) where both figures exist
    if k_est:
        sides.append(("the kernel's", k_floor, k_est))
    if r_est and r_floor:
        sides.append(("the XLA reference's", r_floor, r_est))
    if n.get("basis") == "memory_floor":
        above = [f"{who} floor {t(floor)} is above its compiler estimate {t(est)}"
                 for who, floor, est in sides if floor > est]
        alone = (f" (the compiler's cycles alone say {times(n['compiler_ratio'])})"
                 if n.get("compiler_ratio") else "")
        return text + " It decided the ranking number" + alone + (
            ": " + "; ".join(above) if above else "") + "."
    if n.get("basis") == "roofline":
        return (text + " The ranking number prices the XLA reference at its roofline "
                "instead (its FLOPs at the chip's peak), which is above the compiler's "
                "figure for it: no program computing it is faster.")
    if len(sides) == 2 and all(floor <= est for _who, floor, est in sides):
        return (text + f" It is below both compiler estimates (kernel {t(k_est)}, XLA "
                f"reference {t(r_est)}): the compiler's figures rank.")
    if sides:
        text += " Against the compiler's estimates: " + "; ".join(
            f"{who} floor is {'above' if floor > est else 'not above'} its {t(est)}"
            for who, floor, est in sides) + "."
        ranked = n.get("kernel_time_s")
        if k_est and k_floor > k_est and ranked and abs(ranked - k_floor) <= 1e-3 * k_floor:
            text += " The kernel's floor is the time it is ranked by."
    return text


def seconds_text(seconds: float) -> str:
    """Seconds as the ranking words say them: "0.798 ms", "1.85 us"."""
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.3g} us"


def _ops_text(ops: list[dict[str, Any]], limit: int = 6) -> str:
    parts = []
    for op in ops[:limit]:
        kind = "Pallas kernel" if op["kind"] == "pallas" else "XLA"
        count = f" x{op['count']}" if op.get("count", 1) != 1 else ""
        parts.append(f"{neutralize(op['name'])} ({kind}) {op['cycles']:,.0f}{count}")
    more = f", … {len(ops) - limit} more" if len(ops) > limit else ""
    return ", ".join(parts) + more


def cycles_text(value: float | None) -> str:
    return "?" if value is None else f"{value:,.0f}"


def _source_excerpt(source: str, line: int, around: int = 2) -> str:
    src = defuse(source).splitlines()
    lo, hi = max(1, line - around), min(len(src), line + around)
    return "\n".join(f"{'>' if n == line else ' '}{n:4d} | {src[n - 1]}" for n in range(lo, hi + 1))
