"""The conv template's channels-first kernel text (``_conv_lanes``, the LANES switch): one
image per grid step with its pixels flattened onto the lanes, so that few input channels
(46k's 8) fill the vregs instead of 8 of 128 lanes, and a norm over the image (its
statistics and the steps that use them, a closing reduction over the channels) runs in
the same kernel on the product kept in VMEM: the convolution's output never goes to HBM."""

from __future__ import annotations

_LANES = '''
# The convolution channels-first, the image's pixels flattened onto the lanes
# (_conv_lanes): with few input channels every vreg is full, and a norm over the image
# runs in the same kernel on the product kept in VMEM (True); or channels on the lanes,
# blocks of output rows (False). A switch the tuner measures. Measured on a v5e
# (46k, 128x8x128x128 -> 64 channels, group norm, logsumexp over the channels; bf16):
# channels on the lanes 4.93 ms, channels-first 1.27 ms (XLA 1.76 ms); with 64 channels in
# (18k) 4.98 against 8.34 (XLA 3.17): first where fewer than 32 channels come in.
LANES = {default}'''

_LANES_KERNEL = '''

# Flattened pixels a step of the channels-first kernel works on (a multiple of 128): a
# 128x128 image in one. The TPU compiler's estimator needs far more memory for more steps
# (46k, 4 images: 4.5 GB and 63 s in steps of 2048, 0.6 GB and 4 s in one of 16384, the
# same cycles within 8%), and above 8 GB it gives no figure (at 46k's production it gives
# none either way: its memory there follows the operands' size).
LANE_CHUNK = 16384


def _lanes_body(x_ref, w_ref, *refs, kh, kw, wp, oh, ow, chunk, halo, chunks, epilogue,
                n_params, mean, norm, groups, count, norm_epilogue):
    """One image, channels-first: x_ref (1, c, pixels) with the rows (``wp`` wide)
    flattened; output pixel p = h * wp + w. Tap (i, j) of a chunk of pixels is the
    chunk's window rolled along the lanes by i * wp + j; the taps stacked on the
    sublanes make one (kh * kw * c, chunk) operand and one product by w_ref
    (o, kh * kw * c). Columns w >= ow and pixels past oh * wp are wrapped-around
    garbage: left out of every statistic, sliced off outside."""
    params, refs = refs[:n_params], refs[n_params:]
    o = w_ref.shape[0]
    if norm:
        norm_params, (o_ref, y_ref) = refs[:-2], refs[-2:]
    else:
        norm_params, (o_ref,) = refs[:-1], refs[-1:]
    width = chunk + halo

    def product(start):
        window = x_ref[0, :, pl.ds(start, width)].astype(jnp.float32)
        taps = [window if i * wp + j == 0 else pltpu.roll(window, width - i * wp - j, 1)
                for i in range(kh) for j in range(kw)]
        patch = jnp.concatenate(taps, axis=0)[:, :chunk].astype(w_ref.dtype)
        y = jnp.dot(w_ref[...], patch, preferred_element_type=jnp.float32)
        return y if epilogue is None else epilogue(y, *[p[...] for p in params])

    def valid(start):
        at = start + jax.lax.broadcasted_iota(jnp.int32, (1, chunk), 1)
        return (at % wp < ow) & (at < oh * wp)

    def at(k):
        return pl.multiple_of(k * chunk, chunk)

    def loop(fn, init):
        return jax.lax.fori_loop(0, chunks, lambda k, carry: fn(at(k), carry), init)

    zero = jnp.zeros((o, 1), jnp.float32)
    if mean is not None:  # the image's sum per channel; divided outside
        def add(start, total):
            return total + jnp.sum(jnp.where(valid(start), product(start), 0.0), axis=1,
                                   keepdims=True)
        o_ref[0] = loop(add, zero)
        return
    if not norm:
        def store(start, carry):
            o_ref[0, :, pl.ds(start, chunk)] = product(start).astype(o_ref.dtype)
            return carry
        loop(store, 0)
        return
    # A norm over the image: the product kept in VMEM, its mean, then the variance about
    # it (two passes: the reference's own jnp.var), each channel's or its group's

    def first(start, total):
        y = product(start)
        y_ref[:, pl.ds(start, chunk)] = y
        return total + jnp.sum(jnp.where(valid(start), y, 0.0), axis=1, keepdims=True)

    size = o // groups
    same = (jax.lax.broadcasted_iota(jnp.int32, (o, o), 0) // size
            == jax.lax.broadcasted_iota(jnp.int32, (o, o), 1) // size).astype(jnp.float32)

    def over_group(v):  # (o, 1) per channel -> each channel's group's total
        wide = jnp.dot(same, jnp.broadcast_to(v, (o, 128)),
                       precision=jax.lax.Precision.HIGHEST,
                       preferred_element_type=jnp.float32)
        return wide[:, :1]

    mean_c = over_group(loop(first, zero)) / count

    def second(start, total):
        d = jnp.where(valid(start), y_ref[:, pl.ds(start, chunk)] - mean_c, 0.0)
        return total + jnp.sum(d * d, axis=1, keepdims=True)

    var_c = over_group(loop(second, zero)) / count
    q = [p[...] for p in norm_params]

    def third(start, carry):
        out = norm_epilogue(y_ref[:, pl.ds(start, chunk)], mean_c, var_c, *q, _axis=0)
        o_ref[0, :, pl.ds(start, chunk)] = out.astype(o_ref.dtype)
        return carry

    loop(third, 0)


def _conv_lanes(x, w, ph, pw, out_layout, epilogue, params, mean, norm, norm_epilogue,
                norm_params, norm_groups, norm_closing):
    """The channels-first kernel (LANES) for x (n, c, h, w) NCHW and w (o, c, kh, kw)
    OIHW; ``params``/``norm_params`` as (1, o) rows. None where its blocks do not fit
    VMEM (the channels-on-lanes kernel then runs)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    hp, wp = h + sum(ph), wd + sum(pw)
    oh, ow = hp - kh + 1, wd + sum(pw) - kw + 1
    cp = -(-c // 8) * 8  # whole sublane tiles of channels: the taps stack aligned
    halo = -(-((kh - 1) * wp + kw - 1) // 128) * 128
    item = x.dtype.itemsize
    o_out = 1 if norm_closing else o
    k = kh * kw * cp

    def need(chunk):
        """VMEM: the image and the weights (double-buffered), the output block, a norm's
        float32 product, and a step's taps, their stack and its products."""
        chunks = -(-oh * wp // chunk)
        return 2 * cp * (chunks * chunk + halo) * item + 2 * o * k * item \\
            + (0 if mean is not None else 2 * o_out * chunks * chunk * item) \\
            + (o * chunks * chunk * 4 if norm else 0) \\
            + (kh * kw + 1) * cp * (chunk + halo) * 4 + k * chunk * (4 + item) \\
            + 6 * o * chunk * 4

    # LANE_CHUNK pixels a step (all of them if fewer), halved while a step needs more
    # VMEM than ROWS_VMEM (18k's 64 channels: a 576-deep stack)
    chunk = min(LANE_CHUNK, -(-oh * wp // 128) * 128)
    while need(chunk) > ROWS_VMEM and chunk > 128:
        chunk = -(-chunk // 256) * 128
    if need(chunk) > ROWS_VMEM:
        return None
    chunks = -(-oh * wp // chunk)
    pixels = chunks * chunk + halo
    x = jnp.pad(x, ((0, 0), (0, cp - c), ph, pw)).reshape(n, cp, hp * wp)
    x = jnp.pad(x, ((0, 0), (0, 0), (0, pixels - hp * wp)))
    # (o, kh * kw * cp): tap (i, j)'s channels in the order the taps are stacked
    wt = jnp.pad(w, ((0, 0), (0, cp - c), (0, 0), (0, 0))).transpose(0, 2, 3, 1)
    wt = wt.reshape(o, k).astype(x.dtype)
    col = lambda p: p.reshape(o, 1)  # (1, o) rows as (o, 1) columns
    inputs = [x, wt, *map(col, params), *(map(col, norm_params) if norm else ())]
    count = float(oh * ow * (o // int(norm_groups) if norm == "G" else 1))
    out_dtype = jnp.result_type(x.dtype, w.dtype)
    if mean is not None:
        out_shape = jax.ShapeDtypeStruct((n, o, 1), jnp.float32)
        out_spec = pl.BlockSpec((1, o, 1), lambda b: (b, 0, 0))
    else:
        out_shape = jax.ShapeDtypeStruct((n, o_out, chunks * chunk), out_dtype)
        out_spec = pl.BlockSpec((1, o_out, chunks * chunk), lambda b: (b, 0, 0))
    out = pl.pallas_call(
        functools.partial(_lanes_body, kh=kh, kw=kw, wp=wp, oh=oh, ow=ow, chunk=chunk,
                          halo=halo, chunks=chunks, epilogue=epilogue, n_params=len(params),
                          mean=mean, norm=bool(norm), count=count,
                          groups=int(norm_groups) if norm == "G" else o,
                          norm_epilogue=norm_epilogue),
        out_shape=out_shape,
        grid=(n,),
        in_specs=[pl.BlockSpec((1, cp, pixels), lambda b: (b, 0, 0))]
                 + [pl.BlockSpec(a.shape, lambda b, r=a.ndim: (0,) * r) for a in inputs[1:]],
        out_specs=out_spec,
        scratch_shapes=[pltpu.VMEM((o, chunks * chunk), jnp.float32)] if norm else [],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=_vmem_limit(need(chunk))),
    )(*inputs)
    if mean is not None:
        return out.reshape(n, 1, o)  # each image's sum per channel, as the rows kernel's
    out = out[:, :, :oh * wp].reshape(n, o_out, oh, wp)[..., :ow]
    return jnp.transpose(out, ["NCHW".index(ch) for ch in out_layout])
'''
