"""Kernel text: an epilogue evaluated without the size-1 axes it adds past two.

A reference written for images can view its (rows, columns) product as (N, C, 1, 1) to
apply an instance norm over 1x1 images (26k); the same code on a tile asks Mosaic to cast
a (bm, bn) vector to (bm, bn, 1, 1), which it refuses ("unsupported shape cast"). ``_lean``
evaluates the epilogue's jaxpr one equation at a time on arrays with those axes left out:
a reshape that only adds or drops them is no reshape, a reduction over them is none, and
elementwise work is the same on either shape. What it does not know runs as traced.

An AvgPool1d over the columns (49k's ``reduce_window`` sum, windows as wide as their
stride) has no Mosaic lowering either: ``_lean`` runs it as the tile times a 0/1 pooling
matrix, so it is included for such an epilogue too.
"""

LEAN_EPILOGUE = '''

_ELEMENTWISE = {"add", "sub", "mul", "div", "max", "min", "pow", "integer_pow", "exp",
                "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sqrt", "rsqrt", "cbrt",
                "neg", "abs", "sign", "floor", "ceil", "round", "erf", "erfc", "erf_inv",
                "convert_element_type", "select_n", "eq", "ne", "lt", "le", "gt", "ge", "and",
                "or", "not", "xor", "square", "sin", "cos", "tan", "atan2", "rem", "clamp",
                "is_finite", "copy", "copy_p", "reduce_precision"}


def _lean_axes(shape):
    """The axes of ``shape`` kept on a tile: all, but past two the size-1 ones (the
    trailing first)."""
    kept = list(range(len(shape)))
    while len(kept) > 2 and shape[kept[-1]] == 1:
        kept.pop()
    while len(kept) > 2 and any(shape[i] == 1 for i in kept):
        kept.remove(next(i for i in kept if shape[i] == 1))
    return kept


def _lean_shape(shape):
    return tuple(shape[i] for i in _lean_axes(shape))


def _broadcasts(shape, out):
    """``shape`` is a scalar's, or ``out``'s with 1 along some axes."""
    return not shape or (len(shape) == len(out) and all(a in (1, b) for a, b in zip(shape, out)))


def _pool(x, shape, params):
    """A sum over windows as wide as their stride along the tile's last axis, unpadded and
    undilated (an AvgPool1d's ``reduce_window``), as the tile times a 0/1 matrix on the
    MXU (Mosaic has no ``reduce_window``). None for any other window; an error where a
    window would straddle two tiles."""
    window, strides = params["window_dimensions"], params["window_strides"]
    if any(tuple(p) != (0, 0) for p in params["padding"]) or any(
            d != 1 for d in (*params["base_dilation"], *params["window_dilation"])):
        return None
    pooled = [a for a in range(len(shape)) if window[a] != 1 or strides[a] != 1]
    if len(pooled) != 1 or pooled[0] != _lean_axes(shape)[-1] \
            or window[pooled[0]] != strides[pooled[0]]:
        return None
    k, n, ins_dtype = window[pooled[0]], jnp.shape(x)[-1], x.dtype
    if n % k:
        raise ValueError(f"a pooling window of {k} would straddle tiles of {n} columns: "
                         f"BLOCK_N must be a multiple of {k}")
    at = jax.lax.broadcasted_iota(jnp.int32, (n, n // k), 0) // k
    pool = (at == jax.lax.broadcasted_iota(jnp.int32, (n, n // k), 1)).astype(jnp.float32)
    # float32 at full precision: a product of bf16 parts of the tile (two passes) made
    # libtpu 0.0.42's estimator abort ("Expected vector-bf16packed, got vector-int16")
    return jnp.dot(x.astype(jnp.float32), pool, precision=jax.lax.Precision.HIGHEST,
                   preferred_element_type=jnp.float32).astype(ins_dtype)


def _lean_eval(jaxpr, consts, args):
    """``jaxpr`` (its arguments and results without the size-1 axes past two)."""
    env = {}

    def read(v):
        return v.val if hasattr(v, "val") else env[v]

    for var, val in (*zip(jaxpr.constvars, consts), *zip(jaxpr.invars, args)):
        env[var] = jnp.reshape(val, _lean_shape(var.aval.shape)) \\
            if hasattr(var.aval, "shape") and jnp.shape(val) != _lean_shape(var.aval.shape) \\
            else val
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        name, params = eqn.primitive.name, eqn.params
        shapes = [tuple(getattr(v.aval, "shape", ())) for v in eqn.invars]
        outs_logical = [tuple(getattr(v.aval, "shape", ())) for v in eqn.outvars]
        inner = params.get("jaxpr", params.get("call_jaxpr", params.get("fun_jaxpr")))
        if inner is not None and name in ("pjit", "jit", "closed_call", "custom_jvp_call",
                                          "custom_vjp_call"):
            outs = _lean_eval(getattr(inner, "jaxpr", inner), getattr(inner, "consts", ()),
                              ins)
        elif name in ("reshape", "squeeze", "expand_dims"):
            want = _lean_shape(outs_logical[0])
            outs = [ins[0] if jnp.shape(ins[0]) == want else jnp.reshape(ins[0], want)]
        elif name == "broadcast_in_dim" and len(ins) == 1:
            out = outs_logical[0]
            full = [1] * len(out)  # the operand at the output's rank, 1 where broadcast
            for i, d in enumerate(params["broadcast_dimensions"]):
                full[d] = shapes[0][i]
            mid = tuple(full[i] for i in _lean_axes(out))
            x = ins[0] if jnp.shape(ins[0]) == mid else jnp.reshape(ins[0], mid)
            outs = [jnp.broadcast_to(x, _lean_shape(out))]
        elif name == "reduce_window_sum" and len(ins) == 1 \\
                and (pooled := _pool(ins[0], shapes[0], params)) is not None:
            outs = [pooled]
        elif name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod") \\
                and len(ins) == 1:
            kept = _lean_axes(shapes[0])
            axes = tuple(kept.index(a) for a in params["axes"] if a in kept)
            x = eqn.primitive.bind(ins[0], **{**params, "axes": axes}) if axes else ins[0]
            want = _lean_shape(outs_logical[0])
            outs = [x if jnp.shape(x) == want else jnp.reshape(x, want)]
        elif all(jnp.shape(x) == s for x, s in zip(ins, shapes)) or (
                name in _ELEMENTWISE and all(_broadcasts(s, outs_logical[0]) for s in shapes)):
            # nothing left out of the operands (the equation as traced), or elementwise:
            # each operand without the axes the result leaves out (it is 1 along them)
            if name in _ELEMENTWISE:
                kept = _lean_axes(outs_logical[0])
                ins = [x if not s or jnp.shape(x) == (mid := tuple(s[i] for i in kept))
                       else jnp.reshape(x, mid) for x, s in zip(ins, shapes)]
            found = eqn.primitive.bind(*ins, **params)
            found = found if eqn.primitive.multiple_results else [found]
            outs = [x if jnp.shape(x) == _lean_shape(s) else jnp.reshape(x, _lean_shape(s))
                    for x, s in zip(found, outs_logical)]
        else:  # as traced: the operands at their own shapes
            found = eqn.primitive.bind(*(jnp.reshape(x, s) if hasattr(x, "shape") else x
                                         for x, s in zip(ins, shapes)), **params)
            found = found if eqn.primitive.multiple_results else [found]
            outs = [jnp.reshape(x, _lean_shape(s)) for x, s in zip(found, outs_logical)]
        for var, val in zip(eqn.outvars, outs):
            env[var] = val
    return [read(v) for v in jaxpr.outvars]


def _lean(fn):
    """``fn`` evaluated without the size-1 axes it adds past two (see _lean_eval); its
    results at their own shapes."""
    def run(*args):
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        flat, tree = jax.tree.flatten(shapes)
        outs = _lean_eval(closed.jaxpr, closed.consts, args)
        return jax.tree.unflatten(tree, [o if jnp.shape(o) == s.shape else
                                         jnp.reshape(o, s.shape) for o, s in zip(outs, flat)])
    return run
'''
