"""Static analysis of pallas_call (``profiling.static*``): blocks, bytes moved, VMEM,
alignment, MXU shape, flops and the warnings, against hand-computed figures and against
what the TPU lowering itself accepts. No trace is captured here (tests/test_profiling.py
covers capture, conversion and reports)."""

from __future__ import annotations

import pytest

from tilewright.profiling import chips

KiB, MiB = 1024, 1024 * 1024

# -- static analysis against hand-computed figures --------------------------------------

def _matmul(bm: int, bk: int, bn: int, dtype: str = "bfloat16", semantics: bool = True):
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _init():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _done():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)

    def matmul(x, y):
        m, k = x.shape
        n = y.shape[1]
        params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")) \
            if semantics else None
        return pl.pallas_call(
            kernel, grid=(m // bm, n // bn, k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                      pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j))],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
            compiler_params=params,
        )(x, y)

    return matmul, jnp.dtype(dtype)


def test_static_matmul_by_hand() -> None:
    import jax

    from tilewright.profiling.static import analyze_callable

    fn, dt = _matmul(128, 256, 128)
    x = jax.ShapeDtypeStruct((256, 512), dt)
    y = jax.ShapeDtypeStruct((512, 384), dt)
    result = analyze_callable(fn, (x, y), chip=chips.get_chip("v5e"))
    (k,) = result["kernels"]
    # grid (M/bm, N/bn, K/bk) = (2, 3, 2) = 12 steps, k fastest.
    assert k["grid"] == [2, 3, 2] and k["steps"] == 12
    x_op, y_op, o_op = k["operands"]
    assert (x_op["name"], y_op["name"], o_op["name"]) == ("x_ref", "y_ref", "o_ref")
    # x block (i, k) changes every step: 12 fetches x 128*256*2 B (64 KiB) = 768 KiB.
    assert x_op["fetches"] == 12 and x_op["bytes_total"] == 12 * 64 * KiB
    # y block (k, j) changes every step too: 12 x 256*128*2 B (64 KiB).
    assert y_op["fetches"] == 12 and y_op["bytes_total"] == 12 * 64 * KiB
    # out block (i, j) changes every 2 steps: 6 writebacks x 128*128*2 B (32 KiB).
    assert o_op["fetches"] == 6 and o_op["bytes_total"] == 6 * 32 * KiB
    assert k["bytes_total"] == (768 + 768 + 192) * KiB
    # x (256 KiB) is read 3 times (once per N block), y (384 KiB) twice, out written once.
    assert [o["traffic_factor"] for o in k["operands"]] == [3.0, 2.0, 1.0]
    # VMEM: 2 buffers each of x (64 KiB), y (64 KiB), out (32 KiB) + f32 acc 128*128*4 (64 KiB).
    assert k["vmem_bytes"] == 2 * 64 * KiB + 2 * 64 * KiB + 2 * 32 * KiB + 64 * KiB == 384 * KiB
    assert k["vmem_padded_bytes"] == k["vmem_bytes"]  # aligned blocks need no padding
    # flops: 2*128*256*128 per step x 12 steps = 2*M*K*N.
    assert k["flops_source"] == "dots" and k["flops"] == 2 * 256 * 512 * 384
    assert k["intensity"] == pytest.approx(2 * 256 * 512 * 384 / (1728 * KiB))
    (dot,) = k["dots"]
    assert (dot["m"], dot["k"], dot["n"]) == (128, 256, 128) and dot["mxu_ok"]
    assert all(o["alignment"]["ok"] for o in k["operands"])
    assert not [w for w in k["warnings"] if w["severity"] == "error"]
    # Task flops, when the task has them, replace dot counting.
    with_task = analyze_callable(fn, (x, y), chip=chips.get_chip("v5e"), task_flops=123.0)
    assert with_task["kernels"][0]["flops"] == 123.0


def _elementwise(block_rows: int, block_cols: int):
    import jax
    from jax.experimental import pallas as pl

    def kernel(x_ref, b_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + b_ref[...]

    def scale_bias(x, b):
        rows, cols = x.shape
        # Grid (col blocks, row blocks): rows vary fastest, so the bias block (0, j)
        # stays put for a whole column of steps.
        return pl.pallas_call(
            kernel, grid=(cols // block_cols, rows // block_rows),
            in_specs=[pl.BlockSpec((block_rows, block_cols), lambda j, i: (i, j)),
                      pl.BlockSpec((1, block_cols), lambda j, i: (0, j))],
            out_specs=pl.BlockSpec((block_rows, block_cols), lambda j, i: (i, j)),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(x, b)

    return scale_bias


def test_static_elementwise_by_hand() -> None:
    import jax
    import jax.numpy as jnp

    from tilewright.profiling.static import analyze_callable

    fn = _elementwise(64, 128)
    x = jax.ShapeDtypeStruct((512, 256), jnp.float32)
    b = jax.ShapeDtypeStruct((1, 256), jnp.float32)
    (k,) = analyze_callable(fn, (x, b), chip=chips.get_chip("v5e"))["kernels"]
    assert k["grid"] == [2, 8] and k["steps"] == 16
    x_op, b_op, o_op = k["operands"]
    # x and out blocks (64x128 f32 = 32 KiB) change every step: 16 x 32 KiB each.
    assert x_op["bytes_total"] == o_op["bytes_total"] == 16 * 32 * KiB
    # The bias block changes only when j does: 2 fetches x 128*4 B.
    assert b_op["fetches"] == 2 and b_op["bytes_total"] == 2 * 512
    # VMEM: 2 x 32 KiB (x) + 2 x 32 KiB (out) + 2 x (1,128) f32 bias blocks of 512 B;
    # padded to TPU tiles the bias block takes a whole (8,128) f32 tile: 2 x 4 KiB.
    assert k["vmem_bytes"] == 4 * 32 * KiB + 2 * 512
    assert k["vmem_padded_bytes"] == 4 * 32 * KiB + 2 * 4 * KiB
    # flops: one mul and one add per element: 2 x 64*128 per step x 16 steps.
    assert k["flops_source"] == "elementwise" and k["flops"] == 2 * 64 * 128 * 16
    assert k["dot_flops"] == 0 and k["dots"] == []


def test_misaligned_block_is_an_error_the_lowering_agrees_with() -> None:
    import jax
    import jax.numpy as jnp

    from tilewright.profiling.static import analyze_callable

    fn = _elementwise(8, 64)  # last dim 64: not a multiple of 128, not the full 256
    x = jax.ShapeDtypeStruct((512, 256), jnp.float32)
    b = jax.ShapeDtypeStruct((1, 256), jnp.float32)
    (k,) = analyze_callable(fn, (x, b), chip=chips.get_chip("v5e"))["kernels"]
    errors = [w for w in k["warnings"] if w["code"] == "misaligned_block"]
    assert {w["operand"] for w in errors} == {"args[0]", "args[1]", "outputs"}
    assert "(8, 128)" in errors[0]["fix"]
    assert k["operands"][0]["alignment"]["suggest"] == [8, 128]
    # Each points at the line of its BlockSpec in the kernel source.
    import inspect

    lines, first = inspect.getsourcelines(_elementwise)
    spec_line = first + next(i for i, text in enumerate(lines) if "in_specs=" in text)
    assert next(w for w in errors if w["operand"] == "args[0]")["line"] == spec_line
    # Ground truth: the TPU lowering rejects the same kernel.
    with pytest.raises(ValueError, match="divisible by 8 and 128"):
        jax.jit(fn).trace(x, b).lower(lowering_platforms=("tpu",))
    aligned = analyze_callable(_elementwise(8, 128), (x, b), chip=chips.get_chip("v5e"))
    assert not [w for w in aligned["kernels"][0]["warnings"] if w["code"] == "misaligned_block"]


def test_vmem_overflow_warnings() -> None:
    import jax

    from tilewright.profiling.static import analyze_callable

    fn, dt = _matmul(2048, 2048, 2048, dtype="float32")
    x = jax.ShapeDtypeStruct((4096, 4096), dt)
    # Blocks of 2048x2048 f32 are 16 MiB: 2 x (x, y, out) + acc = 7 x 16 MiB = 112 MiB.
    (k,) = analyze_callable(fn, (x, x), chip=chips.get_chip("v5e"))["kernels"]
    assert k["vmem_bytes"] == 112 * MiB
    codes = {w["code"]: w for w in k["warnings"]}
    assert "vmem_over_scoped" in codes and "vmem_over_physical" not in codes  # 16 < 112 < 128
    assert "vmem_limit_bytes=128" in codes["vmem_over_scoped"]["fix"]  # 112 * 1.25, capped
    (k5p,) = analyze_callable(fn, (x, x), chip=chips.get_chip("v5p"))["kernels"]
    over = [w for w in k5p["warnings"] if w["code"] == "vmem_over_physical"]
    assert over and over[0]["severity"] == "error" and "shrink" in over[0]["fix"]


def test_grid_too_small_for_two_cores() -> None:
    import jax

    from tilewright.profiling.static import analyze_callable

    fn, dt = _matmul(256, 256, 256)
    x = jax.ShapeDtypeStruct((256, 256), dt)  # grid (1, 1, 1)
    (k,) = analyze_callable(fn, (x, x), chip=chips.get_chip("v5p"))["kernels"]
    assert [w["code"] for w in k["warnings"]].count("cores_idle") == 1
    (k1,) = analyze_callable(fn, (x, x), chip=chips.get_chip("v5e"))["kernels"]
    assert "cores_idle" not in [w["code"] for w in k1["warnings"]]  # one TensorCore
    no_sem, _ = _matmul(128, 256, 128, semantics=False)
    y = jax.ShapeDtypeStruct((256, 512), dt)
    (k2,) = analyze_callable(no_sem, (y, jax.ShapeDtypeStruct((512, 384), dt)),
                             chip=chips.get_chip("v4"))["kernels"]
    idle = [w for w in k2["warnings"] if w["code"] == "cores_idle"]
    assert idle and "dimension_semantics=('parallel'" in idle[0]["fix"]


def test_tiny_blocks_warn_about_step_overhead() -> None:
    import jax
    import jax.numpy as jnp

    from tilewright.profiling.static import analyze_callable

    fn = _elementwise(8, 128)  # 4 KiB blocks over a 16 MiB array: 4096 steps
    x = jax.ShapeDtypeStruct((4096, 1024), jnp.float32)
    b = jax.ShapeDtypeStruct((1, 1024), jnp.float32)
    (k,) = analyze_callable(fn, (x, b), chip=chips.get_chip("v5e"))["kernels"]
    (w,) = [w for w in k["warnings"] if w["code"] == "per_step_overhead"]
    # ~8 KiB per step is 0.01 us at 819 GB/s against 0.35 us per step; aim for
    # 2 x 0.35 us x 819 GB/s = 573 kB per step: 128x bigger blocks, 32 steps.
    assert "4096 grid steps" in w["message"]
    assert "grow the blocks about 128x" in w["fix"] and "~32 steps" in w["fix"]
    big = analyze_callable(_elementwise(512, 1024), (x, b), chip=chips.get_chip("v5e"))
    assert "per_step_overhead" not in [w["code"] for w in big["kernels"][0]["warnings"]]



def test_prefetch_hbm_scan_and_buffering_are_read() -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from tilewright.profiling.static import analyze_callable

    v5e = chips.get_chip("v5e")

    def copy(idx_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...]

    def gather(idx, x):  # rows picked by a scalar-prefetch index: known only at run time
        return pl.pallas_call(copy, grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(4,),
            in_specs=[pl.BlockSpec((8, 128), lambda i, idx: (idx[i], 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i, idx: (i, 0))),
            out_shape=jax.ShapeDtypeStruct((32, 128), x.dtype))(idx, x)

    (k,) = analyze_callable(gather, (jax.ShapeDtypeStruct((4,), jnp.int32),
                                     jax.ShapeDtypeStruct((64, 128), jnp.float32)),
                            chip=v5e)["kernels"]
    x_op, o_op = k["operands"]
    assert (x_op["fetches"], x_op["bytes_exact"]) == (4, False)  # upper bound, said so
    assert (o_op["fetches"], o_op["bytes_exact"]) == (4, True)
    assert any("scalar-prefetch" in n for n in k["notes"])
    # With concrete inputs (as in a profile) the prefetched rows are known: [0, 0, 1, 1]
    # picks block 0 twice, then block 1 twice: 2 fetches, exactly.
    (k,) = analyze_callable(gather, (jnp.array([0, 0, 1, 1], jnp.int32), jnp.ones((64, 128))),
                            chip=v5e)["kernels"]
    assert (k["operands"][0]["fetches"], k["operands"][0]["bytes_kind"]) == (2, "exact")
    (k,) = analyze_callable(gather, (jnp.array([0, 9, 1, 1], jnp.int32), jnp.ones((64, 128))),
                            chip=v5e)["kernels"]
    assert "block_out_of_bounds" in [w["code"] for w in k["warnings"]]  # row block 9 of 8

    def manual(x_hbm, o_ref, buf, sem):
        dma = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf, sem)
        dma.start()
        dma.wait()
        o_ref[...] = buf[...]

    def from_hbm(x):
        return pl.pallas_call(manual, grid=(1,), in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
                              out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
                              scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32),
                                              pltpu.SemaphoreType.DMA(())])(x)

    (k,) = analyze_callable(from_hbm, (jax.ShapeDtypeStruct((64, 128), jnp.float32),),
                            chip=v5e)["kernels"]
    hbm, out = k["operands"]
    assert out["fetches"] == 1 and out["bytes_total"] == 4 * KiB
    assert hbm["memory_space"] == "hbm" and hbm["vmem_bytes"] == 0
    # VMEM: the output block twice (2 x 4 KiB) + the 4 KiB scratch buffer; no semaphore bytes.
    assert k["vmem_bytes"] == 3 * 4 * KiB

    def pipelined(x_hbm, o_hbm):  # emit_pipeline needs a TPU context: traced as a v5e
        def inner(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0
        spec = pl.BlockSpec((8, 128), lambda i: (i, 0))
        pltpu.emit_pipeline(inner, grid=(4,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)

    def with_pipeline(x):
        return pl.pallas_call(pipelined, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec(memory_space=pl.ANY),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    (k,) = analyze_callable(with_pipeline, (jax.ShapeDtypeStruct((32, 128), jnp.float32),),
                            chip=v5e)["kernels"]
    # The inner pipeline double-buffers one (8, 128) f32 block per operand: 2 x 2 x 4 KiB.
    assert k["vmem_bytes"] == 16 * KiB

    def twice(x_ref, o_ref):
        o_ref[...] = jax.lax.fori_loop(0, 4, lambda i, acc: acc + x_ref[...] * 2.0,
                                       jnp.zeros_like(o_ref))

    def repeated(x):
        def step(carry, _):
            y = pl.pallas_call(twice, grid=(2,), in_specs=[pl.BlockSpec(
                (8, 128), lambda i: (i, 0), pipeline_mode=pl.Buffered(3))],
                out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                out_shape=jax.ShapeDtypeStruct(carry.shape, carry.dtype))(carry)
            return y, None
        return jax.lax.scan(step, x, None, length=5)[0]

    def scoped(x_ref, o_ref):
        def body(buf, spare):
            buf[...] = x_ref[...] * 2.0
            o_ref[...] = buf[...]
        pl.run_scoped(body, pltpu.VMEM((8, 128), jnp.float32), pltpu.VMEM((16, 128), jnp.bfloat16))

    def with_scope(x):
        return pl.pallas_call(scoped, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                              out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    (k,) = analyze_callable(with_scope, (jax.ShapeDtypeStruct((16, 128), jnp.float32),),
                            chip=v5e)["kernels"]
    # 2 x 4 KiB in + 2 x 4 KiB out + the run_scoped buffers: 4 KiB f32 and 16x128 bf16 (4 KiB).
    assert k["vmem_bytes"] == 6 * 4 * KiB
    assert [s.get("scoped") for s in k["scratch"]] == [True, True]

    result = analyze_callable(repeated, (jax.ShapeDtypeStruct((16, 128), jnp.float32),), chip=v5e)
    (k,) = result["kernels"]
    assert k["calls"] == 5 and k["where"] == "/scan"
    assert [o["buffers"] for o in k["operands"]] == [3, 2]
    # Per grid step: 4 loop iterations x (mul + add) over 8x128; 2 steps.
    assert k["flops"] == 4 * 2 * 8 * 128 * 2
    assert result["totals"]["flops"] == 5 * k["flops"]

@pytest.mark.parametrize(("shape", "block"), [
    ((64, 256), (8, 128)), ((64, 256), (8, 64)), ((64, 256), (16, 256)),
    ((64, 256), (4, 128)), ((12, 256), (12, 128)), ((64, 256), (None, 256)),
    ((4096,), (1024,)), ((4096,), (384,)), ((4096,), (256,)), ((4096,), (64,)),
])
def test_alignment_rule_matches_the_tpu_lowering(shape: tuple, block: tuple) -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from tilewright.profiling.static import analyze_callable

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    def fn(x):
        dims = [b or 1 for b in block]
        grid = tuple(s // d for s, d in zip(shape, dims, strict=True))
        index = (lambda *ids: ids) if len(shape) > 1 else (lambda i: (i,))
        return pl.pallas_call(kernel, grid=grid, in_specs=[pl.BlockSpec(block, index)],
                              out_specs=pl.BlockSpec(block, index),
                              out_shape=jax.ShapeDtypeStruct(shape, x.dtype))(x)

    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    (k,) = analyze_callable(fn, (x,), chip=chips.get_chip("v5e"))["kernels"]
    ours = all(o["alignment"]["ok"] for o in k["operands"])
    from jax._src.mesh import AbstractDevice
    from jax.sharding import AbstractMesh, use_abstract_mesh

    # The rank-1 rule asks for the TPU's tiling: lower as if on a v5e, whose abstract
    # device gives the TPU layout on a CPU host.
    v5e = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
        device_kind="TPU v5 lite", num_cores=1, platform="tpu"))
    try:
        with use_abstract_mesh(v5e):
            jax.jit(fn).trace(x).lower(lowering_platforms=("tpu",))
        lowered = True
    except ValueError as exc:
        assert "block shape" in str(exc)  # rejected for its blocks, not something else
        lowered = False
    assert ours == lowered


def test_mxu_width_and_bf16_packing_by_chip() -> None:
    import jax

    from tilewright.profiling.static import analyze_callable

    fn, dt = _matmul(8, 128, 128)  # bf16 (8, 128) x (128, 128) blocks
    x = jax.ShapeDtypeStruct((64, 256), dt)
    y = jax.ShapeDtypeStruct((256, 256), dt)
    (v5e,) = analyze_callable(fn, (x, y), chip=chips.get_chip("v5e"))["kernels"]
    assert v5e["dots"][0]["mxu_ok"]  # 128-wide MXU: K = N = 128 fills it
    (v6e,) = analyze_callable(fn, (x, y), chip=chips.get_chip("v6e"))["kernels"]
    (dot,) = v6e["dots"]
    assert not dot["mxu_ok"] and dot["mxu_width"] == 256  # v6e's MXU is 256 wide
    assert any(w["code"] == "mxu_shape" for w in v6e["warnings"])
    # bf16 packs 16 rows per (16, 128) tile: 8-row blocks leave tiles half empty.
    packed = [w for w in v6e["warnings"] if w["code"] == "packed_rows"]
    assert packed and packed[0]["severity"] == "info"
    assert v6e["vmem_padded_bytes"] > v6e["vmem_bytes"]


def test_out_of_bounds_block_index_is_an_error() -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from tilewright.profiling.static import analyze_callable

    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    def shifted(x):  # one block too far along rows: grid step i reads block i + 1
        return pl.pallas_call(copy, grid=(8, 4),
                              in_specs=[pl.BlockSpec((32, 128), lambda i, j: (i + 1, j))],
                              out_specs=pl.BlockSpec((32, 128), lambda i, j: (i, j)),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    x = jax.ShapeDtypeStruct((256, 512), jnp.float32)
    (k,) = analyze_callable(shifted, (x,), chip=chips.get_chip("v5e"))["kernels"]
    (w,) = [w for w in k["warnings"] if w["code"] == "block_out_of_bounds"]
    # Row block 8 starts at 8 * 32 = 256 = the array's size; first at step (7, 0), and
    # for all 4 column steps of that row.
    assert w["severity"] == "error" and w["operand"] == "args[0]"
    assert "block 8 along axis 0" in w["message"] and "(7, 0)" in w["message"]
    assert "4 steps" in w["message"] and "0..7" in w["fix"]
    assert k["operands"][1]["out_of_bounds"] == []
    cov = k["operands"][1]["coverage"]
    assert (cov["visited"], cov["total"], cov["depends_on_axes"]) == (32, 32, [True, True])

    def half(x):  # a grid that covers only the first half of the output's rows
        return pl.pallas_call(copy, grid=(4, 4),
                              in_specs=[pl.BlockSpec((32, 128), lambda i, j: (i, j))],
                              out_specs=pl.BlockSpec((32, 128), lambda i, j: (i, j)),
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    (k,) = analyze_callable(half, (x,), chip=chips.get_chip("v5e"))["kernels"]
    (w,) = [w for w in k["warnings"] if w["code"] == "output_not_covered"]
    assert "visits 16 of the 32 blocks" in w["message"]


def test_reduction_axis_marked_parallel() -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from tilewright.profiling.static import analyze_callable

    def row_sum(x_ref, o_ref):
        @pl.when(pl.program_id(1) == 0)
        def _init():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += jnp.sum(x_ref[...], axis=1, keepdims=True) * jnp.ones((1, 128))

    def summed(x, semantics):  # axis 1 walks the columns into one output block per row block
        return pl.pallas_call(row_sum, grid=(2, 4),
                              in_specs=[pl.BlockSpec((64, 128), lambda i, j: (i, j))],
                              out_specs=pl.BlockSpec((64, 128), lambda i, j: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct((128, 128), x.dtype),
                              compiler_params=pltpu.CompilerParams(
                                  dimension_semantics=semantics))(x)

    x = jax.ShapeDtypeStruct((128, 512), jnp.float32)
    wrong = analyze_callable(lambda a: summed(a, ("parallel", "parallel")), (x,),
                             chip=chips.get_chip("v5p"))["kernels"][0]
    (w,) = [w for w in wrong["warnings"] if w["code"] == "parallel_reduction"]
    assert w["severity"] == "error" and "grid axis 1" in w["message"]
    assert "('parallel', 'arbitrary')" in w["fix"]
    assert wrong["operands"][1]["coverage"]["depends_on_axes"] == [True, False]
    right = analyze_callable(lambda a: summed(a, ("parallel", "arbitrary")), (x,),
                             chip=chips.get_chip("v5p"))["kernels"][0]
    assert "parallel_reduction" not in [w["code"] for w in right["warnings"]]
    assert "output_revisited" not in [w["code"] for w in right["warnings"]]

    def reduction_first(x):  # the reduction axis outermost: each output block comes back
        return pl.pallas_call(row_sum, grid=(4, 2),
                              in_specs=[pl.BlockSpec((64, 128), lambda j, i: (i, j))],
                              out_specs=pl.BlockSpec((64, 128), lambda j, i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct((128, 128), x.dtype))(x)

    (k,) = analyze_callable(reduction_first, (x,), chip=chips.get_chip("v5e"))["kernels"]
    (w,) = [w for w in k["warnings"] if w["code"] == "output_revisited"]
    # 2 output blocks, written back at every one of the 8 steps (the index alternates).
    assert "2 output blocks are written back 8 times" in w["message"]


def test_no_grid_is_one_step() -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from tilewright.profiling.static import analyze_callable

    def axpy(x_ref, y_ref, o_ref):
        o_ref[...] = 2.0 * x_ref[...] + y_ref[...]

    def fn(x, y):  # no grid, no BlockSpecs: whole arrays, one step
        return pl.pallas_call(axpy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

    x = jax.ShapeDtypeStruct((16, 128), jnp.float32)
    (k,) = analyze_callable(fn, (x, x), chip=chips.get_chip("v5e"))["kernels"]
    assert k["name"] == "axpy" and k["grid"] == [] and k["steps"] == 1
    assert [o["fetches"] for o in k["operands"]] == [1, 1, 1]
    assert k["bytes_total"] == 3 * 16 * 128 * 4 and "analysis_error" not in k


# -- work inside pl.when branches is counted on the steps where it runs ------------------

def _two_branch_matmul(bm: int, bk: int, data_dependent: bool = False):
    """``acc = x@w`` on the first K step and ``acc += x@w`` after it: one dot per step,
    written twice. ``data_dependent``: the first branch is taken on a value read from
    SMEM (the analysis cannot know where)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def body(x_ref, w_ref, o_ref, acc_ref):
        k = pl.program_id(1)

        @pl.when(k == 0)
        def _first():
            acc_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

        @pl.when(k > 0)
        def _rest():
            acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

        @pl.when(k == pl.num_programs(1) - 1)
        def _done():
            o_ref[...] = (acc_ref[...] * 2.0).astype(o_ref.dtype)

    def kernel(x, w):
        m, kd = x.shape
        n = w.shape[1]
        return pl.pallas_call(
            body, grid=(m // bm, kd // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, k: (i, k)),
                      pl.BlockSpec((bk, n), lambda i, k: (k, 0))],
            out_specs=pl.BlockSpec((bm, n), lambda i, k: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
            scratch_shapes=[pltpu.VMEM((bm, n), jnp.float32)],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        )(x, w)

    def dependent_body(flag_ref, x_ref, w_ref, o_ref):
        @pl.when(flag_ref[0] > 0)
        def _on():
            o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

        @pl.when(flag_ref[0] <= 0)
        def _off():
            o_ref[...] = jnp.dot(x_ref[...], w_ref[...] * 2.0, preferred_element_type=jnp.float32)

    def dependent(x, w):
        m, kd = x.shape
        n = w.shape[1]
        spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(m // bm,),
            in_specs=[pl.BlockSpec((bm, kd), lambda i, f: (i, 0)),
                      pl.BlockSpec((kd, n), lambda i, f: (0, 0))],
            out_specs=pl.BlockSpec((bm, n), lambda i, f: (i, 0)))
        flag = jnp.ones((1,), jnp.int32)
        return pl.pallas_call(dependent_body, grid_spec=spec,
                              out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32))(flag, x, w)

    return dependent if data_dependent else kernel


def test_a_dot_in_two_exclusive_when_branches_counts_once_per_step() -> None:
    import jax
    import jax.numpy as jnp

    from tilewright.profiling.static import analyze_callable

    m, kd, n = 256, 512, 256
    x = jax.ShapeDtypeStruct((m, kd), jnp.float32)
    w = jax.ShapeDtypeStruct((kd, n), jnp.float32)
    (k,) = analyze_callable(_two_branch_matmul(128, 128), (x, w),
                            chip=chips.get_chip("v5e"))["kernels"]
    assert k["steps"] == 8
    assert k["flops"] == k["dot_flops"] == 2 * m * kd * n  # 67.1M, not 134.2M
    (dot,) = k["dots"]  # the two writings of one dot are one entry, on every step
    assert (dot["m"], dot["k"], dot["n"]) == (128, 128, 256)
    assert dot["steps_share"] == 1.0
    assert dot["flops_per_step"] == 2 * 128 * 128 * 256
    assert k["notes"] == []  # every predicate was known per step: no upper bound


def test_a_when_on_runtime_data_is_an_upper_bound_and_says_so() -> None:
    import jax
    import jax.numpy as jnp

    from tilewright.profiling.static import analyze_callable

    x = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    w = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    (k,) = analyze_callable(_two_branch_matmul(128, 256, data_dependent=True), (x, w),
                            chip=chips.get_chip("v5e"))["kernels"]
    # Neither branch can be ruled out: each counts on every step, and the note says so.
    assert k["dot_flops"] == 2 * (2 * 256 * 256 * 256)
    assert any("run-time value" in note for note in k["notes"])
