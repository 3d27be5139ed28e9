"""The task brief with the arrays the kernel is really called with.

``agents.brief(task)`` is built from files alone (no JAX in the app): it knows each
check shape's parameters, not the arrays they give. A JAXBench ``create_inputs`` may
default to bfloat16 while the harness builds float32, and hard-coded sizes are
rewritten by ``--set``; the only trustworthy answer is the task's own input builder.
``with_inputs`` asks a worker for it once per session (the ``inputs`` op, which runs the
builder under ``jax.eval_shape``: nothing is allocated, so a production-sized task costs
nothing) and adds ``inputs`` ([[shape, dtype], ...]) and the reference's ``outputs`` to
every visible check shape, and to the production shape when the task has one. A worker that cannot answer leaves the
brief as it was: the prompt then says the shapes are unknown.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tilewright.agents.base import TaskBrief
from tilewright.kernels.judge.protocol import Judge
from tilewright.kernels.tasks.task import Task


async def with_inputs(brief: TaskBrief, task: Task, judge: Judge,
                      problems: list[dict[str, Any]] | None = None) -> TaskBrief:
    """``brief`` with input arrays from ``judge`` (its ``inputs(task)``); unchanged when
    it cannot tell. What is wrong with the task's own code
    (its input builder or its reference failing: ``{message, file, line, where}``) is
    appended to ``problems``."""
    request = judge.inputs
    checked = await _configs(request, task, problems)
    shapes = tuple({**s, **checked[s["name"]]} if s["name"] in checked else s
                   for s in brief.shapes)
    production = brief.production
    make = getattr(task, "production_task", None)
    if production is not None and callable(make):
        try:
            at_size = make()
        except Exception:  # a task that cannot describe its production shape: say nothing
            at_size = None
        if at_size is not None:
            found = await _configs(request, at_size)
            arrays = found.get(production["name"]) or next(iter(found.values()), None)
            if arrays is not None:
                production = {**production, **arrays}
    return replace(brief, shapes=shapes, production=production)


async def _configs(ask: Any, task: Task, problems: list[dict[str, Any]] | None = None
                   ) -> dict[str, dict[str, Any]]:
    """``{config name: {"inputs": [[shape, dtype], ...], "outputs": [...]}}`` of the
    task's visible configurations (one that lists no array says nothing; ``outputs``
    only where the reference's could be had)."""
    try:
        answer = await ask(task)
    except Exception:  # no worker, a task whose inputs fail: the eval will say why
        return {}
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict) \
            and problems is not None:
        problems.append(answer["error"])
    configs = answer.get("configs") if isinstance(answer, dict) else None
    out: dict[str, list[list[Any]]] = {}
    for config in configs if isinstance(configs, list) else []:
        if isinstance(config, dict) and not config.get("held_out") \
                and isinstance(config.get("inputs"), list) and config["inputs"]:
            arrays: dict[str, Any] = {"inputs": config["inputs"]}
            if isinstance(config.get("outputs"), list) and config["outputs"]:
                arrays["outputs"] = config["outputs"]
            out[str(config.get("name"))] = arrays
    return out
