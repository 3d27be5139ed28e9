"""The task brief with the arrays the kernel is really called with.

``agents.brief(task)`` is built from files alone (no JAX in the app): it knows each
check shape's parameters, not the arrays they give. A JAXBench ``create_inputs`` may
default to bfloat16 while the harness builds float32, and hard-coded sizes are
rewritten by ``--set``; the only trustworthy answer is the task's own input builder.
``with_inputs`` asks a worker for it once per session (the ``inputs`` op, which runs the
builder under ``jax.eval_shape``: nothing is allocated, so a production-sized task costs
nothing) and adds ``inputs`` ([[shape, dtype], ...]) to every visible check shape, and to
the production shape when the task has one. A worker that cannot answer leaves the
brief as it was: the prompt then says the shapes are unknown.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agents.base import TaskBrief
from kernels.task import Task

INPUTS_TIMEOUT_S = 120.0


async def with_inputs(brief: TaskBrief, task: Task, judge: Any) -> TaskBrief:
    """``brief`` with input arrays from ``judge`` (a ``kernels.executors.Judge``: its
    ``inputs(task)``; or anything with ``request(op, payload, timeout)``, e.g. a
    ``WorkerPool``); unchanged when it cannot tell."""
    request = _requester(judge)
    if request is None:
        return brief
    checked = await _configs(request, task)
    shapes = tuple({**s, "inputs": checked[s["name"]]} if s["name"] in checked else s
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
            inputs = found.get(production["name"]) or next(iter(found.values()), None)
            if inputs is not None:
                production = {**production, "inputs": inputs}
    return replace(brief, shapes=shapes, production=production)


def _requester(judge: Any) -> Any:
    """``ask(task) -> inputs JSON``: the judge protocol's ``inputs``, else the worker op."""
    inputs = getattr(judge, "inputs", None)
    if callable(inputs):
        return inputs
    request = getattr(judge, "request", None)
    if callable(request):
        return lambda task: request("inputs", {"task": task.to_spec()}, INPUTS_TIMEOUT_S)
    return None


async def _configs(ask: Any, task: Task) -> dict[str, list[list[Any]]]:
    """``{config name: [[shape, dtype], ...]}`` of the task's visible configurations (one
    that lists no array says nothing)."""
    try:
        answer = await ask(task)
    except Exception:  # no worker, a task whose inputs fail: the eval will say why
        return {}
    configs = answer.get("configs") if isinstance(answer, dict) else None
    out: dict[str, list[list[Any]]] = {}
    for config in configs if isinstance(configs, list) else []:
        if isinstance(config, dict) and not config.get("held_out") \
                and isinstance(config.get("inputs"), list) and config["inputs"]:
            out[str(config.get("name"))] = config["inputs"]
    return out
