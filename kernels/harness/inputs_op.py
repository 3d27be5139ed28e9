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

from kernels.harness.ops import op


@op("inputs")
def input_shapes(payload: dict[str, Any]) -> dict[str, Any]:
    """``{task}`` -> ``{configs: [{name, inputs: [[shape, dtype]], static, how}]}`` or
    ``{error: {message, file, line}}`` when the task's own code fails."""
    from kernels.harness.execution import task_runtime
    from kernels.task import TaskError

    try:
        runtime = task_runtime(payload["task"])
        configs = []
        for config in runtime.configs():
            dyn, static, how = runtime.input_signature(config)
            configs.append({
                "name": config.name, "held_out": config.held_out, "how": how,
                "inputs": [[list(a.shape), str(a.dtype)] for a in dyn],
                "static": [repr(v) for v in static],
            })
    except TaskError as exc:
        return {"error": {"message": str(exc), "file": exc.path, "line": exc.line}}
    except Exception as exc:  # the task's code, whatever it raised
        return {"error": {"message": f"{type(exc).__name__}: {exc}", "file": None,
                          "line": None}}
    return {"configs": configs}
