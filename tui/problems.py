"""Turn evaluation and profile results into the rows of the Problems pane.

Pure functions over the documented JSON (``tilewright.eval/1`` and
``tilewright.profile/1``), so the pane and its tests share one reading of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tilewright.tui.format import rank_at_length

ICONS = {"error": "✗", "warning": "!", "flag": "⚑", "info": "·"}


@dataclass(frozen=True)
class Problem:
    severity: str  # error | warning | flag | info
    kind: str  # lowering | compile | runtime | correctness | integrity | analysis | session
    message: str
    line: int | None = None
    version: int | None = None
    hint: str | None = None

    @property
    def icon(self) -> str:
        return ICONS.get(self.severity, "·")


def _first_line(text: str | None, limit: int = 300) -> str:
    text = (text or "").strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def from_eval(result: dict[str, Any], version: int | None = None) -> list[Problem]:
    """Problems one evaluation reports: errors, lowering, correctness, integrity flags."""
    out: list[Problem] = []
    status = result.get("status", "")
    error = result.get("error") or None
    if error:
        kind = error.get("kind") or status
        kind = {"syntax": "compile", "import": "compile", "missing_entry": "compile"}.get(
            kind, kind)
        message = _first_line(error.get("message")) or status
        out.append(Problem("error", kind, message, error.get("line"), version,
                           error.get("hint")))
    lowering = result.get("lowering") or {}
    if lowering.get("tpu") == "error" and not (error and error.get("kind") == "lowering"):
        out.append(Problem("error", "lowering", _first_line(lowering.get("message"))
                           or "TPU lowering failed", lowering.get("line"), version))
    correctness = result.get("correctness") or {}
    if status == "incorrect" and not error:
        detail = correctness.get("reason") or (
            f"max abs diff {correctness.get('max_abs_diff')} "
            f"(atol {correctness.get('atol')}, rtol {correctness.get('rtol')})")
        out.append(Problem("error", "correctness", _first_line(detail), None, version))
    if status in ("timeout", "crashed") and not error:
        out.append(Problem("error", status, f"the candidate {status.replace('_', ' ')}",
                           None, version))
    out += _from_tpu(result, version)
    for flag in (result.get("integrity") or {}).get("flags", []):
        name = flag if isinstance(flag, str) else flag.get("name", str(flag))
        detail = "" if isinstance(flag, str) else flag.get("detail", "")
        if name == "suspicious_speedup" and result.get("timing"):
            detail = detail or _suspicious(result["timing"] or {})
        out.append(Problem("flag", "integrity", f"{name} {detail}".strip(), None, version))
    return out


def _suspicious(timing: dict[str, Any]) -> str:
    """The ratio that raised ``suspicious_speedup``: a measured speedup, or in TPU
    interpret mode the host simulation ratio (never called a speedup)."""
    measured, host = timing.get("speedup"), timing.get("host_ratio")
    if isinstance(measured, int | float):
        return f"{measured:.1f}x measured"
    return f"host sim. ratio {host:.3g}" if isinstance(host, int | float) else ""


def _from_tpu(result: dict[str, Any], version: int | None) -> list[Problem]:
    """The TPU compiler's refusal (unless the error row already says it), or why no
    compile or no estimate could be had on this host."""
    tpu = result.get("tpu") or {}
    error = result.get("error") or {}
    chip = tpu.get("chip") or "the chip"
    if tpu.get("compile") == "error" and error.get("kind") not in ("tpu_compile", "lowering"):
        return [Problem("error", "tpu compile", f"refused on {chip}: "
                        + _first_line(tpu.get("message")), None, version)]
    if tpu.get("compile") == "unavailable":
        return [Problem("info", "tpu compile", f"not compiled for {chip}: "
                        + (_first_line(tpu.get("message")) or "no reason given"), None,
                        version)]
    if tpu.get("compile") == "ok" and tpu.get("estimate_unavailable") \
            and result.get("status") == "correct":
        return [Problem("info", "estimate", f"no TPU compiler estimate on {chip}: "
                        + _first_line(tpu["estimate_unavailable"]), None, version)]
    return []


def tpu_summary(result: dict[str, Any] | None) -> str:
    """One line for the Problems pane: "v5e: compiles · VMEM 2.0/16.0 MiB · est. 1.80x
    on v5e (TPU compiler) · compute-bound v5e: median 0.96 of measured, 10 programs"
    (``Rank.words``, and how far a compiler figure can be trusted); empty when no TPU
    compile ran."""
    from tilewright.kernels.judge.rank import ranking

    tpu = (result or {}).get("tpu") or {}
    if not tpu.get("compile"):
        return ""
    verdict = {"ok": "compiles", "error": "refused by the TPU compiler",
               "unavailable": "not compiled"}.get(tpu["compile"], str(tpu["compile"]))
    parts = [f"{tpu.get('chip') or '?'}: {verdict}"]
    used = tpu.get("vmem_bytes")
    if isinstance(used, int | float):
        limit = tpu.get("vmem_limit_bytes")
        parts.append(f"VMEM {used / 2**20:.1f}"
                     + (f"/{limit / 2**20:.1f} MiB" if isinstance(limit, int | float)
                        else " MiB"))
    rank = ranking(result or {})
    if rank.ranked:
        parts.append(rank_at_length(rank))
    return " · ".join(parts)


def from_profile(profile: dict[str, Any], version: int | None = None) -> list[Problem]:
    """Static-analysis warnings of every pallas_call in a profile, at the kernel's line."""
    out: list[Problem] = []
    for kernel in (profile.get("analysis") or {}).get("kernels", []) or []:
        line = _line_of(kernel.get("source"))
        for warning in kernel.get("warnings", []) or []:
            if isinstance(warning, str):
                out.append(Problem("warning", "analysis", _first_line(warning), line, version))
                continue
            severity = "error" if warning.get("severity") == "error" else "warning"
            code = warning.get("code")
            text = _first_line(warning.get("message")) or str(code)
            out.append(Problem(severity, "analysis", f"{code}: {text}" if code else text,
                               warning.get("line") or line, version, warning.get("fix")))
    return out


def _line_of(where: Any) -> int | None:
    """'gelu_kernel at kernel.py:22' -> 22."""
    match = re.search(r":(\d+)\s*$", str(where or ""))
    return int(match.group(1)) if match else None
