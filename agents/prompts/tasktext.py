"""The task in words, as every prompt of a session starts with it (the cached prefix of
``agents.prompts.context``): its entry point, the arrays of every visible check shape and
of the production shape, the correctness rule as the judge enforces it, and the reference
source, fenced and bounded."""

from __future__ import annotations

from typing import Any

from tilewright.agents.base import TaskBrief
from tilewright.agents.prompts.evalfacts import array_text
from tilewright.agents.prompts.untrusted import bounded, defuse

MAX_SOURCE_CHARS = 64_000  # a 50 MB kernel or reference file stays a bounded prompt


def task_text(task: TaskBrief) -> str:
    signature = ", ".join(task.signature) if task.signature else "..."
    parts = [
        f"# Task: {task.name}\n\n{task.description.strip()}",
        f"Entry point: `{task.entry}({signature})`: define it with the reference's "
        "signature; it must return what the reference returns (same shapes and dtypes).\n"
        f"Family: {task.family or 'unspecified'}  ·  layout: {task.layout}  ·  Pallas "
        f"required: {'yes' if task.require_pallas else 'no'}",
        shapes_text(task),
        tolerance_rule(task.atol, task.rtol),
        f"## Reference ({'reference.py' if task.layout == 'native' else 'reference'})\n"
        + (reference_note(task) + "\n" if reference_note(task) else "")
        + f"```python\n{defuse(bounded(task.reference_source.rstrip(), MAX_SOURCE_CHARS))}"
          "\n```\n",
    ]
    if task.defining:
        d = task.defining
        parts.append(
            f"## The function that defines the output: `{d['function']}` in {d['module']}\n"
            "The reference calls it: this is the computation your kernel must reproduce "
            "(its arguments, their layout, what it returns).\n"
            f"```python\n{defuse(bounded(d['source'].rstrip(), MAX_SOURCE_CHARS))}\n```\n")
    return "\n\n".join(parts)


def shapes_text(task: TaskBrief) -> str:
    """The check shapes with their input and output arrays, and the production shape in
    a section of its own."""
    prod = task.production
    hidden = task.hidden_checks
    checks = [s for s in task.shapes if not prod or s["name"] != prod.get("name")
              or s.get("size") == "small"]
    more = (f"; {hidden} more configuration{'s are' if hidden != 1 else ' is'} checked that "
            "you cannot see" if hidden else "")
    lines = ["## Shapes",
             "Check shapes (correctness is checked at these, with fresh random inputs each "
             f"trial{more}):"]
    for s in checks:
        lines.append(f"- {s['name']} ({params_text(s['params']) or 'as the task defines it'}): "
                     f"{inputs_text(s.get('inputs'), task.signature)}{_outputs(s)}")
    if not checks:
        lines.append("- (none visible)")
    if prod:
        inputs = inputs_text(prod.get("inputs"), task.signature) + _outputs(prod) \
            if prod.get("inputs") else "arrays not built here; the evaluation names them"
        lines.append(f"Production shape (the size the user runs; the TPU compile, the "
                     f"estimate and the ranking are for it, and --set never changes it): "
                     f"{prod['name']} ({params_text(prod.get('params') or {}) or 'as written'}): "
                     f"{inputs}")
    else:
        lines.append("Production shape: none separate from the check shapes; the "
                     "evaluation names the shape its estimate is for.")
    lines.append("Write one kernel for every shape: read sizes and dtypes from the inputs.")
    return "\n".join(lines)


def _outputs(config: dict[str, Any]) -> str:
    """" -> f32[4096,1024]": the reference's output arrays at a configuration."""
    outs = config.get("outputs")
    if not isinstance(outs, list) or not outs:
        return ""
    found = []
    for item in outs:
        try:
            shape, dtype = item
        except (TypeError, ValueError):
            continue
        found.append(array_text(shape, dtype))
    return f" -> {', '.join(found)}" if found else ""


def inputs_text(inputs: Any, names: tuple[str, ...]) -> str:
    if not isinstance(inputs, list) or not inputs:
        return "input arrays not known (the task's builder was not run)"
    plain = [n for n in names if not n.startswith("*")]
    out = []
    for i, item in enumerate(inputs):
        try:
            shape, dtype = item
        except (TypeError, ValueError):
            continue
        label = f"{plain[i]} " if i < len(plain) else ""
        out.append(f"{label}{array_text(shape, dtype)}")
    return ", ".join(out) or "input arrays not known"


def tolerance_rule(atol: float, rtol: float, effective: float | None = None) -> str:
    """The correctness rule as ``kernels.worker.evaluation.compare`` enforces it."""
    cap = (f"{effective:.3g} at the check shapes so far" if effective is not None else
           "for small outputs far below the stated atol: about 1e-4 for a softmax over a "
           "few hundred columns")
    return ("## When an output is correct\n"
            f"Each output array is compared in float32 with the reference (S = max|ref| of "
            f"that array), with the task's atol={atol:g}, rtol={rtol:g}, and must pass all "
            "three:\n"
            f"1. value by value: |out - ref| <= min(atol, 5% of S) + rtol * |ref|; the "
            f"absolute part is capped at 5% of S ({cap});\n"
            "2. as a whole: rms(out - ref) <= 10% of std(ref) + rtol * rms(ref);\n"
            "3. not constant where the reference varies.\n"
            "NaN/Inf where the reference is finite, or a wrong shape or dtype structure, "
            "is incorrect.")


def reference_note(task: TaskBrief) -> str:
    """What differs between the source shown and what runs at the check shapes."""
    notes = []
    if task.overrides:
        sets = ", ".join(f"{k}={v}" for k, v in task.overrides.items())
        if task.layout == "jaxbench":
            notes.append(f"The check shapes run this file with CONFIG overridden by --set "
                         f"{sets}; the CONFIG written below is the production size.")
        else:
            notes.append(f"The check shapes run with --set {sets}.")
    if task.literal_rewrites:
        pairs = ", ".join(f"{old} -> {new}" for old, new in task.literal_rewrites)
        notes.append(f"Hard-coded sizes are shown rewritten for the check shapes ({pairs}).")
    return " ".join(notes)


def params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())
