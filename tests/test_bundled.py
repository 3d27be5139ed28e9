"""Every bundled task's starting kernel is correct and lowers for TPU.

Checked directly with JAX (not through the worker harness): each small shape
configuration, the held-out one included, runs in TPU interpret mode against the
reference with two fresh keys, compared in float32 at the task's tolerances. Each
of them, and each TPU-sized configuration (from shapes alone), also lowers for TPU
(Mosaic), which catches (8, 128) alignment mistakes that interpret mode accepts. The largest tunable choices are checked too, so the kernels' clamping to
small arrays is exercised.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

from tilewright.kernels.source import tunables  # noqa: E402
from tilewright.kernels.tasks.loaders import bundled_tasks  # noqa: E402
from tilewright.kernels.tasks.task import ShapeConfig, Task  # noqa: E402
from tilewright.kernels.worker.execution import compile_lowered  # noqa: E402

TASKS = {t.name: t for t in bundled_tasks()}
EXPECTED = {"gelu", "softmax", "rmsnorm", "matmul_bias_gelu", "causal_attention"}
_ids = itertools.count()


def _module(path: Path, source: str | None = None):
    name = f"bundled_{path.parent.name}_{path.stem}_{next(_ids)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if source is None:
        spec.loader.exec_module(module)
    else:
        exec(compile(source, str(path), "exec"), module.__dict__)
    return module


def _small_cases() -> list[tuple[str, str]]:
    return [(t.name, s.name) for t in TASKS.values() for s in t.shapes_for("cpu")]


def _check_close(task: Task, shape: ShapeConfig, out, ref) -> None:
    atol = shape.atol if shape.atol is not None else task.atol
    rtol = shape.rtol if shape.rtol is not None else task.rtol
    out = np.asarray(out, dtype=np.float32)
    ref = np.asarray(ref, dtype=np.float32)
    assert out.shape == ref.shape
    assert np.all(np.isfinite(out)), "kernel output has NaN/inf"
    err = np.abs(out - ref)
    bad = err > atol + rtol * np.abs(ref)
    assert not bad.any(), (f"{bad.sum()} elements off; max abs diff {err.max():.3g} "
                           f"(atol {atol}, rtol {rtol})")


def _run_interpret(fn, inputs):
    try:  # compiled as the harness compiles interpreted programs
        with pltpu.force_tpu_interpret_mode():
            compiled = compile_lowered(jax.jit(fn).lower(*inputs), interpret=True)
            return jax.block_until_ready(compiled(*inputs))
    except Exception:
        pltpu.reset_tpu_interpret_mode_state()
        raise


def test_the_five_bundled_tasks_load_with_small_large_and_held_out_shapes() -> None:
    assert set(TASKS) == EXPECTED
    for task in TASKS.values():
        sizes = {s.size for s in task.shapes}
        held = [s for s in task.shapes if s.held_out]
        assert sizes == {"small", "large"}, task.name
        assert len(held) == 1 and held[0].size == "small", task.name
        assert task.kernel_path is not None and task.family and task.description
        assert held[0] not in task.visible_shapes()


@pytest.mark.slow
@pytest.mark.parametrize(("task_name", "shape_name"), _small_cases())
def test_starting_kernel_matches_reference_in_tpu_interpret_mode(task_name: str,
                                                                shape_name: str) -> None:
    task = TASKS[task_name]
    shape = next(s for s in task.shapes if s.name == shape_name)
    ref_mod = _module(task.reference_path)
    kernel = _module(task.kernel_path).kernel
    for seed in (11, 12):  # fresh keys: a kernel cannot pass by caching one answer
        inputs = ref_mod.make_inputs(jax.random.key(seed), **shape.params)
        assert all(x.dtype == jnp.float32 for x in inputs)
        expected = jax.jit(ref_mod.reference)(*inputs)
        # A reference that is ~0 everywhere would let a zero-returning kernel pass.
        assert float(jnp.max(jnp.abs(expected))) > 10 * task.atol
        _check_close(task, shape, _run_interpret(kernel, inputs), expected)


@pytest.mark.parametrize("task_name", sorted(EXPECTED))
def test_starting_kernel_lowers_for_tpu_on_every_small_shape(task_name: str) -> None:
    task = TASKS[task_name]
    ref_mod = _module(task.reference_path)
    kernel = _module(task.kernel_path).kernel
    for shape in task.shapes_for("cpu"):
        inputs = ref_mod.make_inputs(jax.random.key(0), **shape.params)
        lowered = jax.jit(kernel).trace(*inputs).lower(lowering_platforms=("tpu",))
        assert "tpu_custom_call" in lowered.as_text(), "no Mosaic kernel in the lowering"


@pytest.mark.parametrize("task_name", sorted(EXPECTED))
def test_starting_kernel_lowers_for_tpu_on_the_large_shapes(task_name: str) -> None:
    # Shapes only (eval_shape): TPU-sized inputs are never allocated on this host.
    task = TASKS[task_name]
    ref_mod = _module(task.reference_path)
    kernel = _module(task.kernel_path).kernel
    large = [s for s in task.shapes if s.size == "large"]
    assert large
    for shape in large:
        specs = jax.eval_shape(lambda key, p=shape.params: ref_mod.make_inputs(key, **p),
                               jax.random.key(0))
        lowered = jax.jit(kernel).trace(*specs).lower(lowering_platforms=("tpu",))
        assert "tpu_custom_call" in lowered.as_text()


@pytest.mark.parametrize("task_name", sorted(EXPECTED))
def test_tunables_are_declared_and_the_largest_choices_stay_correct(task_name: str) -> None:
    task = TASKS[task_name]
    source = task.kernel_path.read_text()
    declared = tunables.read(source)
    assert declared, "starting kernel declares no TUNABLES"
    for name, (current, choices) in declared.items():
        assert current in choices, f"{name}={current} is not one of its choices"
    largest = tunables.apply(source, {n: max(c) for n, (_, c) in declared.items()})
    kernel = _module(task.kernel_path, largest).kernel
    ref_mod = _module(task.reference_path)
    shape = next(s for s in task.shapes_for("cpu") if not s.held_out)
    inputs = ref_mod.make_inputs(jax.random.key(3), **shape.params)
    jax.jit(kernel).trace(*inputs).lower(lowering_platforms=("tpu",))
    _check_close(task, shape, _run_interpret(kernel, inputs), ref_mod.reference(*inputs))


@pytest.mark.parametrize("task_name", ["matmul_bias_gelu", "causal_attention"])
def test_every_value_of_a_switch_stays_correct(task_name: str) -> None:
    """F32_PASSES=3 (each float32 operand split into two bf16 parts, three MXU products)
    is written out in the kernel: interpret mode computes what the chip does, within the
    task's float32 tolerances (on the v5e at the production shape too, 2026-12-07)."""
    task = TASKS[task_name]
    source = task.kernel_path.read_text()
    switches = tunables.switches(source)
    assert switches == ("F32_PASSES",)
    ref_mod = _module(task.reference_path)
    shape = next(s for s in task.shapes_for("cpu") if not s.held_out)
    inputs = ref_mod.make_inputs(jax.random.key(5), **shape.params)
    for value in tunables.read(source)["F32_PASSES"][1]:
        kernel = _module(task.kernel_path, tunables.apply(source, {"F32_PASSES": value})).kernel
        jax.jit(kernel).trace(*inputs).lower(lowering_platforms=("tpu",))
        _check_close(task, shape, _run_interpret(kernel, inputs), ref_mod.reference(*inputs))
