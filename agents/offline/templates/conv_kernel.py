"""The conv template's kernel text: the convolution as MXU matmuls over one NHWC image in
VMEM (``_conv``; 3-D ones in ``_conv3d``), the per-channel steps after it on each block,
a mean over the image, and a norm's two kernels (the blocks and their statistics, then
the steps that use them: ``_norm``). ``conv.py`` reads the reference and writes it."""

from __future__ import annotations

from tilewright.agents.offline.templates.kernel_text import VMEM_HELPERS

_TUNABLES = 'TUNABLES = {"BLOCK_ROWS": [1, 2, 4, 8, 16, 32, 64, 128]}'
_NORM_F32 = '''
# A norm's first pass stores its blocks for the second in float32 (the epilogue's own
# precision), or (False) in the output's dtype: for a 16-bit output half the bytes each
# way, rounded where the reference rounds its own intermediates (a switch the tuner
# measures); for a float32 one the same program.
NORM_F32 = True'''
_PACK_TAPS = '''
# The column taps' output channels side by side in one product (True), or a product per
# tap: with fewer than 128 channels out, fewer of the MXU's 128-wide output passes (64
# channels, 3 taps: 2 passes, not 3), at the cost of slicing the product's lanes. A
# switch the tuner measures, the same program at every shape. TPU compiler, v5e:
# JAXBench's 33k (3-D, 288-deep contraction, 64 channels out) 4.71 -> 3.70 Mcycles; its
# 46k (2-D, 24-deep) 4.69 -> 4.73.
PACK_TAPS = {default}'''

_CONV_KERNEL = '''

# Output rows per grid step (or its largest divisor of the output's rows), halved while
# the blocks need more VMEM than ROWS_VMEM. Measured on a v5e (18k, 126 output rows):
# 5.81 ms at 21 rows, 5.42 at 63, 5.02 at 126 (XLA 3.16 ms).
BLOCK_ROWS = 128
''' + _TUNABLES + '''
ROWS_VMEM = 56 * 2**20  # under VMEM_CAP, with room for what the count below leaves out
''' + VMEM_HELPERS + '''

class _Unfusable(Exception):
    """An operand of the epilogue is not per channel: the statements run as written."""


def _per_channel(p, axis, o, rank=4):
    """An epilogue operand as a (1, o) float32 row: it must broadcast against the
    convolution's output (of ``rank`` axes) along its channel ``axis`` only (a bias, a
    scale) or be a scalar (``axis`` None: a scalar only, as in a group norm's grouped
    view)."""
    a = jnp.asarray(p)
    if axis is None:
        if a.size != 1:
            raise _Unfusable(f"an operand of shape {a.shape} where a scalar is read")
        return jnp.broadcast_to(a.reshape(()), (1, o)).astype(jnp.float32)
    if a.ndim > rank:
        raise _Unfusable(f"an operand of rank {a.ndim}")
    shape = (1,) * (rank - a.ndim) + tuple(a.shape)
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, o):
        raise _Unfusable(f"an operand of shape {a.shape} is not per channel")
    return jnp.broadcast_to(a.reshape(-1), (o,)).reshape(1, o).astype(jnp.float32)


def _conv_body(*refs, kd, kh, kw, rows, epilogue, mean, oh, ow, clamp, stats, row_axis=1):
    # ``kd`` input planes (a 3-D convolution's depth taps: the same image at kd depths;
    # one for a 2-D one), the weights, the epilogue's operands, the output
    planes, w_ref, refs = refs[:kd], refs[kd], refs[kd + 1:]
    count = 3 if stats else 1  # with ``stats``, the image's running mean and M2 follow
    params, (o_ref, *stat_refs) = refs[:-count], refs[-count:]
    r = pl.program_id(row_axis)  # the block of rows (after the output plane, in 3-D)
    # (kw, taps, o) weights, a product per column tap; or (taps, kw * o), every column
    # tap's output channels side by side (PACK_TAPS), one product for all of them
    o = w_ref.shape[-1] // kw if w_ref.ndim == 2 else w_ref.shape[-1]
    x_ref = planes[0]
    cols = x_ref.shape[2]
    # ``clamp``: the last block of rows ends at the last output row, overlapping the one
    # before it (only a mean, whose rows are counted once below, reads that way)
    start = jnp.minimum(r * rows, oh - rows) if clamp else r * rows
    # The row taps (of every depth tap's plane) side by side in the contraction (channels
    # fewer than the MXU's depth, 128, share a pass instead of leaving most of it empty);
    # each tap is ``rows`` image rows at every column: an aligned slab.
    slabs = [p[0, pl.ds(start + i, rows), :, :] for p in planes for i in range(kh)]
    lhs = slabs[0] if len(slabs) == 1 else jnp.concatenate(slabs, axis=-1)
    lhs = lhs.reshape(rows * cols, len(slabs) * x_ref.shape[-1])
    acc = None
    full = jnp.dot(lhs, w_ref[...], preferred_element_type=jnp.float32) \
        if w_ref.ndim == 2 else None
    for j in range(kw):
        # A column tap rotates the float32 product of every column by its offset (the
        # XLU's sublane rotation): the columns it wraps land past the output's width.
        # Not the packed bf16 inputs: a window of them at an odd column offset is a
        # sublane shift that libtpu 0.0.42's estimator cannot price.
        product = jnp.dot(lhs, w_ref[j], preferred_element_type=jnp.float32) \
            if full is None else full[:, j * o:(j + 1) * o]
        if j:
            product = pltpu.roll(product, rows * cols - j, 0)
        acc = product if acc is None else acc + product
    acc = acc.reshape(rows, cols, o)
    if epilogue is not None:  # the reference's elementwise steps, on the float32 block
        acc = epilogue(acc, *[p[...] for p in params])
    if stats:
        _store_with_statistics(acc, o_ref, *stat_refs, start=start, oh=oh, ow=ow)
        return
    if not mean:
        o_ref[0] = acc[:, :ow, :].astype(o_ref.dtype)
        return
    # A mean over the image: each block adds its valid rows and columns to the image's
    # sum (padding rows and columns hold the epilogue of zeros, not zeros; a clamped
    # block's rows that the block before it counted are left out).
    at_row = start + jax.lax.broadcasted_iota(jnp.int32, (rows, cols, 1), 0)
    at_col = jax.lax.broadcasted_iota(jnp.int32, (rows, cols, 1), 1)
    keep = (at_row >= r * rows) & (at_row < oh) & (at_col < ow)
    total = jnp.sum(jnp.where(keep, acc, 0.0).reshape(rows * cols, o), axis=0, keepdims=True)

    @pl.when(r == 0)
    def _():
        o_ref[0] = jnp.zeros_like(o_ref[0])

    o_ref[0] += total


def _store_with_statistics(acc, o_ref, mu_ref, m2_ref, *, start, oh, ow):
    """A norm's first pass: the block (float32 unless NORM_F32 is off), and each
    channel's mean and sum of squared deviations (M2) over the image's rows so far, the
    block's own (its valid rows and columns) combined with them by Chan's parallel
    formula: no E[x^2] - E[x]^2, which cancels where the mean is large beside the
    spread."""
    rows, cols, o = acc.shape
    r = pl.program_id(1)
    o_ref[0] = acc[:, :ow, :].astype(o_ref.dtype)
    at_row = start + jax.lax.broadcasted_iota(jnp.int32, (rows, cols, 1), 0)
    at_col = jax.lax.broadcasted_iota(jnp.int32, (rows, cols, 1), 1)
    keep = (at_row < oh) & (at_col < ow)
    n_b = (jnp.minimum(rows, oh - start) * ow).astype(jnp.float32)
    block_mean = jnp.sum(jnp.where(keep, acc, 0.0).reshape(rows * cols, o), axis=0,
                         keepdims=True) / n_b
    dev = jnp.where(keep, acc - block_mean.reshape(1, 1, o), 0.0)
    block_m2 = jnp.sum((dev * dev).reshape(rows * cols, o), axis=0, keepdims=True)

    @pl.when(r == 0)
    def _():
        mu_ref[0] = block_mean
        m2_ref[0] = block_m2

    @pl.when(r > 0)
    def _():
        n_a = (r * rows * ow).astype(jnp.float32)  # the blocks before are whole
        total = n_a + n_b
        delta = block_mean - mu_ref[0]
        mu_ref[0] = mu_ref[0] + delta * (n_b / total)
        m2_ref[0] = m2_ref[0] + block_m2 + delta * delta * (n_a * n_b / total)


def _norm_body(y_ref, mu_ref, m2_ref, *refs, epilogue, count):
    """A norm's second pass: each channel's mean and variance over the image (one
    image's statistics) or the batch (every image's, combined), and the reference's
    steps that use them, on a block of the first pass's output (in float32)."""
    params, o_ref = refs[:-1], refs[-1]
    mu, m2 = mu_ref[...], m2_ref[...]  # (images, 1, o)
    mean = jnp.mean(mu, axis=0)
    m2 = jnp.sum(m2, axis=0) + count * jnp.sum((mu - mean) ** 2, axis=0)
    var = m2 / (count * mu.shape[0])
    out = epilogue(y_ref[0].astype(jnp.float32), mean, var, *[p[...] for p in params])
    o_ref[0] = out.astype(o_ref.dtype)


def _group_statistics(mu, m2, groups, count):
    """A group norm's statistics from its channels' over the image (each (n, 1, o), of
    ``count`` values): each group's mean and M2 combined over its channels by Chan's
    formula (equal counts), given to every channel of the group, the M2 divided by the
    group's size so that the second pass, which divides by one channel's count, reads
    the group's variance. On (n, o) arrays, between the two kernels."""
    n, _, o = mu.shape
    if o % groups:
        raise ValueError(f"{o} channels do not split into {groups} groups")
    size = o // groups
    mu, m2 = mu.reshape(n, groups, size), m2.reshape(n, groups, size)
    mean = jnp.mean(mu, axis=-1, keepdims=True)
    total = jnp.sum(m2, axis=-1, keepdims=True) + count * jnp.sum(
        (mu - mean) ** 2, axis=-1, keepdims=True)
    return (jnp.broadcast_to(mean, mu.shape).reshape(n, 1, o),
            jnp.broadcast_to(total / size, mu.shape).reshape(n, 1, o))


def _norm(y, mu, m2, epilogue, params, over, oh, out_dtype, closing):
    """The second pass over ``y`` (n, rows, ow, o) in blocks of whole rows of about 2 MiB;
    ``over``: "HW" (each image's statistics) or "NHW" (the batch's); ``closing``: the
    epilogue ends on a reduction over the channels (one channel out)."""
    n, rows, ow, o = y.shape
    o_out = 1 if closing else o
    row_bytes = ow * (-(-o // 128) * 128) * 4  # in float32, as the epilogue works
    block = max(d for d in range(1, rows + 1) if rows % d == 0 and d * row_bytes <= 2 << 20
                or d == 1)
    stat_spec = (pl.BlockSpec((n, 1, o), lambda b, r: (0, 0, 0)) if over == "NHW"
                 else pl.BlockSpec((1, 1, o), lambda b, r: (b, 0, 0)))
    need = 2 * block * row_bytes * (1 + jnp.dtype(out_dtype).itemsize / 4) \
        + 4 * block * row_bytes
    return pl.pallas_call(
        functools.partial(_norm_body, epilogue=epilogue, count=float(oh * ow)),
        out_shape=jax.ShapeDtypeStruct((n, rows, ow, o_out), out_dtype),
        grid=(n, rows // block),
        in_specs=[pl.BlockSpec((1, block, ow, o), lambda b, r: (b, r, 0, 0)),
                  stat_spec, stat_spec]
                 + [pl.BlockSpec((1, o), lambda b, r: (0, 0)) for _ in params],
        out_specs=pl.BlockSpec((1, block, ow, o_out), lambda b, r: (b, r, 0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=_vmem_limit(int(need))),
    )(y, mu, m2, *params)


def _plane(i):
    """The index map of a 3-D convolution's depth tap ``i``: output plane z reads input
    plane z + i (a block of one plane, its axis squeezed)."""
    return lambda b, z, r: (b, z + i, 0, 0, 0)


def _conv3d(lhs, rhs, padding, layout, epilogue, params, channel_axes):
    """A 3-D convolution (stride 1, undilated, ungrouped) and the elementwise steps after
    it: for each output plane and block of rows, the kd input planes it reads come in as
    kd blocks of the same image (index maps z + i), all their row taps side by side in
    the contraction (kd * kh * C_in deep), column taps rotating the products as in 2-D."""
    x = jnp.transpose(lhs, [layout[0].index(c) for c in "NDHWC"])
    w = jnp.transpose(rhs, [layout[1].index(c) for c in "DHWIO"])
    kd, kh, kw = w.shape[:3]
    if isinstance(padding, str) and padding.upper() in ("SAME", "VALID"):
        pads = [((k - 1) // 2, k // 2) if padding.upper() == "SAME" else (0, 0)
                for k in (kd, kh, kw)]
    elif isinstance(padding, str):
        raise ValueError(f"padding {padding!r}")
    else:
        pads = [tuple(p) for p in padding]
    pd, ph, pw = pads
    n, d, h, wd, c = x.shape
    od, oh, ow = d + sum(pd) - kd + 1, h + sum(ph) - kh + 1, wd + sum(pw) - kw + 1
    cols = -(-(wd + sum(pw)) // 16) * 16  # whole sublane tiles, as in 2-D
    o = w.shape[-1]
    out_dtype = jnp.result_type(lhs.dtype, rhs.dtype)
    item = x.dtype.itemsize

    packed = PACK_TAPS  # column taps side by side in one product

    def need(rows, extra_rows):
        """VMEM: the kd planes and the weights (double-buffered, channels padded to 128
        lanes), the output block, three float32 products, the taps side by side."""
        lanes, o_lanes = -(-c // 128) * 128, -(-o // 128) * 128
        plane = (h + sum(ph) + extra_rows) * cols * lanes * item
        taps_lanes = -(-kd * kh * c // 128) * 128
        block = rows * ow * o * jnp.dtype(out_dtype).itemsize
        return 2 * (kd * plane + kd * kh * kw * c * o * item + block) \
            + 3 * rows * cols * o_lanes * 4 + rows * cols * taps_lanes * item \
            + (rows * cols * -(-kw * o // 128) * 128 * 4 if packed else 0)

    rows, _clamp, extra_rows = _block_rows(oh, False, need)
    oh_pad = oh + extra_rows
    if pd != (0, 0) or ph != (0, 0) or extra_rows or cols != wd:
        x = jnp.pad(x, ((0, 0), pd, (ph[0], ph[1] + extra_rows),
                        (pw[0], cols - wd - pw[0]), (0, 0)))
    w = w.transpose(2, 0, 1, 3, 4).reshape(kw, kd * kh * c, o)
    if packed:
        w = w.transpose(1, 0, 2).reshape(kd * kh * c, kw * o)
    rows_in = [_per_channel(p, a, o, 5) for p, a in zip(params, channel_axes, strict=True)]
    out = pl.pallas_call(
        functools.partial(_conv_body, kd=kd, kh=kh, kw=kw, rows=rows, epilogue=epilogue,
                          mean=False, oh=oh, ow=ow, clamp=False, stats=False, row_axis=2),
        out_shape=jax.ShapeDtypeStruct((n, od, oh_pad, ow, o), out_dtype),
        grid=(n, od, -(-oh_pad // rows)),
        in_specs=[pl.BlockSpec((1, None, *x.shape[2:]), _plane(i)) for i in range(kd)]
                 + [pl.BlockSpec(w.shape, lambda b, z, r: (0,) * w.ndim)]
                 + [pl.BlockSpec((1, o), lambda b, z, r: (0, 0)) for _ in rows_in],
        out_specs=pl.BlockSpec((1, None, rows, ow, o), lambda b, z, r: (b, z, r, 0, 0)),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(need(rows, extra_rows))),
    )(*([x] * kd), w, *rows_in)
    if oh_pad != oh:
        out = out[:, :, :oh]
    return jnp.transpose(out, ["NDHWC".index(ch) for ch in layout[2]])


def _block_rows(oh, mean, need):
    """Output rows per grid step, whether the last block is clamped, and the rows the
    image is padded by: BLOCK_ROWS (halved while ``need(rows, padded rows)`` is over
    ROWS_VMEM) where it divides the output, else its largest divisor down to half of it;
    a mean clamps its last block instead; else the rows are padded to a multiple."""
    top = min(BLOCK_ROWS, oh)
    while True:
        near = max(d for d in range(1, top + 1) if oh % d == 0)
        rows, clamp = (near, False) if 2 * near >= top else (top, mean)
        extra = 0 if clamp else -(-oh // rows) * rows - oh
        if top == 1 or need(rows, extra) <= ROWS_VMEM:
            return rows, clamp, extra
        top //= 2


def _image_mean(total, mean, oh, ow, out_dtype):
    """Each image's mean per channel from its sums (n, 1, o), in the layout the
    reference takes it in (``mean``: keepdims, that layout)."""
    n, _, o = total.shape
    keepdims, taken_in = mean
    found = (total[:, 0, :] / (oh * ow)).astype(out_dtype)  # (n, o)
    if [a for a in taken_in if a in "NC"] == ["C", "N"]:
        found = found.T
    if keepdims:
        found = found.reshape([n if a == "N" else o if a == "C" else 1 for a in taken_in])
    return found


def _conv(lhs, rhs, window_strides=(1, 1), padding="VALID", lhs_dilation=None,
          rhs_dilation=None, dimension_numbers=None, feature_group_count=1, *,
          epilogue=None, params=(), channel_axes=(), mean=None, norm=None,
          norm_epilogue=None, norm_params=(), norm_channel_axes=(), norm_groups=None,
          norm_closing=False, **unused):
    """lax.conv_general_dilated for 2-D, stride 1, undilated, ungrouped convolutions (3-D
    ones, with elementwise steps only, go to ``_conv3d``);
    with ``epilogue``, the reference's elementwise steps after it (their operands
    ``params``, each per channel along its ``channel_axes`` entry) run on each block
    before it is stored, and with ``mean`` (keepdims, the layout it is taken in) the
    block's mean over the image is all that is stored. With ``norm`` ("HW": each
    image's statistics, "NHW": the batch's), the blocks are stored (in float32 unless
    NORM_F32 is off) with their channels' running statistics, and a second kernel runs
    ``norm_epilogue`` (the steps that use the mean and variance, their operands
    ``norm_params``) on them; "G" is a group norm, its statistics over each image's
    ``norm_groups`` groups of channels. ``norm_closing``: that epilogue ends on a
    reduction over the channels, and one channel is stored. With LANES (not for a batch's
    statistics) the channels-first kernel runs instead, where its blocks fit VMEM."""
    if dimension_numbers is not None:
        layout = tuple(dimension_numbers)
    else:
        layout = ("NCHW", "OIHW", "NCHW") if jnp.ndim(lhs) == 4 else (
            "NCDHW", "OIDHW", "NCDHW")
    if len(layout) != 3 or any(not isinstance(s, str) for s in layout) \
            or len(layout[0]) not in (4, 5):
        raise ValueError(f"the conv template handles 2-D and 3-D convolutions named by "
                         f"strings (NHWC/HWIO, NCHW/OIHW, NDHWC/DHWIO, NCDHW/OIDHW), not "
                         f"{dimension_numbers!r}")
    if any(s != 1 for s in window_strides) or any(
            d is not None and any(e != 1 for e in d) for d in (lhs_dilation, rhs_dilation)) \
            or feature_group_count != 1:
        raise ValueError("the conv template handles stride 1, no dilation, one group")
    if len(layout[0]) == 5:
        if mean is not None or norm:
            raise ValueError("a 3-D convolution takes in elementwise steps only")
        return _conv3d(lhs, rhs, padding, layout, epilogue, params, channel_axes)
    x = jnp.transpose(lhs, [layout[0].index(c) for c in "NHWC"])
    w = jnp.transpose(rhs, [layout[1].index(c) for c in "HWIO"])
    kh, kw = w.shape[0], w.shape[1]
    if isinstance(padding, str):
        if padding.upper() == "SAME":
            ph, pw = ((kh - 1) // 2, kh // 2), ((kw - 1) // 2, kw // 2)
        elif padding.upper() == "VALID":
            ph = pw = (0, 0)
        else:
            raise ValueError(f"padding {padding!r}")
    else:
        ph, pw = (tuple(p) for p in padding)
    n, h, wd, c = x.shape
    oh, ow = h + sum(ph) - kh + 1, wd + sum(pw) - kw + 1
    # The image's columns in whole (16-row) sublane tiles, so that a slab of rows
    # flattens for free: no padding at all for a VALID convolution over such a width,
    # whose output rows the blocks divide (measured on v5e, 18k at 128x64x128x128: the
    # pad before the kernel and the slice after it took 3.0 of the program's 9.4 ms).
    cols = -(-(wd + sum(pw)) // 16) * 16
    o = w.shape[-1]
    out_dtype = jnp.result_type(lhs.dtype, rhs.dtype)
    if LANES and norm != "NHW":  # (a batch's statistics span the images: channels on lanes)
        lanes = _conv_lanes(
            jnp.transpose(lhs, [layout[0].index(ch) for ch in "NCHW"]),
            jnp.transpose(rhs, [layout[1].index(ch) for ch in "OIHW"]), ph, pw, layout[2],
            epilogue, [_per_channel(p, a, o) for p, a in zip(params, channel_axes, strict=True)],
            mean, norm, norm_epilogue,
            [_per_channel(p, a, o) for p, a in zip(norm_params, norm_channel_axes,
                                                    strict=True)],
            norm_groups, norm_closing)
        if lanes is not None:
            return lanes if mean is None else _image_mean(lanes, mean, oh, ow, out_dtype)
    # a norm's first pass: float32 blocks, or (NORM_F32 off) the output's dtype
    y_dtype = jnp.float32 if norm and NORM_F32 else out_dtype
    item = x.dtype.itemsize

    packed = PACK_TAPS  # column taps side by side in one product

    def need(rows, extra_rows):
        """VMEM for blocks of ``rows``: the image and the weights (double-buffered, the
        channels padded to whole 128-lane vregs: C_in = 64 takes 128), the output block,
        three float32 products and the row taps side by side."""
        lanes, o_lanes = -(-c // 128) * 128, -(-o // 128) * 128
        image = (h + sum(ph) + extra_rows) * cols * lanes * item
        taps_lanes = -(-kh * c // 128) * 128
        block = 0 if mean is not None else rows * ow * o * jnp.dtype(
            y_dtype if norm else out_dtype).itemsize
        return 2 * (image + kh * kw * c * o * item + block) \
            + 3 * rows * cols * o_lanes * 4 + rows * cols * taps_lanes * item \
            + (rows * cols * -(-kw * o // 128) * 128 * 4 if packed else 0)

    rows, clamp, extra_rows = _block_rows(oh, mean is not None, need)
    oh_pad = oh + extra_rows
    if ph != (0, 0) or extra_rows or cols != wd:
        x = jnp.pad(x, ((0, 0), (ph[0], ph[1] + extra_rows),
                        (pw[0], cols - wd - pw[0]), (0, 0)))
    # Every row tap side by side in the contraction, per column tap: (kw, kh * c, o). As
    # few MXU passes as any grouping of the taps (ceil(kh * c / 128) per column tap; v5e
    # estimates of a probe of 4 images of 32x128 outputs, 128 channels out: pairs of taps
    # and all three within 5% at c = 64, the same cycles as one tap a pass at c = 128),
    # and the same program whatever c is, so the check shapes' kernel (fewer channels)
    # is the one that runs at production.
    w = w.transpose(1, 0, 2, 3).reshape(kw, kh * c, o)
    if packed:
        w = w.transpose(1, 0, 2).reshape(kh * c, kw * o)
    rows_in = [_per_channel(p, a, o) for p, a in zip(params, channel_axes, strict=True)]
    norm_in = [_per_channel(p, a, o) for p, a in zip(norm_params, norm_channel_axes,
                                                      strict=True)]
    if norm:  # the block and its image's running mean and M2 per channel
        stat = jax.ShapeDtypeStruct((n, 1, o), jnp.float32)
        out_shape = (jax.ShapeDtypeStruct((n, oh_pad, ow, o), y_dtype), stat, stat)
        out_spec = (pl.BlockSpec((1, rows, ow, o), lambda b, r: (b, r, 0, 0)),
                    pl.BlockSpec((1, 1, o), lambda b, r: (b, 0, 0)),
                    pl.BlockSpec((1, 1, o), lambda b, r: (b, 0, 0)))
    elif mean is not None:  # one (1, o) float32 sum per image, added to over its rows
        out_shape = jax.ShapeDtypeStruct((n, 1, o), jnp.float32)
        out_spec = pl.BlockSpec((1, 1, o), lambda b, r: (b, 0, 0))
    else:
        out_shape = jax.ShapeDtypeStruct((n, oh_pad, ow, o), out_dtype)
        out_spec = pl.BlockSpec((1, rows, ow, o), lambda b, r: (b, r, 0, 0))
    out = pl.pallas_call(
        functools.partial(_conv_body, kd=1, kh=kh, kw=kw, rows=rows, epilogue=epilogue,
                          mean=mean is not None, oh=oh, ow=ow, clamp=clamp,
                          stats=bool(norm)),
        out_shape=out_shape,
        grid=(n, -(-oh_pad // rows)),
        in_specs=[pl.BlockSpec((1, *x.shape[1:]), lambda b, r: (b, 0, 0, 0)),
                  pl.BlockSpec(w.shape, lambda b, r: (0,) * w.ndim)]
                 + [pl.BlockSpec((1, o), lambda b, r: (0, 0)) for _ in rows_in],
        out_specs=out_spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=_vmem_limit(
                                                 need(rows, extra_rows))),
    )(x, w, *rows_in)
    if norm:
        y, mu, m2 = out
        if norm == "G":
            mu, m2 = _group_statistics(mu, m2, int(norm_groups), float(oh * ow))
        out = _norm(y, mu, m2, norm_epilogue, norm_in, "NHW" if norm == "NHW" else "HW", oh,
                    out_dtype, norm_closing)
    elif mean is not None:
        return _image_mean(out, mean, oh, ow, out_dtype)
    if oh_pad != oh:
        out = out[:, :oh]
    return jnp.transpose(out, ["NHWC".index(ch) for ch in layout[2]])
'''

_CONV_END = '''

# The reference, its convolution done by the kernel above.
'''
