"""Dots priced at the precision XLA runs them (``profiling.precision``), and the XLA
reference's roofline with them: an f32 matmul at DEFAULT precision runs as one bf16
pass on a TPU's matrix unit (XLA's f32 4096x8192 @ 8192x8192 measured 3.66 ms on a v5e:
150 TFLOP/s of the 197 bf16 peak), so pricing it at a third of the bf16 peak put the
reference's physical limit 3x too high. Real StableHLO from ``jax.export``; no TPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from tilewright.kernels.worker.tpu import reference_programs as reference
from tilewright.profiling.chips import get_chip
from tilewright.profiling.precision import dot_work, mxu_seconds

S = jax.ShapeDtypeStruct


def stablehlo(fn, *avals) -> str:
    return jax.export.export(jax.jit(fn), platforms=["tpu"])(*avals).mlir_module()


def test_each_dot_has_its_work_type_and_precision() -> None:
    x, w = S((512, 256), jnp.float32), S((256, 128), jnp.float32)
    default = dot_work(stablehlo(lambda a, b: a @ b, x, w))
    assert [(d.flops, d.dtype, d.precision, d.passes) for d in default] == [
        (2.0 * 512 * 128 * 256, "f32", "DEFAULT", 1)]
    high = dot_work(stablehlo(lambda a, b: jnp.dot(a, b, precision="high"), x, w))
    highest = dot_work(stablehlo(lambda a, b: jnp.dot(a, b, precision="highest"), x, w))
    assert high[0].passes == 3 and highest[0].passes == 6
    batched = dot_work(stablehlo(lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b),
                                 S((4, 64, 32), jnp.bfloat16), S((4, 32, 16), jnp.bfloat16)))
    assert [(d.flops, d.dtype, d.passes) for d in batched] == [(2.0 * 4 * 64 * 16 * 32,
                                                                 "bf16", 1)]
    int8 = dot_work(stablehlo(
        lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.int32),
        S((256, 256), jnp.int8), S((256, 256), jnp.int8)))
    assert int8[0].dtype == "i8"
    v5e = get_chip("v5e")
    # int8 at the v5e's int8 rate (394 TOPS), twice its bf16 rate
    assert mxu_seconds(int8, v5e) == pytest.approx(int8[0].flops / 394e12)
    assert dot_work(stablehlo(lambda a: jnp.tanh(a), x)) == []


def test_the_reference_roofline_prices_a_default_f32_matmul_at_the_bf16_peak() -> None:
    def gemm(x, w):
        return x @ w

    avals = [S((4096, 8192), jnp.float32), S((8192, 8192), jnp.float32)]
    cost = reference.export_program(jax.jit(gemm), avals, [], "v5e").cost
    roof = reference.roofline(cost, "v5e")
    flops = 2.0 * 4096 * 8192 * 8192
    assert cost["dot_flops"] == flops and cost["dot_max_passes"] == 1
    assert roof["compute_s"] == pytest.approx(flops / 197e12, rel=1e-3)  # 2.79 ms
    assert roof["bound_by"] == "compute" and "one bf16 pass" in roof["precision"]
    # the same matmul at HIGHEST: six passes
    def gemm_highest(x, w):
        return jnp.dot(x, w, precision="highest")

    cost = reference.export_program(jax.jit(gemm_highest), avals, [], "v5e").cost
    assert reference.roofline(cost, "v5e")["compute_s"] == pytest.approx(6 * flops / 197e12,
                                                                         rel=1e-3)
    # a program without dots: priced as before (memory-bound here)
    cost = reference.export_program(jax.jit(jnp.tanh), avals[:1], [], "v5e").cost
    roof = reference.roofline(cost, "v5e")
    assert roof["precision"] is None and roof["bound_by"] == "memory"
