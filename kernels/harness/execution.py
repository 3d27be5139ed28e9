"""How code runs in this worker: the execution mode and what stays warm between requests.

- ``execution_mode(interpret)``: TPU interpret mode (``pltpu.force_tpu_interpret_mode``)
  off-TPU, nothing on a TPU; ``reset_interpret_state()`` after an exception there.
- ``task_runtime(spec)``: task runtimes cached per task (and reference file stamps), so
  a warm worker imports a reference once.
- ``jitted_reference(runtime, ...)``: one jitted reference per runtime and signature, so
  a warm worker compiles a reference once.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
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
