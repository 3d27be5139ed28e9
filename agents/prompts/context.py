"""What the model is told: the stable, cached prefix and the per-turn context.

The prompt has two parts. The stable prefix (system text, our Pallas guide, and the
task: entry point, the arrays of every visible check shape and of the production shape
with their dtypes, the correctness rule as the harness enforces it, the reference
source) is identical across every turn of a session and carries ``cache_control`` so
Anthropic's prompt cache serves it after the first request. The per-turn part says, in
this order: the role's instructions; which number ranks kernels, for which chip and
shape (never the host simulation ratio); where the proposal starts (best, latest, base
and why); the chip's figures; the base kernel's source; its evaluation with every
number (estimate and reference estimate in cycles, the per-op breakdown, VMEM of the
limit, grid steps, the tolerance as enforced); its own diagnosis, held against the
estimator; a table of every version with the same columns and a one-line diagnosis
each; the read-only tool answers of the session; lessons, notes and the person's words.

Everything comes from the ``AgentRequest``, whose ``TaskBrief`` never holds the held-out
shape; evaluation details are copied field by field (never the per-shape ``extra``), so
nothing the harness keeps private leaks into a prompt. Everything that came from the
candidate (error messages, tracebacks, compiler messages, stderr) is fenced as untrusted
(``agents.prompts.untrusted``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from typing import Any

from tilewright.agents.base import AgentRequest, TaskBrief, VersionRow
from tilewright.agents.prompts.evalfacts import fidelity_text, rank_of, version_numbers
from tilewright.agents.prompts.evaltext import cycles_text, eval_text
from tilewright.agents.prompts.roles import SYSTEM_TEXT, pallas_guide, role_spec
from tilewright.agents.prompts.tasktext import MAX_SOURCE_CHARS, inputs_text, params_text, task_text
from tilewright.agents.prompts.untrusted import bounded, defuse, fence, neutralize
from tilewright.profiling.chips import DEFAULT_TPU

CACHE = {"type": "ephemeral"}
# Requests stay bounded whatever a candidate or a task file holds (a 50 MB kernel would
# otherwise become a 50 MB request): each piece is cut, then the whole turn.
MAX_TURN_CHARS = 160_000
MAX_PROFILE_LINES = 40
# Read-only tool answers kept for the session: the newest first, within this budget
# (about 6k tokens), each cut to a share of it.
MAX_LOOKUP_CHARS = 24_000
MAX_LOOKUP_ONE = 6_000
TABLE_ROWS = 24


def lines_bounded(text: str, max_lines: int, max_chars: int) -> str:
    """Whole lines of ``text`` only, at most ``max_lines`` and ``max_chars``: a digest is
    cut between lines, never inside one (nor inside a structure)."""
    out: list[str] = []
    used = 0
    lines = text.splitlines()
    for line in lines:
        if len(out) == max_lines or used + len(line) + 1 > max_chars:
            out.append(f"…({len(lines) - len(out)} more lines left out)")
            break
        out.append(line)
        used += len(line) + 1
    return "\n".join(out)


def system_blocks() -> list[dict[str, Any]]:
    text = f"{SYSTEM_TEXT}\n\n{pallas_guide()}"
    return [{"type": "text", "text": text, "cache_control": CACHE}]


# -- the task (cached prefix) -------------------------------------------------------------

def first_user_message(request: AgentRequest) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "text", "text": task_text(request.task), "cache_control": CACHE},
        {"type": "text", "text": turn_text(request)},
    ]}


# -- the turn -----------------------------------------------------------------------------

def turn_text(request: AgentRequest) -> str:
    spec = role_spec(request.role)
    parts = [f"## Your role: {spec.title}\n{spec.instructions}"]
    parts.append(ranking_text(request))
    parts.append(base_text(request))
    parts.append(chip_text(request.chip))
    if request.current_source is not None:
        label = f"v{request.current_version}" if request.current_version else "current"
        source = defuse(bounded(request.current_source.rstrip(), MAX_SOURCE_CHARS))
        parts.append(f"## Base kernel ({label}: your change applies to this source)\n"
                     f"```python\n{source}\n```")
        tunables = _tunables_text(request.current_source)
        if tunables:
            parts.append(tunables)
    else:
        parts.append("## Base kernel\nNone yet: this is the first version.")
    if request.last_eval:
        visible = {shape["name"] for shape in request.task.shapes}
        parts.append(eval_text(request.last_eval, request.current_source, visible,
                               version=request.current_version))
    if request.diagnosis:
        parts.append(diagnosis_text(request.diagnosis, request.current_version))
    elif request.current_version is not None and \
            (request.last_eval or {}).get("status") == "correct":
        parts.append(f"## Diagnosis of v{request.current_version}\nNone yet (no static "
                     "analysis of this version was made).")
    if request.profile_summary:
        parts.append(profile_text(request.profile_summary))
    if request.history:
        parts.append(history_text(request.history, best=request.best_version,
                                  base=request.current_version))
    lookups = lookups_text(request.lookups)
    if lookups:
        parts.append(lookups)
    lessons = request.lessons or stored_lessons(request)
    if lessons:
        parts.append("## Lessons from earlier sessions\n" + "\n".join(f"- {x}" for x in lessons))
    if request.notes:
        parts.append("## Notes since your last proposal\n"
                     + "\n".join(f"- {defuse(x)}" for x in request.notes))
    if request.user_message:
        parts.append(f"## Message from the user\n{defuse(request.user_message)}")
    return bounded("\n\n".join(p for p in parts if p), MAX_TURN_CHARS)


def _ranks(numbers: dict[str, Any]) -> bool:
    rank = rank_of(numbers)
    return rank is not None and rank.ranked


def _latest_numbers(request: AgentRequest) -> dict[str, Any]:
    """The numbers that say how ranking works here: the base's evaluation, else the
    newest evaluated version's."""
    numbers = version_numbers(request.last_eval)
    if _ranks(numbers):
        return numbers
    for entry in reversed(request.history):
        if _ranks(entry.numbers):
            return entry.numbers
    return numbers


def ranking_text(request: AgentRequest) -> str:
    """Which number ranks kernels, in words, for this session's chip and shape."""
    n = _latest_numbers(request)
    rank = rank_of(n)
    backend = request.backend or (request.last_eval or {}).get("backend") or {}
    on_tpu = backend.get("platform") == "tpu" and backend.get("mode") == "native"
    chip = n.get("chip") or (request.chip if request.chip not in ("", "cpu", None)
                             else DEFAULT_TPU)
    shape = _estimate_shape(n, request.task)
    head = "## What ranks kernels\n"
    if on_tpu or (rank is not None and rank.on_chip):
        return head + (
            f"The measured device time on this TPU ({backend.get('device_kind') or chip}) "
            f"against the XLA reference's, at {shape}: speedup = reference time / kernel "
            "time, higher is better. The TPU compiler's estimate is recorded beside it.")
    if rank is not None and rank.simulated:
        why = n.get("estimate_unavailable") or "the TPU compiler gave no estimate"
        return head + (
            f"No TPU estimate is available ({why}), so kernels are ranked by the host "
            "simulation ratio (XLA's time / the interpreted kernel's on this CPU), which "
            "predicts nothing about a TPU: treat any ranking here as weak.")
    if rank is not None and rank.is_bound:
        why = n.get("unpriced") or n.get("implausible") or "no reason given"
        return head + (
            f"The TPU compiler's estimate of your kernel for TPU {chip} at {shape} is not "
            f"believed ({neutralize(why)}), so it is ranked by an upper bound: the XLA "
            "reference's time over the least time your kernel can take (its work at the "
            "chip's peak, its memory floor). \"≤5.6x bound\" means at most 5.6x; kernels "
            "ranked this way tie on their work, so their tiling choices are not told apart; "
            "a loop whose length is known at trace time (static bounds) is estimated.")
    if rank is not None and rank.is_roofline:
        why = n.get("estimate_unavailable") or "no reason given"
        text = (f"The TPU compiler's estimate of your kernel, compiled for TPU {chip} at "
                f"{shape}, against the XLA reference's roofline: the reference has no "
                f"compiler estimate ({neutralize(why)}), so it is priced by its FLOPs at the "
                "chip's peak and its compulsory bytes (inputs read, outputs written once) "
                "at the HBM bandwidth, the larger of the two, a time XLA cannot beat. "
                "\"≥0.87x roofline\" = that roofline time / your kernel's estimated time: "
                "a lower bound of the speedup; higher is better")
    else:
        text = (f"The TPU compiler's estimated speedup: est. = the XLA reference's estimated "
                f"time / your kernel's, both compiled for TPU {chip} at {shape}. Higher is "
                "better; 1.0x ties XLA")
    text += ("; it decides \"best\", the base of the next proposal, and when autonomous "
             "mode stops. Versions are ordered by your kernel's own estimated time there "
             "(the larger of the compiler's figure and its memory floor, the bytes it must "
             "move through HBM at the chip's bandwidth): a reference figure that arrives "
             "later changes the ratio, never the order. It is a static estimate (no TPU "
             "here)")
    fidelity = fidelity_text(n.get("fidelity"))
    text += f"; how far it can be trusted for this kind of program: {fidelity}." if fidelity \
        else ("; it tends to undercount time spent waiting on HBM (memory-bound programs "
              "read faster than they run).")
    if n.get("basis") == "memory_floor":
        text += " The latest figure rests on the memory system's floor, which was higher " \
                "than the compiler's count."
    elif n.get("basis") == "roofline":
        text += " The latest figure prices the XLA reference at its roofline (its FLOPs " \
                "at the chip's peak), which was higher than the compiler's count for it."
    text += (" Off a TPU the check shapes run in TPU interpret mode on this CPU: that host "
             "simulation time checks correctness only. It is not a speedup and ranks "
             "nothing.")
    return head + text


def _estimate_shape(numbers: dict[str, Any], task: TaskBrief) -> str:
    """Where the estimate is computed, in words: the production shape, its inputs named
    as the entry point names them ("the production shape production (x f32[512,1024],
    w f32[1,1024])"), the same words before and after the first evaluation."""
    arrays = numbers.get("input_shapes") or []
    label = numbers.get("shape_label")
    name = numbers.get("shape")
    prod = task.production or {}
    if prod:
        inputs = inputs_text(prod.get("inputs"), task.signature) if prod.get("inputs") else \
            (", ".join(arrays) if arrays else params_text(prod.get("params") or {}))
        return f"the production shape {prod['name']} ({inputs})"
    if label or arrays:
        what = f"the production shape {label or name}" if label else f"shape {name}"
        return what + (f" ({', '.join(arrays)})" if arrays else "")
    check = next((s for s in task.shapes if s["name"] == name), None)
    if check is not None:
        return (f"the check shape {name} ({inputs_text(check.get('inputs'), task.signature)})"
                if check.get("inputs") else f"the check shape {name} "
                f"({params_text(check['params'])})")
    if name:
        return f"shape {name}"
    if len(task.shapes) == 1:  # no production shape: the estimate is for the check shape
        only = task.shapes[0]
        arrays = inputs_text(only.get("inputs"), task.signature) if only.get("inputs") else \
            params_text(only["params"])
        return f"the check shape {only['name']} ({arrays})"
    return "the largest check shape"


def base_text(request: AgentRequest) -> str:
    """Which version is best, which is latest, and which one this proposal starts from."""
    base, best, latest = request.current_version, request.best_version, \
        request.latest_version
    if base is None:
        return "## Where this proposal starts\nNo kernel yet: write the first version."
    rows = {h.version: h for h in request.history}

    def said(number: int | None) -> str:
        entry = rows.get(number) if number is not None else None
        rank = entry.rank if entry is not None else None
        # in short: its source and shape are said once, in "What ranks kernels"
        label = None if rank is None else rank.words(short=True) if rank.ranked else \
            rank.words() if rank.disqualified else None
        status = entry.status if entry is not None else None
        return f"v{number}, {label or status or 'not evaluated'}"

    lines = ["## Where this proposal starts",
             f"Best so far: {said(best) if best is not None else 'none yet (no correct, ranked version)'}."
             f" Latest: {said(latest)}."]
    reason = f" ({request.base_reason})" if request.base_reason else ""
    if request.role == "analyze":
        lines.append(f"The version in question: v{base}{reason}; the kernel below is its "
                     "source.")
    else:
        lines.append(f"Base: v{base}{reason}. The kernel below is v{base}'s source; a tuning "
                     "change applies to it. To start from another version, give its number "
                     "as `base` in your proposal.")
    return "\n".join(lines)


def diagnosis_text(diagnosis: dict[str, Any], base: int | None = None) -> str:
    """The base version's diagnosis (profiling.diagnose, checked against the estimator)
    with the numbers it rests on."""
    version = diagnosis.get("version")
    sources = diagnosis.get("sources") or []
    how = ("static analysis + TPU compiler figures" if "trace" not in sources else
           "profile + static analysis + TPU compiler figures")
    if base is not None and version != base:
        head = f"## Diagnosis of v{version}, an earlier version (v{base} has none of its own)"
    else:
        head = f"## Diagnosis of v{version} ({how})"
    lines = [head, str(diagnosis.get("summary", ""))]
    for finding in diagnosis.get("findings") or []:
        mark = (f" [CONTRADICTED by the estimator: {finding['contradicted']}]"
                if finding.get("contradicted") else "")
        lines.append(f"- {finding.get('kind')}: {finding.get('reason')}{mark}")
    evidence = evidence_text(diagnosis.get("evidence") or {})
    if evidence:
        lines.append(evidence)
    return "\n".join(lines)


def evidence_text(e: dict[str, Any]) -> str:
    """The diagnosis's evidence as a few readable facts (not a JSON dump)."""
    out = []
    if e.get("grid") is not None:
        blocks = ", ".join(f"{k} {tuple(v) if isinstance(v, list) else v}"
                           for k, v in (e.get("blocks") or {}).items())
        steps = e.get("steps")
        out.append(f"grid {tuple(e['grid'])} = {steps} step{'' if steps == 1 else 's'}; "
                   f"blocks {blocks}")
    if e.get("bytes_total"):
        per = f" ({e['bytes_per_step'] / 1024:.1f} KiB per step)" if e.get("bytes_per_step") \
            else ""
        out.append(f"HBM traffic {e['bytes_total'] / 1024:.1f} KiB{per}")
    if e.get("flops"):
        out.append(f"{e['flops']:,.0f} FLOP")
    if e.get("intensity") is not None and e.get("ridge_intensity") is not None:
        dtype = f"{e['ridge_dtype']} " if e.get("ridge_dtype") else ""
        out.append(f"intensity {e['intensity']:.3g} FLOP/B vs the {dtype}ridge "
                   f"{e['ridge_intensity']:.3g} FLOP/B")
    if e.get("vmem_padded_bytes") and e.get("vmem_budget_bytes"):
        out.append(f"VMEM (static, padded) {e['vmem_padded_bytes'] / 2**20:.2f} of "
                   f"{e['vmem_budget_bytes'] / 2**20:.0f} MiB")
    if e.get("step_overhead_share") is not None:
        out.append(f"fixed step cost ~{e['step_overhead_share']:.0%} of the static time model "
                   "(0.35 us per step)")
    steps = e.get("estimator_steps")
    if steps:
        out.append("the TPU compiler's cycles by grid steps (same kernel, other blocks, at "
                   f"{e.get('estimator_steps_at', 'one shape')}): " + ", ".join(
                       f"{s['steps']} step{'s' if s['steps'] != 1 else ''} {s['cycles']:,.0f} "
                       f"(v{s['version']})" for s in steps))
    return ("Evidence: " + "; ".join(out) + ".") if out else ""


def stored_lessons(request: AgentRequest) -> tuple[str, ...]:
    """Lessons from ``agents.memory`` when the caller passed none; a broken file gives none."""
    from tilewright.agents import memory

    try:
        return memory.relevant(family=request.task.family, chip=request.chip,
                               task=request.task.name)
    except OSError:
        return ()


# -- every version ------------------------------------------------------------------------

def history_text(history: tuple[VersionRow, ...], limit: int = TABLE_ROWS,
                 best: int | None = None, base: int | None = None) -> str:
    """A table of the versions with their numbers, then one diagnosis line each."""
    rows = list(history)
    if len(rows) > limit:
        keep = {best, base}
        rows = [r for r in rows[:-limit] if r.version in keep] + rows[-limit:]
    ranks = [h.rank for h in rows]
    mhz = {round(r.clock_hz / 1e6) for r in ranks if r is not None and r.clock_hz}
    # one chip's clock (one task, one chip): "1,000,000 cycles = 0.667 ms at 1.5 GHz"
    clock = (f"; 1,000,000 cycles = {1e3 / next(iter(mhz)):.3g} ms at "
             f"{next(iter(mhz)) / 1e3:g} GHz" if len(mhz) == 1 else "")
    head = ("## Versions so far (rank = the ranking number; cycles from the TPU compiler "
            f"at the estimate's shape{clock})\n"
            "| v | from | status | rank | kernel cycles | ref. cycles | in Pallas / outside |"
            " VMEM used / limit | grid steps | change |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    table = [head]
    for h in rows:
        n = h.numbers
        marks = [m for m, on in (("best", h.version == best),
                                 ("base", h.version == base)) if on]
        label = f"v{h.version}" + (f" ({', '.join(marks)})" if marks else "")
        status = str(h.status or "not evaluated")
        if h.flags:
            status += f" [{', '.join(h.flags)}]"
        est = h.rank.words(short=True) if h.rank is not None else "-"
        split = (f"{cycles_text(n.get('pallas_cycles'))} / {cycles_text(n.get('outside_cycles'))}"
                 if n.get("ops") else "-")
        vmem = (f"{n['vmem_bytes'] / 2**20:.2f} / {n['vmem_limit_bytes'] / 2**20:.0f} MiB"
                if n.get("vmem_bytes") is not None and n.get("vmem_limit_bytes") else "-")
        steps = str(h.steps) + ("" if h.steps_source == "tpu" else "*") \
            if h.steps is not None else "-"
        parent = f"v{h.parent}" if h.parent else "-"
        summary = h.summary.replace("|", "/")[:80]
        table.append(f"| {label} | {parent} | {status} | {est} | {cycles_text(n.get('cycles'))} | "
                     f"{cycles_text(n.get('ref_cycles'))} | {split} | {vmem} | {steps} | "
                     f"{summary} |")
    if any(r.steps_source == "static" for r in rows):
        table.append("* grid steps from the static analysis at the first check shape.")
    diagnosed = [r for r in rows if r.diagnosis and r.version != base]
    if diagnosed:
        table.append("Diagnosis of each other version (static analysis + compiler figures):")
        for r in diagnosed:
            d = r.diagnosis or {}
            marks = [f"{f.get('kind')} contradicted by the estimator"
                     for f in d.get("findings") or [] if f.get("contradicted")]
            others = [f.get("kind") for f in d.get("findings") or []
                      if not f.get("contradicted") and f.get("kind") != d.get("kind")]
            extra = "; ".join([*marks, *(f"also {k}" for k in others)])
            table.append(f"- v{r.version}: {d.get('summary', '')}"
                         + (f" ({extra})" if extra else ""))
    return "\n".join(table)


def lookups_text(lookups: tuple[dict[str, Any], ...]) -> str:
    """The session's read-only tool answers, newest kept within ``MAX_LOOKUP_CHARS``;
    a repeated call keeps only its latest answer."""
    latest: dict[str, dict[str, Any]] = {}
    for call in lookups:
        key = f"{call.get('name')} {json.dumps(call.get('input'), sort_keys=True)}"
        latest.pop(key, None)
        latest[key] = call
    kept: list[str] = []
    used = 0
    dropped = 0
    for call in reversed(list(latest.values())):
        body = bounded(str(call.get("output") or ""), MAX_LOOKUP_ONE)
        entry = (f"### {call.get('name')}({json.dumps(call.get('input') or {})})"
                 f"{' (error)' if call.get('is_error') else ''}\n{body}")
        if used + len(entry) > MAX_LOOKUP_CHARS:
            dropped += 1
            continue
        kept.append(entry)
        used += len(entry)
    if not kept:
        return ""
    note = f" ({dropped} older ones left out for space)" if dropped else ""
    return ("## Read-only tool answers earlier in this session (kept for the session"
            f"{note}; oldest first)\n" + "\n\n".join(reversed(kept)))


def _tunables_text(source: str) -> str:
    from tilewright.kernels.source import tunables

    try:
        declared = tunables.read(source)
    except (tunables.TunablesError, SyntaxError):
        return ""
    if not declared:
        return ""
    return "Declared tunables: " + "; ".join(
        f"{name}={cur!r} of {choices}" for name, (cur, choices) in declared.items())


# -- the chip -----------------------------------------------------------------------------

def chip_text(chip: str) -> str:
    """The target chip's figures, from ``profiling.chips`` when that module is present."""
    if chip in ("cpu", "", None):
        target = chip_figures(DEFAULT_TPU)
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
                f"point (FLOP per HBM byte where compute starts to bind) "
                f"{f['bf16_flops'] / f['hbm_bytes_per_s']:.0f} FLOP/B for bf16 work, "
                f"{f['f32_flops'] / f['hbm_bytes_per_s']:.0f} FLOP/B for f32 work.")
    except (KeyError, TypeError, ZeroDivisionError):
        text = ", ".join(f"{k}={v}" for k, v in f.items())
    return text + (f" {f['note']}" if f.get("note") else "")


def chip_figures(chip: str) -> dict[str, Any]:
    try:
        from tilewright.profiling import chips  # the profiling layer's table; optional here
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


# -- a profile ----------------------------------------------------------------------------

def profile_text(profile: dict[str, Any]) -> str:
    """A profile (``tilewright.profile/1``) as its digest (``profiling.digest``): the
    static analysis per kernel, the roofline with its ridge's dtype, and the trace's top
    ops only when they were measured on a device (an interpret-mode trace is host
    noise). Whole lines only, bounded."""
    try:
        from tilewright.profiling.digest import digest

        text = digest(profile)
    except Exception:  # a profile from another version of the schema: say what we can
        text = str(profile.get("digest") or "")
    if not text:
        return ""
    if profile.get("status") != "ok":
        return "## Profile\n" + fence(lines_bounded(text, MAX_PROFILE_LINES, 6000),
                                      "profile error of the kernel")
    return "## Profile digest\n" + lines_bounded(neutralize(text), MAX_PROFILE_LINES, 6000)
