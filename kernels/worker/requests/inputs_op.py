"""The ``inputs`` op: does a task's input generation run, and what does it build?

``tilewright tasks`` asks a worker this for every task it lists, so a task whose
inputs cannot be generated (MaxKernel code that needs names it never imports, a
``--set`` that breaks a shape) shows up as broken in the listing, with the task
file's line, instead of failing at the first evaluation. The builder runs under
``jax.eval_shape`` where it can, so TPU-sized tasks are checked at no cost.
Worker-side: imports JAX.
"""

from __future__ import annotations

from typing import Any

from tilewright.kernels.worker.ops import op


@op("inputs")
def input_shapes(payload: dict[str, Any]) -> dict[str, Any]:
    """``{task}`` -> ``{configs: [{name, inputs: [[shape, dtype]], outputs, static,
    how}]}`` (``outputs``: the reference's, from its shapes alone; None when it cannot
    tell) or ``{error: {message, file, line}}`` when the task's own code fails."""
    from tilewright.kernels.tasks.task import TaskError
    from tilewright.kernels.worker.execution import task_runtime

    try:
        runtime = task_runtime(payload["task"])
        configs = []
        for config in runtime.configs():
            dyn, static, how = runtime.input_signature(config)
            try:
                outputs = _outputs(runtime, dyn, static)
            except Exception as exc:  # the reference fails: the task's own code
                return {"error": _reference_error(runtime, config.name, exc)}
            configs.append({
                "name": config.name, "held_out": config.held_out, "how": how,
                "inputs": [[list(a.shape), str(a.dtype)] for a in dyn],
                "outputs": outputs, "static": [repr(v) for v in static],
            })
    except TaskError as exc:
        return {"error": {"message": str(exc), "file": exc.path, "line": exc.line}}
    except Exception as exc:  # the task's code, whatever it raised
        return {"error": {"message": f"{type(exc).__name__}: {exc}", "file": None,
                          "line": None}}
    return {"configs": configs}


def _outputs(runtime: Any, dyn: list[Any], static: list[Any]) -> list[list[Any]]:
    """The reference's output arrays ([[shape, dtype], ...]) for these inputs, asked of
    ``jax.eval_shape`` (nothing runs). Raises what the reference raises."""
    import jax

    out = jax.eval_shape(lambda *a: runtime.reference(*a, *static), *dyn)
    return [[list(leaf.shape), str(leaf.dtype)] for leaf in jax.tree.leaves(out)]


def _reference_error(runtime: Any, config: str, exc: BaseException) -> dict[str, Any]:
    """A reference that fails, placed in the task's file (the line of its own code the
    failure went through)."""
    import traceback

    path = str(runtime.task.reference_path)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    line = next((f.lineno for f in reversed(frames) if f.filename == path), None)
    where = next((f"{f.filename}:{f.lineno}" for f in reversed(frames)
                  if "site-packages" not in f.filename), None)
    return {"message": f"the reference fails at shape {config}: {type(exc).__name__}: {exc}",
            "file": path, "line": line, "where": where, "config": config}
