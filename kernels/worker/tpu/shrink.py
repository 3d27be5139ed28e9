"""A task's production shape made smaller along one size parameter, for the estimator.

The TPU compiler's estimator is too costly for a big XLA reference at its production
size (a 4096x4096x14336 f32 matmul: more than 300 s and 18 GB here). Its cost at the
production size is extrapolated instead from two smaller sizes along a *batch-like*
parameter: one whose halving halves the output (rows of a matmul, the batch of an
attention), so the work is a fixed part plus a part proportional to it. The parameter
is found by asking the reference's output shape (``jax.eval_shape``: nothing runs).

Sizes are changed the way ``--set`` changes them (``kernels.tasks.loaders``: CONFIG keys and
hard-coded literals of a JAXBench baseline, named literals of MaxKernel input code,
make_inputs parameters of a native task), so what is estimated is the task's own
program at another size. Worker-side (imports JAX through the runtime).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from tilewright.kernels.tasks.task import ShapeConfig, Task

MIN_SIZE = 16  # a parameter smaller than this is not a batch worth scaling


def size_parameters(task: Task, config: ShapeConfig) -> dict[str, int]:
    """The integer size parameters of the production configuration and their values."""
    def sizes(values: dict[str, Any]) -> dict[str, int]:
        return {k: v for k, v in values.items()
                if isinstance(v, int) and not isinstance(v, bool) and v >= MIN_SIZE}

    if task.layout == "native":
        return sizes(config.params)
    if task.layout == "jaxbench":
        return sizes(task.meta.get("config") or {})
    if task.layout == "maxkernel" and task.input_gen_path is not None:
        from tilewright.kernels.tasks.loaders.maxkernel import named_sizes

        return sizes(named_sizes(task.input_gen_path))
    return {}


def with_size(task: Task, config: ShapeConfig, param: str, value: int) -> Task:
    """The task with one configuration: the production one with ``param`` = ``value``."""
    if task.layout == "native":
        scaled = ShapeConfig(f"{config.name}@{param}={value}", {**config.params, param: value},
                             "large", atol=config.atol, rtol=config.rtol)
        return replace(task, shapes=(scaled,), production=None, production_meta=None)
    from tilewright.kernels.tasks.loaders import load_task

    overrides: dict[str, Any] = {param: value}
    if "dtype" in config.params:
        overrides["dtype"] = config.params["dtype"]
    loaded = load_task(task.root, overrides)
    return replace(loaded, shapes=loaded.shapes[:1], production=None, production_meta=None)


def config_of(spec: dict[str, Any]) -> ShapeConfig:
    return Task.from_spec(spec).shapes[0]


def output_elements(task: Task) -> int | None:
    """Elements of the reference's output at the task's first configuration (abstract)."""
    import jax

    from tilewright.kernels.worker.execution import jitted_reference, task_runtime

    try:
        runtime = task_runtime(task.to_spec())
        dyn, static, _ = runtime.input_signature(task.shapes[0])
        fn = jitted_reference(runtime, len(dyn), len(static))
        out = jax.eval_shape(fn, *dyn, *static)
    except Exception:
        return None
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(out))


def batch_parameters(task: Task, config: ShapeConfig) -> list[tuple[str, int]]:
    """(parameter, production value) of every size whose halving halves the output,
    the largest value first (more room to scale)."""
    base = output_elements(replace(task, shapes=(config,), production=None,
                                   production_meta=None))
    if not base:
        return []
    found = []
    for param, value in size_parameters(task, config).items():
        if value % 2:
            continue
        try:
            half = output_elements(with_size(task, config, param, value // 2))
        except Exception:  # the size cannot be changed that way (a shared literal)
            continue
        if half is not None and half * 2 == base:
            found.append((value, param))
    return [(param, value) for value, param in sorted(found, reverse=True)]


def batch_parameter(task: Task, config: ShapeConfig) -> tuple[str, int] | None:
    """The first of ``batch_parameters``, or None when no parameter halves the output."""
    found = batch_parameters(task, config)
    return found[0] if found else None


# -- sizes the program has: axes of the reference's inputs ------------------------------

Axes = tuple[tuple[int, int], ...]  # (input index, axis) pairs shrunk together


def _out_elements(fn: Any, avals: list[Any], static: list[Any]) -> int | None:
    import jax

    try:
        out = jax.eval_shape(fn, *avals, *static)
    except Exception:
        return None
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(out))


def with_axes(avals: list[Any], axes: Axes, value: int) -> list[Any]:
    """``avals`` with every (input, axis) of ``axes`` set to ``value``."""
    import jax

    out = list(avals)
    for index, axis in axes:
        shape = list(out[index].shape)
        shape[axis] = value
        out[index] = jax.ShapeDtypeStruct(tuple(shape), out[index].dtype)
    return out


def _axis_groups(avals: list[Any]) -> list[Axes]:
    """Candidate axes to shrink, most specific first: each axis alone, then the leading
    axes of every input that share a size (a batch), then every axis of one size."""
    singles: list[Axes] = []
    by_size: dict[int, list[tuple[int, int]]] = {}
    for index, aval in enumerate(avals):
        for axis, size in enumerate(getattr(aval, "shape", ())):
            size = int(size)
            if size >= MIN_SIZE and size % 2 == 0:
                singles.append(((index, axis),))
                by_size.setdefault(size, []).append((index, axis))
    groups: list[Axes] = list(singles)
    for members in by_size.values():
        leading = tuple(m for m in members if m[1] == 0)
        if len(leading) > 1:
            groups.append(leading)
        if len(members) > 1 and tuple(members) != leading:
            groups.append(tuple(members))
    return groups


def xla_cost(fn: Any, avals: list[Any], static: list[Any]) -> dict[str, float]:
    """XLA's cost analysis of ``fn`` at ``avals`` (its lowering's: nothing is compiled or
    run), {} where XLA gives none. On a TPU host the program lowers for the chip, whose
    client gives no cost analysis (the v5e at hand: none, so a 550 GFLOP reference went
    to the estimator whole and did not finish in 150 s): XLA's CPU client counts it."""
    import contextlib

    import jax

    def counted() -> dict[str, float]:
        found: Any = None
        with contextlib.suppress(Exception):
            found = (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(
                *avals, *static).cost_analysis()
        if isinstance(found, list | tuple):
            found = found[0] if found else {}
        return {k: float(v) for k, v in (found or {}).items()
                if isinstance(v, int | float) and v >= 0}

    cost = counted()
    if "flops" not in cost:
        with contextlib.suppress(Exception), jax.default_device(jax.devices("cpu")[0]):
            cost = counted()
    return cost


def _flops(fn: Any, avals: list[Any], static: list[Any]) -> float | None:
    """XLA's FLOP count of the program at ``avals`` (``xla_cost``); None where XLA gives
    none."""
    value = xla_cost(fn, avals, static).get("flops")
    return value if value is not None and value > 0 else None


FLOPS_HALF_TOLERANCE = 0.05  # a halved axis must halve XLA's FLOP count within this


def batch_axes(fn: Any, avals: list[Any], static: list[Any]) -> tuple[Axes, int] | None:
    """(axes, production size) of the reference's inputs whose halving halves its
    output and its work (a batch, the rows of a matmul, the queries of an attention):
    the largest such size, the fewest axes on a tie. ``fn(*avals, *static)`` is asked for
    its output shape (``jax.eval_shape``) and XLA's FLOP count (its lowering's cost
    analysis): nothing runs. An axis that is also contracted (a square matmul's shared
    size: halving it quarters the work while it halves the output) is not one: the cost
    per unit would not extrapolate. None when no axis does."""
    base = _out_elements(fn, avals, static)
    if not base:
        return None
    base_flops = _flops(fn, avals, static)
    found: list[tuple[int, int, Axes]] = []
    for axes in _axis_groups(avals):
        value = int(avals[axes[0][0]].shape[axes[0][1]])
        halved = with_axes(avals, axes, value // 2)
        half = _out_elements(fn, halved, static)
        if half is None or half * 2 != base:
            continue
        if base_flops:
            flops = _flops(fn, halved, static)
            if flops is None or abs(flops * 2 / base_flops - 1.0) > FLOPS_HALF_TOLERANCE:
                continue
        found.append((value, -len(axes), axes))
    if not found:
        return None
    value, _, axes = max(found, key=lambda item: (item[0], item[1]))
    return axes, value


def axes_name(axes: Axes, names: list[str] | None = None) -> str:
    """``x[0]`` / ``q[0], k[0], v[0]``: the axes in words (input names when known)."""
    def one(index: int, axis: int) -> str:
        name = names[index] if names and index < len(names) else f"input {index + 1}"
        return f"{name}[{axis}]" if names and index < len(names) else f"axis {axis} of {name}"

    return ", ".join(one(i, a) for i, a in axes)
