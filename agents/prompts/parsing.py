"""Turning a model's reply into a ``Proposal``, or into a precise follow-up question.

A reply may carry a tool call (propose_plan / propose_kernel / propose_tuning) or,
failing that, the complete kernel in one fenced python block. A text-only reply to a
question (the request carries the person's message) or from a role that expects no
proposal (the analyst) is an answer, not a failure. A reply that has no code,
a syntax error, no entry point, or a tuning of names the kernel does not declare is
answered with a follow-up that says exactly what is wrong (with line numbers), so the
model can correct itself; the caller gives up after a limit.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from typing import Any

from tilewright.agents.base import AgentRequest, Proposal, ToolCall
from tilewright.agents.prompts.roles import TOOL_KIND, role_spec
from tilewright.agents.providers.provider import FinalMessage
from tilewright.agents.tools import READ_TOOL_NAMES

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class Parsed:
    """A proposal, an answer (a text-only reply to a question or an explanation), or the
    follow-up to send (with the tool call it answers, if any)."""

    proposal: Proposal | None = None
    followup: str | None = None
    tool_use_id: str | None = None
    answer: str | None = None


def fenced_python(text: str) -> list[str]:
    return [block for block in _FENCE.findall(text) if block.strip()]


def check_kernel_source(source: str, entry: str, require_pallas: bool) -> str | None:
    """What is wrong with a proposed kernel module, or None when it may be evaluated."""
    from tilewright.kernels.source.printable import controls_text, source_controls
    from tilewright.kernels.source.tunables import MAX_PARSE_CHARS

    if len(source) > MAX_PARSE_CHARS:  # parsing it would stall the app for minutes
        return (f"The kernel is {len(source):,} characters; a kernel module is at most "
                f"{MAX_PARSE_CHARS:,}. Send the complete module itself, without generated "
                "data.")
    controls = source_controls(source)
    if controls:  # a terminal showing the kernel would obey them
        return (f"The kernel holds raw control characters ({controls_text(controls)}). "
                "Write them as escapes inside strings (`\\x1b`), drop them from comments, "
                "and send the complete module.")
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        line = (exc.text or "").rstrip()
        return (f"The kernel does not parse: SyntaxError at line {exc.lineno}"
                f"{f', column {exc.offset}' if exc.offset else ''}: {exc.msg}"
                f"{f' (`{line.strip()}`)' if line else ''}. Send the corrected complete module.")
    defined = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    if entry not in defined:
        found = sorted(n for n in defined if not n.startswith("_") and n.islower())[:8]
        return (f"The module defines no `{entry}` function at top level (found: "
                f"{', '.join(found) or 'nothing'}). The harness calls `{entry}(*inputs)` with "
                "the reference's arguments: define it, and send the complete module.")
    if require_pallas and "pallas_call" not in source:
        return ("This task requires a Pallas kernel, and the module never calls "
                "`pl.pallas_call`. Write the computation as a Pallas kernel and send the "
                "complete module.")
    return None


def parse_reply(reply: FinalMessage, request: AgentRequest) -> Parsed:
    spec = role_spec(request.role)
    if reply.malformed:
        bad = reply.malformed[0]
        return Parsed(followup=(
            f"The input of your {bad.name} call was not valid JSON ({bad.error}). Call "
            f"{bad.name} again with a JSON object matching its schema; escape newlines and "
            "quotes inside the source string."), tool_use_id=bad.id)
    calls = [c for c in reply.tool_calls if c.name in TOOL_KIND]
    if calls:
        return _from_tool(calls[0], reply.text, request)
    unknown = next((c for c in reply.tool_calls if c.name not in READ_TOOL_NAMES), None)
    if unknown is not None:
        return Parsed(followup=f"There is no tool named {unknown.name!r}; use propose_plan, "
                      "propose_kernel or propose_tuning.", tool_use_id=unknown.id)
    blocks = fenced_python(reply.text)
    if blocks:
        if len(blocks) > 1:
            return Parsed(followup=(
                f"Your reply has {len(blocks)} python blocks; I cannot tell which is the kernel. "
                "Send the complete kernel module in one block, or call propose_kernel."))
        return _kernel(blocks[0], _first_line(reply.text), reply.text, request, "fenced")
    if "plan" in spec.expects and reply.text.strip():
        return Parsed(Proposal(kind="plan", summary=_first_line(reply.text), plan=reply.text.strip()))
    if reply.text.strip() and (request.user_message or not spec.expects):
        # A question from the person, or an explanation asked for: prose is the answer.
        return Parsed(answer=reply.text.strip())
    if reply.stop_reason == "max_tokens":
        return Parsed(followup=("Your reply was cut off at the output token limit before any "
                                "proposal. Send only the proposal, without long explanations."))
    return Parsed(followup=(
        f"Your reply contains no proposal: as the {spec.title}, answer with "
        f"{_expected_tools(spec.expects)}, or the complete `{request.task.entry}` module in one "
        "```python fenced block."))


def _from_tool(call: ToolCall, text: str, request: AgentRequest) -> Parsed:
    kind = TOOL_KIND[call.name]
    data: dict[str, Any] = call.input
    if kind == "plan":
        plan = str(data.get("plan") or "").strip()
        if not plan:
            return Parsed(followup="propose_plan needs a non-empty `plan`.", tool_use_id=call.id)
        return Parsed(Proposal(kind="plan", summary=str(data.get("summary") or _first_line(plan)),
                               plan=plan, rationale=text.strip(), meta={"via": "tool"}))
    if kind == "kernel":
        source = data.get("source")
        if not isinstance(source, str) or not source.strip():
            return Parsed(followup="propose_kernel needs `source`: the complete module as a string.",
                          tool_use_id=call.id)
        rationale = str(data.get("rationale") or text).strip()
        base, problem = _base(data, request)
        if problem:
            return Parsed(followup=problem, tool_use_id=call.id)
        parsed = _kernel(source, str(data.get("summary") or ""), rationale, request, "tool")
        if parsed.proposal is not None and base is not None:
            parsed = Parsed(replace(parsed.proposal, meta={**parsed.proposal.meta,
                                                           "base": base}))
        return Parsed(parsed.proposal, parsed.followup, call.id if parsed.followup else None)
    return _tuning(call, text, request)


def _base(data: dict[str, Any], request: AgentRequest) -> tuple[int | None, str | None]:
    """The ``base`` a proposal names (None: the request's own), or what is wrong with it."""
    base = data.get("base")
    if base is None or base == request.current_version:
        return None, None
    known = {h.version: h for h in request.history}
    if not isinstance(base, int) or isinstance(base, bool) or base not in known:
        names = ", ".join(f"v{n}" for n in known) or "none"
        return None, (f"`base` must be the number of a version of this session (versions: "
                      f"{names}); leave it out to start from v{request.current_version}.")
    return base, None


def _kernel(source: str, summary: str, rationale: str, request: AgentRequest, via: str) -> Parsed:
    problem = check_kernel_source(source, request.task.entry, request.task.require_pallas)
    if problem:
        return Parsed(followup=problem)
    return Parsed(Proposal(kind="kernel", summary=summary or "new kernel version",
                           rationale=rationale.strip(), source=source.rstrip() + "\n",
                           meta={"via": via}))


def _tuning(call: ToolCall, text: str, request: AgentRequest) -> Parsed:
    from tilewright.kernels.source import tunables

    changes = call.input.get("changes")
    if not isinstance(changes, dict) or not changes:
        return Parsed(followup="propose_tuning needs `changes`: a JSON object {NAME: value}.",
                      tool_use_id=call.id)
    if request.current_source is None:
        return Parsed(followup="There is no kernel to tune yet: call propose_kernel.",
                      tool_use_id=call.id)
    base, problem = _base(call.input, request)
    if problem:
        return Parsed(followup=problem, tool_use_id=call.id)
    if base is not None:
        # Another version's source is not in the request: its recorded tunables are.
        entry = next(h for h in request.history if h.version == base)
        declared_there = entry.tunables or {}
        unknown = sorted(set(changes) - set(declared_there))
        if unknown:
            return Parsed(followup=(f"v{base} declares no tunable {', '.join(unknown)} "
                                    f"(it declares: {', '.join(declared_there) or 'none'})."),
                          tool_use_id=call.id)
        summary = "tune " + ", ".join(f"{k}={v!r}" for k, v in changes.items()) + \
            f" (from v{base})"
        return Parsed(Proposal(kind="tuning", summary=summary,
                               rationale=str(call.input.get("rationale") or text).strip(),
                               tuning=dict(changes), meta={"via": "tool", "base": base}))
    try:
        declared = tunables.read(request.current_source)
        tunables.apply(request.current_source, changes)
    except tunables.TunablesError as exc:
        names = ", ".join(declared) if "declared" in locals() and declared else "none"
        return Parsed(followup=f"That tuning cannot be applied: {exc}. Declared tunables: {names}.",
                      tool_use_id=call.id)
    summary = "tune " + ", ".join(f"{k}={v!r}" for k, v in changes.items())
    rationale = str(call.input.get("rationale") or text).strip()
    return Parsed(Proposal(kind="tuning", summary=summary, rationale=rationale,
                           tuning=dict(changes), meta={"via": "tool"}))


def _expected_tools(kinds: tuple[str, ...]) -> str:
    names = {v: k for k, v in TOOL_KIND.items()}
    return " or ".join(names[k] for k in kinds) or "a text answer"


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        line = line.strip().lstrip("#").strip()
        if line and not line.startswith("```"):
            return line[:120]
    return ""
