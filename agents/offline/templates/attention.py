"""Flash attention: an online softmax over key blocks (causal skip, GQA, a score bias)."""

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
from tilewright.agents.offline.templates.kernel_text import (
    F32_PASSES_HELPERS,
    F32_PASSES_TUNABLE,
    VMEM_HELPERS,
)


def attention(brief: TaskBrief) -> tuple[str, str]:
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
    # The reference's products at full precision (``precision=HIGHEST``): kept on float32
    # operands, where a TPU's default is one bf16 pass (about three digits)
    highest = "highest" in text
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
    # q and k go to the MXU in their own dtype (bf16 stays bf16), scores in f32; float32
    # operands at the reference's precision, HIGHEST in 6 or 3 passes (F32_PASSES)
    if highest:
        qk = "_product(q_ref[0], k_ref[0], (((1,), (1,)), ((), ())))"
        pv = "_product(p.astype(v_ref.dtype), v_ref[0], (((1,), (0,)), ((), ())))"
    else:
        qk = ("jax.lax.dot_general(q_ref[0], k_ref[0], (((1,), (1,)), ((), ())),\n"
              "                                preferred_element_type=jnp.float32)")
        pv = ("jnp.dot(\n            p.astype(v_ref.dtype), v_ref[0], "
              "preferred_element_type=jnp.float32)")
    src = _preamble(brief, "flash attention (online softmax over key blocks)") + _IMPORTS
    src += f'''

CAUSAL = {causal}
SCALED = {scaled}  # the reference multiplies the scores by head_dim ** -0.5
SEQ_MAJOR = {seq_major}  # inputs and output are (batch, seq, heads, head_dim)
BIAS = {bias is not None}  # the reference adds `{bias}` to the (scaled) scores
PRECISION = {"jax.lax.Precision.HIGHEST" if highest else None}  # the reference's, on float32 products
BLOCK_Q = 512
BLOCK_K = 512
{"F32_PASSES = 6  # MXU passes per float32 product: 6 (HIGHEST) or 3 (see _product)"
 if highest else ""}
TUNABLES = {{"BLOCK_Q": [128, 256, 512, 1024, 2048], "BLOCK_K": [128, 256, 512, 1024, 2048]{", " + F32_PASSES_TUNABLE if highest else ""}}}
{'TUNABLE_SWITCHES = ("F32_PASSES",)  # how the products are made, not a block size'
 if highest else ""}
_MASKED = -1e9  # what the reference writes where the mask hides a score
''' + VMEM_HELPERS + (F32_PASSES_HELPERS if highest else '') + f'''

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
        s = {qk} * scale
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
        acc_ref[...] = alpha * acc_ref[...] + {pv}
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
