"""Read-only tools an agent may call mid-reply, without approval.

``lookup_api`` (the installed JAX's own signature and docstring for a name, answered by
a worker process so it matches the JAX that will run the kernel), ``get_version`` (a
version's source, evaluation and profile digest), ``diff_versions`` and ``chip_info``.
None of them changes anything, so no decision is needed: the model calls one, gets the
answer as a ``tool_result``, and carries on with its reply.

The agent layer only defines the tools and the ``Toolbox`` protocol; the session layer
supplies the implementation (``sessions.control.tools``), which can read the session log and
ask the worker pool. Every provider's agent loop shares ``run_tool_calls``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from tilewright.agents.base import ToolCall, ToolResult

MAX_OUTPUT_CHARS = 12000


def tool_schema(name: str, description: str, properties: dict[str, Any],
                required: list[str] | None = None) -> dict[str, Any]:
    """One tool as the providers are given it (Anthropic's form; the OpenAI adapter
    rewrites it): its name, what it does, and its JSON-schema arguments."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required is not None:
        schema["required"] = required
    return {"name": name, "description": description, "input_schema": schema}


READ_TOOLS: list[dict[str, Any]] = [
    tool_schema("lookup_api",
                "The installed JAX's signature and docstring for a name, e.g. "
                "'pl.BlockSpec', 'pltpu.CompilerParams', 'jax.lax.dot_general' "
                "(pl = jax.experimental.pallas, pltpu = its tpu module, jnp, lax). "
                "Read-only: use it before relying on an API you are unsure of.",
                {"name": {"type": "string"}}, ["name"]),
    tool_schema("get_version",
                "A kernel version of this session: its source, its evaluation and "
                "its profile digest (when it was profiled). Read-only.",
                {"version": {"type": "integer"}}, ["version"]),
    tool_schema("diff_versions",
                "The unified diff between two kernel versions of this session.",
                {"old": {"type": "integer"}, "new": {"type": "integer"}}, ["old", "new"]),
    tool_schema("chip_info",
                "The target TPU's figures: peak FLOP/s, HBM bandwidth and size, "
                "VMEM, cores, ridge point. Optional chip name (v5e, v6e, ...).",
                {"chip": {"type": "string"}}),
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
