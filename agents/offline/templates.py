"""First kernels written from a task's reference: elementwise, row-wise, matmul + epilogue.

The reference is plain ``jax.numpy`` code, so its math is correct on any block that
holds whole units of independent work: any tile for an elementwise function, whole
rows for a row-wise one (softmax, norms). The templates copy the reference function
into the kernel module (renamed ``_reference_math``, with the imports and module
constants it needs) and call it on the VMEM blocks inside a ``pl.pallas_call``. For a
matmul the reference's ``x @ w`` / ``jnp.dot(x, w)`` is cut out with ``ast``: the tiled
kernel accumulates it in float32 and the rest of the reference becomes the epilogue,
applied to the finished tile. Each template declares its block sizes as TUNABLES.
"""

from __future__ import annotations

import ast

from tilewright.agents.base import TaskBrief

# infer_families, REFERENCE_NAMES and TemplateError are part of this module's interface.
from tilewright.agents.offline.reference_reading import (  # noqa: F401
    _IMPORTS,
    FALLBACK,
    FAMILIES,
    REFERENCE_NAMES,
    TemplateError,
    _preamble,
    _renamed,
    defining_source,
    infer_families,
    reference_parts,
)


def write_template(brief: TaskBrief, family: str | None = None) -> tuple[str, str]:
    """(kernel source, rationale) for the task's family (or ``family`` when given, for a
    task that declares none); ``TemplateError`` if none fits."""
    family = (family or brief.family or "").lower()
    if family == "elementwise":
        return _elementwise(brief)
    if family in ("rowwise", "row-wise", "normalization", "reduction"):
        return _rowwise(brief)
    if family == "matmul":
        return _matmul(brief)
    if family == "attention":
        return _attention(brief)
    if family == FALLBACK:
        return _whole(brief)
    raise TemplateError(
        f"no offline template for family {brief.family or '(none declared)'}; templates exist "
        f"for {', '.join(FAMILIES)} (declare `family` in task.toml), or start from a kernel.py")


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
    o_ref[...] = _reference_math(*args).astype(o_ref.dtype)


def {entry}(*inputs):
    static, arrays = _split_static(inputs)
    return {driver}(static, *arrays)
'''


def _elementwise(brief: TaskBrief) -> tuple[str, str]:
    src = _preamble(brief, "tiled elementwise kernel") + _IMPORTS + "\n" + _reference_block(brief)
    src += '''


BLOCK_ROWS = 128
BLOCK_COLS = 512
TUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512],
            "BLOCK_COLS": [128, 256, 512, 1024, 2048]}

''' + _OPERAND_SPECS + _blockwise_entry(brief.entry, "_tiled") + '''

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

    result = pl.pallas_call(
        functools.partial(_body, static),
        out_shape=jax.ShapeDtypeStruct((rows, cols), out.dtype),
        grid=(pl.cdiv(rows, br), pl.cdiv(cols, bc)),
        in_specs=[spec(a) for a in operands],
        out_specs=pl.BlockSpec((br, bc), lambda i, j: (i, j)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(*operands)
    return result.reshape(out.shape)
'''
    why = ("Elementwise: every output element depends only on the same element of the inputs, "
           "so the reference's own math is correct on any (BLOCK_ROWS, BLOCK_COLS) tile. The "
           "kernel streams 2-D tiles through VMEM (both grid axes parallel); 128x512 f32 tiles "
           "are (8,128)-aligned and small enough for any TPU's VMEM; the tuner sizes them next.")
    return src, why


def _rowwise(brief: TaskBrief) -> tuple[str, str]:
    src = _preamble(brief, "row-block kernel") + _IMPORTS + "\n" + _reference_block(brief)
    src += '''


BLOCK_ROWS = 32
TUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512]}

''' + _OPERAND_SPECS + _blockwise_entry(brief.entry, "_row_blocks") + '''

@functools.partial(jax.jit, static_argnums=0)
def _row_blocks(static, *arrays):
    out = jax.eval_shape(lambda *a: _reference_math(*_merge(static, a)), *arrays)
    cols = out.shape[-1]
    rows = out.size // cols
    operands = [_as_2d(a, rows, cols) for a in arrays]
    br = min(BLOCK_ROWS, rows)

    def spec(a):
        # Whole rows per block, so row reductions (max, sum, mean) see the full row.
        r = br if a.shape[0] == rows else 1
        return pl.BlockSpec((r, a.shape[1]), lambda i: (i if r == br else 0, 0))

    result = pl.pallas_call(
        functools.partial(_body, static),
        out_shape=jax.ShapeDtypeStruct((rows, cols), out.dtype),
        grid=(pl.cdiv(rows, br),),
        in_specs=[spec(a) for a in operands],
        out_specs=pl.BlockSpec((br, cols), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(*operands)
    return result.reshape(out.shape)
'''
    why = ("Row-wise: each output row depends only on its own input row (reductions run along "
           "the last axis), so the reference's math is correct on a block of whole rows. Each "
           "grid step takes BLOCK_ROWS full rows into VMEM; rows are independent, so the axis "
           "is parallel. Whole rows must fit VMEM (2 buffers x BLOCK_ROWS x cols x 4 B).")
    return src, why


class _CutMatmul(ast.NodeTransformer):
    """Replaces the first ``a @ b`` / ``jnp.dot(a, b)`` / ``jnp.matmul(a, b)`` with ``_acc``;
    ``b`` may be transposed (``w.T``, ``jnp.transpose(w)``: a weight stored (n, k), as
    torch-style linear layers keep it)."""

    def __init__(self) -> None:
        self.operands: tuple[str, str] | None = None
        self.transposed = False

    @staticmethod
    def _untransposed(node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and node.attr == "T" and isinstance(node.value,
                                                                              ast.Name):
            return node.value.id
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", "")) == "transpose" and len(node.args) == 1 \
                and isinstance(node.args[0], ast.Name) and not node.keywords:
            return node.args[0].id
        return None

    def _cut(self, left: ast.AST, right: ast.AST, node: ast.AST) -> ast.AST:
        if self.operands is None and isinstance(left, ast.Name):
            if isinstance(right, ast.Name):
                self.operands = (left.id, right.id)
            elif self._untransposed(right):
                self.operands = (left.id, self._untransposed(right) or "")
                self.transposed = True
            else:
                return self.generic_visit(node)
            return ast.copy_location(ast.Name("_acc", ast.Load()), node)
        return self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        if isinstance(node.op, ast.MatMult):
            return self._cut(node.left, node.right, node)
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if name in ("dot", "matmul") and len(node.args) >= 2:
            return self._cut(node.args[0], node.args[1], node)
        return self.generic_visit(node)


def _matmul(brief: TaskBrief) -> tuple[str, str]:
    head, fn, helpers = reference_parts(brief)
    fn = ast.parse(ast.get_source_segment(defining_source(brief)[0], fn)
                   or ast.unparse(fn)).body[0]
    cutter = _CutMatmul()
    fn = cutter.visit(fn)
    if cutter.operands is None:
        raise TemplateError("the matmul template needs the reference to compute `x @ w` or "
                            "`jnp.dot(x, w)` of two of its arguments")
    params = [a.arg for a in fn.args.args]
    lhs, rhs = cutter.operands
    if lhs not in params or rhs not in params:
        raise TemplateError(f"the matmul operands `{lhs}`, `{rhs}` must be arguments of the reference")
    rest = [p for p in params if p not in (lhs, rhs)]
    fn.name = "_epilogue"
    fn.args.args = [ast.arg("_acc")] + [a for a in fn.args.args if a.arg in rest]
    ast.fix_missing_locations(fn)
    epilogue = ast.unparse(fn)
    order = ", ".join(params)
    rest_tuple = "(" + ", ".join(rest) + ("," if len(rest) == 1 else "") + ")"
    unpack = f"\n    x, w = {lhs}, {rhs}" if (lhs, rhs) != ("x", "w") else ""
    bm, bn, bk = _matmul_blocks(brief)
    if cutter.transposed:  # w is (n, k): contract both operands' last axes on the MXU
        dot = ("jax.lax.dot_general(x_ref[...], w_ref[...], (((1,), (1,)), ((), ())),\n"
               "                                  preferred_element_type=jnp.float32)")
        n_of_w, w_spec = "w.shape[0]", "pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk))"
    else:
        dot = "jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)"
        n_of_w, w_spec = "w.shape[1]", "pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))"
    src = _preamble(brief, "tiled matmul with a fused epilogue") + _IMPORTS + "\n"
    src += "\n\n\n".join(x for x in ("# From the task's reference.\n" + head if head else "",
                                     *helpers) if x)
    src += f'''


# The reference with its matmul replaced by the accumulated tile `_acc`.
{epilogue}


BLOCK_M = {bm}
BLOCK_N = {bn}
BLOCK_K = {bk}
TUNABLES = {{"BLOCK_M": [128, 256, 512, 1024], "BLOCK_N": [128, 256, 512, 1024],
             "BLOCK_K": [128, 256, 512, 1024]}}


def _body(x_ref, w_ref, *refs):
    *extra_refs, o_ref, acc_ref = refs
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += {dot}

    @pl.when(k == pl.num_programs(2) - 1)
    def _finish():
        o_ref[...] = _epilogue(acc_ref[...], *(r[...] for r in extra_refs)).astype(o_ref.dtype)


def _k_block(k, want):
    """A K block that divides k: a ragged last K block would add padding into the sum."""
    bk = min(want, k)
    while k % bk and bk > 128:
        bk //= 2
    return bk if k % bk == 0 and (bk % 128 == 0 or bk == k) else k


def _tile_spec(a, m, n, bm, bn):
    """Epilogue operands: (m, n) tiles, (1, n) row vectors, (m, 1) column vectors."""
    a = a.reshape(1, n) if a.ndim == 1 and a.shape[0] == n else a
    if a.shape == (m, n):
        return a, pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j))
    if a.shape == (1, n):
        return a, pl.BlockSpec((1, bn), lambda i, j, kk: (0, j))
    if a.shape == (m, 1):
        return a, pl.BlockSpec((bm, 1), lambda i, j, kk: (i, 0))
    raise ValueError(f"epilogue operand of shape {{a.shape}} does not broadcast to ({{m}}, {{n}})")


@jax.jit
def {brief.entry}({order}):{unpack}
    m, k = x.shape
    n = {n_of_w}
    out = jax.eval_shape(_epilogue, jax.ShapeDtypeStruct((m, n), jnp.float32),
                         *{rest_tuple})
    if out.shape != (m, n):
        raise ValueError(f"the epilogue turns the ({{m}}, {{n}}) product into {{out.shape}}: "
                         "a reduction over the output, which this template cannot apply "
                         "tile by tile")
    bm, bn, bk = min(BLOCK_M, m), min(BLOCK_N, n), _k_block(k, BLOCK_K)
    extras = [_tile_spec(a, m, n, bm, bn) for a in {rest_tuple}]
    return pl.pallas_call(
        _body,
        out_shape=jax.ShapeDtypeStruct((m, n), out.dtype),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  {w_spec},
                  *(spec for _a, spec in extras)],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, w, *(a for a, _spec in extras))
'''
    why = (f"Matmul with an epilogue: the reference's `{lhs} @ {rhs}` becomes a tiled MXU matmul "
           "over a (m/BLOCK_M, n/BLOCK_N, k/BLOCK_K) grid with k innermost and 'arbitrary'; a "
           "float32 VMEM accumulator is zeroed at k == 0 and, at the last k step, the rest of "
           f"the reference ({', '.join(rest) or 'no extra operands'}) is applied to the finished "
           f"tile before one write to HBM. Blocks ({bm}, {bn}, {bk}) are chosen for the MXU "
           "and the scoped VMEM at the production shape's dtype (the Pallas TPU guide's "
           "best for bf16; half of it for f32, whose blocks take twice the bytes); the tuner "
           "moves them next." + (" The weight is stored (n, k): both operands contract "
                                 "their last axes." if cutter.transposed else ""))
    return src, why


def _matmul_blocks(brief: TaskBrief) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) to start from: for 16-bit inputs the Pallas TPU guide's
    fastest at 4096^3 on v5e, (512, 1024, 1024); for float32 (512, 512, 512), which with
    double buffering and the f32 accumulator stays within the default scoped VMEM."""
    inputs = ((brief.production or {}).get("inputs") or [])
    dtypes = {str(d) for _shape, d in inputs} if inputs else set()
    if dtypes and dtypes <= {"bfloat16", "float16", "int8", "bf16", "f16", "i8"}:
        return 512, 1024, 1024
    return 512, 512, 512


def _whole(brief: TaskBrief) -> tuple[str, str]:
    """The universal fallback: the reference's math inside one pallas_call whose blocks
    hold whole arrays (optionally split along a leading axis every operand shares).
    Any output rank works: 0-d and 1-d arrays travel as (1, n) blocks."""
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


def _attention(brief: TaskBrief) -> tuple[str, str]:
    """Flash attention: ``softmax(q k^T * scale [causal]) v`` with an online softmax over
    key blocks, for a reference whose first three arguments are q, k, v laid out as
    (..., seq, head_dim) with the same leading dims, or with fewer k/v heads shared by
    groups of query heads (GQA). Read from the reference: causality (``tril``,
    ``causal``), whether the scores are scaled by head_dim ** -0.5 (a reference with no
    scale is matched as written), and a (batch, seq, heads, head_dim) layout (it
    transposes with (0, 2, 1, 3))."""
    _head, fn, _helpers = reference_parts(brief)
    params = [a.arg for a in fn.args.args]
    if len(params) < 3:
        raise TemplateError("the attention template needs a reference taking q, k and v")
    text = (ast.get_source_segment(defining_source(brief)[0], fn) or "").lower()
    causal = any(word in text for word in ("tril", "causal", "triu"))
    # A reference that never scales the scores (no scale, sqrt or ** -0.5) is matched
    # as written; one that transposes (b, s, h, d) inputs to (b, h, s, d) gets the same.
    scaled = any(word in text for word in ("scale", "sqrt", "**-0.5", "** -0.5", "** (-0.5)"))
    seq_major = "transpose(0,2,1,3)" in "".join(text.split())
    q, k, v = params[:3]
    extra = params[3:]
    signature = ", ".join(params)
    src = _preamble(brief, "flash attention (online softmax over key blocks)") + _IMPORTS
    src += f'''

CAUSAL = {causal}
SCALED = {scaled}  # the reference multiplies the scores by head_dim ** -0.5
SEQ_MAJOR = {seq_major}  # inputs and output are (batch, seq, heads, head_dim)
BLOCK_Q = 128
BLOCK_K = 128
TUNABLES = {{"BLOCK_Q": [64, 128, 256, 512], "BLOCK_K": [64, 128, 256, 512]}}
_MASKED = -1e9  # what the reference writes where the mask hides a score


def _block(size, want):
    """The largest block <= want that divides size (the whole axis when none does)."""
    b = min(want, size)
    while b > 8 and size % b:
        b //= 2
    return b if size % b == 0 else size


def _flash(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, scale, bq, bk):
    qi, ki = pl.program_id(1), pl.program_id(2)

    @pl.when(ki == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def _step():
        q = q_ref[0].astype(jnp.float32) * scale
        s = jax.lax.dot_general(q, k_ref[0].astype(jnp.float32), (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
        if CAUSAL:
            row = qi * bq + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
            col = ki * bk + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
            s = jnp.where(col <= row, s, _MASKED)
        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
        l_ref[...] = alpha * l_ref[...] + p.sum(axis=-1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(
            p, v_ref[0].astype(jnp.float32), preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    if CAUSAL:  # key blocks entirely above the diagonal contribute nothing
        pl.when(ki * bk <= qi * bq + bq - 1)(_step)
    else:
        _step()

    @pl.when(ki == pl.num_programs(2) - 1)
    def _finish():
        o_ref[0] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@jax.jit
def {brief.entry}({signature}):
    q, k, v = {q}, {k}, {v}
    {"del " + ", ".join(extra) if extra else "pass"}
    if SEQ_MAJOR and q.ndim == k.ndim == v.ndim == 4:
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    # Grouped heads (GQA): k and v have fewer heads than q, each shared by a group of
    # consecutive query heads (``jnp.repeat`` along the head axis).
    grouped = (q.ndim >= 3 and q.shape[:-3] == k.shape[:-3] == v.shape[:-3]
               and k.shape[-3] == v.shape[-3] and q.shape[-3] % k.shape[-3] == 0)
    group = q.shape[-3] // k.shape[-3] if grouped else 1
    if not ((q.shape[:-2] == k.shape[:-2] or grouped) and k.shape[:-1] == v.shape[:-1]
            and q.shape[-1] == k.shape[-1]):
        raise ValueError(f"q {{q.shape}}, k {{k.shape}}, v {{v.shape}}: the attention template "
                         "needs matching leading dims (or grouped heads)")
    lead, sq, d = q.shape[:-2], q.shape[-2], q.shape[-1]
    sk, dv = k.shape[-2], v.shape[-1]
    n = 1
    for size in lead:
        n *= size
    q3, k3, v3 = q.reshape(n, sq, d), k.reshape(n // group, sk, d), v.reshape(n // group, sk, dv)
    bq, bk = _block(sq, BLOCK_Q), _block(sk, BLOCK_K)
    out = pl.pallas_call(
        functools.partial(_flash, scale=d ** -0.5 if SCALED else 1.0, bq=bq, bk=bk),
        out_shape=jax.ShapeDtypeStruct((n, sq, dv), q.dtype),
        grid=(n, sq // bq, sk // bk),
        in_specs=[pl.BlockSpec((1, bq, d), lambda b, i, j: (b, i, 0)),
                  pl.BlockSpec((1, bk, d), lambda b, i, j: (b // group, j, 0)),
                  pl.BlockSpec((1, bk, dv), lambda b, i, j: (b // group, j, 0))],
        out_specs=pl.BlockSpec((1, bq, dv), lambda b, i, j: (b, i, 0)),
        scratch_shapes=[pltpu.VMEM((bq, 1), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
                        pltpu.VMEM((bq, dv), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(q3, k3, v3)
    out = out.reshape(*lead, sq, dv)
    return out.transpose(0, 2, 1, 3) if SEQ_MAJOR and out.ndim == 4 else out
'''
    why = ("Attention: the reference multiplies q by k^T, applies a softmax along the keys and "
           "multiplies by v. The kernel never builds the (seq x seq) score matrix: for each "
           "BLOCK_Q rows of queries it walks the key blocks (the innermost, 'arbitrary' grid "
           "axis) keeping a running max, a running sum and a float32 accumulator in VMEM "
           "(online softmax), and writes the normalized block once at the last key block"
           + ("; key blocks above the causal diagonal are skipped." if causal else "."))
    return src, why
