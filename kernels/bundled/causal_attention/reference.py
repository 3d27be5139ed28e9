"""Reference for the causal_attention task: masked softmax attention in jax.numpy."""

import jax
import jax.numpy as jnp


def make_inputs(key, batch=1, heads=2, seq=256, head_dim=128):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (batch, heads, seq, head_dim)
    q = jax.random.normal(kq, shape, dtype=jnp.float32)
    k = jax.random.normal(kk, shape, dtype=jnp.float32)
    v = jax.random.normal(kv, shape, dtype=jnp.float32)
    return q, k, v


def reference(q, k, v):
    seq, head_dim = q.shape[-2], q.shape[-1]
    hi = jax.lax.Precision.HIGHEST
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=hi) / jnp.sqrt(jnp.float32(head_dim))
    mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    s = jnp.where(mask, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v, precision=hi)


def flops(q, k, v):
    batch, heads, seq, head_dim = q.shape
    # Two matmuls over the lower triangle (about half of seq x seq).
    return 2.0 * 2.0 * batch * heads * seq * seq * head_dim / 2.0
