"""The ``task_check`` op: do a task's inputs build, and does its reference run on them?

``tilewright new`` asks a worker this for the task it just wrote, at every shape
configuration (the production one included): the inputs are built and the reference
is traced under ``jax.eval_shape``, so a TPU-sized shape costs nothing, and a shape
given wrong (a weight whose size does not match the activations) is found before the
first evaluation, with the reference's line. Worker-side: imports JAX.
"""

from __future__ import annotations

import traceback
from typing import Any

from tilewright.kernels.worker.ops import op


@op("task_check")
def task_check(payload: dict[str, Any]) -> dict[str, Any]:
    """``{task}`` -> ``{configs: [{name, inputs: [[shape, dtype]], static, outputs:
    [[shape, dtype]], how}]}``, or ``{error: {message, file, line, config}}`` naming the
    configuration whose inputs or reference failed."""
    import jax

    from tilewright.kernels.tasks.task import TaskError
    from tilewright.kernels.worker.execution import task_runtime

    name = None
    try:
        runtime = task_runtime(payload["task"])
        configs = []
        for config in runtime.configs():
            name = config.name
            dyn, static, how = runtime.input_signature(config)
            try:
                out = jax.eval_shape(lambda *a, s=tuple(static): runtime.reference(*a, *s),
                                     *dyn)
            except Exception as exc:
                path = str(runtime.task.reference_path)
                frames = [f for f in traceback.extract_tb(exc.__traceback__)
                          if f.filename != __file__]
                line = next((f.lineno for f in reversed(frames) if f.filename == path), None)
                where = next((f"{f.filename}:{f.lineno}" for f in reversed(frames)
                              if "site-packages" not in f.filename), None)
                return {"error": {"message": f"the reference fails at shape {config.name}: "
                                             f"{type(exc).__name__}: {exc}",
                                  "file": path, "line": line, "where": where,
                                  "config": config.name}}
            leaves = jax.tree_util.tree_leaves(out)
            configs.append({
                "name": config.name, "held_out": config.held_out, "how": how,
                "inputs": [[list(a.shape), str(a.dtype)] for a in dyn],
                "static": [repr(v) for v in static],
                "outputs": [[list(a.shape), str(a.dtype)] for a in leaves],
            })
    except TaskError as exc:
        return {"error": {"message": str(exc), "file": exc.path, "line": exc.line,
                          "config": name}}
    except Exception as exc:  # the task's own code, whatever it raised
        return {"error": {"message": f"{type(exc).__name__}: {exc}", "file": None,
                          "line": None, "config": name}}
    return {"configs": configs}
