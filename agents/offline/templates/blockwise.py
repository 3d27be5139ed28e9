"""The whole-block and blockwise templates: elementwise tiles, whole rows, and the
universal fallback (whole arrays in one pallas_call)."""

from __future__ import annotations

import ast

from tilewright.agents.base import TaskBrief
from tilewright.agents.offline.reference_reading import (
    _IMPORTS,
    TemplateError,
    _preamble,
    _renamed,
    defining_source,
    reference_parts,
)
from tilewright.agents.offline.templates.kernel_text import VMEM_HELPERS


def _reference_block(brief: TaskBrief) -> str:
    head, fn, helpers = reference_parts(brief)
    body = _renamed(defining_source(brief)[0], fn, "_reference_math")
    return "\n\n\n".join(x for x in ("# From the task's reference.\n" + head if head else "",
                                     *helpers, body) if x)


_STATIC_ARGS = '''
def _split_static(inputs):
    """Python scalars (static arguments) stay out of the pallas_call; arrays go in."""
    static = tuple((i, a) for i, a in enumerate(inputs) if not hasattr(a, "shape"))
    return static, [a for a in inputs if hasattr(a, "shape")]


def _merge(static, arrays):
    """The reference's argument list again: static values back in their places."""
    args, it = [], iter(arrays)
    fixed = dict(static)
    for i in range(len(static) + len(arrays)):
        args.append(fixed[i] if i in fixed else next(it))
    return args


def _widen(block):
    """16-bit float blocks are computed in float32 inside the kernel (the result is cast
    back to the output's dtype): the TPU's vector unit computes in f32 anyway, and the
    TPU compiler aborts on some packed bf16 broadcasts (a (1, n) bf16 row)."""
    return block.astype(jnp.float32) if block.dtype in (jnp.bfloat16, jnp.float16) else block
'''

_OPERAND_SPECS = _STATIC_ARGS + '''

def _as_2d(a, rows, cols):
    """Each operand as 2-D: full tiles, a broadcast row (1, cols), a column (rows, 1),
    or a 0-d value as a (1, 1) block."""
    if a.ndim == 0:
        return a.reshape(1, 1)
    if a.size == rows * cols:
        return a.reshape(rows, cols)
    if a.size == cols:
        return a.reshape(1, cols)
    if a.size == rows:
        return a.reshape(rows, 1)
    raise ValueError(f"operand of shape {a.shape} does not broadcast against ({rows}, {cols})")
'''


def _blockwise_entry(entry: str, driver: str) -> str:
    """The kernel body of the elementwise and row-block templates (the reference's own
    math on one block) and the entry point that hands the arrays to ``driver``."""
    return f'''

def _body(static, *refs):
    *in_refs, o_ref = refs
    args = _merge(static, [_widen(r[...]) for r in in_refs])
    o_ref[...] = _reference_math(*args).reshape(o_ref.shape).astype(o_ref.dtype)


def {entry}(*inputs):
    static, arrays = _split_static(inputs)
    return {driver}(static, *arrays)
'''


def elementwise(brief: TaskBrief) -> tuple[str, str]:
    src = _preamble(brief, "tiled elementwise kernel") + _IMPORTS + "\n" + _reference_block(brief)
    src += '''


BLOCK_ROWS = 512
BLOCK_COLS = 1024
TUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512, 1024, 2048],
            "BLOCK_COLS": [128, 256, 512, 1024, 2048, 4096]}
''' + VMEM_HELPERS + _OPERAND_SPECS + _blockwise_entry(brief.entry, "_tiled") + '''

@functools.partial(jax.jit, static_argnums=0)
def _tiled(static, *arrays):
    out = jax.eval_shape(lambda *a: _reference_math(*_merge(static, a)), *arrays)
    cols = out.shape[-1] if out.shape else 1
    rows = out.size // cols
    operands = [_as_2d(a, rows, cols) for a in arrays]
    br, bc = min(BLOCK_ROWS, rows), min(BLOCK_COLS, cols)

    def spec(a):
        r = br if a.shape[0] == rows else 1
        c = bc if a.shape[1] == cols else 1
        return pl.BlockSpec((r, c), lambda i, j: (i if r == br else 0, j if c == bc else 0))

    # double-buffered blocks of every operand and the output, and one f32 working tile
    need = 2 * (sum(br * bc * a.dtype.itemsize for a in operands)
                + br * bc * out.dtype.itemsize) + br * bc * 4
    result = pl.pallas_call(
        functools.partial(_body, static),
        out_shape=jax.ShapeDtypeStruct((rows, cols), out.dtype),
        grid=(pl.cdiv(rows, br), pl.cdiv(cols, bc)),
        in_specs=[spec(a) for a in operands],
        out_specs=pl.BlockSpec((br, bc), lambda i, j: (i, j)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=_vmem_limit(need)),
    )(*operands)
    return result.reshape(out.shape)
'''
    why = ("Elementwise: every output element depends only on the same element of the inputs, "
           "so the reference's own math is correct on any (BLOCK_ROWS, BLOCK_COLS) tile. The "
           "kernel streams 2-D tiles through VMEM (both grid axes parallel); 512x1024 tiles "
           "(2 MiB in f32) are (8,128)-aligned and large enough that each grid step's fixed "
           "cost is small beside its HBM traffic; the kernel asks for the scoped VMEM they "
           "need (vmem_limit_bytes) and the tuner sizes them next.")
    return src, why


def rowwise(brief: TaskBrief) -> tuple[str, str]:
    src = _preamble(brief, "row-block kernel") + _IMPORTS + "\n" + _reference_block(brief)
    src += '''


BLOCK_ROWS = 256
TUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512, 1024, 2048]}
''' + VMEM_HELPERS + _OPERAND_SPECS + _blockwise_entry(brief.entry, "_row_blocks") + '''

@functools.partial(jax.jit, static_argnums=0)
def _row_blocks(static, *arrays):
    out = jax.eval_shape(lambda *a: _reference_math(*_merge(static, a)), *arrays)
    # Rows and columns of the largest operand: the rows are what the grid splits; an
    # output that reduces each row (a norm's statistics, a logsumexp, a per-row loss)
    # keeps the rows and has fewer columns.
    widest = max(arrays, key=lambda a: a.size)
    cols = widest.shape[-1] if widest.ndim else 1
    rows = widest.size // cols
    if out.size % rows:
        raise ValueError(f"the output {out.shape} does not keep the {rows} rows of the "
                         f"input {widest.shape}: not a row-wise computation")
    out_cols = out.size // rows
    operands = [_as_2d(a, rows, cols) for a in arrays]
    br = min(BLOCK_ROWS, rows)

    def need(br):  # double-buffered blocks and output, and one f32 working block
        return 2 * (sum((br if a.shape[0] == rows else 1) * a.shape[1] * a.dtype.itemsize
                        for a in operands) + br * out_cols * out.dtype.itemsize) \
            + br * cols * 4

    while need(br) > VMEM_CAP and br > 8 and rows % (br // 2) == 0:
        br //= 2

    def spec(a):
        # Whole rows per block, so row reductions (max, sum, mean) see the full row.
        r = br if a.shape[0] == rows else 1
        return pl.BlockSpec((r, a.shape[1]), lambda i: (i if r == br else 0, 0))

    result = pl.pallas_call(
        functools.partial(_body, static),
        out_shape=jax.ShapeDtypeStruct((rows, out_cols), out.dtype),
        grid=(pl.cdiv(rows, br),),
        in_specs=[spec(a) for a in operands],
        out_specs=pl.BlockSpec((br, out_cols), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=_vmem_limit(need(br))),
    )(*operands)
    return result.reshape(out.shape)
'''
    why = ("Row-wise: each output row depends only on its own input row (reductions run along "
           "the last axis), so the reference's math is correct on a block of whole rows; an "
           "output that reduces the row (a per-row statistic or loss) keeps the rows. Each "
           "grid step takes BLOCK_ROWS full rows into VMEM; rows are independent, so the axis "
           "is parallel. The kernel asks for the scoped VMEM its blocks need "
           "(vmem_limit_bytes, up to VMEM_CAP) and takes fewer rows when they would not fit.")
    return src, why



# Calls whose primitive has no Pallas TPU lowering: a kernel that holds them fails to
# compile at production every time (a budget's evaluation spent for nothing).
_NO_TPU_LOWERING = frozenset({"conv_general_dilated", "conv", "conv_with_general_padding",
                              "conv_transpose", "reduce_window"})


def whole(brief: TaskBrief) -> tuple[str, str]:
    """The universal fallback: the reference's math inside one pallas_call whose blocks
    hold whole arrays (optionally split along a leading axis every operand shares).
    Any output rank works: 0-d and 1-d arrays travel as (1, n) blocks."""
    calls = {node.func.attr if isinstance(node.func, ast.Attribute) else
             getattr(node.func, "id", "")
             for node in ast.walk(ast.parse(defining_source(brief)[0]))
             if isinstance(node, ast.Call)}
    refused = sorted(calls & _NO_TPU_LOWERING)
    if refused:
        raise TemplateError(f"the reference calls {', '.join(refused)}, which Pallas does "
                            "not lower for TPU: inside a kernel it could never compile")
    src = _preamble(brief, "whole-array kernel (universal fallback)") + _IMPORTS + "\n"
    src += _reference_block(brief)
    src += '''


# Rows of the shared leading axis per grid step (0: the whole axis in one block). The
# tuner shrinks it; a computation that mixes the leading axis then fails the checks.
BLOCK_LEAD = 0
TUNABLES = {"BLOCK_LEAD": [0, 1, 2, 4, 8, 16, 32, 64, 128, 256]}

''' + _STATIC_ARGS + '''

def _as_block(shape):
    """TPU blocks are at least 2-D: 0-d and 1-d arrays travel as (1, n)."""
    size = 1
    for n in shape:
        size *= n
    return tuple(shape) if len(shape) >= 2 else (1, size)


def _body(static, shapes, out_tree, n_in, *refs):
    in_refs, out_refs = refs[:n_in], refs[n_in:]
    arrays = [_widen(r[...].reshape(s) if r.shape != s else r[...])
              for r, s in zip(in_refs, shapes)]
    out = _reference_math(*_merge(static, arrays))
    for ref, value in zip(out_refs, jax.tree.leaves(out)):
        ref[...] = jnp.asarray(value).reshape(ref.shape).astype(ref.dtype)


def {entry}(*inputs):
    static, arrays = _split_static(inputs)
    return _whole(static, *arrays)


@functools.partial(jax.jit, static_argnums=0)
def _whole(static, *arrays):
    out = jax.eval_shape(lambda *a: _reference_math(*_merge(static, a)), *arrays)
    leaves, out_tree = jax.tree.flatten(out)
    lead = arrays[0].shape[0] if arrays and arrays[0].ndim >= 3 else None
    split = (BLOCK_LEAD and lead and lead % BLOCK_LEAD == 0 and BLOCK_LEAD < lead
             and all(a.ndim >= 3 and a.shape[0] == lead for a in arrays)
             and all(len(o.shape) >= 3 and o.shape[0] == lead for o in leaves))
    b = BLOCK_LEAD if split else None
    operands = [a.reshape(_as_block(a.shape)) for a in arrays]
    # The shapes the reference sees inside one grid step.
    shapes = [((b, *a.shape[1:]) if b else a.shape) for a in arrays]

    def spec(shape):
        if b:
            return pl.BlockSpec((b, *shape[1:]), lambda i: (i,) + (0,) * (len(shape) - 1))
        return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))

    out_shapes = [jax.ShapeDtypeStruct(_as_block(o.shape), o.dtype) for o in leaves]
    results = pl.pallas_call(
        functools.partial(_body, static, shapes, out_tree, len(operands)),
        out_shape=out_shapes,
        grid=(lead // b,) if b else (1,),
        in_specs=[spec(a.shape) for a in operands],
        out_specs=[spec(o.shape) for o in out_shapes],
    )(*operands)
    return jax.tree.unflatten(out_tree, [r.reshape(o.shape) for r, o in zip(results, leaves)])
'''.replace("{entry}", brief.entry)
    why = ("Universal fallback: the reference's own math inside one pallas_call whose blocks "
           "hold the whole arrays (0-d and 1-d ones as (1, n) blocks), so any computation "
           "whose operations Mosaic lowers is correct as long as the arrays fit VMEM. "
           "BLOCK_LEAD lets the tuner split a leading axis that every operand shares "
           "(batch, heads) into grid steps; the checks reject a split the math does not allow.")
    return src, why
