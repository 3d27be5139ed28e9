"""The five roles (planner, implementer, fixer, tuner, analyst) and the tools they answer with.

All roles share one system prompt, one Pallas guide and one tool list, so the cached
prompt prefix is the same whichever role speaks; what a role is asked to do lives in
its instructions, which go into the per-turn part of the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from agents.tools import READ_TOOLS

SYSTEM_TEXT = """\
You are a kernel engineer working inside tilewright, a workbench where a person and an \
agent design and optimize JAX/Pallas kernels for TPUs together. You propose; the person \
(or an auto-approver under budgets) decides what runs. Every kernel you propose is \
evaluated by a fixed harness: correctness against the task's reference on several shape \
configurations with fresh random inputs (some configurations are never shown to you), \
TPU lowering, and timing against the reference compiled by XLA.

Rules:
- A kernel proposal is one complete Python module defining the task's entry function \
with the reference's signature. It must use `jax.experimental.pallas` (`pl.pallas_call`) \
and should declare its tunable block sizes as module constants plus a literal \
`TUNABLES = {"NAME": [choices...]}` dict, clamping to the array with `min(BLOCK, n)`.
- Do not hard-code shapes: read them from the inputs. Never pass `interpret=`.
- To propose, answer with exactly one tool call (propose_plan, propose_kernel or \
propose_tuning), after a short explanation. If you cannot use tools, put the complete \
kernel in a single ```python fenced block.
- When the person asks a question, or you are asked to explain, answer in plain text \
without a proposing tool call: a text-only reply is shown as your answer.
- Read-only tools (lookup_api, get_version, diff_versions, chip_info) need no approval: \
call them whenever a fact would help, e.g. lookup_api("pl.BlockSpec") before relying on \
a Pallas API, since the API changes between JAX releases.
- Be concrete and brief: say what you change and why it should be faster or correct.
"""

TOOLS: list[dict[str, Any]] = [
    {
        "name": "propose_plan",
        "description": "Propose a short plan of the next steps (markdown), without code.",
        "input_schema": {
            "type": "object",
            "properties": {
                "summary": {"type": "string", "description": "One line."},
                "plan": {"type": "string", "description": "Markdown steps."},
            },
            "required": ["summary", "plan"],
        },
    },
    {
        "name": "propose_kernel",
        "description": "Propose a complete new kernel module (full source, not a diff).",
        "input_schema": {
            "type": "object",
            "properties": {
                "summary": {"type": "string", "description": "One line: what changed."},
                "rationale": {"type": "string", "description": "Why it is correct and faster."},
                "source": {"type": "string", "description": "The complete Python module."},
            },
            "required": ["summary", "source"],
        },
    },
    {
        "name": "propose_tuning",
        "description": ("Propose new values for tunables the current kernel declares in TUNABLES; "
                        "the rest of the source stays as it is."),
        "input_schema": {
            "type": "object",
            "properties": {
                "changes": {"type": "object", "description": "{NAME: new_value}",
                            "additionalProperties": True},
                "rationale": {"type": "string"},
            },
            "required": ["changes", "rationale"],
        },
    },
]

TOOLS += READ_TOOLS  # read-only: answered mid-reply, no approval (agents.tools)

TOOL_KIND = {"propose_plan": "plan", "propose_kernel": "kernel", "propose_tuning": "tuning"}


@dataclass(frozen=True)
class RoleSpec:
    name: str
    title: str
    instructions: str
    expects: tuple[str, ...]  # proposal kinds this role should answer with


ROLES: dict[str, RoleSpec] = {
    "plan": RoleSpec(
        "plan", "planner",
        "Study the reference and the current state. Propose a plan (propose_plan) as a "
        "numbered list, one line per step (`1. ...`), each step one kernel change that can "
        "be evaluated on its own: the kernel structure (grid, blocks, what stays in VMEM), "
        "the first version to write, and what to tune after it is correct. The person "
        "approves it and the implementer then carries it out one approved step at a time.",
        ("plan",)),
    "implement": RoleSpec(
        "implement", "implementer",
        "Write the next kernel version (propose_kernel): the complete module. Start from the "
        "current kernel if there is one; keep what works.",
        ("kernel",)),
    "fix": RoleSpec(
        "fix", "fixer",
        "The last evaluation failed. Read the error, its line and the hint, find the cause, "
        "and propose a corrected kernel (propose_kernel), or a tuning change "
        "(propose_tuning) when a block size alone is at fault. Change as little as needed.",
        ("kernel", "tuning")),
    "tune": RoleSpec(
        "tune", "tuner",
        "The kernel is correct. Propose one tuning change (propose_tuning) to the declared "
        "tunables that you expect to make it faster, with the reason; or a structural "
        "change (propose_kernel) when the profile says tuning cannot help.",
        ("tuning", "kernel")),
    "analyze": RoleSpec(
        "analyze", "analyst",
        "Explain the version in question, its evaluation, profile and diagnosis, or its "
        "error: where the time goes, how far from the roofline, what limits it, and what "
        "the next change should be. Answer in text (no proposing tool call).",
        ()),
}


def role_spec(role: str) -> RoleSpec:
    return ROLES.get(role, ROLES["implement"])


@cache
def pallas_guide() -> str:
    """Our Pallas-on-TPU guide (agents/guide.md), part of the cached prompt prefix."""
    return files("agents").joinpath("guide.md").read_text()
