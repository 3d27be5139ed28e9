"""Fused layers: cross entropy (an online logsumexp over vocabulary blocks) and the
gated MLP (two products of x in one kernel, then the down projection)."""

from __future__ import annotations

import ast

from tilewright.agents.base import TaskBrief
from tilewright.agents.offline.reference_reading import (
    _IMPORTS,
    TemplateError,
    _preamble,
    defining_source,
    reference_parts,
)
from tilewright.agents.offline.templates.kernel_text import VMEM_HELPERS

_CROSS_ENTROPY_KERNEL = '''

BLOCK_M = 512  # rows (tokens) per block; each keeps its whole hidden row in VMEM
BLOCK_V = 1024  # vocabulary columns per grid step
TUNABLES = {"BLOCK_M": [128, 256, 512, 1024], "BLOCK_V": [256, 512, 1024, 2048, 4096]}
''' + VMEM_HELPERS + '''

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


def cross_entropy(brief: TaskBrief) -> tuple[str, str]:
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
''' + VMEM_HELPERS + '''

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


def gated_mlp(brief: TaskBrief) -> tuple[str, str]:
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
