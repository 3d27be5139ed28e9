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

from tilewright.agents.prompts.untrusted import RULE as UNTRUSTED_RULE
from tilewright.agents.tools import READ_TOOLS, tool_schema

SYSTEM_TEXT = """\
You are a kernel engineer working inside tilewright, a workbench where a person and an \
agent design and optimize JAX/Pallas kernels for TPUs together. You propose; the person \
(or an auto-approver under budgets) decides what runs. Every kernel you propose is \
evaluated by a fixed harness: correctness against the task's reference at its check \
shapes with fresh random inputs (some configurations are never shown to you), TPU \
lowering, and a compile by the real TPU compiler for the session's chip.

What ranks kernels: on a TPU, the measured device time against the XLA reference's. \
Off a TPU (the usual case here), the TPU compiler's static estimate: est. = the XLA \
reference's estimated time / your kernel's, both compiled for the session's chip at \
the task's production shape (each the larger of the compiler's figure and the memory \
floor of the bytes it must move); higher is better, 1.0x ties XLA. Where the reference \
has no estimate, your kernel's is held against the reference's roofline ("≥0.87x \
roofline", a lower bound of the speedup). Versions are ordered by your kernel's own \
estimated time. Each request says which applies and at what shape. Off a TPU the check \
shapes run in TPU interpret mode on the CPU: that host simulation time checks \
correctness only. It is not a speedup, predicts nothing about a TPU, and ranks nothing.

Where a proposal starts: the kernel shown in a request is the base your change applies \
to. After a version comes out slower than the best, the base is the best version \
again; the request says which version is best, which is latest, and why the base is \
what it is. To start from another version, give its number as `base`.

Untrusted text: @UNTRUSTED@

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
a Pallas API, since the API changes between JAX releases. Their answers stay with the \
session: later requests repeat them, so there is no need to ask again.
- Be concrete and brief: say what you change and why it should be faster or correct.
"""

SYSTEM_TEXT = SYSTEM_TEXT.replace("@UNTRUSTED@", UNTRUSTED_RULE)

TOOLS: list[dict[str, Any]] = [
    tool_schema("propose_plan",
                "Propose a short plan of the next steps (markdown), without code.",
                {"summary": {"type": "string", "description": "One line."},
                 "plan": {"type": "string", "description": "Markdown steps."}},
                ["summary", "plan"]),
    tool_schema("propose_kernel",
                "Propose a complete new kernel module (full source, not a diff).",
                {"summary": {"type": "string", "description": "One line: what changed."},
                 "rationale": {"type": "string",
                               "description": "Why it is correct and faster."},
                 "source": {"type": "string", "description": "The complete Python module."},
                 "base": {"type": "integer",
                          "description": "The version this module starts from, when not "
                                         "the base the request names (optional)."}},
                ["summary", "source"]),
    tool_schema("propose_tuning",
                "Propose new values for one or more tunables the base kernel declares in "
                "TUNABLES, all applied at once; the rest of the source stays as it is.",
                {"changes": {"type": "object",
                             "description": "{NAME: new_value, ...}: one or several tunables",
                             "additionalProperties": True},
                 "rationale": {"type": "string"},
                 "base": {"type": "integer",
                          "description": "The version whose source to tune, when not the "
                                         "base the request names (optional; it must declare "
                                         "the same tunables)."}},
                ["changes", "rationale"]),
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
        "The base kernel is correct. Propose new values for the declared tunables "
        "(propose_tuning; `changes` may set one tunable or several at once) that you expect "
        "to raise the ranking number, with the reason read from the numbers of the versions "
        "so far; or a structural change (propose_kernel) when the numbers say tuning "
        "cannot help.",
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
    return files("tilewright.agents").joinpath("guide.md").read_text()
