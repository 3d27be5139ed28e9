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
    if family == "conv":
        return _conv(brief)
    if family == "cross_entropy":
        return _cross_entropy(brief)
    if family == "gated_mlp":
        return _gated_mlp(brief)
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
    o_ref[...] = _reference_math(*args).reshape(o_ref.shape).astype(o_ref.dtype)


def {entry}(*inputs):
    static, arrays = _split_static(inputs)
    return {driver}(static, *arrays)
'''


def _elementwise(brief: TaskBrief) -> tuple[str, str]:
    src = _preamble(brief, "tiled elementwise kernel") + _IMPORTS + "\n" + _reference_block(brief)
    src += '''


BLOCK_ROWS = 512
BLOCK_COLS = 1024
TUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512, 1024, 2048],
            "BLOCK_COLS": [128, 256, 512, 1024, 2048, 4096]}
''' + _VMEM_HELPERS + _OPERAND_SPECS + _blockwise_entry(brief.entry, "_tiled") + '''

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


def _rowwise(brief: TaskBrief) -> tuple[str, str]:
    src = _preamble(brief, "row-block kernel") + _IMPORTS + "\n" + _reference_block(brief)
    src += '''


BLOCK_ROWS = 256
TUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512, 1024, 2048]}
''' + _VMEM_HELPERS + _OPERAND_SPECS + _blockwise_entry(brief.entry, "_row_blocks") + '''

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


class _CutMatmul(ast.NodeTransformer):
    """Replaces the first ``a @ b`` / ``jnp.dot(a, b)`` / ``jnp.matmul(a, b)`` with ``_acc``;
    ``b`` may be transposed (``w.T``, ``jnp.transpose(w)``: a weight stored (n, k), as
    torch-style linear layers keep it)."""

    def __init__(self) -> None:
        self.operands: tuple[str, str] | None = None
        self.transposed = False
        # the reference's ``precision=`` on its product (``lax.Precision.HIGHEST``), kept
        self.precision: str | None = None

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
        left = right = None
        if name in ("dot", "matmul") and len(node.args) >= 2:
            left, right = node.args[0], node.args[1]
        elif name == "einsum" and len(node.args) == 3 and all(
                isinstance(a, ast.Name) for a in node.args[1:]):
            form = _einsum_form(_literal(node.args[0]))
            if form is not None:
                left, right = node.args[1], node.args[2]
                if form == "transposed":
                    right = ast.Attribute(right, "T", ast.Load())
        elif name == "dot_general" and len(node.args) >= 2:
            numbers = node.args[2] if len(node.args) > 2 else next(
                (k.value for k in node.keywords if k.arg == "dimension_numbers"), None)
            contract = _literal(numbers)
            if contract == (((1,), (0,)), ((), ())):  # x @ w
                left, right = node.args[0], node.args[1]
            elif contract == (((1,), (1,)), ((), ())) and isinstance(node.args[1], ast.Name):
                # x @ w.T with w stored (n, k): the transposed form _cut knows
                left, right = node.args[0], ast.Attribute(node.args[1], "T", ast.Load())
        if left is None or right is None or self.operands is not None:
            return self.generic_visit(node)
        cut = self._cut(left, right, node)
        if self.operands is not None:  # this is the product cut out: keep its precision
            precision = next((k.value for k in node.keywords if k.arg == "precision"), None)
            self.precision = ast.unparse(precision) if precision is not None else None
        return cut


_VMEM_HELPERS = """

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

_EPILOGUE_MIXING = """

_REDUCING = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
             "reduce_or", "reduce_xor", "argmax", "argmin"}
_ALONG_AXIS = {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "sort"}
_MIXES_ALL = {"dot_general", "conv_general_dilated", "gather", "scatter", "scatter-add",
              "scatter_add", "dynamic_slice", "dynamic_update_slice", "reduce_window_sum",
              "reduce_window_max", "reduce_window_min", "reduce_window", "fft", "while",
              "scan", "cond", "top_k", "rng_bit_generator"}


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


def _mixing(fn, *args):
    \"\"\"(rows mixed, columns mixed): whether ``fn`` combines values of its first argument
    (the tile) across the first or the last axis (a reduction, a cumulative op, a reshape
    or transpose that moves it, an iota along it, a product that contracts it), read from
    its jaxpr. Only what derives from the tile counts (a second layer's weight may be
    transposed freely). Conservative: an operation it does not know mixes both, so such
    an epilogue gets the whole product in one block.\"\"\"
    closed = jax.make_jaxpr(fn)(*args)
    first = last = False
    for eqn, touched in _eqns(closed.jaxpr, {closed.jaxpr.invars[0]}):
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
            elif name == "iota":
                axes, nd = (eqn.params.get("dimension", 0),), len(out)
            elif name == "reshape":
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
                    first |= bool(shape) and bool(out) and shape[0] != out[0]
                    last |= bool(shape) and bool(out) and shape[-1] != out[-1]
            elif name == "dot_general" and touched[:2] == [True, False] and nd == 2 and tuple(
                    eqn.params["dimension_numbers"][0][0]) == (1,) and not any(
                    eqn.params["dimension_numbers"][1]):
                last = True  # the tile's rows by a weight (a second layer): rows stay apart
            elif name in _MIXES_ALL:
                first = last = True
            elif name != "broadcast_in_dim" and any(
                    _resized(tuple(getattr(v.aval, "shape", ())), out)
                    for v in eqn.invars if hasattr(v, "aval")):
                first = last = True  # an op it does not know changes the sizes
            for a in axes:
                a = a % nd if nd else 0
                first |= a == 0
                last |= a == nd - 1

    return first, last


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
    for eqn, touched in _eqns(closed.jaxpr, {closed.jaxpr.invars[0]}):
        most = max([0, *(padded(v.aval) for v in eqn.outvars if hasattr(v, "aval"))])
        if any(touched):
            ours = max(ours, most)
        else:
            other = max(other, most)
    return (3 * ours if ours > tile else 2 * tile) + other
"""


def _einsum_form(spec: object) -> str | None:
    """What the matmul template can do with an einsum of two operands: ``plain`` for a
    product over the lhs's last axis by a (k, n) or batched (g, k, n) rhs
    (``'bsd,df->bsf'``, ``'gmk,gkn->gmn'``), ``transposed`` for a (n, k) rhs
    (``'mk,nk->mn'``); None for anything else."""
    if not isinstance(spec, str) or "->" not in spec or "." in spec:
        return None
    inputs, out = "".join(spec.split()).split("->")
    if inputs.count(",") != 1:
        return None
    a, b = inputs.split(",")
    shared = set(a) & set(b) - set(out)
    if len(shared) != 1 or len(set(a)) != len(a) or len(set(b)) != len(b):
        return None
    c = shared.pop()
    if not a or a[-1] != c:
        return None
    if len(b) == 2 and b[0] == c and out == a[:-1] + b[1]:
        return "plain"
    if len(b) == 2 and b[1] == c and out == a[:-1] + b[0]:
        return "transposed"
    if len(b) == 3 == len(a) and b[0] == a[0] == out[0] and b[1] == c \
            and out == a[:-1] + b[2]:
        return "plain"  # batched: (g, m, k) by (g, k, n)
    return None


def _literal(node: ast.AST | None) -> object:
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        return None


def _matmul(brief: TaskBrief) -> tuple[str, str]:
    head, fn, helpers = reference_parts(brief)
    fn = ast.parse(ast.get_source_segment(defining_source(brief)[0], fn)
                   or ast.unparse(fn)).body[0]
    fn, sized = _sizes_as_written(brief, fn)
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
    # the reference's precision, for float32 operands (Mosaic takes it for f32 only)
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
TUNABLES = {{"BLOCK_M": [128, 256, 512, 1024, 2048], "BLOCK_N": [128, 256, 512, 1024, 2048],
             "BLOCK_K": [128, 256, 512, 1024, 2048]}}
""" + _VMEM_HELPERS + _EPILOGUE_MIXING + f"""

def _body(x_ref, w_ref, *refs):
    *extra_refs, o_ref, acc_ref = refs
    k = pl.program_id(3)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += {dot}

    @pl.when(k == pl.num_programs(3) - 1)
    def _finish():
        out = _epilogue(acc_ref[...], *(r[...] for r in extra_refs))
        o_ref[...] = out.reshape(o_ref.shape).astype(o_ref.dtype)


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


@jax.jit
def {brief.entry}({order}):{unpack}
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
                          else a, m, n) for a in {rest_tuple}]
    # Which axes the epilogue reduces or moves (a row sum, a softmax, a batch norm): an
    # axis it mixes is not split, its whole length is one block.
    rows_mixed, cols_mixed = _mixing(_epilogue, jax.ShapeDtypeStruct((m, n), jnp.float32),
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

    full = jax.eval_shape(_epilogue, jax.ShapeDtypeStruct((m, n), jnp.float32), *extras)

    def need(bm, bn, bk):
        # double-buffered x, w, operand and output blocks, the f32 accumulator, and room
        # for one f32 intermediate tile (the compiler keeps most of an epilogue's work in
        # registers: a row-sum epilogue's kernel compiled to its blocks' bytes alone)
        working = _working(_epilogue, jax.ShapeDtypeStruct((bm, bn), jnp.float32),
                           *tile_shapes(bm, bn))
        blocks = (bm * bk + {w_bytes}) * item + sum(
            s.size * s.dtype.itemsize for s in tile_shapes(bm, bn))
        return 2 * blocks + 2 * bm * bn * 4 + working

    # Shrink K first (it moves no extra HBM traffic), then the axes the epilogue leaves free.
    while need(bm, bn, bk) > VMEM_CAP and bk > 128 and k % (bk // 2) == 0:
        bk //= 2
    while need(bm, bn, bk) > VMEM_CAP and not rows_mixed and bm > 8 and m % (bm // 2) == 0:
        bm //= 2
    while need(bm, bn, bk) > VMEM_CAP and not cols_mixed and bn > 128 and n % (bn // 2) == 0:
        bn //= 2
    tile = jax.eval_shape(_epilogue, jax.ShapeDtypeStruct((bm, bn), jnp.float32),
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
    out = pl.pallas_call(
        _body,
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
           + (f" The reference hard-codes sizes ({', '.join(sized)}, as written): the "
              "epilogue reads them from the product's own sizes when it is traced "
              "(`_size`), so one kernel runs at the check shapes and at production."
              if sized else ""))
    return src, why


_SIZE_HELPER = '''

# The product's full sizes while the kernel is traced (set by the entry point): the sizes
# the reference hard-codes are read from them (`_size`), not written in.
_DIMS = {}


def _size(check, production):
    """The product's dimension (n, m or k, in that order) that a size the reference
    hard-codes stands for: ``production`` as written, ``check`` at the check shapes."""
    for name in ("n", "m", "k"):
        if _DIMS.get(name) in (check, production):
            return _DIMS[name]
    raise ValueError(f"the reference's hard-coded size {production} ({check} at the check "
                     f"shapes) is none of the product's sizes {_DIMS}")
'''

_SIZE_SET = """
    _DIMS.update(m=m, n=n, k=k)"""


def _sizes_as_written(brief: TaskBrief, fn: ast.FunctionDef) -> tuple[ast.FunctionDef, list[str]]:
    """``fn`` (read from the brief's reference, whose hard-coded sizes ``--set`` rewrote for
    the check shapes) with each rewritten number replaced by ``_size(check, production)``,
    and the sizes replaced (``"4096"``). Unchanged without rewrites, or when the reference
    as written is not in the brief or its function does not line up node for node."""
    written = (brief.production or {}).get("reference_source")
    if not brief.literal_rewrites or not written or brief.defining:
        return fn, []
    try:
        tree = ast.parse(written)
    except SyntaxError:
        return fn, []
    twin = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                 and n.name == fn.name), None)
    if twin is None:
        return fn, []
    ours, theirs = list(ast.walk(fn)), list(ast.walk(twin))
    if len(ours) != len(theirs) or any(type(a) is not type(b) for a, b in zip(ours, theirs)):
        return fn, []
    changed = {id(a): b.value for a, b in zip(ours, theirs) if isinstance(a, ast.Constant)
               and type(a.value) in (int, float) and a.value != b.value}
    if not changed:
        return fn, []
    sized: list[str] = []

    class _Restore(ast.NodeTransformer):
        def visit_Constant(self, node: ast.Constant) -> ast.AST:
            if id(node) not in changed:
                return node
            sized.append(repr(changed[id(node)]))
            call = ast.Call(ast.Name("_size", ast.Load()),
                            [ast.Constant(node.value), ast.Constant(changed[id(node)])], [])
            return ast.copy_location(call, node)

    fn = _Restore().visit(fn)
    ast.fix_missing_locations(fn)
    return fn, sorted(set(sized), key=sized.index)


def _matmul_blocks(brief: TaskBrief) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) to start from: for 16-bit inputs the Pallas TPU guide's
    fastest at 4096^3 on v5e, (512, 1024, 1024); for float32 (1024, 1024, 512): output
    tiles as large, so each operand is re-read from HBM as few times, with a K block half
    as long for the doubled bytes (about 32 MiB with double buffering and the epilogue's
    room, which the kernel asks for with vmem_limit_bytes)."""
    inputs = ((brief.production or {}).get("inputs") or next(
        (s["inputs"] for s in brief.shapes if s.get("inputs")), []))
    dtypes = {str(d) for _shape, d in inputs} if inputs else set()
    dtypes -= {"int32", "i32", "int64", "i64"}  # labels and indices: not the operands
    if dtypes and dtypes <= {"bfloat16", "float16", "int8", "bf16", "f16", "i8"}:
        return 512, 1024, 1024
    return 1024, 1024, 512


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
    # One more argument added to the scores (flex attention's relative position bias):
    # a (..., seq_q, seq_k) array whose leading dims are the trailing ones of q's heads.
    flat = "".join(text.split())
    bias = next((name for name in extra if any(f"{w}+{name.lower()}" in flat or
                                               f"+{name.lower()}[" in flat
                                               for w in ("attn", "scores", "s", "logits"))),
                None)
    extra = [name for name in extra if name != bias]
    signature = ", ".join(params)
    src = _preamble(brief, "flash attention (online softmax over key blocks)") + _IMPORTS
    src += f'''

CAUSAL = {causal}
SCALED = {scaled}  # the reference multiplies the scores by head_dim ** -0.5
SEQ_MAJOR = {seq_major}  # inputs and output are (batch, seq, heads, head_dim)
BIAS = {bias is not None}  # the reference adds `{bias}` to the (scaled) scores
BLOCK_Q = 512
BLOCK_K = 512
TUNABLES = {{"BLOCK_Q": [128, 256, 512, 1024, 2048], "BLOCK_K": [128, 256, 512, 1024, 2048]}}
_MASKED = -1e9  # what the reference writes where the mask hides a score
''' + _VMEM_HELPERS + f'''

def _block(size, want):
    """The largest block <= want that divides size (the whole axis when none does)."""
    b = min(want, size)
    while b > 8 and size % b:
        b //= 2
    return b if size % b == 0 else size


def _flash(q_ref, k_ref, v_ref, *refs, scale, bq, bk):
    *bias_ref, o_ref, m_ref, l_ref, acc_ref = refs
    qi, ki = pl.program_id(1), pl.program_id(2)

    @pl.when(ki == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def _step():
        # q and k go to the MXU in their own dtype (bf16 stays bf16), scores in f32
        s = jax.lax.dot_general(q_ref[0], k_ref[0], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * scale
        if BIAS:
            s = s + bias_ref[0][0].astype(jnp.float32)
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
            p.astype(v_ref.dtype), v_ref[0], preferred_element_type=jnp.float32)
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
    score_bias = {bias if bias else "None"}
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

    def kv_block(b, i, j):
        # Causal: a key block above the diagonal is skipped by the body; fetching the last
        # one it uses again instead costs no DMA (the block index does not change).
        if CAUSAL:
            j = jnp.minimum(j, (i * bq + bq - 1) // bk)
        return (b // group, j, 0)

    bias_operand, bias_spec = (), ()
    if BIAS:
        # (..., sq, sk) with leading dims the trailing ones of q's (batch, heads): the
        # flattened head b reads bias row b % nb
        nb = score_bias.size // (sq * sk)
        if score_bias.shape[-2:] != (sq, sk) or n % nb:
            raise ValueError(f"score bias {{score_bias.shape}} does not broadcast against "
                             f"the scores ({{n}}, {{sq}}, {{sk}})")
        bias_operand = (score_bias.reshape(nb, sq, sk),)

        def bias_block(b, i, j):  # the key block kv_block fetches (causal: clamped)
            return (b % nb, i, kv_block(b, i, j)[1])

        bias_spec = (pl.BlockSpec((1, bq, bk), bias_block),)
    # double-buffered q, k, v and output blocks, the f32 scores and the scratch
    item = q.dtype.itemsize
    need = (2 * (bq * d + bk * d + bk * dv + bq * dv) * item + 2 * bq * bk * 4
            + bq * (dv + 256) * 4)
    out = pl.pallas_call(
        functools.partial(_flash, scale=d ** -0.5 if SCALED else 1.0, bq=bq, bk=bk),
        out_shape=jax.ShapeDtypeStruct((n, sq, dv), q.dtype),
        grid=(n, sq // bq, sk // bk),
        in_specs=[pl.BlockSpec((1, bq, d), lambda b, i, j: (b, i, 0)),
                  pl.BlockSpec((1, bk, d), kv_block),
                  pl.BlockSpec((1, bk, dv), kv_block),
                  *bias_spec],
        out_specs=pl.BlockSpec((1, bq, dv), lambda b, i, j: (b, i, 0)),
        scratch_shapes=[pltpu.VMEM((bq, 1), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
                        pltpu.VMEM((bq, dv), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(need)),
    )(q3, k3, v3, *bias_operand)
    out = out.reshape(*lead, sq, dv)
    return out.transpose(0, 2, 1, 3) if SEQ_MAJOR and out.ndim == 4 else out
'''
    why = ("Attention: the reference multiplies q by k^T, applies a softmax along the keys and "
           "multiplies by v. The kernel never builds the (seq x seq) score matrix: for each "
           "BLOCK_Q rows of queries it walks the key blocks (the innermost, 'arbitrary' grid "
           "axis) keeping a running max, a running sum and a float32 accumulator in VMEM "
           "(online softmax), and writes the normalized block once at the last key block"
           + ("; key blocks above the causal diagonal are skipped, and not fetched either."
              if causal else ".")
           + " 512x512 blocks keep the grid short (each step has a fixed cost) and the "
           "MXU busy; the kernel asks for the scoped VMEM they need.")
    return src, why


class _CutConv(ast.NodeTransformer):
    """Replaces every ``lax.conv_general_dilated(...)`` / ``lax.conv(...)`` call of the
    reference with ``_conv(...)`` (the same arguments): the kernel's own convolution."""

    def __init__(self) -> None:
        self.cut = 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if name in ("conv_general_dilated", "conv"):
            self.cut += 1
            return ast.copy_location(ast.Call(ast.Name("_conv", ast.Load()), node.args,
                                              node.keywords), node)
        return node


_CONV_KERNEL = '''

BLOCK_ROWS = 8  # output rows per grid step
TUNABLES = {"BLOCK_ROWS": [1, 2, 4, 8, 16, 32, 64]}
''' + _VMEM_HELPERS + '''

def _conv_body(x_ref, w_ref, o_ref, *, kh, kw, rows, width):
    r = pl.program_id(1)
    acc = jnp.zeros((rows * width, o_ref.shape[-1]), jnp.float32)
    for i in range(kh):
        for j in range(kw):
            window = x_ref[0, pl.ds(r * rows + i, rows), pl.ds(j, width), :]
            acc += jnp.dot(window.reshape(rows * width, window.shape[-1]), w_ref[i, j],
                           preferred_element_type=jnp.float32)
    o_ref[0] = acc.reshape(rows, width, o_ref.shape[-1]).astype(o_ref.dtype)


def _conv(lhs, rhs, window_strides=(1, 1), padding="VALID", lhs_dilation=None,
          rhs_dilation=None, dimension_numbers=None, feature_group_count=1, **unused):
    """lax.conv_general_dilated for 2-D, stride 1, undilated, ungrouped convolutions."""
    layout = tuple(dimension_numbers) if dimension_numbers is not None else (
        "NCHW", "OIHW", "NCHW")
    if len(layout) != 3 or any(not isinstance(s, str) for s in layout) or len(layout[0]) != 4:
        raise ValueError(f"the conv template handles 2-D convolutions named by strings "
                         f"(NHWC/HWIO or NCHW/OIHW), not {dimension_numbers!r}")
    if tuple(window_strides) != (1, 1) or any(d not in (None, (1, 1), [1, 1]) for d in (
            lhs_dilation, rhs_dilation)) or feature_group_count != 1:
        raise ValueError("the conv template handles stride 1, no dilation, one group")
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
    rows = min(BLOCK_ROWS, oh)
    width = -(-ow // 16) * 16  # whole sublane tiles: a window's rows flatten for free
    oh_pad = -(-oh // rows) * rows
    x = jnp.pad(x, ((0, 0), (ph[0], ph[1] + oh_pad - oh), (pw[0], pw[1] + width - ow),
                    (0, 0)))
    o = w.shape[-1]
    out_dtype = jnp.result_type(lhs.dtype, rhs.dtype)
    # VMEM holds the channels padded to whole 128-lane vregs (C_in = 64 takes 128)
    lanes = -(-c // 128) * 128
    image = x.shape[1] * x.shape[2] * lanes * x.dtype.itemsize
    need = 2 * (image + w.size * w.dtype.itemsize
                + rows * width * o * jnp.dtype(out_dtype).itemsize) + 3 * rows * width * o * 4
    out = pl.pallas_call(
        functools.partial(_conv_body, kh=kh, kw=kw, rows=rows, width=width),
        out_shape=jax.ShapeDtypeStruct((n, oh_pad, width, o), out_dtype),
        grid=(n, oh_pad // rows),
        in_specs=[pl.BlockSpec((1, *x.shape[1:]), lambda b, r: (b, 0, 0, 0)),
                  pl.BlockSpec(w.shape, lambda b, r: (0, 0, 0, 0))],
        out_specs=pl.BlockSpec((1, rows, width, o), lambda b, r: (b, r, 0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=_vmem_limit(need)),
    )(x, w)
    out = out[:, :oh, :ow, :]
    return jnp.transpose(out, ["NHWC".index(ch) for ch in layout[2]])


# The reference, its convolution done by the kernel above.
'''


def _conv(brief: TaskBrief) -> tuple[str, str]:
    """Convolution as matmuls: the reference's ``conv_general_dilated`` (2-D, stride 1,
    VALID or SAME, NHWC/HWIO or NCHW/OIHW) becomes a Pallas kernel that keeps one padded
    image in VMEM and, for each block of output rows, accumulates ``KH x KW`` MXU
    matmuls of shifted (rows x width, C_in) windows by the (C_in, C_out) weight slices in
    float32. The rest of the reference (layout changes, bias, activations, norms) stays
    as written around it."""
    head, fn, helpers = reference_parts(brief)
    fn = ast.parse(ast.get_source_segment(defining_source(brief)[0], fn)
                   or ast.unparse(fn)).body[0]
    cutter = _CutConv()
    fn = cutter.visit(fn)
    if not cutter.cut:
        raise TemplateError("the conv template needs the reference to call "
                            "`lax.conv_general_dilated` (or `lax.conv`)")
    ast.fix_missing_locations(fn)
    body = ast.unparse(fn).replace(f"def {fn.name}(", f"def {brief.entry}(", 1)
    src = _preamble(brief, "convolution as shifted MXU matmuls") + _IMPORTS + "\n"
    src += "\n\n\n".join(x for x in ("# From the task's reference.\n" + head if head else "",
                                     *helpers) if x)
    src += _CONV_KERNEL + body + "\n"
    why = ("Convolution: the reference's conv_general_dilated becomes a Pallas kernel. One "
           "padded image (NHWC) stays in VMEM while the grid walks blocks of BLOCK_ROWS "
           "output rows; each block accumulates KH x KW MXU matmuls of a shifted "
           "(rows x width, C_in) window by the (C_in, C_out) weight slice in float32 "
           "(convolution as matmul, without materialising im2col patches in HBM). The "
           "width is padded to whole sublane tiles so a window flattens without a "
           "relayout; the rest of the reference (its layout changes, bias and activations) "
           "runs as written around the kernel. The tuner sizes BLOCK_ROWS next.")
    return src, why


_CROSS_ENTROPY_KERNEL = '''

BLOCK_M = 512  # rows (tokens) per block; each keeps its whole hidden row in VMEM
BLOCK_V = 1024  # vocabulary columns per grid step
TUNABLES = {"BLOCK_M": [128, 256, 512, 1024], "BLOCK_V": [256, 512, 1024, 2048, 4096]}
''' + _VMEM_HELPERS + '''

def _ce_body(labels_ref, x_ref, w_ref, loss_ref, m_ref, l_ref, t_ref, *, vocab, bv,
             transposed):
    """One (rows, vocabulary block) step: the block's logits on the MXU, folded into each
    row's running max, sum of exponentials and label logit (an online logsumexp), so the
    (tokens x vocabulary) logits never reach HBM."""
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        t_ref[...] = jnp.zeros_like(t_ref)

    dims = (((1,), (1,)), ((), ())) if transposed else (((1,), (0,)), ((), ()))
    logits = jax.lax.dot_general(x_ref[...], w_ref[...], dims,
                                 preferred_element_type=jnp.float32)
    col = j * bv + jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    logits = jnp.where(col < vocab, logits, -jnp.inf)  # the last block may run past
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, logits.max(axis=-1, keepdims=True))
    l_ref[...] = jnp.exp(m_prev - m_new) * l_ref[...] + jnp.exp(logits - m_new).sum(
        axis=-1, keepdims=True)
    m_ref[...] = m_new
    t_ref[...] += jnp.where(col == labels_ref[...], logits, 0.0).sum(axis=-1, keepdims=True)

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        loss_ref[...] = m_ref[...] + jnp.log(l_ref[...]) - t_ref[...]


def _row_losses(x, w, labels):
    """-log softmax(x @ w)[label] per row, for x (rows, d), w (d, vocab) or (vocab, d)."""
    rows, d = x.shape
    transposed = w.shape[0] != d
    vocab = w.shape[0] if transposed else w.shape[1]
    bm, bv = min(BLOCK_M, rows), min(BLOCK_V, vocab)
    item = x.dtype.itemsize

    def need(bm, bv):  # double-buffered x rows and w columns, f32 logits and their exps
        return 2 * (bm * d + d * bv) * w.dtype.itemsize + 3 * bm * bv * 4 + 2 * bm * d * item

    while need(bm, bv) > VMEM_CAP and bv > 128:
        bv //= 2
    while need(bm, bv) > VMEM_CAP and bm > 8 and rows % (bm // 2) == 0:
        bm //= 2
    w_spec = (pl.BlockSpec((bv, d), lambda i, j: (j, 0)) if transposed
              else pl.BlockSpec((d, bv), lambda i, j: (0, j)))
    losses = pl.pallas_call(
        functools.partial(_ce_body, vocab=vocab, bv=bv, transposed=transposed),
        out_shape=jax.ShapeDtypeStruct((rows, 1), jnp.float32),
        grid=(pl.cdiv(rows, bm), pl.cdiv(vocab, bv)),
        in_specs=[pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
                  pl.BlockSpec((bm, d), lambda i, j: (i, 0)),
                  w_spec],
        out_specs=pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
        scratch_shapes=[pltpu.VMEM((bm, 1), jnp.float32) for _ in range(3)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(need(bm, bv))),
    )(labels.reshape(rows, 1).astype(jnp.int32), x, w)
    return losses.reshape(rows)
'''


def _cross_entropy(brief: TaskBrief) -> tuple[str, str]:
    """Linear cross entropy: ``mean(-log_softmax(h @ w)[label])`` (or the per-row losses)
    for a reference that projects hidden states onto a vocabulary and takes a softmax
    cross entropy against integer labels. Its own math is not reused (the logits are
    never formed); the checks decide whether the reference is this computation."""
    _head, fn, _helpers = reference_parts(brief)
    params = [a.arg for a in fn.args.args]
    if len(params) != 3:
        raise TemplateError("the cross-entropy template needs a reference taking hidden "
                            "states, a projection weight and integer labels")
    hidden, weight, labels = params
    src = _preamble(brief, "linear cross entropy with an online logsumexp") + _IMPORTS
    src += _CROSS_ENTROPY_KERNEL + f'''

@jax.jit
def {brief.entry}({hidden}, {weight}, {labels}):
    x = {hidden}.reshape(-1, {hidden}.shape[-1])
    losses = _row_losses(x, {weight}, {labels}.reshape(-1))
    return jnp.mean(losses)
'''
    why = ("Cross entropy after a projection: the reference forms the (tokens x vocabulary) "
           "logits, takes a log-softmax and picks each row's label. The kernel never forms "
           "them: for each block of BLOCK_M token rows (the whole hidden row in VMEM, read "
           "once) it walks the vocabulary in BLOCK_V-column blocks (the 'arbitrary' axis), "
           "computes each block's logits on the MXU in f32 and folds them into the row's "
           "running max, sum of exponentials and label logit; the last block writes "
           "max + log(sum) - label logit. Only the mean of the per-row losses runs outside.")
    return src, why


def _matmul_operands(node: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """(lhs, rhs) of ``a @ b``, ``jnp.dot(a, b)`` or ``jnp.matmul(a, b)``, else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return node.left, node.right
    if isinstance(node, ast.Call) and len(node.args) == 2 and not node.keywords:
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if name in ("dot", "matmul"):
            return node.args[0], node.args[1]
    return None


class _CutGated(ast.NodeTransformer):
    """The two products of one input by two weights (``x @ gate``, ``x @ up``) become
    ``_acc0`` and ``_acc1``."""

    def __init__(self, params: list[str]) -> None:
        self.params = params
        self.cut: list[tuple[str, str]] = []

    def visit(self, node: ast.AST) -> ast.AST:
        pair = _matmul_operands(node)
        if pair is not None and all(isinstance(p, ast.Name) and p.id in self.params
                                    for p in pair) and len(self.cut) < 2 and (
                not self.cut or self.cut[0][0] == pair[0].id):
            self.cut.append((pair[0].id, pair[1].id))
            return ast.copy_location(ast.Name(f"_acc{len(self.cut) - 1}", ast.Load()), node)
        return self.generic_visit(node)


_GATED_KERNEL = '''

BLOCK_M = 512
BLOCK_N = 1024
BLOCK_K = 1024
TUNABLES = {"BLOCK_M": [128, 256, 512, 1024, 2048], "BLOCK_N": [128, 256, 512, 1024, 2048],
            "BLOCK_K": [128, 256, 512, 1024, 2048]}
''' + _VMEM_HELPERS + '''

def _k_block(k, want):
    """A K block that divides k: a ragged last K block would add padding into the sum."""
    bk = min(want, k)
    while k % bk and bk > 128:
        bk //= 2
    return bk if k % bk == 0 and (bk % 128 == 0 or bk == k) else k


def _gated_body(x_ref, a_ref, b_ref, o_ref, acc0, acc1):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc0[...] = jnp.zeros_like(acc0)
        acc1[...] = jnp.zeros_like(acc1)

    x = x_ref[...]
    acc0[...] += jnp.dot(x, a_ref[...], preferred_element_type=jnp.float32)
    acc1[...] += jnp.dot(x, b_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _finish():
        # the gating in f32 on the finished products (the TPU's vector unit computes in
        # f32 anyway), one rounding to the output's dtype
        o_ref[...] = _gate(acc0[...], acc1[...]).astype(o_ref.dtype)


def _matmul_body(h_ref, w_ref, o_ref, acc):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc[...] = jnp.zeros_like(acc)

    acc[...] += jnp.dot(h_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _finish():
        o_ref[...] = acc[...].astype(o_ref.dtype)


def _blocks(m, n, k, item, operands):
    bm, bn, bk = min(BLOCK_M, m), min(BLOCK_N, n), _k_block(k, BLOCK_K)

    def need(bm, bn, bk):  # double-buffered blocks, the f32 accumulators
        return 2 * (bm * bk + operands * bk * bn + bm * bn) * item + operands * bm * bn * 4

    while need(bm, bn, bk) > VMEM_CAP and bk > 128 and k % (bk // 2) == 0:
        bk //= 2
    while need(bm, bn, bk) > VMEM_CAP and bm > 8 and m % (bm // 2) == 0:
        bm //= 2
    return bm, bn, bk, need(bm, bn, bk)


def _gated(x, a, b):
    """_gate(x @ a, x @ b) in one kernel: both products share each x block."""
    (m, k), n = x.shape, a.shape[1]
    bm, bn, bk, need = _blocks(m, n, k, x.dtype.itemsize, 2)
    w_spec = pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))
    return pl.pallas_call(
        _gated_body,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)), w_spec, w_spec],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32), pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(need)),
    )(x, a, b)


def _matmul(h, w):
    (m, k), n = h.shape, w.shape[1]
    bm, bn, bk, need = _blocks(m, n, k, h.dtype.itemsize, 1)
    return pl.pallas_call(
        _matmul_body,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.result_type(h.dtype, w.dtype)),
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn), pl.cdiv(k, bk)),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=_vmem_limit(need)),
    )(h, w)
'''


def _gated_mlp(brief: TaskBrief) -> tuple[str, str]:
    """A gated MLP (SwiGLU, GeGLU): ``act(x @ gate) * (x @ up) @ down``. The two
    products of x are one kernel (each x block feeds both MXU products, the gating is
    their epilogue) and the down projection a second; nothing of size runs outside."""
    head, fn, helpers = reference_parts(brief)
    fn = ast.parse(ast.get_source_segment(defining_source(brief)[0], fn)
                   or ast.unparse(fn)).body[0]
    params = [a.arg for a in fn.args.args]
    last = fn.body[-1] if fn.body else None
    down = _matmul_operands(last.value) if isinstance(last, ast.Return) and last.value \
        else None
    if down is None or not isinstance(down[1], ast.Name) or down[1].id not in params:
        raise TemplateError("the gated-MLP template needs a reference that returns "
                            "`h @ down` (or jnp.dot(h, down)) of a weight argument")
    cutter = _CutGated(params)
    body = [cutter.visit(stmt) for stmt in fn.body[:-1]]
    gated = cutter.visit(down[0])
    if len(cutter.cut) != 2:
        raise TemplateError("the gated-MLP template needs two products of one input by two "
                            "weight arguments (x @ gate, x @ up)")
    (x, a), (_x, b) = cutter.cut
    w_down = down[1].id
    used = {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)} | {
        n.id for n in ast.walk(gated) if isinstance(n, ast.Name)}
    if used & (set(params) - {x, a, b, w_down}) or x in used:
        raise TemplateError("the gating uses more of the reference's arguments than the two "
                            "products: this template cannot fuse it")
    gate_fn = ast.FunctionDef(
        name="_gate", args=ast.arguments(posonlyargs=[], args=[ast.arg("_acc0"),
                                                                 ast.arg("_acc1")],
                                         kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[*body, ast.Return(gated)], decorator_list=[], returns=None)
    ast.fix_missing_locations(gate_fn)
    src = _preamble(brief, "gated MLP: fused gate and up projections, then down") + _IMPORTS
    src += "\n" + "\n\n\n".join(x for x in ("# From the task's reference.\n" + head if head
                                            else "", *helpers) if x)
    src += f'''


# The reference's gating, on the two products `_acc0` = {x} @ {a}, `_acc1` = {x} @ {b}.
{ast.unparse(gate_fn)}
''' + _GATED_KERNEL + f'''

@jax.jit
def {brief.entry}({", ".join(params)}):
    x2 = {x}.reshape(-1, {x}.shape[-1])
    h = _gated(x2, {a}, {b})
    return _matmul(h, {w_down}).reshape(*{x}.shape[:-1], {w_down}.shape[-1])
'''
    why = (f"Gated MLP: the reference multiplies `{x}` by two weights (`{a}`, `{b}`), gates one "
           f"product by the other and projects the result by `{w_down}`. The first kernel "
           "walks (rows, hidden, K) blocks with two f32 accumulators, so each block of x "
           "feeds both MXU products, and applies the reference's gating to the finished "
           "tiles before one write; the second kernel is a tiled matmul by the down "
           "projection. The kernels ask for the scoped VMEM their blocks need.")
    return src, why
