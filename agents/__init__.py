"""Who proposes.

LLM providers (Anthropic's Claude through the official SDK), the offline agent
(templates, rule-based fixes, autotuner), the roles (planner, implementer, fixer,
tuner, analyst) and the context they are given, and the lessons remembered across
sessions. Agents only propose: the controller in ``sessions`` decides what runs.
May import ``kernels`` data types; never imports jax, textual, ``sessions`` or ``tui``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from agents.base import Agent, TaskBrief
    from kernels.task import Task

AgentKind = Literal["offline", "anthropic", "auto"]


def make_agent(kind: AgentKind, config: dict[str, Any] | None = None) -> Agent:
    """The agent a session talks to.

    ``anthropic`` raises ``agents.errors.NoApiKey`` (naming ANTHROPIC_API_KEY and offering
    ``--agent offline``) when no key is set; ``auto`` picks Claude when a key is set and
    the offline agent otherwise.
    """
    config = config or {}
    if kind == "auto":
        from agents.claude import api_key_from_env

        kind = "anthropic" if api_key_from_env() else "offline"
    if kind == "offline":
        from agents.offline import OfflineAgent

        return OfflineAgent(config)
    if kind == "anthropic":
        from agents.claude import AnthropicProvider
        from agents.llm_agent import LLMAgent

        followups = int(config.get("agent", {}).get("followups", 2))
        return LLMAgent(AnthropicProvider(config), followups=followups)
    from agents.errors import AgentError

    raise AgentError(f"unknown agent kind {kind!r}: use offline, anthropic or auto")


def brief(task: Task) -> TaskBrief:
    """What an agent may know of a task: everything but the held-out shape configuration."""
    from agents.base import TaskBrief

    return TaskBrief(
        name=task.name,
        description=task.description,
        layout=task.layout,
        entry=task.entry,
        family=task.family,
        reference_source=task.reference_source(),
        shapes=tuple({"name": s.name, "params": dict(s.params)} for s in task.visible_shapes()),
        atol=task.atol,
        rtol=task.rtol,
        require_pallas=task.require_pallas,
    )
