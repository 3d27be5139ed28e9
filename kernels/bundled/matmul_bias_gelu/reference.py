"""Reference for the matmul_bias_gelu task: gelu(x @ w + b) in jax.numpy, float32."""

import jax
import jax.numpy as jnp


def make_inputs(key, m=256, k=256, n=256):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (m, k), dtype=jnp.float32)
    # Scaled so that x @ w stays O(1) whatever k is, where GELU is far from linear.
    w = jax.random.normal(kw, (k, n), dtype=jnp.float32) / jnp.sqrt(jnp.float32(k))
    b = 0.1 * jax.random.normal(kb, (1, n), dtype=jnp.float32)
    return x, w, b


def reference(x, w, b):
    y = jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST) + b
    return jax.nn.gelu(y, approximate=True)


def flops(x, w, b):
    m, k = x.shape
    n = w.shape[1]
    return 2.0 * m * k * n + 10.0 * m * n
