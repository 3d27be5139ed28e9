"""Starting kernel for gelu: a tiled elementwise Pallas kernel.

Each grid step loads one (BLOCK_ROWS, BLOCK_COLS) tile into VMEM, applies GELU and
writes it back. Naive on purpose: small tiles mean many grid steps, each paying
per-step overhead, which leaves the tuner room.
"""

import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 64
BLOCK_COLS = 256
TUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512], "BLOCK_COLS": [128, 256, 512, 1024, 2048]}

_C = math.sqrt(2.0 / math.pi)


def gelu_kernel(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = 0.5 * x * (1.0 + jnp.tanh(_C * (x + 0.044715 * x * x * x)))


@jax.jit
def kernel(x):
    rows, cols = x.shape
    # Clamp to the array: a block may equal the full dimension, which TPU accepts.
    br, bc = min(BLOCK_ROWS, rows), min(BLOCK_COLS, cols)
    return pl.pallas_call(
        gelu_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(pl.cdiv(rows, br), pl.cdiv(cols, bc)),
        in_specs=[pl.BlockSpec((br, bc), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((br, bc), lambda i, j: (i, j)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
    )(x)
