"""Starting kernel for softmax: one block of whole rows per grid step.

Each step loads (BLOCK_ROWS, cols) into VMEM, does max / exp / sum / divide on it and
writes it back. Naive: a plain division instead of a reciprocal multiply, and the
whole row must fit in VMEM (fine up to tens of thousands of columns).
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 32
TUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512]}


def softmax_kernel(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


@jax.jit
def kernel(x):
    rows, cols = x.shape
    br = min(BLOCK_ROWS, rows)  # a block may equal the full dimension
    return pl.pallas_call(
        softmax_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(pl.cdiv(rows, br),),
        in_specs=[pl.BlockSpec((br, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((br, cols), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(x)
