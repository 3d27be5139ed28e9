"""The matmul template's online row reduction, as kernel text: an epilogue that reduces
each row (a row sum, a mean, a max, a logsumexp) carried across the column blocks in a
(BLOCK_M, 1) scratch, so the product is tiled like a plain matmul and never written to
HBM. ``W_BLOCK_2D`` and ``W_BYTES`` are the template's own weight block and its size,
``DOT_PART`` its product of a part of the tile's rows."""

from __future__ import annotations

ONLINE_ROW_REDUCTION = '''

_PARTS = {"sum": jnp.sum, "mean": jnp.sum, "max": jnp.max, "min": jnp.min}
_COMBINE = {"sum": jnp.add, "mean": jnp.add, "max": jnp.maximum, "min": jnp.minimum}


def _online_body(pre, post, kind, n_total, parts, rows_apart, x_ref, w_ref, *refs):
    # one (BLOCK_M, BLOCK_N) tile of the product per (i, j): the part of the epilogue
    # before the reduction on it, its partial reduction folded into red_ref (for a
    # logsumexp the running max, with the running sum of exponentials in sum_ref), and at
    # the last column block the rest of the epilogue on the reduced column. As in _body,
    # the last k step runs the tile's rows in ``parts`` parts (``rows_apart``: for each
    # operand whether its block's rows are the tile's), in a loop
    *extra_refs, o_ref, acc_ref, red_ref, sum_ref = refs
    j = pl.program_id(2)

    @pl.when(_accumulate_but_last(x_ref, w_ref, acc_ref))
    def _tile():
        rows = acc_ref.shape[0] // parts

        def one(c, carry):
            part = pl.ds(pl.multiple_of(c * rows, rows), rows)
            acc = acc_ref[part, :] + DOT_PART
            ops = [r[part, :] if s else r[...] for r, s in zip(extra_refs, rows_apart)]
            t = pre(acc, *ops).astype(jnp.float32)
            if kind == "logsumexp":
                top = jnp.max(t, axis=-1, keepdims=True)
                new = jnp.where(j == 0, top, jnp.maximum(red_ref[part, :], top))
                carried = jnp.where(j == 0, 0.0,
                                    sum_ref[part, :] * jnp.exp(red_ref[part, :] - new))
                sum_ref[part, :] = carried + jnp.sum(jnp.exp(t - new), axis=-1, keepdims=True)
                red_ref[part, :] = new
            else:
                reduced = _PARTS[kind](t, axis=-1, keepdims=True)
                red_ref[part, :] = jnp.where(j == 0, reduced,
                                           _COMBINE[kind](red_ref[part, :], reduced))

            @pl.when(j == pl.num_programs(2) - 1)
            def _finish():
                red = red_ref[part, :]
                if kind == "mean":
                    red = red / n_total
                elif kind == "logsumexp":
                    red = red + jnp.log(sum_ref[part, :])
                out = post(red, *ops)
                o_ref[part, :] = out.reshape(rows, o_ref.shape[-1]).astype(o_ref.dtype)
            return carry

        jax.lax.fori_loop(0, parts, one, 0, unroll=True)


def _online(static, x, w, extras, m, n, k, full):
    """The row-reducing epilogue carried across column blocks (ROW_REDUCTION): blocks
    as a plain matmul's, the product never stored. None where the part before the
    reduction mixes columns, the part after it needs more than the reduced column, the
    blocks do not divide the product, or they do not fit VMEM: the caller then keeps
    whole rows in a block (or the two kernels of SPLIT_REDUCING). In two kernels
    MaxKernel's f32 36k (4096x8192 @ 8192x8192, sigmoid, row sum) measured 0.93x of XLA
    on a v5e, the float32 product written and read back."""
    pre = _bound(static, 0, None, _epilogue_pre)
    post = _bound(static, 0, None, _epilogue_post)
    if len(full.shape) not in (1, 2) or full.shape[0] != m:
        return None
    r, f32 = (full.shape[1] if len(full.shape) == 2 else 1), jnp.float32
    bm, bn, bk = min(BLOCK_M, m), min(BLOCK_N, n), _k_block(k, BLOCK_K)
    item = x.dtype.itemsize

    def shapes(bm, bn):
        return [jax.ShapeDtypeStruct((bm if a.shape[0] == m else 1, bn if a.shape[1] == n else 1)
                                     if _tiled(a, m, n) else a.shape, a.dtype) for a in extras]

    try:
        # (a pooling of the columns mixes nothing here: its windows do not straddle the
        # column blocks, or _lean's _pool refuses the tile, and the reduction after it
        # takes all the pooled columns, of fewer per tile: 49k's AvgPool1d)
        plain = _bound(static, 0, None, _epilogue_pre, plain=True)
        rows_mixed, cols_mixed = _mixing(plain, jax.ShapeDtypeStruct((bm, n), f32),
                                         *shapes(bm, n), pooled=True)
        # a pooling is a product on the MXU too (_pool): the last step's parts would only
        # take turns on it (49k, v5e: 4.78 Mcycles whole, 4.84 in 4 parts)
        pooling = "reduce_window" in str(jax.make_jaxpr(plain)(
            jax.ShapeDtypeStruct((bm, bn), f32), *shapes(bm, bn)))
        tile = jax.eval_shape(pre, jax.ShapeDtypeStruct((bm, bn), f32), *shapes(bm, bn))
        width = jax.eval_shape(pre, jax.ShapeDtypeStruct((bm, n), f32), *shapes(bm, n)).shape
        out = jax.eval_shape(post, jax.ShapeDtypeStruct((bm, 1), f32), *shapes(bm, bn))
    except (TypeError, ValueError):  # a part that does not stand alone on a tile
        return None
    if rows_mixed or cols_mixed or len(tile.shape) != 2 or tile.shape[0] != bm \\
            or tile.shape[1] * (n // bn) != width[-1] or out.size != bm * r:
        return None

    def need(bm, bn, bk):
        blocks = (bm * bk + W_BYTES) * item + sum(s.size * s.dtype.itemsize
                                                  for s in shapes(bm, bn))
        working = _working(pre, jax.ShapeDtypeStruct((bm, bn), f32), *shapes(bm, bn))
        # blocks double-buffered, the accumulator, the tile's intermediates, the output
        # block and the two (bm, 1) scratch columns (each padded to 128 lanes)
        return 2 * blocks + bm * bn * 4 + working + 2 * bm * 128 * 4 * (2 + r)

    while need(bm, bn, bk) > VMEM_CAP and bk > 512 and k % (bk // 2) == 0:
        bk //= 2
    while need(bm, bn, bk) > VMEM_CAP and bn > 128 and n % (bn // 2) == 0:
        bn //= 2
    while need(bm, bn, bk) > VMEM_CAP and bm > 8 and m % (bm // 2) == 0:
        bm //= 2
    if m % bm or n % bn or k % bk or need(bm, bn, bk) > VMEM_CAP:
        return None
    try:  # the tile the blocks shrank to (a pooling's windows must not straddle it)
        jax.eval_shape(pre, jax.ShapeDtypeStruct((bm, bn), f32), *shapes(bm, bn))
    except ValueError:
        return None
    rows_apart = tuple(_tiled(a, m, n) and a.shape[0] == m for a in extras)
    parts = 1 if pooling or bm % (16 * LAST_PARTS) else LAST_PARTS
    return pl.pallas_call(
        functools.partial(_online_body, pre, post, ROW_REDUCTION, width[-1], parts,
                          rows_apart),
        out_shape=jax.ShapeDtypeStruct((m, r), full.dtype),
        grid=(1, m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((None, bm, bk), lambda b, i, j, kk: (b, i, kk)),
                  W_BLOCK_2D,
                  *(_operand_spec(a, m, n, bm, bn) for a in extras)],
        out_specs=pl.BlockSpec((bm, r), lambda b, i, j, kk: (i, 0)),
        scratch_shapes=[pltpu.VMEM((bm, bn), f32), pltpu.VMEM((bm, 1), f32),
                        pltpu.VMEM((bm, 1), f32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(need(bm, bn, bk))),
    )(x, w, *extras)
'''
