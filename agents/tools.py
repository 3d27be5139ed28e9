"""Read-only tools an agent may call mid-reply, without approval.

``lookup_api`` (the installed JAX's own signature and docstring for a name, answered by
a worker process so it matches the JAX that will run the kernel), ``get_version`` (a
version's source, evaluation and profile digest), ``diff_versions`` and ``chip_info``.
None of them changes anything, so no decision is needed: the model calls one, gets the
answer as a ``tool_result``, and carries on with its reply.

The agent layer only defines the tools and the ``Toolbox`` protocol; the session layer
supplies the implementation (``sessions.tools``), which can read the session log and
ask the worker pool. Every provider's agent loop shares ``run_tool_calls``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from agents.base import ToolCall, ToolResult

MAX_OUTPUT_CHARS = 12000

READ_TOOLS: list[dict[str, Any]] = [
    {
        "name": "lookup_api",
        "description": ("The installed JAX's signature and docstring for a name, e.g. "
                        "'pl.BlockSpec', 'pltpu.CompilerParams', 'jax.lax.dot_general' "
                        "(pl = jax.experimental.pallas, pltpu = its tpu module, jnp, lax). "
                        "Read-only: use it before relying on an API you are unsure of."),
        "input_schema": {"type": "object",
                         "properties": {"name": {"type": "string"}},
                         "required": ["name"]},
    },
    {
        "name": "get_version",
        "description": ("A kernel version of this session: its source, its evaluation and "
                        "its profile digest (when it was profiled). Read-only."),
        "input_schema": {"type": "object",
                         "properties": {"version": {"type": "integer"}},
                         "required": ["version"]},
    },
    {
        "name": "diff_versions",
        "description": "The unified diff between two kernel versions of this session.",
        "input_schema": {"type": "object",
                         "properties": {"old": {"type": "integer"}, "new": {"type": "integer"}},
                         "required": ["old", "new"]},
    },
    {
        "name": "chip_info",
        "description": ("The target TPU's figures: peak FLOP/s, HBM bandwidth and size, "
                        "VMEM, cores, ridge point. Optional chip name (v5e, v6e, ...)."),
        "input_schema": {"type": "object", "properties": {"chip": {"type": "string"}}},
    },
]

READ_TOOL_NAMES = frozenset(t["name"] for t in READ_TOOLS)


@runtime_checkable
class Toolbox(Protocol):
    """Answers read-only tool calls; a failure is returned as text, never raised."""

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """(output text, is_error)."""
        ...


async def run_tool_calls(toolbox: Toolbox | None, calls: list[ToolCall]
                         ) -> AsyncIterator[ToolResult]:
    """Answer each read-only call in order (a missing toolbox answers with an error the
    model can read, so it carries on without the tool)."""
    for call in calls:
        if toolbox is None:
            output, is_error = ("tools are not available in this session; answer from what "
                                "the prompt says", True)
        else:
            try:
                output, is_error = await toolbox.call(call.name, dict(call.input))
            except Exception as exc:  # a tool bug is the model's information, not a crash
                output, is_error = f"{call.name} failed: {type(exc).__name__}: {exc}", True
        if len(output) > MAX_OUTPUT_CHARS:
            output = output[:MAX_OUTPUT_CHARS] + "\n…(truncated)"
        yield ToolResult(call.id, call.name, output, is_error)
