"""What the model is told: the stable, cached prefix and the per-turn context.

The prompt has two parts. The stable prefix (system text, our Pallas guide, and the
task with its reference source) is identical across every turn of a session and carries
``cache_control`` so Anthropic's prompt cache serves it after the first request. The
per-turn part holds the role's instructions, the current kernel, the last evaluation,
the profile and its diagnosis, the chip's figures, history, notes and lessons. Everything comes from the
``AgentRequest``, whose ``TaskBrief`` never holds the held-out shape; evaluation
details are copied field by field (never the per-shape ``extra``), so nothing the
harness keeps private leaks into a prompt.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, is_dataclass
from typing import Any

from agents.base import AgentRequest, TaskBrief
from agents.roles import SYSTEM_TEXT, pallas_guide, role_spec
from kernels.result import is_interpret

CACHE = {"type": "ephemeral"}
_MAX_PROFILE_CHARS = 6000
_MAX_TRACEBACK_LINES = 20
# Requests stay bounded whatever a candidate or a task file holds (a 50 MB kernel would
# otherwise become a 50 MB request): each piece is cut, then the whole turn.
MAX_SOURCE_CHARS = 64_000
MAX_ERROR_CHARS = 4_000
MAX_TURN_CHARS = 160_000


def bounded(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n…({len(text) - limit} characters cut)"


def system_blocks() -> list[dict[str, Any]]:
    text = f"{SYSTEM_TEXT}\n\n{pallas_guide()}"
    return [{"type": "text", "text": text, "cache_control": CACHE}]


def task_text(task: TaskBrief) -> str:
    shapes = "\n".join(f"- {s['name']}: {_params(s['params'])}" for s in task.shapes) or "- (none)"
    return (
        f"# Task: {task.name}\n\n{task.description.strip()}\n\n"
        f"Entry point: `{task.entry}` (same signature as the reference function)\n"
        f"Family: {task.family or 'unspecified'}  ·  layout: {task.layout}\n"
        f"Tolerance: atol={task.atol:g}, rtol={task.rtol:g} (compared in float32)\n"
        f"Pallas required: {'yes' if task.require_pallas else 'no'}\n"
        f"Shape configurations you may see (more are checked, unseen):\n{shapes}\n\n"
        f"## Reference ({'reference.py' if task.layout == 'native' else 'reference'})\n"
        f"```python\n{bounded(task.reference_source.rstrip(), MAX_SOURCE_CHARS)}\n```\n"
    )


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def first_user_message(request: AgentRequest) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "text", "text": task_text(request.task), "cache_control": CACHE},
        {"type": "text", "text": turn_text(request)},
    ]}


def turn_text(request: AgentRequest) -> str:
    spec = role_spec(request.role)
    parts = [f"## Your role: {spec.title}\n{spec.instructions}"]
    parts.append(chip_text(request.chip))
    if request.current_source is not None:
        label = f"v{request.current_version}" if request.current_version else "current"
        source = bounded(request.current_source.rstrip(), MAX_SOURCE_CHARS)
        parts.append(f"## Current kernel ({label})\n```python\n{source}\n```")
        tunables = _tunables_text(request.current_source)
        if tunables:
            parts.append(tunables)
    else:
        parts.append("## Current kernel\nNone yet: this is the first version.")
    if request.last_eval:
        visible = {shape["name"] for shape in request.task.shapes}
        parts.append(eval_text(request.last_eval, request.current_source, visible))
    if request.profile_summary:
        parts.append(profile_text(request.profile_summary))
    if request.diagnosis:
        parts.append(diagnosis_text(request.diagnosis))
    if request.history:
        parts.append(history_text(request.history))
    lessons = request.lessons or stored_lessons(request)
    if lessons:
        parts.append("## Lessons from earlier sessions\n" + "\n".join(f"- {x}" for x in lessons))
    if request.notes:
        parts.append("## Notes since your last proposal\n" + "\n".join(f"- {x}" for x in request.notes))
    if request.user_message:
        parts.append(f"## Message from the user\n{request.user_message}")
    return bounded("\n\n".join(parts), MAX_TURN_CHARS)


def diagnosis_text(diagnosis: dict[str, Any]) -> str:
    """The latest diagnosis (profiling.diagnose) with the numbers it rests on."""
    lines = [f"## Diagnosis (from the profile of v{diagnosis.get('version')})",
             str(diagnosis.get("summary", ""))]
    for finding in diagnosis.get("findings") or []:
        lines.append(f"- {finding.get('kind')}: {finding.get('reason')}")
    evidence = {k: v for k, v in (diagnosis.get("evidence") or {}).items()
                if v is not None and k != "warnings"}
    if evidence:
        lines.append("Evidence: " + _compact(_prune(evidence), 1500))
    return "\n".join(lines)


def stored_lessons(request: AgentRequest) -> tuple[str, ...]:
    """Lessons from ``agents.memory`` when the caller passed none; a broken file gives none."""
    from agents import memory

    try:
        return memory.relevant(family=request.task.family, chip=request.chip,
                               task=request.task.name)
    except OSError:
        return ()


def eval_text(result: dict[str, Any], source: str | None = None,
              visible: set[str] | None = None) -> str:
    """The last evaluation, field by field: status, error with its line, numbers.

    A correctness reason about a configuration the agent may not see is reworded so that
    neither its name nor array indices (which would hint at its shape) reach the prompt.
    """
    lines = [f"## Last evaluation: {result.get('status', '?')}"]
    backend = result.get("backend") or {}
    if backend:
        lines.append(f"Backend: {backend.get('platform')} ({backend.get('mode')}); "
                     "interpret-mode timings are not TPU performance." if
                     is_interpret(backend) else
                     f"Backend: {backend.get('platform')} {backend.get('device_kind', '')}")
    lowering = result.get("lowering") or {}
    if lowering.get("tpu") not in (None, "skipped"):
        msg = f": {lowering.get('message')}" if lowering.get("message") else ""
        lines.append(f"TPU lowering: {lowering.get('tpu')}{msg}")
    error = result.get("error")
    if error:
        where = f" at line {error['line']}" if error.get("line") else ""
        lines.append(f"Error ({error.get('kind')}){where}: "
                     f"{bounded(str(error.get('message')), MAX_ERROR_CHARS)}")
        if error.get("line") and source:
            lines.append(_source_excerpt(source, int(error["line"])))
        if error.get("hint"):
            lines.append(f"Hint: {error['hint']}")
        tb = (error.get("traceback") or "").strip().splitlines()
        if tb:
            lines.append("Traceback (last lines):\n" + bounded(
                "\n".join(tb[-_MAX_TRACEBACK_LINES:]), MAX_ERROR_CHARS))
    corr = dict(result.get("correctness") or {})
    reason = str(corr.get("reason") or "")
    if visible is not None and ":" in reason and reason.split(":", 1)[0] not in visible:
        detail = re.sub(r"\(\d+(, ?\d+)*\)", "(…)", reason.split(":", 1)[1]).strip()
        corr["reason"] = f"a shape configuration you cannot see failed: {detail}"
    if corr:
        lines.append("Correctness: " + ", ".join(
            f"{k}={corr[k]}" for k in ("correct", "trials", "max_abs_diff", "max_rel_diff",
                                        "atol", "rtol", "reason") if corr.get(k) is not None))
    flags = (result.get("integrity") or {}).get("flags") or []
    if flags:
        lines.append("Integrity flags: " + ", ".join(map(str, flags)))
    timing = result.get("timing")
    if timing:
        lines.append("Timing: " + ", ".join(
            f"{k}={timing[k]:.4g}" if isinstance(timing[k], float) else f"{k}={timing[k]}"
            for k in ("method", "median_ms", "p10_ms", "p90_ms", "baseline_median_ms", "speedup")
            if timing.get(k) is not None))
    return "\n".join(lines)


def _source_excerpt(source: str, line: int, around: int = 2) -> str:
    src = source.splitlines()
    lo, hi = max(1, line - around), min(len(src), line + around)
    return "\n".join(f"{'>' if n == line else ' '}{n:4d} | {src[n - 1]}" for n in range(lo, hi + 1))


def history_text(history: tuple[dict[str, Any], ...], limit: int = 12) -> str:
    rows = []
    for h in history[-limit:]:
        speed = f"{h['speedup']:.3g}x" if isinstance(h.get("speedup"), int | float) else "-"
        rows.append(f"- v{h.get('version')}: {h.get('status')}, speedup {speed}: {h.get('summary', '')}")
    return "## Versions so far\n" + "\n".join(rows)


def _tunables_text(source: str) -> str:
    from kernels import tunables

    try:
        declared = tunables.read(source)
    except (tunables.TunablesError, SyntaxError):
        return ""
    if not declared:
        return ""
    return "Declared tunables: " + "; ".join(
        f"{name}={cur!r} of {choices}" for name, (cur, choices) in declared.items())


def chip_text(chip: str) -> str:
    """The target chip's figures, from ``profiling.chips`` when that module is present."""
    if chip in ("cpu", "", None):
        target = chip_figures("v5e")
        head = ("## Chip\nRunning on a CPU host in TPU interpret mode: correctness and TPU "
                "lowering are real, timings measure the interpreter. Optimize for a real TPU")
        return head + (f"; for reference, {_describe_chip(target)}" if target else ".")
    figures = chip_figures(chip)
    return f"## Chip: {chip}\n{_describe_chip(figures)}" if figures else f"## Chip: {chip}"


def _describe_chip(f: dict[str, Any]) -> str:
    """One readable line from a profiling.chips.Chip (unknown layouts: key=value)."""
    try:
        est = " (estimated)" if f.get("f32_estimated") else ""
        text = (f"{f['label']}: {f['bf16_flops'] / 1e12:.0f} TFLOP/s bf16, "
                f"{f['f32_flops'] / 1e12:.0f} TFLOP/s f32{est}; HBM {f['hbm_bytes_per_s'] / 1e9:.0f} "
                f"GB/s, {f['hbm_bytes'] / 2**30:.0f} GiB; VMEM {f['vmem_bytes'] / 2**20:.0f} MiB "
                f"per core ({f['scoped_vmem_bytes'] / 2**20:.0f} MiB scoped by default); "
                f"{f['cores']} core(s){', megacore' if f.get('megacore') else ''}; ridge "
                f"{f['bf16_flops'] / f['hbm_bytes_per_s']:.0f} FLOP/byte.")
    except (KeyError, TypeError, ZeroDivisionError):
        text = ", ".join(f"{k}={v}" for k, v in f.items())
    return text + (f" {f['note']}" if f.get("note") else "")


def chip_figures(chip: str) -> dict[str, Any]:
    try:
        from profiling import chips  # the profiling layer's table; optional here
    except ImportError:
        return {}
    spec: Any = None
    for attr in ("get_chip", "chip_spec", "lookup"):
        fn = getattr(chips, attr, None)
        if callable(fn):
            try:
                spec = fn(chip)
            except (KeyError, ValueError):  # an unknown chip is no reason to fail a prompt
                spec = None
            break
    if spec is None:
        return {}
    if is_dataclass(spec):
        spec = asdict(spec)
    return {k: v for k, v in dict(spec).items() if isinstance(v, int | float | str | bool)}


_PROFILE_FIRST = ("status", "error", "analysis", "roofline", "top_ops", "per_iteration",
                  "pallas_share", "timeline")
_PROFILE_DROP = {"events", "traceEvents", "trace", "tracks", "logdir", "raw", "chip"}


def profile_text(profile: dict[str, Any]) -> str:
    """The profile JSON (``tilewright.profile/1``) pruned for a prompt: the static analysis
    (grid, blocks, VMEM, warnings), roofline placement and top ops first; raw trace
    events, long lists and long strings cut."""
    ordered = {k: profile[k] for k in _PROFILE_FIRST if k in profile}
    ordered.update({k: v for k, v in profile.items() if k not in ordered})
    return "## Profile summary\n" + _compact(_prune(ordered), _MAX_PROFILE_CHARS)


def _prune(value: Any, depth: int = 0) -> Any:
    if isinstance(value, dict):
        return {k: _prune(v, depth + 1) for k, v in value.items()
                if k not in _PROFILE_DROP and depth < 6}
    if isinstance(value, list):
        head = [_prune(v, depth + 1) for v in value[:10]]
        return head + ([f"... {len(value) - 10} more"] if len(value) > 10 else [])
    if isinstance(value, str) and len(value) > 300:
        return value[:300] + "…"
    if isinstance(value, float):
        return float(f"{value:.4g}")
    return value


def _compact(value: Any, limit: int) -> str:
    text = json.dumps(value, default=str, indent=None, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + " …(truncated)"
