"""Kernel text the templates share: the VMEM helpers (VMEM_CAP, _vmem_limit) and the
epilogue analysis (_mixing, _working) that matmul-like kernels run when traced."""


VMEM_HELPERS = """

# A kernel may use the chip's default scoped VMEM (16 MiB on v5e, 32 MiB on v6e) unless it
# asks for more. This one asks for what its blocks need, up to VMEM_CAP: 64 MiB, the VMEM
# of one v7x TensorCore (v5e, v5p and v6e have more).
VMEM_CAP = 67108864  # 64 MiB


def _vmem_limit(need):
    \"\"\"vmem_limit_bytes for blocks that need ``need`` bytes: None (the chip's default)
    while they fit the smallest default, else the need plus a quarter, within VMEM_CAP.\"\"\"
    if need <= 12 * 2**20:
        return None
    return int(min(VMEM_CAP, need + need // 4 + (2 << 20)))
"""

EPILOGUE_MIXING = """

_REDUCING = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
             "reduce_or", "reduce_xor", "argmax", "argmin"}
_ALONG_AXIS = {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "sort"}
_MIXES_ALL = {"dot_general", "conv_general_dilated", "gather", "scatter", "scatter-add",
              "scatter_add", "dynamic_slice", "dynamic_update_slice", "reduce_window", "fft",
              "while", "scan", "cond", "top_k", "rng_bit_generator"}
# A pooling (windows of an axis summed, or their max or min): it mixes the axes its
# windows span, each within its window
_WINDOWED = {"reduce_window_sum", "reduce_window_max", "reduce_window_min"}


def _eqns(jaxpr, derived):
    \"\"\"(equation, which of its inputs derive from ``derived``) for every equation of
    ``jaxpr`` and of the jaxprs inside it (a jnp.var's, a where's), in order; the
    equations inside a known mixing op (a scan, a while) are not entered.\"\"\"
    for eqn in jaxpr.eqns:
        touched = [not hasattr(v, "val") and v in derived for v in eqn.invars]
        if any(touched):
            derived.update(eqn.outvars)
        subs = [p for v in eqn.params.values() for p in (v if isinstance(v, (tuple, list))
                                                         else (v,))
                if hasattr(p, "eqns") or hasattr(getattr(p, "jaxpr", None), "eqns")]
        if subs and eqn.primitive.name not in _MIXES_ALL:
            for sub in subs:
                inner = sub if hasattr(sub, "eqns") else sub.jaxpr
                yield from _eqns(inner, {iv for iv, ov, t in zip(inner.invars, eqn.invars,
                                                                 touched) if t})
            continue
        yield eqn, touched


def _split_like_the_tile(closed, args):
    \"\"\"The jaxpr inputs that are split as the tile is: the tile itself and the operands
    cut into blocks with it ((m, n) tiles, (1, n) rows, (m, 1) columns). An operand
    passed whole (a second layer's weight) is not: what is made of it alone mixes nothing.\"\"\"
    m, n = tuple(args[0].shape)[0], tuple(args[0].shape)[-1]
    return {v for i, (v, a) in enumerate(zip(closed.jaxpr.invars, args))
            if i == 0 or tuple(getattr(a, "shape", ())) in ((m, n), (1, n), (m, 1))}


def _mixing(fn, *args, pooled=False):
    \"\"\"(rows mixed, columns mixed): whether ``fn`` combines values of its first argument
    (the tile) across the first or the last axis (a reduction, a cumulative op, a reshape
    or transpose that moves it, an iota along it, a product that contracts it, a pooling's
    windows along it), read from its jaxpr. Only what derives from the tile and the
    operands split with it counts (a second layer's weight may be transposed freely).
    Conservative: an operation it does not know mixes both, so such an epilogue gets the
    whole product in one block. ``pooled``: a sum over unpadded windows as wide as their
    stride (an AvgPool1d, which ``_lean`` runs on a tile only when its windows do not
    straddle tiles) mixes nothing.\"\"\"
    closed = jax.make_jaxpr(fn)(*args)
    first = last = False
    for eqn, touched in _eqns(closed.jaxpr, _split_like_the_tile(closed, args)):
        if any(touched):
            name = eqn.primitive.name
            shape = tuple(getattr(eqn.invars[0].aval, "shape", ())) if eqn.invars else ()
            out = tuple(getattr(eqn.outvars[0].aval, "shape", ())) if eqn.outvars else ()
            nd = len(shape)
            axes = ()
            if name in _REDUCING:
                axes = tuple(eqn.params.get("axes", ()))
            elif name in _ALONG_AXIS:
                axes = (eqn.params.get("axis", eqn.params.get("dimension", 0)),)
            elif name in _WINDOWED:
                window, strides = eqn.params["window_dimensions"], eqn.params["window_strides"]
                axes = tuple(i for i, (a, b) in enumerate(zip(window, strides)) if a != 1 or b != 1)
                if pooled and name == "reduce_window_sum" and tuple(window) == tuple(strides) \\
                        and all(tuple(p) == (0, 0) for p in eqn.params["padding"]):
                    axes = ()
            elif name == "iota":
                axes, nd = (eqn.params.get("dimension", 0),), len(out)
            elif name == "reshape":
                if not _only_ones(shape, out):
                    first |= not shape or not out or shape[0] != out[0]
                    last |= not shape or not out or shape[-1] != out[-1]
            elif name == "transpose":
                perm = tuple(eqn.params.get("permutation", ()))
                first |= bool(perm) and perm[0] != 0
                last |= bool(perm) and perm[-1] != len(perm) - 1
            elif name in ("concatenate", "pad", "slice", "rev", "squeeze", "expand_dims"):
                if name == "concatenate":
                    axes = (eqn.params.get("dimension", 0),)
                elif name == "rev":
                    axes = tuple(eqn.params.get("dimensions", ()))
                elif out != shape and len(out) == len(shape):  # a slice or pad changes sizes
                    axes = tuple(i for i, (a, b) in enumerate(zip(shape, out)) if a != b)
                elif len(out) != len(shape) and name in ("squeeze", "expand_dims"):
                    if not _only_ones(shape, out):
                        first |= bool(shape) and bool(out) and shape[0] != out[0]
                        last |= bool(shape) and bool(out) and shape[-1] != out[-1]
            elif name == "dot_general" and touched[:2] == [True, False] and nd == 2 and tuple(
                    eqn.params["dimension_numbers"][0][0]) == (1,) and not any(
                    eqn.params["dimension_numbers"][1]):
                last = True  # the tile's rows by a weight (a second layer): rows stay apart
            elif name in _MIXES_ALL:
                first = last = True
            elif name == "broadcast_in_dim" and touched[0] and shape:
                # the rows' axis is no longer the first (x[None]): what reduces the
                # result along an axis cannot tell the rows from the columns any more
                first |= tuple(eqn.params.get("broadcast_dimensions", (0,)))[:1] != (0,)
            elif name != "broadcast_in_dim" and any(
                    _resized(tuple(getattr(v.aval, "shape", ())), out)
                    for v in eqn.invars if hasattr(v, "aval")):
                first = last = True  # an op it does not know changes the sizes
            for a in axes:
                a = a % nd if nd else 0
                if name in _REDUCING and a < len(shape) and shape[a] == 1:
                    continue  # over a size-1 axis: nothing is combined
                first |= a == 0
                # any other axis: the columns, or what was made of them (an axis between
                # them and size-1 axes appended after them, (m, n, 1, 1), is the columns)
                last |= a != 0

    return first, last


def _only_ones(shape, out):
    \"\"\"A reshape that only adds or drops size-1 axes after the rows' axis: it moves no
    value (an instance norm over (m, n, 1, 1), MaxKernel's 26k, mixes nothing).\"\"\"
    return (bool(shape) and bool(out) and shape[0] == out[0]
            and tuple(d for d in shape if d != 1) == tuple(d for d in out if d != 1))


def _resized(shape, out):
    # An operand that is neither a scalar nor out's shape with size-1 dims broadcast
    # (x + bias with a (1, n) bias keeps every row its own).
    if not shape:
        return False
    if len(shape) != len(out):
        return True
    return any(a != b and a != 1 for a, b in zip(shape, out))


def _working(fn, *args):
    \"\"\"VMEM bytes for the intermediates of ``fn`` on one tile (its first argument): two
    f32 tiles, as the compiler keeps most elementwise work in registers, unless an
    intermediate of the tile is laid out larger (a group norm's (rows, groups, 64)
    reshape pads its last axis to 128 lanes): then three of that one (compiled: such an
    epilogue's scoped VMEM was its blocks plus about three padded intermediates). Plus
    the largest array made from the other operands alone (a bf16 weight widened to f32
    for a second product), once.\"\"\"
    closed = jax.make_jaxpr(fn)(*args)
    tile = args[0].size * 4

    def padded(aval):
        shape = tuple(getattr(aval, "shape", ()))
        if len(shape) < 2:
            return 0
        lead = 1
        for d in shape[:-2]:
            lead *= d
        return lead * -(-shape[-2] // 8) * 8 * -(-shape[-1] // 128) * 128 * 4

    ours = other = 0
    for eqn, touched in _eqns(closed.jaxpr, _split_like_the_tile(closed, args)):
        most = max([0, *(padded(v.aval) for v in eqn.outvars if hasattr(v, "aval"))])
        if any(touched):
            ours = max(ours, most)
        else:
            other = max(other, most)
    return (3 * ours if ours > tile else 2 * tile) + other
"""


# A float32 product at HIGHEST (the reference's) is 6 bf16 passes on the MXU; 3 do where
# the task's tolerance allows (F32_PASSES, a switch the tuner measures: measured on a v5e
# at production, the bundled attention (4x32x4096x128) went 1.59x -> 2.73x of XLA, the
# bundled matmul (4096x4096 @ 4096x14336) 1.06x -> 2.09x). The bundled kernels carry
# their own copy of these helpers: a kernel file stands alone.
F32_PASSES_HELPERS = """

def _f32_halves(x):
    \"\"\"x as a bf16 high part (its top 16 bits: exact in bf16) and a bf16 remainder
    (x - high, exact in float32, then rounded: 16 significant bits in all).\"\"\"
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0xFFFF0000)
    high = jax.lax.bitcast_convert_type(bits, jnp.float32)
    return high.astype(jnp.bfloat16), (x - high).astype(jnp.bfloat16)


def _product(a, b, dims):
    \"\"\"The product of two blocks on the MXU, in float32. Float32 operands at the
    reference's PRECISION in F32_PASSES bf16 passes: 6 as PRECISION asks, or 3 (each
    operand split into a bf16 high part and remainder, the three products that matter
    summed in float32; the remainders' product, about 2**-16 of the whole, dropped).\"\"\"
    if a.dtype != jnp.float32 or b.dtype != jnp.float32:
        return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)
    if F32_PASSES != 3:
        return jax.lax.dot_general(a, b, dims, precision=PRECISION,
                                   preferred_element_type=jnp.float32)
    (a_hi, a_lo), (b_hi, b_lo) = _f32_halves(a), _f32_halves(b)

    def one(x, y):
        return jax.lax.dot_general(x, y, dims, preferred_element_type=jnp.float32)
    return one(a_hi, b_hi) + (one(a_hi, b_lo) + one(a_lo, b_hi))
"""
F32_PASSES_TUNABLE = '"F32_PASSES": [6, 3]'


def highest(precision: str | None) -> bool:
    """Whether a reference's ``precision=`` asks for full float32 products (HIGHEST)."""
    return precision is not None and "highest" in precision.lower()
