"""Who proposes.

LLM providers (Anthropic's Claude, and any OpenAI-compatible endpoint, each through
its official SDK), the offline agent
(templates, rule-based fixes, autotuner), the roles (planner, implementer, fixer,
tuner, analyst) and the context they are given, and the lessons remembered across
sessions. Agents only propose: the controller in ``sessions`` decides what runs.
May import ``kernels`` data types; never imports jax, textual, ``sessions`` or ``tui``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tilewright.agents.base import Agent, TaskBrief
    from tilewright.agents.config import Config
    from tilewright.kernels.tasks.task import Task

AgentKind = Literal["offline", "anthropic", "openai", "auto"]
AGENT_KINDS = ("offline", "anthropic", "openai", "auto")  # the --agent choices
PROVIDERS = ("anthropic", "openai")  # what [agent] provider may name


def make_agent(kind: AgentKind, config: Config | dict[str, Any] | None = None) -> Agent:
    """The agent a session talks to.

    ``anthropic`` raises ``agents.errors.NoApiKey`` (naming ANTHROPIC_API_KEY and offering
    ``--agent offline``) when no key is set; ``openai`` raises an ``AgentError`` naming
    OPENAI_API_KEY for a hosted endpoint without a key, or OPENAI_BASE_URL when nothing
    listens at a key-less (local) one. ``auto`` picks ``[agent] provider`` (anthropic
    unless set) when it is usable (a key, or a key-less endpoint), else the offline agent.
    """
    from tilewright.agents.config import coerce

    config = coerce(config)  # a dict is validated like the file: unknown keys refused
    if kind == "auto":
        kind = resolve_auto(config)
    if kind == "offline":
        from tilewright.agents.offline import OfflineAgent

        return OfflineAgent(config)
    if kind == "anthropic":
        from tilewright.agents.llm_agent import LLMAgent
        from tilewright.agents.providers.claude import AnthropicProvider

        return LLMAgent(AnthropicProvider(config), followups=config.agent.followups)
    if kind == "openai":
        from tilewright.agents.llm_agent import LLMAgent
        from tilewright.agents.providers.openai_chat import OpenAIProvider

        provider = OpenAIProvider(config)
        agent = LLMAgent(provider, followups=config.agent.followups)
        agent.label = provider.label  # "gpt-4.1", or "qwen3 at 127.0.0.1" for a local server
        return agent
    from tilewright.agents.errors import AgentError

    raise AgentError(f"unknown agent kind {kind!r}: use {', '.join(AGENT_KINDS[:-1])} or "
                     f"{AGENT_KINDS[-1]}")


def configured_provider(config: Config | dict[str, Any] | None) -> str:
    """``[agent] provider`` (anthropic unless set); an unknown name is a clear error."""
    from tilewright.agents.config import coerce

    provider = coerce(config).agent.provider or "anthropic"
    if provider not in PROVIDERS:
        from tilewright.agents.errors import AgentError

        raise AgentError(f"[agent] provider = {provider!r} is not one tilewright knows: "
                         f"use {' or '.join(PROVIDERS)}")
    return provider


def resolve_auto(config: Config | dict[str, Any] | None) -> str:
    """What ``auto`` means here: the configured provider when usable, else offline."""
    provider = configured_provider(config)
    if provider == "openai":
        from tilewright.agents.providers.openai_chat import usable

        return "openai" if usable(config) else "offline"
    from tilewright.agents.providers.claude import api_key_from_env

    return "anthropic" if api_key_from_env() else "offline"


def describe_agent(kind: str | None, config: Config | dict[str, Any] | None) -> dict[str, Any]:
    """The agent a session would get, for ``tilewright config``: provider, model,
    endpoint and where the key comes from. Never the key itself; no network."""
    from tilewright.agents.config import coerce

    config = coerce(config)
    kind = kind or config.agent.kind or "auto"
    chosen = resolve_auto(config) if kind == "auto" else kind
    info: dict[str, Any] = {"kind": kind, "provider": chosen}
    if chosen == "openai":
        from tilewright.agents.providers.openai_chat import endpoint

        ep = endpoint(config)
        info.update(model=ep.model, endpoint=ep.base_url,
                    key=ep.key_source or ("missing: set OPENAI_API_KEY" if ep.key_required
                                          else "none (key-less local server)"))
    elif chosen == "anthropic":
        from tilewright.agents.providers.claude import DEFAULT_MODEL, api_key_from_env

        info.update(model=config.agent.model or DEFAULT_MODEL,
                    endpoint=config.base_url("anthropic") or "https://api.anthropic.com",
                    key="ANTHROPIC_API_KEY" if api_key_from_env()
                    else "missing: set ANTHROPIC_API_KEY")
    return info


def brief(task: Task) -> TaskBrief:
    """What an agent may know of a task: everything but the held-out shape configuration."""
    from tilewright.agents.base import TaskBrief

    source = task.reference_source()
    meta = task.meta or {}
    return TaskBrief(
        name=task.name,
        description=task.description,
        layout=task.layout,
        entry=task.entry,
        family=task.family,
        reference_source=source,
        shapes=tuple({"name": s.name, "params": dict(s.params), "size": s.size}
                     for s in task.visible_shapes()),
        hidden_checks=sum(1 for s in task.shapes if s.held_out),
        atol=task.atol,
        rtol=task.rtol,
        require_pallas=task.require_pallas,
        production=_production(task),
        signature=_signature(source, _REFERENCE_FUNCTION.get(task.layout, task.entry)),
        overrides=dict(meta.get("overrides") or {}),
        literal_rewrites=tuple(tuple(pair) for pair in meta.get("literal_rewrites") or ()),
        defining=_defining(task, source),
    )


def _defining(task: Task, source: str) -> dict[str, str] | None:
    """The function that defines the output when the reference only delegates to it:
    ``SOURCE_FUNCTION = 'model:mm'`` (written by ``tilewright new``), or the production
    variant's ``workload``/``computation`` of a converted benchmark
    (``bench_production.py``)."""
    import re

    if task.layout != "native":
        return None
    root = task.root
    found = re.search(r"^SOURCE_FUNCTION\s*=\s*['\"]([\w.]+):(\w+)['\"]", source, re.MULTILINE)
    candidates: list[tuple[str, str]] = []
    if found:
        candidates.append((found.group(1).replace(".", "/") + ".py", found.group(2)))
    candidates += [("bench_production.py", "workload"), ("bench_production.py", "computation")]
    for module, function in candidates:
        path = root / module
        try:
            text = path.read_text()
        except OSError:
            continue
        if re.search(rf"^def {function}\(", text, re.MULTILINE):
            return {"module": module, "function": function, "source": text}
    return None


# The reference's function, whose signature a candidate's entry point copies.
_REFERENCE_FUNCTION = {"native": "reference", "jaxbench": "workload",
                       "maxkernel": "computation"}


def _signature(source: str, name: str) -> tuple[str, ...]:
    """The parameter names of ``name`` in ``source`` (empty when it cannot be read)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args)]
            if a.vararg:
                names.append("*" + a.vararg.arg)
            return tuple(names)
    return ()


def _production(task: Task) -> dict[str, Any] | None:
    """The production shape as an agent may know it (+ "config": a JAXBench CONFIG as
    written; + "reference_source": the reference as written when ``--set`` rewrote its
    hard-coded sizes for the check shapes); None when there is none or it is held out."""
    production = getattr(task, "production", None)
    if production is None or getattr(production, "held_out", False):
        return None
    found: dict[str, Any] = {"name": production.name, "params": dict(production.params)}
    if task.production_meta and "config" in task.production_meta:
        found["config"] = task.production_meta["config"]
    if (task.meta or {}).get("literal_rewrites"):
        # The reference as written, its hard-coded sizes the production ones (the brief's
        # reference_source shows them rewritten for the check shapes, same lines).
        found["reference_source"] = task.reference_path.read_text()
    return found
