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

from agents.base import TaskBrief

# The reference's function name per task layout.
REFERENCE_NAMES = {"native": "reference", "jaxbench": "workload", "maxkernel": "computation"}
FAMILIES = ("elementwise", "rowwise", "matmul")
_SKIP_FUNCTIONS = {"make_inputs", "flops", "create_inputs", "get_flops", "get_inputs"}


class TemplateError(Exception):
    """The reference does not fit the family's template; the message says why."""


def reference_parts(brief: TaskBrief) -> tuple[str, ast.FunctionDef, list[str]]:
    """(imports and constants, the reference function node, other helper sources)."""
    source = brief.reference_source
    tree = ast.parse(source)
    name = REFERENCE_NAMES.get(brief.layout, "reference")
    head, helpers, fn = [], [], None
    for node in tree.body:
        text = ast.get_source_segment(source, node) or ""
        if isinstance(node, ast.Import | ast.ImportFrom):
            if text not in _IMPORTS.splitlines():  # the template imports these already
                head.append(text)
        elif isinstance(node, ast.FunctionDef):
            if node.name == name:
                fn = node
            elif node.name not in _SKIP_FUNCTIONS:
                helpers.append(text)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and not _is_docstring(node):
            head.append(text)
    if fn is None:
        raise TemplateError(f"the reference defines no `{name}` function to build a kernel from")
    return "\n".join(head), fn, helpers


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant)


def _renamed(source: str, fn: ast.FunctionDef, new_name: str) -> str:
    text = ast.get_source_segment(source, fn) or ast.unparse(fn)
    return text.replace(f"def {fn.name}(", f"def {new_name}(", 1)


def _preamble(brief: TaskBrief, title: str) -> str:
    return (f'"""{brief.name}: {title} (offline agent template).\n\n'
            "Written from the task's reference; block sizes are TUNABLES for the autotuner.\n"
            '"""\n\n')


_IMPORTS = ("import functools\n\nimport jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"
            "from jax.experimental.pallas import tpu as pltpu\n")


_MATMUL_CALLS = {"dot", "matmul", "einsum", "tensordot", "dot_general", "inner"}
_ROW_CALLS = {"sum", "max", "min", "mean", "var", "std", "logsumexp", "softmax",
              "log_softmax", "norm", "argmax", "argmin", "prod", "cumsum", "rsqrt_mean"}


def infer_families(brief: TaskBrief) -> tuple[str, ...]:
    """Template families to try, most likely first, for a task that declares none.

    Read from the reference function's AST: a matrix product (``@``, ``jnp.dot``,
    ``einsum``...) suggests matmul; a reduction or an ``axis=`` argument suggests a
    row-wise kernel; otherwise elementwise. The others follow as fallbacks.
    """
    if brief.family:
        return (brief.family.lower(),)
    try:
        tree = ast.parse(brief.reference_source)
    except SyntaxError:
        return FAMILIES
    matmul = rows = False
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            matmul = True
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                getattr(node.func, "id", "")
            matmul |= name in _MATMUL_CALLS
            rows |= name in _ROW_CALLS or any(k.arg in ("axis", "axes") for k in node.keywords)
    first = "matmul" if matmul else "rowwise" if rows else "elementwise"
    return (first, *(f for f in FAMILIES if f != first))


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
    raise TemplateError(
        f"no offline template for family {brief.family or '(none declared)'}; templates exist "
        f"for {', '.join(FAMILIES)} (declare `family` in task.toml), or start from a kernel.py")


def _reference_block(brief: TaskBrief) -> str:
    head, fn, helpers = reference_parts(brief)
    body = _renamed(brief.reference_source, fn, "_reference_math")
    return "\n\n\n".join(x for x in ("# From the task's reference.\n" + head if head else "",
                                     *helpers, body) if x)


_OPERAND_SPECS = '''
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


def _elementwise(brief: TaskBrief) -> tuple[str, str]:
    src = _preamble(brief, "tiled elementwise kernel") + _IMPORTS + "\n" + _reference_block(brief)
    src += '''


BLOCK_ROWS = 128
BLOCK_COLS = 512
TUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512],
            "BLOCK_COLS": [128, 256, 512, 1024, 2048]}

''' + _OPERAND_SPECS + f'''

def _body(static, *refs):
    *in_refs, o_ref = refs
    args = _merge(static, [r[...] for r in in_refs])
    o_ref[...] = _reference_math(*args).astype(o_ref.dtype)


def {brief.entry}(*inputs):
    static, arrays = _split_static(inputs)
    return _tiled(static, *arrays)


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

''' + _OPERAND_SPECS + f'''

def _body(static, *refs):
    *in_refs, o_ref = refs
    args = _merge(static, [r[...] for r in in_refs])
    o_ref[...] = _reference_math(*args).astype(o_ref.dtype)


def {brief.entry}(*inputs):
    static, arrays = _split_static(inputs)
    return _row_blocks(static, *arrays)


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
    """Replaces the first ``a @ b`` / ``jnp.dot(a, b)`` / ``jnp.matmul(a, b)`` with ``_acc``."""

    def __init__(self) -> None:
        self.operands: tuple[str, str] | None = None

    def _cut(self, left: ast.AST, right: ast.AST, node: ast.AST) -> ast.AST:
        if self.operands is None and isinstance(left, ast.Name) and isinstance(right, ast.Name):
            self.operands = (left.id, right.id)
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
    fn = ast.parse(ast.get_source_segment(brief.reference_source, fn) or ast.unparse(fn)).body[0]
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
    src = _preamble(brief, "tiled matmul with a fused epilogue") + _IMPORTS + "\n"
    src += "\n\n\n".join(x for x in ("# From the task's reference.\n" + head if head else "",
                                     *helpers) if x)
    src += f'''


# The reference with its matmul replaced by the accumulated tile `_acc`.
{epilogue}


BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 128
TUNABLES = {{"BLOCK_M": [128, 256, 512, 1024], "BLOCK_N": [128, 256, 512, 1024],
             "BLOCK_K": [128, 256, 512, 1024]}}


def _body(x_ref, w_ref, *refs):
    *extra_refs, o_ref, acc_ref = refs
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

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
    n = w.shape[1]
    out = jax.eval_shape(_epilogue, jax.ShapeDtypeStruct((m, n), jnp.float32),
                         *{rest_tuple})
    bm, bn, bk = min(BLOCK_M, m), min(BLOCK_N, n), _k_block(k, BLOCK_K)
    extras = [_tile_spec(a, m, n, bm, bn) for a in {rest_tuple}]
    return pl.pallas_call(
        _body,
        out_shape=jax.ShapeDtypeStruct((m, n), out.dtype),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
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
           "tile before one write to HBM. 128-wide blocks are MXU- and (8,128)-aligned; the "
           "tuner grows them next.")
    return src, why
