"""Jaxpr walking for the static analysis (worker-side: imports jax lazily).

Two jobs: evaluate a BlockSpec's index map over every grid step at once (a small
numpy interpreter for the integer arithmetic index maps use, falling back to
``jax.vmap`` for anything else), and count the work in a kernel body (dots with
their M/K/N, elementwise ops, transcendentals), following cond, scan, while and
nested calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

TRANSCENDENTAL = {"exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "erf", "erf_inv",
                  "erfc", "sqrt", "rsqrt", "cbrt", "pow", "sin", "cos", "tan", "atan2"}
ELEMENTWISE = {"add", "sub", "mul", "div", "max", "min", "neg", "abs", "select_n", "integer_pow",
               "square", "sign", "floor", "ceil", "round", "rem", "clamp", "reduce_sum",
               "reduce_max", "reduce_min", "cumsum", "cummax", "add_any", "exp", "exp2", "log",
               "log1p", "expm1", "tanh", "logistic", "erf", "erfc", "sqrt", "rsqrt", "pow", "sin",
               "cos", "tan", "reciprocal"}


class _Unknown(Exception):
    """The index map needs something we cannot evaluate statically."""


def _np_div(a: Any, b: Any) -> Any:
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    if np.issubdtype(np.result_type(a, b), np.integer):  # lax.div truncates toward zero
        q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
        return np.where((a < 0) ^ (b < 0), -q, q)
    return a / b


def _np_table() -> dict[str, Callable[..., Any]]:
    import numpy as np

    return {
        "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _np_div,
        "rem": np.fmod, "max": np.maximum, "min": np.minimum, "neg": np.negative,
        "abs": np.abs, "sign": np.sign, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
        "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "and": np.bitwise_and,
        "or": np.bitwise_or, "not": np.invert, "xor": np.bitwise_xor,
        "shift_left": np.left_shift, "shift_right_arithmetic": np.right_shift,
        "clamp": lambda lo, x, hi: np.clip(x, lo, hi),
        "select_n": lambda which, *cases: np.choose(np.asarray(which).astype(np.int64), cases),
    }


def evaluate_index_map(closed: Any, grid_indices: list[Any], num_prefetch: int,
                       prefetch: list[Any] | None = None) -> list[Any] | None:
    """Block indices for every grid step (arrays aligned with ``grid_indices``), or None.

    None means the map reads scalar-prefetch values that are not known here (``prefetch``
    holds them when the analysis was given concrete inputs).
    """
    try:
        return _eval_numpy(closed.jaxpr, closed.consts, grid_indices)
    except _Unknown:
        pass
    if num_prefetch:
        if prefetch is None:
            return None
        return _eval_with_prefetch(closed, grid_indices, prefetch)
    return _eval_jax(closed, grid_indices)


def _eval_with_prefetch(closed: Any, grid_indices: list[Any], prefetch: list[Any]) -> list[Any]:
    """vmap the index map over the grid with the scalar-prefetch refs bound to values."""
    import jax
    import numpy as np
    from jax._src.state import discharge as state_discharge
    from jax.extend import core as jcore

    pure = state_discharge.discharge_state(closed)  # refs in, values (and refs) out
    n_out = len(closed.jaxpr.outvars)
    fn = jax.vmap(lambda *a: jcore.jaxpr_as_fun(pure)(*a)[:n_out],
                  in_axes=(0,) * len(grid_indices) + (None,) * len(prefetch))
    with jax.default_device(jax.devices("cpu")[0]):
        outs = jax.jit(fn)(*[np.asarray(g) for g in grid_indices],
                           *[np.asarray(p) for p in prefetch])
    return [np.asarray(o) for o in outs]


def prefetch_values(closed: Any, args: list[Any]) -> dict[int, list[Any]]:
    """Concrete scalar-prefetch operands of the pallas_calls in ``closed``, by ``id(eqn)``.

    Evaluates the program around the kernels with these inputs (kernels themselves are not
    run: their outputs are zeros, and values derived from them are not trusted).
    """
    found: dict[int, list[Any]] = {}
    _eval_prefetch(closed.jaxpr, list(closed.consts), list(args), [False] * len(args), found)
    return found


def _eval_prefetch(jaxpr: Any, consts: list[Any], args: list[Any], tainted: list[bool],
                   found: dict[int, list[Any]]) -> tuple[list[Any], list[bool]]:
    import numpy as np
    from jax.extend import core as jcore

    env: dict[Any, Any] = {}
    dirty: set[Any] = set()
    for var, val in zip(jaxpr.constvars, consts, strict=False):
        env[var] = val
    for var, val, bad in zip(jaxpr.invars, args, tainted, strict=False):
        env[var] = val
        if bad:
            dirty.add(var)

    def read(atom: Any) -> Any:
        return atom.val if isinstance(atom, jcore.Literal) else env[atom]

    def is_dirty(atom: Any) -> bool:
        return not isinstance(atom, jcore.Literal) and atom in dirty

    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        bad_in = [is_dirty(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name == "pallas_call":
            n = eqn.params["grid_mapping"].num_index_operands
            if n and not any(bad_in[:n]):
                found[id(eqn)] = [np.asarray(x) for x in ins[:n]]
            outs = [np.zeros(a.shape, a.dtype) for a in eqn.params["out_avals"]]
            bad_out = [True] * len(outs)
        elif name in ("pjit", "jit", "closed_call", "core_call"):
            sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            outs, bad_out = _eval_prefetch(sub.jaxpr, list(sub.consts), ins, bad_in, found)
        else:
            with eqn.ctx.manager:  # as jax.core.eval_jaxpr binds an equation
                outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
            if not eqn.primitive.multiple_results:
                outs = [outs]
            bad_out = [any(bad_in)] * len(outs)
        for var, val, bad in zip(eqn.outvars, outs, bad_out, strict=False):
            env[var] = val
            if bad:
                dirty.add(var)
    return [read(v) for v in jaxpr.outvars], [is_dirty(v) for v in jaxpr.outvars]


def _eval_numpy(jaxpr: Any, consts: list[Any], args: list[Any]) -> list[Any]:
    import numpy as np
    from jax.extend import core as jcore

    table = _np_table()
    env: dict[Any, Any] = {}
    for var, val in zip(jaxpr.constvars, consts, strict=False):
        env[var] = np.asarray(val)
    for var, val in zip(jaxpr.invars, args, strict=False):
        env[var] = val  # prefetch refs beyond the grid args stay unbound

    def read(atom: Any) -> Any:
        if isinstance(atom, jcore.Literal):
            return np.asarray(atom.val)
        if atom not in env:
            raise _Unknown(str(atom))
        return env[atom]

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [read(v) for v in eqn.invars]
        if name in table:
            outs = [table[name](*ins)]
        elif name == "convert_element_type":
            outs = [np.asarray(ins[0]).astype(np.dtype(eqn.params["new_dtype"]))]
        elif name == "integer_pow":
            outs = [np.power(ins[0], eqn.params["y"])]
        elif name in ("pjit", "jit", "closed_call", "core_call"):
            sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            sub_jaxpr = getattr(sub, "jaxpr", sub)
            outs = _eval_numpy(sub_jaxpr, getattr(sub, "consts", []), ins)
        else:
            raise _Unknown(name)
        for var, val in zip(eqn.outvars, outs, strict=False):
            env[var] = val
    return [read(v) for v in jaxpr.outvars]


def _eval_jax(closed: Any, grid_indices: list[Any]) -> list[Any]:
    import jax
    import numpy as np
    from jax.extend import core as jcore

    fn = jax.vmap(jcore.jaxpr_as_fun(closed))
    with jax.default_device(jax.devices("cpu")[0]):
        outs = jax.jit(fn)(*[np.asarray(g) for g in grid_indices])
    return [np.asarray(o) for o in outs]


def count_kernel_work(jaxpr: Any, grid: list[int | None] | None = None) -> dict[str, Any]:
    """Dots (with M, K, N), dot flops, elementwise flops and transcendentals of one grid
    step, averaged over the grid.

    With a static ``grid``, a ``cond`` (``pl.when``) whose predicate is computed from
    ``program_id``/``num_programs`` is evaluated for every grid step, and each branch is
    counted on the steps where it runs: a dot written in two exclusive ``pl.when``
    branches (``k == 0`` and ``k > 0``) counts once per step, not twice. A predicate that
    reads run-time data counts its costliest branch on every step (an upper bound, noted).
    """
    acc: dict[str, Any] = {"dot_flops": 0.0, "elementwise_flops": 0.0, "transcendentals": 0.0,
                           "dots": [], "notes": [], "scoped_avals": []}
    steps = _StepIndex.of(grid)
    _walk_work(jaxpr, 1.0, acc, steps, steps.all() if steps else None, {})
    return acc


def _size(aval: Any) -> int:
    return math.prod(int(d) for d in getattr(aval, "shape", ()))


class _StepIndex:
    """The grid indices of every step, in iteration order (last axis innermost)."""

    def __init__(self, grid: list[int]) -> None:
        import numpy as np

        self.grid = grid
        self.count = math.prod(grid)
        mesh = np.meshgrid(*[np.arange(g) for g in grid], indexing="ij")
        self.indices = [m.reshape(-1) for m in mesh]

    @classmethod
    def of(cls, grid: list[int | None] | None) -> _StepIndex | None:
        if not grid or any(not isinstance(g, int) or g <= 0 for g in grid):
            return None
        if math.prod(g for g in grid if g) > 1 << 22:  # too many steps to enumerate
            return None
        return cls([int(g) for g in grid if g is not None])

    def all(self) -> Any:
        import numpy as np

        return np.ones(self.count, dtype=bool)


def _step_value(eqn: Any, env: dict[Any, Any], steps: _StepIndex) -> list[Any] | None:
    """The outputs of a scalar equation for every grid step, when they follow from
    program ids, grid sizes and literals alone; None otherwise."""
    import numpy as np
    from jax.extend import core as jcore

    name = eqn.primitive.name
    if name == "program_id":
        axis = int(eqn.params["axis"])
        return [steps.indices[axis]] if axis < len(steps.indices) else None
    if name == "num_programs":
        axis = int(eqn.params["axis"])
        return [np.full(steps.count, steps.grid[axis])] if axis < len(steps.grid) else None
    ins = []
    for atom in eqn.invars:
        if isinstance(atom, jcore.Literal):
            ins.append(np.asarray(atom.val))
        elif atom in env:
            ins.append(env[atom])
        else:
            return None
    table = _np_table()
    if name in table:
        return [table[name](*ins)]
    if name == "convert_element_type":
        return [np.asarray(ins[0]).astype(np.dtype(eqn.params["new_dtype"]))]
    if name == "integer_pow":
        return [np.power(ins[0], eqn.params["y"])]
    return None


def _walk_work(jaxpr: Any, times: float, acc: dict[str, Any],
               steps: _StepIndex | None = None, mask: Any = None,
               env: dict[Any, Any] | None = None) -> None:
    """Add the work of ``jaxpr`` run ``times`` times per grid step (on average).

    ``mask`` (with ``steps``) marks the grid steps on which this code runs, ``env`` the
    scalars known for every step; both are None inside loops, whose iterations the
    grid indices do not describe."""
    env = {} if env is None else env
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if steps is not None and not eqn.primitive.multiple_results and len(eqn.outvars) == 1 \
                and getattr(eqn.outvars[0].aval, "shape", None) == ():
            value = _step_value(eqn, env, steps)
            if value is not None:
                env[eqn.outvars[0]] = value[0]
        if name == "dot_general":
            _count_dot(eqn, times, acc)
        elif name in ELEMENTWISE:
            n = max((_size(v.aval) for v in eqn.invars if hasattr(v, "aval")), default=1)
            acc["elementwise_flops"] += n * times
            if name in TRANSCENDENTAL:
                acc["transcendentals"] += n * times
        elif name == "cond":
            _walk_cond(eqn, times, acc, steps, mask, env)
        elif name == "scan":
            _walk_work(eqn.params["jaxpr"].jaxpr, times * int(eqn.params["length"]), acc)
        elif name == "run_scoped":
            # pl.run_scoped (and emit_pipeline's buffers): the body's inputs are allocations.
            sub = eqn.params["jaxpr"]
            acc.setdefault("scoped_avals", []).extend(v.aval for v in sub.invars)
            _walk_work(sub, times, acc, steps, mask, {})
        elif name == "while":
            note = "a while loop with a run-time trip count was counted once per grid step"
            if note not in acc["notes"]:
                acc["notes"].append(note)
            _walk_work(eqn.params["body_jaxpr"].jaxpr, times, acc)
        else:
            for value in eqn.params.values():
                for sub in _jaxprs_in(value):
                    _walk_work(sub, times, acc, steps, mask, {})


def _empty_work() -> dict[str, Any]:
    return {"dot_flops": 0.0, "elementwise_flops": 0.0, "transcendentals": 0.0,
            "dots": [], "notes": [], "scoped_avals": []}


_DOT_KEY = ("m", "k", "n", "batch", "lhs_dtype", "rhs_dtype", "out_dtype")


def _merge_work(acc: dict[str, Any], sub: dict[str, Any]) -> None:
    for key in ("dot_flops", "elementwise_flops", "transcendentals"):
        acc[key] += sub[key]
    for dot in sub["dots"]:
        same = next((d for d in acc["dots"]
                     if all(d.get(k) == dot.get(k) for k in _DOT_KEY)), None)
        if same is None:
            acc["dots"].append(dot)
        elif "steps_share" in dot and "steps_share" in same:
            # The same dot in exclusive branches (k == 0, k > 0): one dot on every step.
            same["flops_per_step"] += dot["flops_per_step"]
            same["steps_share"] = min(1.0, same["steps_share"] + dot["steps_share"])
    acc["notes"].extend(n for n in sub["notes"] if n not in acc["notes"])
    acc["scoped_avals"].extend(sub["scoped_avals"])


def _walk_cond(eqn: Any, times: float, acc: dict[str, Any], steps: _StepIndex | None,
               mask: Any, env: dict[Any, Any]) -> None:
    """A ``cond`` (``pl.when``, ``lax.cond``): each branch on the steps it runs on when
    the predicate is known per grid step, else its costliest branch on every step."""
    import numpy as np
    from jax.extend import core as jcore

    branches = eqn.params["branches"]
    index_atom = eqn.invars[0]
    which = None
    if steps is not None and mask is not None:
        if isinstance(index_atom, jcore.Literal):
            which = np.full(steps.count, int(index_atom.val))
        elif index_atom in env:
            which = np.broadcast_to(np.asarray(env[index_atom]), (steps.count,))
    if which is not None:
        which = np.clip(which.astype(np.int64), 0, len(branches) - 1)
        running = int(mask.sum())
        for b, branch in enumerate(branches):
            on = mask & (which == b)
            share = int(on.sum())
            if not share:
                continue
            sub = _empty_work()
            # The branch runs on ``share`` of the steps this code runs on (times is
            # already per grid step of the whole grid for the enclosing code).
            _walk_work(branch.jaxpr, times * share / running, sub, steps, on,
                       _branch_env(branch.jaxpr, eqn.invars[1:], env))
            for dot in sub["dots"]:
                dot["steps_share"] = share / steps.count
            _merge_work(acc, sub)
        return
    best = None
    for branch in branches:
        sub = _empty_work()
        _walk_work(branch.jaxpr, times, sub)
        if best is None or (sub["dot_flops"], sub["elementwise_flops"]) > (
                best["dot_flops"], best["elementwise_flops"]):
            best = sub
    if best:
        _merge_work(acc, best)
        if any(b.eqns for b in (br.jaxpr for br in branches)):
            note = ("a pl.when/cond on a run-time value: its costliest branch was counted on "
                    "every grid step (an upper bound)")
            if note not in acc["notes"]:
                acc["notes"].append(note)


def _branch_env(jaxpr: Any, operands: list[Any], env: dict[Any, Any]) -> dict[Any, Any]:
    from jax.extend import core as jcore

    inner: dict[Any, Any] = {}
    for var, atom in zip(jaxpr.invars, operands, strict=False):
        if not isinstance(atom, jcore.Literal) and atom in env:
            inner[var] = env[atom]
    return inner


def _jaxprs_in(value: Any) -> list[Any]:
    from jax.extend import core as jcore

    if isinstance(value, jcore.ClosedJaxpr):
        return [value.jaxpr]
    if isinstance(value, jcore.Jaxpr):
        return [value]
    if isinstance(value, tuple | list):
        return [j for item in value for j in _jaxprs_in(item)]
    return []


def _count_dot(eqn: Any, times: float, acc: dict[str, Any]) -> None:
    import numpy as np

    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
    ls, rs = [int(d) for d in lhs.shape], [int(d) for d in rhs.shape]
    k = math.prod(ls[d] for d in lc)
    batch = math.prod(ls[d] for d in lb)
    m = math.prod(ls[d] for d in range(len(ls)) if d not in lc and d not in lb)
    n = math.prod(rs[d] for d in range(len(rs)) if d not in rc and d not in rb)
    flops = 2.0 * batch * m * n * k
    acc["dot_flops"] += flops * times
    out = eqn.outvars[0].aval
    entry = {"m": m, "k": k, "n": n, "batch": batch, "lhs_dtype": np.dtype(lhs.dtype).name,
             "rhs_dtype": np.dtype(rhs.dtype).name, "out_dtype": np.dtype(out.dtype).name,
             "flops_per_step": flops * times}
    if entry not in acc["dots"]:
        acc["dots"].append(entry)
