"""Integrity checks that keep a candidate honest.

- ``contains_pallas_call``: does the candidate's jaxpr hold a ``pallas_call`` at all
  (a task that requires Pallas rejects plain-XLA rewrites).
- ``ModuleSnapshot``: the harness runs the candidate in its own process, so it checks
  that the candidate did not patch the libraries the harness and the reference use
  (``numpy``, ``jax.numpy``, ...); a tampering candidate is rejected and the worker
  recycled.
- ``outputs_identical``: same inputs twice must give the same bits (``nondeterministic``).
- ``is_degenerate``: a reference output that is constant (zeros included) cannot tell a
  kernel that ignores its inputs from one that computes; flagged
  ``degenerate_reference`` (a property of the task and its inputs, the same every time).
- ``outside_compute``: non-trivial operations on full-size operands outside every
  ``pallas_call`` in the traced program: the XLA-computes-then-Pallas-copies trick;
  flagged ``compute_outside_kernel``.

- ``ModuleSnapshot.restore_config``: jax.config options a candidate changed are put back
  (flag ``jax_config_changed``) so they cannot leak into the next candidate.

Flags (strings in ``integrity.flags``): no_pallas_call, nondeterministic,
suspicious_speedup, degenerate_reference, compute_outside_kernel, harness_tampering,
background_threads, jax_config_changed. ``kernels.result.DISQUALIFYING_FLAGS`` lists the
ones that keep a correct kernel from being ranked "best".
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

SUSPICIOUS_SPEEDUP = 10.0

# Modules whose attributes the harness and references rely on.
GUARDED_MODULES = (
    "builtins", "numpy", "numpy.random", "jax", "jax.numpy", "jax.lax", "jax.random",
    "jax.experimental.pallas", "jax.experimental.pallas.tpu", "time", "math",
    "kernels.harness.evaluate", "kernels.harness.integrity", "kernels.harness.timing",
    "kernels.harness.compare", "kernels.harness.runtime", "kernels.harness.execution",
    "kernels.result",
)


def _sub_jaxprs(value: Any) -> list[Any]:
    """Jaxprs nested in an equation parameter (pjit, cond branches, scan, custom_vjp...)."""
    found = []
    items = value if isinstance(value, (list, tuple)) else [value]
    for item in items:
        inner = getattr(item, "jaxpr", None)
        if hasattr(item, "eqns"):
            found.append(item)
        elif inner is not None and hasattr(inner, "eqns"):
            found.append(inner)
    return found


def _pallas_eqns(jaxpr: Any) -> Iterator[Any]:
    """Every pallas_call (or core_map) equation in ``jaxpr`` and its nested jaxprs."""
    stack = [getattr(jaxpr, "jaxpr", jaxpr)]
    seen: set[int] = set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for eqn in current.eqns:
            if eqn.primitive.name in ("pallas_call", "core_map"):
                yield eqn
                continue
            for param in eqn.params.values():
                stack.extend(_sub_jaxprs(param))


def contains_pallas_call(jaxpr: Any) -> bool:
    """True when ``jaxpr`` (a Jaxpr or ClosedJaxpr) or any nested jaxpr calls Pallas."""
    return next(_pallas_eqns(jaxpr), None) is not None


def pallas_call_lines(jaxpr: Any, filename: str) -> list[int]:
    """Lines of ``filename`` where the jaxpr's pallas_calls were made (innermost frame):
    where to point when an interpreted kernel fails at run time without a traceback."""
    lines = []
    for eqn in _pallas_eqns(jaxpr):
        traceback = getattr(eqn.source_info, "traceback", None)
        frames = [f for f in getattr(traceback, "frames", []) if f.file_name == filename]
        if frames:
            lines.append(frames[0].line_num)
    return sorted(set(lines))


class ModuleSnapshot:
    """Identity of every attribute of the guarded modules, to detect monkeypatching."""

    def __init__(self) -> None:
        self.ids: dict[str, dict[str, int]] = {}
        for name in GUARDED_MODULES:
            module = sys.modules.get(name)
            if module is not None:
                self.ids[name] = {k: id(v) for k, v in vars(module).items()}
        self.threads = {t.ident for t in threading.enumerate()}
        self.config = _jax_config_values()

    def restore_config(self) -> tuple[list[str], bool]:
        """Put back any jax.config option the candidate changed (x64, matmul precision,
        ...), so it cannot leak into the next candidate. Returns (changed names, whether
        every one could be restored)."""
        import jax

        now = _jax_config_values()
        changed = sorted(k for k in self.config if now.get(k, self.config[k]) != self.config[k])
        restored = True
        for name in changed:
            try:
                jax.config.update(name, self.config[name])
            except Exception:
                restored = False
        return changed, restored

    def changed(self) -> list[str]:
        """``module.attr`` names that were replaced or deleted since the snapshot.

        New attributes are ignored: jax and numpy add submodules lazily.
        """
        changes = []
        for name, before in self.ids.items():
            module = sys.modules.get(name)
            now = vars(module) if module is not None else {}
            for attr, ident in before.items():
                if attr not in now or id(now[attr]) != ident:
                    changes.append(f"{name}.{attr}")
        return changes

    def new_threads(self) -> list[str]:
        return [t.name for t in threading.enumerate()
                if t.ident not in self.threads and t.is_alive()]


def _jax_config_values() -> dict[str, Any]:
    config = getattr(sys.modules.get("jax"), "config", None)
    values = getattr(config, "values", None)
    return dict(values) if isinstance(values, dict) else {}


def outputs_identical(first: list[np.ndarray], second: list[np.ndarray]) -> bool:
    if len(first) != len(second):
        return False
    return all(a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
               for a, b in zip(first, second, strict=True))


def is_degenerate(reference: list[np.ndarray], atol: float | None = None) -> bool:
    """Every reference leaf constant (all zeros included), or empty: a kernel that
    returns that constant passes whatever the inputs. (``atol`` is accepted for old
    callers; the loose-tolerance case is handled by the comparison's scale rules.)"""
    for r in reference:
        finite = r[np.isfinite(r)]
        if finite.size == 1 or (finite.size and float(finite.max()) != float(finite.min())):
            return False  # a single value (a loss, a norm) varies across trials instead
    return True


# Primitives that only move, reshape or convert data: free to appear outside a kernel.
MOVEMENT = {
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice",
    "dynamic_slice", "dynamic_update_slice", "concatenate", "pad", "copy", "copy_p",
    "iota", "rev", "gather", "convert_element_type", "bitcast_convert_type",
    "reduce_precision", "stop_gradient", "split", "device_put", "select_n",
    "optimization_barrier", "sharding_constraint", "mesh_cast", "pvary",
}
FULL_SIZE_SHARE = 0.25  # an operand this share of the largest input/output is "full size"


def outside_compute(jaxpr: Any, filename: str) -> list[str]:
    """Non-trivial equations on full-size operands outside every pallas_call.

    "Full size": an operand or result with at least FULL_SIZE_SHARE of the elements of
    the program's largest input or output. Data movement (reshape, transpose, pad,
    casts, gathers) is allowed; arithmetic, reductions, dots and convolutions are not.
    Returns a description per offending equation (primitive, shapes, candidate line).
    """
    closed = getattr(jaxpr, "jaxpr", jaxpr)
    sizes = [_numel(v.aval) for v in (*closed.invars, *closed.outvars) if hasattr(v, "aval")]
    threshold = FULL_SIZE_SHARE * max(sizes, default=0)
    found: list[str] = []
    stack = [closed]
    seen: set[int] = set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for eqn in current.eqns:
            name = eqn.primitive.name
            if name in ("pallas_call", "core_map"):
                continue
            nested = [j for p in eqn.params.values() for j in _sub_jaxprs(p)]
            if nested:  # pjit, cond, scan, custom_jvp...: look inside, not at the wrapper
                stack.extend(nested)
                continue
            if name in MOVEMENT:
                continue
            avals = [v.aval for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval")]
            biggest = max((_numel(a) for a in avals), default=0)
            if threshold <= 0 or biggest < threshold:
                continue
            shapes = " ".join(_aval_text(v.aval) for v in eqn.invars if hasattr(v, "aval"))
            found.append(f"{name}({shapes}){_line_of(eqn, filename)}")
    return found


def _numel(aval: Any) -> int:
    shape = getattr(aval, "shape", ())
    return int(np.prod(shape)) if shape else 1


def _aval_text(aval: Any) -> str:
    dtype = getattr(aval, "dtype", "")
    return f"{dtype}{list(getattr(aval, 'shape', ()))}"


def _line_of(eqn: Any, filename: str) -> str:
    traceback = getattr(eqn.source_info, "traceback", None)
    frames = [f for f in getattr(traceback, "frames", []) if f.file_name == filename]
    return f" at line {frames[0].line_num}" if frames else ""
