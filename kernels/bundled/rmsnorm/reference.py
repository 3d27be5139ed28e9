"""Reference for the rmsnorm task: RMSNorm with a learned scale, in jax.numpy."""

import jax
import jax.numpy as jnp

EPS = 1e-6


def make_inputs(key, rows=256, cols=512):
    kx, kw = jax.random.split(key)
    x = jax.random.normal(kx, (rows, cols), dtype=jnp.float32)
    weight = 1.0 + 0.1 * jax.random.normal(kw, (1, cols), dtype=jnp.float32)
    return x, weight


def reference(x, weight):
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(ms + EPS) * weight


def flops(x, weight):
    # square, sum, scale, multiply by weight: about 4 operations per element.
    return 4.0 * x.size
