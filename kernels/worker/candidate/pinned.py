"""Kernels with loops of run-time length (a grouped matmul's per-group tile counts, read
from a scalar-prefetch operand), pinned for the estimator: the bookkeeping that
computes their bounds runs on this host from the production inputs' known values, and
each such kernel is exported alone with its bounds as constants (``pinned_programs``),
at its real counts or, when one long count decides them, at shorter ones scaled back
as shortened grids are (``kernels.worker.candidate.production``).

Worker-side (imports JAX); runs in the confined candidate process.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tilewright.kernels.worker.candidate.production import (
    SHORT_NAME,
    KernelPlan,
    pallas_eqns,
    sub_jaxprs,
)

PIN_MAX_ELEMENTS = 1 << 16  # integer inputs up to this size are bookkeeping (group sizes)


def _bind_here(eqn: Any, invals: list[Any]) -> Any:
    """Run one bookkeeping equation on this host: in the context it was traced in, else
    (jax 0.12 refuses to run under the abstract TPU mesh a trace off a TPU carries)
    without it; a small integer op means the same either way."""
    try:
        with eqn.ctx.manager:
            return eqn.primitive.bind(*invals, **eqn.params)
    except ValueError as exc:
        if "AbstractMesh" not in str(exc):
            raise
        return eqn.primitive.bind(*invals, **eqn.params)


def kernel_operands(closed: Any, known: dict[int, Any]) -> dict[int, list[Any]]:
    """Per pallas_call (program order), the values of its operands that follow from the
    inputs ``known`` (input index -> array; the others unknown): the program is
    evaluated equation by equation, an equation with an unknown input gives unknown
    outputs (None), so only the bookkeeping that reads the known inputs (small integer
    arrays: group sizes) runs, never the kernels or the big arrays' work."""
    import numpy as np
    from jax.extend.core import Literal

    from tilewright.kernels.worker.execution import _FORWARD

    found: dict[int, list[Any]] = {}
    counter = [0]

    def evaluate(jaxpr: Any, consts: Any, args: list[Any]) -> list[Any]:
        env: dict[Any, Any] = {}

        def read(var: Any) -> Any:
            return var.val if isinstance(var, Literal) else env.get(var)

        env.update(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            name = eqn.primitive.name
            outs: list[Any] = [None] * len(eqn.outvars)
            if name == "pallas_call":
                found[counter[0]] = [None if v is None else np.asarray(v) for v in invals]
                counter[0] += 1
            elif name in ("pjit", "jit", "closed_call", "core_call") or name in _FORWARD:
                key = _FORWARD.get(name, "jaxpr" if "jaxpr" in eqn.params else "call_jaxpr")
                inner = eqn.params.get(key)
                if inner is not None:
                    outs = evaluate(getattr(inner, "jaxpr", inner),
                                    getattr(inner, "consts", ()), invals)
            elif all(v is not None for v in invals) and not sub_jaxprs(eqn.params) \
                    and all(_elements(v.aval) <= PIN_MAX_ELEMENTS for v in eqn.outvars):
                # bookkeeping-sized only: a constant broadcast to a big array is not made
                try:
                    got = _bind_here(eqn, invals)
                    outs = list(got) if eqn.primitive.multiple_results else [got]
                except Exception:  # an op that cannot run here: its outputs unknown
                    pass
            else:  # control flow, or unknown inputs: kernels inside are counted, not run
                for _, sub in sub_jaxprs(eqn.params):
                    for one in sub if isinstance(sub, tuple) else (sub,):
                        counter[0] += len(pallas_eqns(getattr(one, "jaxpr", one)))
            env.update(zip(eqn.outvars, outs, strict=True))
        return [read(v) for v in jaxpr.outvars]

    args = [known.get(i) for i in range(len(closed.jaxpr.invars))]
    evaluate(closed.jaxpr, closed.consts, args)
    return found


def _elements(aval: Any) -> int:
    shape = getattr(aval, "shape", None)
    if shape is None:
        return PIN_MAX_ELEMENTS + 1  # not an array (a token, a ref): not evaluated
    return int(math.prod(int(d) for d in shape))


def pinned_body(body: Any, values: list[Any], short: int | None = None
                ) -> tuple[Any, list[str]]:
    """The kernel body with every top-level read of a known SMEM operand at a static
    index replaced by its value (a loop bound, a tile count): the loops that read them
    get trip counts the estimator can see. With ``short``, the one read pinned is given
    that value instead (a shorter loop, as a shortened grid). Returns (body, what was
    pinned)."""
    import numpy as np
    from jax.extend.core import Literal

    refs = {var: values[i] for i, var in enumerate(body.invars[:len(values)])
            if values[i] is not None and np.size(values[i]) <= PIN_MAX_ELEMENTS}
    subs: dict[Any, Any] = {}
    pinned: list[str] = []
    eqns = []
    for eqn in body.eqns:
        if eqn.primitive.name == "get" and eqn.invars and eqn.invars[0] in refs \
                and all(isinstance(v, Literal) for v in eqn.invars[1:]):
            value = _static_read(refs[eqn.invars[0]], eqn)
            if value is not None and short is not None:
                value = np.full_like(np.asarray(value), short)
            if value is not None:
                out = eqn.outvars[0]
                subs[out] = Literal(np.asarray(value, out.aval.dtype), out.aval)
                pinned.append(f"{value.tolist() if hasattr(value, 'tolist') else value}")
                continue
        if subs:
            eqn = eqn.replace(invars=[subs.get(v, v) if not isinstance(v, Literal) else v
                                      for v in eqn.invars])
        eqns.append(eqn)
    if subs:
        body = body.replace(eqns=eqns, outvars=[subs.get(v, v) if not isinstance(v, Literal)
                                                else v for v in body.outvars])
    return body, pinned


def _static_read(value: Any, eqn: Any) -> Any:
    """What a ``get`` without dynamic indices reads from ``value``: the whole of a
    one-element ref, else the element its integer indexer names (None: not static)."""
    import numpy as np
    from jax import tree_util
    from jax.extend.core import Literal

    array = np.asarray(value)
    aval = eqn.outvars[0].aval
    try:  # the index operands are literals here (checked by the caller)
        transforms = tree_util.tree_unflatten(eqn.params["tree"],
                                              [v.val for v in eqn.invars[1:]])
    except Exception:
        return None
    index: list[int] = []
    for transform in transforms or ():
        for i in getattr(transform, "indices", ()):
            start = getattr(i, "start", i)
            start = start.val if isinstance(start, Literal) else start
            if getattr(i, "size", 1) != 1 or not isinstance(start, int | np.integer):
                return None
            index.append(int(start))
    if not index and array.size == 1 and getattr(aval, "size", 1) == 1:
        return array.reshape(aval.shape)
    if len(index) != array.ndim or getattr(aval, "shape", None) not in ((), (1,) * len(index)):
        return None
    return array[tuple(index)].reshape(aval.shape)


def pin_shortened(count: int) -> tuple[int, ...] | None:
    """The shorter counts a long pinned loop is estimated at, in order (then scaled from
    the two longest the estimator could price, as a shortened grid is): 1 and 2 (a count
    of tiles whose each step is a long loop: the estimator's memory bounds it), and an
    eighth and a quarter of it, at most 32 and 64 (single steps: past the pipeline's
    first ones); None: estimated as it is."""
    if count <= 2:
        return None
    u2 = min(max(2, count // 4), 64)
    return tuple(sorted({1, 2, max(1, u2 // 2), u2} - {count}))


def pinned_programs(closed: Any, plans: list[KernelPlan], known: dict[int, Any]
                    ) -> dict[str, tuple[Any, list[Any], list[str]]]:
    """For each kernel with loops of run-time length whose bounds follow from the
    production inputs' known values: programs of that kernel alone, its operands as the
    program's inputs (the XLA bookkeeping around it, which the estimator may not price,
    stays out), by name: ``pinned<index>`` with the bounds as the inputs make them, or,
    when one count decides them and it is long (``pin_shortened``: the estimator's
    memory grows with the loop, a grouped matmul's 896 steps need more than 4 GB),
    ``pinned<index>_<u>`` at each shorter count ``u``, scaled to the real one as
    shortened grids are. Each with (program, avals, what was pinned: the real values)."""
    import jax
    from jax.extend.core import ClosedJaxpr

    looped = {p.index for p in plans if p.run_time_loops}
    if not looped:
        return {}
    values = kernel_operands(closed, known)
    out = {}
    for index, eqn in enumerate(pallas_eqns(closed.jaxpr)):
        if index not in looped or index not in values:
            continue
        body = eqn.params["jaxpr"]
        inner = getattr(body, "jaxpr", body)
        new, pinned = pinned_body(inner, values[index])
        if not pinned:
            continue
        bodies = {f"pinned{index}": new}
        count = _single_count(pinned)
        shorter = pin_shortened(count) if count is not None else None
        if shorter is not None:
            bodies = {f"pinned{index}_{u}": pinned_body(inner, values[index], u)[0]
                      for u in shorter}
        avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
        for key, one in bodies.items():
            new_body = ClosedJaxpr(one, body.consts) if isinstance(body, ClosedJaxpr) \
                else one
            params = {**eqn.params, "jaxpr": new_body, "name": SHORT_NAME.format(index)}

            def alone(*ops: Any, _eqn: Any = eqn, _params: dict[str, Any] = params) -> Any:
                with _eqn.ctx.manager:
                    return _eqn.primitive.bind(*ops, **_params)

            out[key] = (jax.make_jaxpr(alone)(*avals), avals, pinned)
    return out


def _single_count(pinned: list[str]) -> int | None:
    """The count when exactly one scalar was pinned (a loop's length or tile count)."""
    if len(pinned) != 1:
        return None
    try:
        value = json.loads(pinned[0])
    except ValueError:
        return None
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, int) else None
