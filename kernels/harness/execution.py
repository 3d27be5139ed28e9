"""How code runs in this worker: the execution mode and what stays warm between requests.

- ``execution_mode(interpret)``: TPU interpret mode (``pltpu.force_tpu_interpret_mode``)
  off-TPU, nothing on a TPU; ``reset_interpret_state()`` after an exception there.
- ``task_runtime(spec)``: task runtimes cached per task (and reference file stamps), so
  a warm worker imports a reference once.
- ``jitted_reference(runtime, ...)``: one jitted reference per runtime and signature, so
  a warm worker compiles a reference once.
- ``rebound(closed, bind)``: a traced program evaluated equation by equation (nested
  jits inlined), each equation bound again by ``bind``: how a jaxpr runs with its
  kernels interpreted, or with each kernel in a jit named after it, and no candidate
  Python.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

_RUNTIMES: dict[str, Any] = {}  # task spec (+ file stamps) -> TaskRuntime
_RUNTIME_CACHE_SIZE = 8


def task_runtime(spec: dict[str, Any]) -> Any:
    from kernels.harness.runtime import load_runtime

    stamps = []
    for key in ("reference_path", "input_gen_path"):
        if spec.get(key):
            with contextlib.suppress(OSError):
                stamps.append(os.stat(spec[key]).st_mtime_ns)
    cache_key = json.dumps(spec, sort_keys=True, default=str) + repr(stamps)
    if cache_key not in _RUNTIMES:
        if len(_RUNTIMES) >= _RUNTIME_CACHE_SIZE:
            _RUNTIMES.pop(next(iter(_RUNTIMES)))
        _RUNTIMES[cache_key] = load_runtime(spec)
    return _RUNTIMES[cache_key]


def jitted_reference(runtime: Any, n_dynamic: int, n_static: int) -> Any:
    """One jitted reference per runtime and signature: a warm worker reuses its compile."""
    import jax

    cache = runtime.__dict__.setdefault("_tilewright_jitted", {})
    if (n_dynamic, n_static) not in cache:
        static_argnums = tuple(range(n_dynamic, n_dynamic + n_static)) or None
        cache[n_dynamic, n_static] = jax.jit(runtime.reference, static_argnums=static_argnums)
    return cache[n_dynamic, n_static]


@contextlib.contextmanager
def execution_mode(interpret: bool) -> Iterator[None]:
    if not interpret:
        yield
        return
    from jax.experimental.pallas import tpu as pltpu

    with pltpu.force_tpu_interpret_mode():
        yield


def reset_interpret_state() -> None:
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()


Bind = Callable[[Any, list[Any]], list[Any]]


def bind_as_traced(eqn: Any, invals: list[Any], params: dict[str, Any] | None = None
                   ) -> list[Any]:
    """``eqn``'s primitive bound to ``invals`` (with ``params``, else its own), under its
    context: a list of its outputs."""
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(
            eqn.params if params is None else params))
    return outs if eqn.primitive.multiple_results else [outs]


def rebound(closed: Any, bind: Bind = bind_as_traced) -> Callable[..., list[Any]]:
    """A function evaluating ``closed`` (a ClosedJaxpr) equation by equation, nested
    ``jit``s inlined (so effects are traced afresh), every other equation through
    ``bind(eqn, invals)``. Nothing else changes and no candidate Python runs."""
    from jax.extend.core import Literal

    def evaluate(jaxpr: Any, consts: Any, *args: Any) -> list[Any]:
        env: dict[Any, Any] = {}

        def read(var: Any) -> Any:
            return var.val if isinstance(var, Literal) else env[var]

        env.update(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            if eqn.primitive.name in ("pjit", "jit") and "jaxpr" in eqn.params:
                inner = eqn.params["jaxpr"]
                outs = evaluate(inner.jaxpr, inner.consts, *invals)
            else:
                outs = bind(eqn, invals)
            env.update(zip(eqn.outvars, outs, strict=True))
        return [read(v) for v in jaxpr.outvars]

    def run(*args: Any) -> list[Any]:
        return evaluate(closed.jaxpr, closed.consts, *args)

    return run
