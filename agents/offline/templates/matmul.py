"""The tiled matmul with a fused epilogue: the reference's product cut out with ``ast``,
accumulated in float32 over a (m, n, k) grid, the rest of the reference applied to each
finished tile."""

from __future__ import annotations

import ast
import re

from tilewright.agents.base import TaskBrief
from tilewright.agents.offline.reference_reading import (
    _IMPORTS,
    TemplateError,
    _preamble,
    defining_source,
    reference_parts,
)
from tilewright.agents.offline.templates.kernel_text import (
    EPILOGUE_MIXING,
    F32_PASSES_HELPERS,
    F32_PASSES_TUNABLE,
    VMEM_HELPERS,
    highest,
)
from tilewright.agents.offline.templates.lean import LEAN_EPILOGUE
from tilewright.agents.offline.templates.matmul_cut import (
    CutMatmul,
    may_mix_columns,
    sizes_as_written,
    split_chain,
    split_row_reduction,
)
from tilewright.agents.offline.templates.matmul_online import ONLINE_ROW_REDUCTION
from tilewright.agents.offline.templates.matmul_sizes import (
    _SIZE_HELPER,
    _SIZE_SET,
    SPLIT_COLS_FROM,
    SPLIT_ROWS_FROM,
    _matmul_blocks,
    _narrow_operands,
    _production_cols,
    _production_rows,
)


def matmul(brief: TaskBrief) -> tuple[str, str]:
    head, fn, helpers = reference_parts(brief)
    fn = ast.parse(ast.get_source_segment(defining_source(brief)[0], fn)
                   or ast.unparse(fn)).body[0]
    fn, sized = sizes_as_written(brief, fn)
    cutter = CutMatmul()
    fn = cutter.visit(fn)
    if cutter.operands is None:
        raise TemplateError("the matmul template needs the reference to compute `x @ w` or "
                            "`jnp.dot(x, w)` of two of its arguments")
    params = [a.arg for a in fn.args.args]
    lhs, rhs = cutter.operands
    if lhs not in params or rhs not in params:
        raise TemplateError(f"the matmul operands `{lhs}`, `{rhs}` must be arguments of the reference")
    rest = [p for p in params if p not in (lhs, rhs)]
    # A second product in the epilogue (an MLP's h @ w2): two stages of the same kernel,
    # the first writing h, the second its product with the rest (split_chain)
    chain = split_chain(fn, params, cutter) if not sized else None
    if chain is None:
        fn.name = "_epilogue"
        fn.args.args = [ast.arg("_acc")] + [a for a in fn.args.args if a.arg in rest]
        ast.fix_missing_locations(fn)
        epilogue = ast.unparse(fn)
        rests: tuple[tuple[str, ...], ...] = (tuple(rest),)
        online = split_row_reduction(fn)
        if online is not None:
            pre, reduction, post = online
            epilogue += ("\n\n\n# The same epilogue taken apart at its row reduction (a "
                         f"{reduction}), carried across column blocks: see _online.\n"
                         + ast.unparse(pre) + "\n\n\n" + ast.unparse(post))
        stages = f"    return _stage(0, x, w, {_tuple(rest)})"
    else:
        online = None
        one, two, w2 = chain
        rests = tuple(tuple(a.arg for a in f.args.args[1:]) for f in (one, two))
        epilogue = (ast.unparse(one) + "\n\n\n# The rest of the reference, on its second "
                    f"product `_acc` = h @ {w2}.\n" + ast.unparse(two))
        stages = (f"    h = _stage(0, x, w, {_tuple(rests[0])})\n"
                  f"    return _stage(1, h, {w2}, {_tuple(rests[1])})")
    # An epilogue that views the tile with size-1 axes added (an instance norm over 1x1
    # images, 26k) runs without them: Mosaic refuses such a shape cast (see lean.py)
    # (and one that pools windows of columns, 49k: reduce_window, which Mosaic lacks)
    lean = re.search(r"expand_dims|squeeze|None\]|newaxis|reduce_window", epilogue) is not None
    order = ", ".join(params)
    unpack = f"\n    x, w = {lhs}, {rhs}" if (lhs, rhs) != ("x", "w") else ""
    bm, bn, bk = _matmul_blocks(brief)
    split_rows = _production_rows(brief, params.index(lhs)) >= SPLIT_ROWS_FROM
    split_cols = _production_cols(brief, params.index(rhs),
                                  cutter.transposed) >= SPLIT_COLS_FROM
    # a row-reducing epilogue too, when the operands are 4-byte (below)
    split_reducing = split_cols and not _narrow_operands(brief)
    # Below that width the split is a switch the tuner measures: MaxKernel's f32 29k (a
    # group norm of 8192x4096 @ 4096x4096) left its fused kernel 256-row blocks, w read 32
    # times: 0.95x of XLA on a v5e, est. 0.83x; in two kernels est. 1.12x
    # (not where the row reduction is carried online: the product is then never stored)
    split_switch = not split_cols and online is None and may_mix_columns(fn)
    # the reference's precision, for float32 operands (Mosaic takes it for f32 only);
    # at HIGHEST, in 6 or 3 MXU passes (F32_PASSES, a switch the tuner measures; none for
    # 16-bit operands, where it changes nothing: JAXBench's bf16 21k spent a proposal on it)
    passes = highest(cutter.precision) and not _narrow_operands(brief)
    switches = ((("F32_PASSES",) if passes else ()) + (("SPLIT_COLS",) if split_switch else ())
                + (("ROW_REDUCTION",) if online is not None else ()))
    precision = (", precision=PRECISION if x_ref.dtype == jnp.float32 else None"
                 if cutter.precision else "")
    if cutter.transposed:  # w is (n, k): contract both operands' last axes on the MXU
        dot = ("jax.lax.dot_general(x_ref[...], w_ref[...], (((1,), (1,)), ((), ())),\n"
               f"                                  preferred_element_type=jnp.float32{precision})")
        n_of_w = "w.shape[-2]"
        w_block = "pl.BlockSpec((None, bn, bk), lambda b, i, j, kk: (b, j, kk))"
        w_block_2d = "pl.BlockSpec((bn, bk), lambda b, i, j, kk: (j, kk))"
        w_bytes = "bn * bk"
    else:
        dot = f"jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32{precision})"
        n_of_w = "w.shape[-1]"
        w_block = "pl.BlockSpec((None, bk, bn), lambda b, i, j, kk: (b, kk, j))"
        w_block_2d = "pl.BlockSpec((bk, bn), lambda b, i, j, kk: (kk, j))"
        w_bytes = "bk * bn"
    if passes:
        dims = "(((1,), (1,)), ((), ()))" if cutter.transposed else "(((1,), (0,)), ((), ()))"
        dot = f"_product(x_ref[...], w_ref[...], {dims})"
    dot_part = dot.replace("x_ref[...]", "x_ref[part, :]")  # a part of the tile's rows
    assert dot_part != dot
    src = _preamble(brief, "tiled matmul with a fused epilogue") + _IMPORTS + "\n"
    src += "\n\n\n".join(x for x in ("# From the task's reference.\n" + head if head else "",
                                     *helpers) if x)
    src += f"""


# The reference with its matmul replaced by the accumulated tile `_acc`.
{epilogue}
{_SIZE_HELPER if sized else ""}

{"PRECISION = " + cutter.precision + "  # the reference's, kept on float32 operands"
 if cutter.precision else ""}
BLOCK_M = {bm}
BLOCK_N = {bn}
BLOCK_K = {bk}
# The last k step runs the tile's rows in this many parts, each one's product and
# epilogue in turn, so the compiler overlaps one part's epilogue (VPU, EUP) with the
# next part's MXU work; in one piece the epilogue waits for the whole tile's product.
# TPU compiler, v5e, JAXBench's 47k (bf16 4096x8192 @ 8192x8192, four activations,
# 1024x1024x2048 blocks): 4.53 Mcycles in one piece (est. 0.96x of XLA), 4.31 in 2 or 4
# parts (1.01x), 4.34 in 8; 36k's row sum carried online (_online_body), 1024x1024x512:
# 4.53 -> 4.45 Mcycles.
LAST_PARTS = 4
# An epilogue that mixes the rows (a batch norm) runs as a second kernel on whole columns
# when the product is this tall at production ({SPLIT_ROWS_FROM} rows or more); one that
# mixes the columns (a group norm), on whole rows when it is this wide
# ({SPLIT_COLS_FROM} columns or more), and where it is narrower as the tuner measures
# (SPLIT_COLS is then a switch): see _split.
SPLIT_ROWS = {split_rows}
SPLIT_COLS = {split_cols}
# An epilogue that reduces each row (a row sum, a logsumexp) of such a wide product, when
# its operands are float32: whole rows of w in a block leave room for 128 rows, and w is
# read 32 times (MaxKernel's f32 36k, 4096x8192 @ 8192x8192: 0.28x of XLA on a v5e; in
# two kernels est. 0.97x). In bf16 they leave 256 rows, as fast as XLA in one kernel
# (JAXBench's bf16 36k at the same size: 0.99x measured on a v5e).
SPLIT_REDUCING = {"SPLIT_COLS  # narrower: as the SPLIT_COLS switch says" if split_switch
                   else split_reducing}
# The reference reduces each row once: the reduction carried across column blocks, the
# product tiled as a plain matmul's and never stored (_online); None: whole rows, above
# (a switch the tuner measures: in bf16 whole rows leave room for 256 of them).
ROW_REDUCTION = {(online[1] if online else None)!r}
{"F32_PASSES = 6  # MXU passes per float32 product: 6 (HIGHEST) or 3 (see _product)"
 if passes else ""}
TUNABLES = {{"BLOCK_M": [128, 256, 512, 1024, 2048], "BLOCK_N": [128, 256, 512, 1024, 2048],
             "BLOCK_K": [128, 256, 512, 1024, 2048]{", " + F32_PASSES_TUNABLE if passes else ""}{
                 ', "SPLIT_COLS": [False, True]' if split_switch else ""}{
                 f', "ROW_REDUCTION": [{online[1]!r}, None]' if online is not None else ""}}}
{f'TUNABLE_SWITCHES = {switches!r}  # how the product is made, not a block size'
 if switches else ""}
""" + VMEM_HELPERS + (F32_PASSES_HELPERS if passes else "") + EPILOGUE_MIXING \
        + (LEAN_EPILOGUE if lean else "") + f"""

def _accumulate(x_ref, w_ref, acc_ref):
    \"\"\"The float32 accumulator plus this k step's product (zeroed at the first step);
    True at the last step, when it holds the whole product.\"\"\"
    k = pl.program_id(3)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += {dot}
    return k == pl.num_programs(3) - 1


def _accumulate_but_last(x_ref, w_ref, acc_ref):
    \"\"\"As _accumulate, but the last step's product is left to the caller (added in
    parts of rows, each with its epilogue): True at the last step.\"\"\"
    k = pl.program_id(3)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(k < pl.num_programs(3) - 1)
    def _step():
        acc_ref[...] += {dot}

    return k == pl.num_programs(3) - 1


def _body(epilogue, parts, rows_apart, x_ref, w_ref, *refs):
    # ``parts``: how many parts of rows the last k step runs in (1: the tile whole);
    # ``rows_apart``: for each operand whether its block's rows are the tile's (sliced
    # with a part), None where the epilogue mixes rows (one part, its output block not
    # the tile's rows). A loop, so that the kernel's body is the same at every shape.
    *extra_refs, o_ref, acc_ref = refs

    @pl.when(_accumulate_but_last(x_ref, w_ref, acc_ref))
    def _finish():
        rows = acc_ref.shape[0] // parts

        def one(c, carry):
            part = pl.ds(pl.multiple_of(c * rows, rows), rows)
            acc = acc_ref[part, :] + {dot_part}
            if rows_apart is None:
                out = epilogue(acc, *(r[...] for r in extra_refs))
                o_ref[...] = out.reshape(o_ref.shape).astype(o_ref.dtype)
            else:
                out = epilogue(acc, *(r[part, :] if split else r[...]
                                      for r, split in zip(extra_refs, rows_apart)))
                o_ref[part, :] = out.reshape(rows, o_ref.shape[-1]).astype(o_ref.dtype)
            return carry

        jax.lax.fori_loop(0, parts, one, 0, unroll=True)


def _product_body(x_ref, w_ref, o_ref, acc_ref):
    # the product alone, for an epilogue that mixes one axis (_split)
    @pl.when(_accumulate(x_ref, w_ref, acc_ref))
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def _epilogue_body(epilogue, y_ref, *refs):
    # the epilogue on a block of whole columns (every row of them) or of whole rows
    *extra_refs, o_ref = refs
    out = epilogue(y_ref[...].astype(jnp.float32), *(r[...] for r in extra_refs))
    o_ref[...] = out.astype(o_ref.dtype)


def _column_spec(a, m, n, cols):
    if not _tiled(a, m, n):
        return pl.BlockSpec(a.shape, lambda j: (0,) * a.ndim)
    return pl.BlockSpec((a.shape[0], cols if a.shape[1] == n else 1),
                        lambda j: (0, j if a.shape[1] == n else 0))


def _row_spec(a, m, n, rows):
    if not _tiled(a, m, n):
        return pl.BlockSpec(a.shape, lambda i: (0,) * a.ndim)
    return pl.BlockSpec((rows if a.shape[0] == m else 1, a.shape[1]),
                        lambda i: (i if a.shape[0] == m else 0, 0))


def _split(epilogue, x, w, extras, m, n, k, out_dtype, whole, out_cols=None):
    \"\"\"An epilogue that mixes one axis of a large product, in two kernels: the
    product tiled as a plain matmul (stored in float32), then the epilogue on blocks of
    ``whole`` columns (a batch norm's column statistics) or rows (a group norm's). In
    one kernel that whole axis would be one block, leaving room for only narrow blocks
    of the other, each re-reading an operand: 16384 rows left 128 columns, x read 64
    times (0.54x of XLA measured on a v5e); 8192 columns of a group norm of 32-wide
    groups (each padded to 128 lanes) left 64 rows, w read 64 times (0.33x). None when
    even the narrowest block of the other axis would not fit VMEM: the caller keeps
    the fused kernel. ``out_cols``: the epilogue's output columns on whole rows, where it
    reduces them (a row sum: 1; MaxKernel's f32 36k kept all 8192 columns in one block,
    w read 32 times: 0.28x of XLA on a v5e).\"\"\"
    out_cols = n if out_cols is None else out_cols
    # the product kept in float32, as the fused kernel hands its accumulator to the
    # epilogue: stored in bf16 (the dtype of the reference's own product) a batch norm of
    # 16384 rows was off by up to 2.7% in 1.5% of its values on a v5e (tolerance 1%)
    y_dtype = jnp.float32
    item, y_item = x.dtype.itemsize, 4
    out_item = jnp.dtype(out_dtype).itemsize

    def whole_need(width):  # a block of `width` of the other axis, all of `whole`
        rows, cols = (m, width) if whole == "columns" else (width, n)
        shapes = [jax.ShapeDtypeStruct((rows if a.shape[0] == m else 1,
                                        cols if a.shape[1] == n else 1), a.dtype)
                  if _tiled(a, m, n) else a for a in extras]
        working = _working(epilogue, jax.ShapeDtypeStruct((rows, cols), jnp.float32),
                           *shapes)
        return 2 * rows * cols * (y_item + out_item) + 2 * sum(
            s.size * s.dtype.itemsize for s in shapes) + working

    # 128 lanes; else 8 sublanes of f32 (16 of a 16-bit output, whose rows pack in pairs)
    along, first = (n, 128) if whole == "columns" else (m, max(8, 32 // out_item))
    if along % first or whole_need(first) > VMEM_CAP:
        return None
    width = first  # wider while it fits and a block stays under 8 MiB of f32
    while (along % (width * 2) == 0 and (m * n // along) * width * 2 * 4 <= 8 << 20
           and whole_need(width * 2) <= VMEM_CAP):
        width *= 2
    bm, bn, bk = min(BLOCK_M, m), min(BLOCK_N, n), _k_block(k, BLOCK_K)

    def need(bm, bn, bk):
        return 2 * (bm * bk + {w_bytes}) * item + bm * bn * 4 + 2 * bm * bn * y_item

    while need(bm, bn, bk) > VMEM_CAP and bk > 128 and k % (bk // 2) == 0:
        bk //= 2
    while need(bm, bn, bk) > VMEM_CAP and bm > 8 and m % (bm // 2) == 0:
        bm //= 2
    while need(bm, bn, bk) > VMEM_CAP and bn > 128 and n % (bn // 2) == 0:
        bn //= 2
    y = pl.pallas_call(
        _product_body,
        out_shape=jax.ShapeDtypeStruct((m, n), y_dtype),
        grid=(1, pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[pl.BlockSpec((None, bm, bk), lambda b, i, j, kk: (b, i, kk)),
                  {w_block_2d}],
        out_specs=pl.BlockSpec((bm, bn), lambda b, i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(need(bm, bn, bk))),
    )(x, w)
    if whole == "columns":
        block, index = (m, width), lambda j: (0, j)
        specs = [_column_spec(a, m, n, width) for a in extras]
    else:
        block, index = (width, n), lambda i: (i, 0)
        specs = [_row_spec(a, m, n, width) for a in extras]
    out_block = block if whole == "columns" else (width, out_cols)
    return pl.pallas_call(
        functools.partial(_epilogue_body, epilogue),
        out_shape=jax.ShapeDtypeStruct((m, out_cols), out_dtype),
        grid=(along // width,),
        in_specs=[pl.BlockSpec(block, index), *specs],
        out_specs=pl.BlockSpec(out_block, index),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel",),
            vmem_limit_bytes=_vmem_limit(whole_need(width))),
    )(y, *extras)


def _k_block(k, want):
    \"\"\"A K block that divides k: a ragged last K block would add padding into the sum.\"\"\"
    bk = min(want, k)
    while k % bk and bk > 128:
        bk //= 2
    return bk if k % bk == 0 and (bk % 128 == 0 or bk == k) else k


def _as_operand(a, m, n):
    \"\"\"Epilogue operands as 2-D: (m, n) tiles, (1, n) rows, (m, 1) columns; any other
    array (a second layer's weight and bias) goes whole into every step, a vector as one
    row (it broadcasts along the last axis, as in the reference).\"\"\"
    a = a.reshape(1, -1) if a.ndim == 1 else a
    return a.reshape(1, 1) if a.size == 1 else a


def _tiled(a, m, n):
    return a.shape in ((m, n), (1, n), (m, 1), (1, 1))


def _operand_spec(a, m, n, bm, bn):
    if not _tiled(a, m, n):
        return pl.BlockSpec(a.shape, lambda b, i, j, kk: (0,) * a.ndim)
    rows = bm if a.shape[0] == m else 1
    cols = bn if a.shape[1] == n else 1
    return pl.BlockSpec((rows, cols), lambda b, i, j, kk: (i if rows == bm else 0,
                                                           j if cols == bn else 0))


def _bound(static, stage, dtype, fn=None, plain=False):
    \"\"\"The stage's epilogue with the reference's Python scalars (``static``: name ->
    value) in their places and the arrays, in order, in the others; a stage that feeds
    the next stores its result in ``dtype`` (the operands'), as the reference's own
    product would be. ``plain``: as the reference wrote it (to read what it mixes).\"\"\"
    fixed, names, fn = dict(static), _RESTS[stage], fn or _EPILOGUES[stage]

    def epilogue(acc, *arrays):
        rest = iter(arrays)
        out = fn(acc, *(fixed[n] if n in fixed else next(rest) for n in names))
        return out if dtype is None else out.astype(dtype)
    return {"epilogue if plain else _lean(epilogue)  # without the size-1 axes it adds"
            if lean else "epilogue"}


_EPILOGUES = {"(_epilogue,)" if chain is None else "(_epilogue, _epilogue_2)"}
_RESTS = {rests!r}  # each epilogue's arguments beside its product


def {brief.entry}({order}):{unpack}
{stages}


def _stage(stage, x, w, rest):
    # The reference's Python scalars (a task's static arguments: a group count) stay Python
    # values, bound to the epilogue: traced, a reshape by them is not concrete (MaxKernel's
    # 45k: x.reshape(batch, num_groups, out_features // num_groups))
    static = tuple((n, a) for n, a in zip(_RESTS[stage], rest) if not hasattr(a, "shape"))
    return _matmul(stage, static, x, w, *(a for a in rest if hasattr(a, "shape")))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _matmul(stage, static, x, w, *operands):
    epilogue = _bound(static, stage, x.dtype if stage + 1 < len(_EPILOGUES) else None)
    # A batched product ((g, m, k) by (g, k, n)) walks the groups as the outer grid axis;
    # otherwise the lhs's leading axes are flattened into the rows.
    batched = w.ndim == 3
    if batched and (x.ndim != 3 or x.shape[0] != w.shape[0]):
        raise ValueError(f"x {{x.shape}} by w {{w.shape}}: a batched product needs (g, m, k) "
                         "by (g, k, n)")
    g = x.shape[0] if batched else 1
    lead = x.shape[:-1]
    x = x if batched else x.reshape(1, -1, x.shape[-1])
    m, k = x.shape[1:]
    n = {n_of_w}{_SIZE_SET if sized else ""}
    extras = [_as_operand(a.reshape(m, n) if a.ndim > 2 and a.size == m * n and not batched
                          else a, m, n) for a in operands]
    # Which axes the epilogue reduces or moves (a row sum, a softmax, a batch norm): an
    # axis it mixes is not split, its whole length is one block.
    rows_mixed, cols_mixed = _mixing(epilogue, jax.ShapeDtypeStruct((m, n), jnp.float32),
                                     *extras)
    if batched and (rows_mixed or cols_mixed):
        raise ValueError("the epilogue of a batched product reduces an axis: this template "
                         "fuses only elementwise epilogues there")
    bm = m if rows_mixed else min(BLOCK_M, m)
    bn = n if cols_mixed else min(BLOCK_N, n)
    bk = _k_block(k, BLOCK_K)
    item = x.dtype.itemsize

    def tile_shapes(bm, bn):
        return [jax.ShapeDtypeStruct((bm if a.shape[0] == m else 1, bn if a.shape[1] == n else 1)
                                     if _tiled(a, m, n) else a.shape, a.dtype) for a in extras]

    full = jax.eval_shape(epilogue, jax.ShapeDtypeStruct((m, n), jnp.float32), *extras)

    workings = {{}}  # (bm, bn) -> the epilogue's working bytes: one trace per tile size

    def need(bm, bn, bk):
        # double-buffered x, w, operand and output blocks, the f32 accumulator, and the
        # epilogue's intermediates on one tile (_working)
        if (bm, bn) not in workings:
            workings[bm, bn] = _working(epilogue, jax.ShapeDtypeStruct((bm, bn), jnp.float32),
                                        *tile_shapes(bm, bn))
        working = workings[bm, bn]
        blocks = (bm * bk + {w_bytes}) * item + sum(
            s.size * s.dtype.itemsize for s in tile_shapes(bm, bn))
        return 2 * blocks + 2 * bm * bn * 4 + working

    # Shrink K first (it moves no extra HBM traffic), down to 512, then the axes the
    # epilogue leaves free down to 128, then K to 128 and those axes further: a K block of
    # 128 does too little per step (36k's row sum over 8192 columns: 256x8192x128 blocks
    # estimated 7% slower on a v5e than 256x8192x512, which fits as well).
    for k_floor, floor in ((512, 128), (128, 8)):
        while need(bm, bn, bk) > VMEM_CAP and bk > k_floor and k % (bk // 2) == 0:
            bk //= 2
        while (need(bm, bn, bk) > VMEM_CAP and not rows_mixed and bm > floor
               and m % (bm // 2) == 0):
            bm //= 2
        while (need(bm, bn, bk) > VMEM_CAP and not cols_mixed and bn > max(floor, 128)
               and n % (bn // 2) == 0):
            bn //= 2
    if ROW_REDUCTION and cols_mixed and not rows_mixed and not batched and len(_EPILOGUES) == 1:
        online = _online(static, x, w, extras, m, n, k, full)
        if online is not None:
            return online.reshape(full.shape)
    # a row-wise epilogue that reduces each row (a row sum, a logsumexp): (m, r)
    row_reduced = (SPLIT_REDUCING and cols_mixed and not rows_mixed
                   and len(full.shape) == 2 and full.shape[0] == m)
    if rows_mixed != cols_mixed and not batched and (full.shape == (m, n) or row_reduced) \
            and (SPLIT_ROWS if rows_mixed else SPLIT_COLS):
        # the mixed axis whole in one block would leave room for narrow blocks of the
        # other only, each reading an operand again: the product first, then the
        # epilogue on whole columns (or rows) (decided for the production size, so the
        # check shapes run the same program)
        split = _split(epilogue, x, w, extras, m, n, k, full.dtype,
                       "columns" if rows_mixed else "rows", full.shape[-1])
        if split is not None:
            return split.reshape(*lead, full.shape[-1]) if len(lead) > 1 else split
    tile = jax.eval_shape(epilogue, jax.ShapeDtypeStruct((bm, bn), jnp.float32),
                          *tile_shapes(bm, bn))
    if batched:
        out_shape, out_block, out_index = (g, m, n), (None, bm, bn), \
            lambda b, i, j, kk: (b, i, j)
    elif full.shape == (m, n):
        out_shape, out_block, out_index = (m, n), (bm, bn), lambda b, i, j, kk: (i, j)
    elif not rows_mixed and full.size % m == 0 and tile.size == bm * (full.size // m):
        # a row-wise epilogue that reduces the row (a row sum, a logsumexp): (m, r)
        r = full.size // m
        out_shape, out_block, out_index = (m, r), (bm, r), lambda b, i, j, kk: (i, 0)
    elif not cols_mixed and full.size % n == 0 and tile.size == bn * (full.size // n):
        r = full.size // n  # a column-wise one (a column statistic): (r, n)
        out_shape, out_block, out_index = (r, n), (r, bn), lambda b, i, j, kk: (0, j)
    else:  # both axes mixed: one block holds the whole product
        cols = full.shape[-1] if full.shape else 1
        out_shape = (full.size // cols, cols)
        out_block, out_index = out_shape, lambda b, i, j, kk: (0, 0)
    w_block = {w_block} if batched else {w_block_2d}
    # the last k step in LAST_PARTS parts of rows: where the epilogue keeps rows apart and
    # each part is whole sublane tiles of the (bf16 or f32) operands
    rows_apart = None if rows_mixed else tuple(_tiled(a, m, n) and a.shape[0] == m
                                               for a in extras)
    parts = LAST_PARTS if rows_apart is not None and bm % (16 * LAST_PARTS) == 0 else 1
    out = pl.pallas_call(
        functools.partial(_body, epilogue, parts, rows_apart),
        out_shape=jax.ShapeDtypeStruct(out_shape, full.dtype),
        grid=(g, pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[pl.BlockSpec((None, bm, bk), lambda b, i, j, kk: (b, i, kk)),
                  w_block,
                  *(_operand_spec(a, m, n, bm, bn) for a in extras)],
        out_specs=pl.BlockSpec(out_block, out_index),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(need(bm, bn, bk))),
    )(x, w, *extras)
    if batched:
        return out.reshape(g, m, n) if full.shape == (m, n) else out
    return out.reshape(*lead, n) if full.shape == (m, n) and len(lead) > 1 else \
        out.reshape(full.shape)
"""
    if online is not None:
        src += ONLINE_ROW_REDUCTION.replace("W_BLOCK_2D", w_block_2d).replace(
            "W_BYTES", w_bytes).replace("DOT_PART", dot_part)
    why = (f"Matmul with an epilogue: the reference's `{lhs} @ {rhs}` becomes a tiled MXU matmul "
           "over a (m/BLOCK_M, n/BLOCK_N, k/BLOCK_K) grid with k innermost and 'arbitrary'; a "
           "float32 VMEM accumulator is zeroed at k == 0 and, at the last k step, the rest of "
           f"the reference ({', '.join(rest) or 'no extra operands'}) is applied to the finished "
           "tile before one write to HBM. An epilogue that reduces or normalizes along an axis "
           "(a row sum, a logsumexp, a softmax, a group norm; a batch norm down the columns) "
           "gets that whole axis in one block, read from the epilogue's own operations when "
           f"the kernel is traced. Blocks ({bm}, {bn}, {bk}) start large for the dtype; the "
           "kernel asks for the scoped VMEM its blocks need (vmem_limit_bytes, up to "
           "VMEM_CAP) and shrinks K, then the free axes, when they would not fit; the tuner "
           "moves them next." + (" The weight is stored (n, k): both operands contract "
                                 "their last axes." if cutter.transposed else "")
           + (f" The product keeps the reference's precision ({cutter.precision})."
              if cutter.precision else "")
           + (f" The epilogue reduces each row (a {online[1]}): the reduction is carried "
              "across column blocks in a (BLOCK_M, 1) scratch, so the product is tiled as a "
              "plain matmul's and never stored." if online is not None else "")
           + (" The epilogue may combine a row's columns and the product is narrower than "
              f"{SPLIT_COLS_FROM} columns at production: whether it runs as a second kernel "
              "on whole rows (SPLIT_COLS) is a switch the tuner measures, since in one "
              "kernel whole rows can leave room for few rows, each block re-reading w."
              if split_switch else "")
           + (" A second product follows in the reference (an MLP's h @ w2): the same "
              "kernel runs twice, the first stage storing h in the operands' dtype with "
              "what comes before the second product as its epilogue, the second "
              "multiplying h with the rest of the reference as its epilogue, so no "
              "block has to hold the whole hidden width." if chain is not None else "")
           + (f" The reference hard-codes sizes ({', '.join(sized)}, as written): the "
              "epilogue reads them from the product's own sizes when it is traced "
              "(`_size`), so one kernel runs at the check shapes and at production."
              if sized else "")
           + (" The epilogue views the tile with size-1 axes added (expand_dims, squeeze, "
              "None): it runs without them (`_lean`), since Mosaic refuses to cast a tile "
              "to such a shape." if lean else ""))
    return src, why


def _tuple(names: tuple[str, ...] | list[str]) -> str:
    """Python text of a tuple of these names: ``(a,)``, ``(a, b)``, ``()``."""
    return "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"
