"""Profiling: chip table and roofline, the Timeline model, xprof conversion (real CPU
traces captured in a worker; the device path on CONSTRUCTED TPU fixtures), static
pallas_call analysis against hand-computed figures, and the CLI's clean stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from profiling import SCHEMA, chips
from profiling.convert import (
    module_times,
    pallas_share,
    timeline_from_trace,
    top_ops,
)
from profiling.timeline import Event, Timeline, Track

ROOT = Path(__file__).resolve().parent.parent
PROFILES = Path(__file__).resolve().parent / "fixtures" / "profiles"
KiB, MiB = 1024, 1024 * 1024


# -- chips and roofline -----------------------------------------------------------------

def test_chip_table_is_complete_and_sane() -> None:
    for key in ("v4", "v5e", "v5p", "v6e", "v7x", "h100", "h200", "cpu"):
        chip = chips.get_chip(key)
        assert chip.bf16_flops > 0 and chip.f32_flops > 0 and chip.hbm_bytes_per_s > 0
        assert 0 < chip.scoped_vmem_bytes <= chip.vmem_bytes
    assert [k for k, c in chips.CHIPS.items() if c.megacore] == ["v4", "v5p", "v7x"]
    assert chips.get_chip("TPU v5 lite").name == "v5e"  # JAX's device_kind for v5e
    with pytest.raises(KeyError, match="choose one of"):
        chips.get_chip("v9z")


def test_roofline_bound_by_hand() -> None:
    v5e = chips.get_chip("v5e")
    # 1 GFLOP bf16 and 1 MiB on v5e: compute 1e9 / 197e12 s = 5.076 us; memory
    # 1048576 / 819e9 s = 1.280 us; the bound is the larger: compute-bound 5.076 us.
    roof = chips.bound(1e9, MiB, v5e, "bf16")
    assert roof["bound_by"] == "compute"
    assert roof["bound_ms"] == pytest.approx(1e9 / 197e12 * 1e3)
    assert roof["memory_bound_ms"] == pytest.approx(MiB / 819e9 * 1e3)
    # A run measured at 10.152 us sits at half of the roofline.
    placed = chips.placement(roof, 2 * roof["bound_ms"])
    assert placed["fraction"] == pytest.approx(0.5)
    assert chips.placement(roof, None)["fraction"] is None


# -- the Timeline model -----------------------------------------------------------------

def _toy_timeline() -> Timeline:
    # One host track: outer [0, 100) holds op a [10, 40) which holds op b [20, 30);
    # op c [50, 60) sits outside a; the measured region is [0, 100).
    track = Track("python", "host_thread", "/host:CPU", [
        Event("outer", 0, 100), Event("a.1", 10, 30, {"hlo_op": "a.1"}),
        Event("b.2", 20, 10, {"hlo_op": "b.2"}), Event("c.3", 50, 10, {"hlo_op": "c.3"}),
        Event("a.4", 120, 5, {"hlo_op": "a.4"}),  # after the region: not counted
    ])
    track.sort()
    return Timeline([track], source="host", measured=(0.0, 100.0))


def test_op_summary_self_time_and_share_by_hand() -> None:
    tl = _toy_timeline()
    rows = {r.name: r for r in tl.op_summary(("host_thread",), is_op=lambda e: "hlo_op" in e.args,
                                             group="family")}
    assert rows["a"].total_us == 30 and rows["a"].self_us == 20 and rows["a"].count == 1
    assert rows["b"].self_us == 10 and rows["c"].self_us == 10
    assert rows["a"].share == pytest.approx(0.2)
    assert tl.event_counts() == {"python": 5}
    assert tl.span == (0, 125)
    assert tl.busy_us(("host_thread",), lambda e: "hlo_op" in e.args) == 40  # [10,40) + [50,60)


def test_chrome_trace_export_reads_back() -> None:
    tl = _toy_timeline()
    exported = json.loads(json.dumps(tl.to_chrome_trace()))
    assert {e["ph"] for e in exported["traceEvents"]} >= {"M", "X"}
    back = timeline_from_trace(exported)
    assert back.event_counts() == {"python": 5}
    assert [e.name for e in back.tracks[0].events][:3] == ["outer", "a.1", "b.2"]
    assert "5 events" in tl.summary()


# -- device path on CONSTRUCTED fixtures ------------------------------------------------

def test_constructed_tpu_trace_device_path() -> None:
    trace = json.loads((PROFILES / "constructed_tpu_v5e.trace.json").read_text())
    tl = timeline_from_trace(trace)
    assert tl.source == "device"
    kinds = {t.name: t.kind for t in tl.tracks}
    assert kinds == {"XLA Ops": "device_ops", "XLA Modules": "device_modules",
                     "python": "host_thread"}
    assert tl.event_counts()["XLA Ops"] == 12 and tl.event_counts()["XLA Modules"] == 3
    assert tl.measured is not None and tl.measured[1] - tl.measured[0] == pytest.approx(300)
    assert tl.meta["iterations"] == 3
    # Per iteration: pallas_call.1 40 us + pallas_call.2 10 us of 62 us device op time.
    share = pallas_share(tl)
    assert share["value"] == pytest.approx(50 / 62)
    assert share["kernels"] == pytest.approx({"pallas_call.1": 0.12, "pallas_call.2": 0.03})
    ops = top_ops(tl)
    assert [o["name"] for o in ops] == ["pallas_call.1", "pallas_call.2", "fusion.3", "copy.1"]
    assert ops[0]["total_ms"] == pytest.approx(0.12) and ops[0]["count"] == 3
    assert ops[0]["share"] == pytest.approx(120 / 300)
    assert module_times(tl)["median_ms"] == pytest.approx(0.07)


def test_constructed_gpu_trace_uses_the_stream_line() -> None:
    trace = json.loads((PROFILES / "constructed_gpu_h100.trace.json").read_text())
    tl = timeline_from_trace(trace)
    assert tl.source == "device"
    assert {t.name: t.kind for t in tl.tracks}["Stream #7(Compute)"] == "device_stream"
    share = pallas_share(tl, ["matmul_kernel"])
    assert share["value"] == pytest.approx(40 / 45) and "stream" in share["basis"]
    assert [o["name"] for o in top_ops(tl)] == ["matmul_kernel", "input_transpose_fusion"]


def test_xprof_converts_the_constructed_xplane_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    from profiling.convert import trace_events

    trace, log = trace_events(PROFILES / "constructed_tpu_v5e.xplane.pb")
    expected = json.loads((PROFILES / "constructed_tpu_v5e.trace.json").read_text())
    assert trace["traceEvents"] == expected["traceEvents"]
    captured = capfd.readouterr()
    assert captured.err == ""  # xprof's C++ logging went to our temporary file
    assert isinstance(log, list)


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

    from profiling.static import analyze_callable

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

    from profiling.static import analyze_callable

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

    from profiling.static import analyze_callable

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

    from profiling.static import analyze_callable

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

    from profiling.static import analyze_callable

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

    from profiling.static import analyze_callable

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

    from profiling.static import analyze_callable

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

# -- real traces captured on the CPU, in a worker ---------------------------------------

@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_profile_op_captures_a_real_cpu_trace(worker_pool, tmp_path: Path) -> None:
    from kernels.loaders import load_task

    task = load_task("rmsnorm")
    # As the session controller sends it: logdir at the payload's top level.
    payload = {"task": task.to_spec(), "source": task.starting_source(),
               "filename": "kernel.py", "logdir": str(tmp_path / "prof"), "options": {"iters": 2}}
    result = await worker_pool.request("profile", payload, 300)
    assert result["status"] == "ok", result.get("error")
    assert result["schema"] == SCHEMA and result["chip"]["name"] == "v5e"
    run_dir = Path(result["run_dir"])
    assert list(run_dir.glob("*.xplane.pb")) and (run_dir / "perfetto_trace.json.gz").exists()
    assert Path(result["logdir"]) == tmp_path / "prof"
    tl = result["timeline"]
    assert tl["source"] == "host" and tl["tracks"] and tl["span_us"][1] > tl["span_us"][0]
    assert any(t["events"] > 0 for t in tl["tracks"])
    ops = result["top_ops"]
    assert ops and {"name", "total_ms", "self_ms", "count"} <= set(ops[0])
    assert all(o["self_ms"] <= o["total_ms"] + 1e-9 for o in ops)
    (kernel,) = result["analysis"]["kernels"]
    assert kernel["grid"] and kernel["vmem_bytes"] > 0 and kernel["bytes_total"] > 0
    assert result["pallas_share"]["value"] is None and result["pallas_share"]["reason"]
    assert result["roofline"]["bound_ms"] > 0 and result["roofline"]["fraction"] is None
    # Our Chrome-trace export of the captured timeline is valid JSON for Perfetto.
    exported = json.loads(Path(tl["chrome_trace"]).read_text())
    assert any(e["ph"] == "X" for e in exported["traceEvents"])
    assert result["wall"]["iters"] == 2
    assert "kernel rmsnorm_kernel: grid (8,)" in result["digest"]
    # The kernel author's report renders it: kernel, VMEM bar, roofline, ops, raw trace.
    from rich.console import Console

    from profiling.report import print_report

    console = Console(record=True, width=120)
    print_report({**result, "task": "rmsnorm", "kernel": "kernel.py"}, console)
    text = console.export_text()
    for needle in ("kernel rmsnorm_kernel", "VMEM", "scoped", "roofline on TPU v5e",
                   "top XLA ops", "raw trace", "xprof --logdir"):
        assert needle in text, needle


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_static_only_profile_runs_nothing(worker_pool) -> None:
    from kernels.cli_profile import profile
    from kernels.loaders import load_task

    task = load_task("causal_attention")
    result = await profile(task, task.starting_source(), "kernel.py",
                           {"static_only": True, "chip": "v5p"}, pool=worker_pool)
    assert result["status"] == "ok" and result["chip"]["name"] == "v5p"
    assert result["timeline"] is None and result["logdir"] is None and result["top_ops"] == []
    (k,) = result["analysis"]["kernels"]
    # q/out blocks (128x128 f32, 64 KiB) change with the query block: 4 of 8 steps;
    # k/v blocks change every step.
    assert [o["fetches"] for o in k["operands"]] == [4, 8, 8, 4]
    roof = result["roofline"]
    assert roof["note"] == "static analysis only: nothing was run" and roof["fraction"] is None
    # Estimate: the blocking's bound + 8 grid steps x 0.35 us.
    assert roof["step_overhead_ms"] == pytest.approx(8 * 0.35e-3)
    assert roof["estimate_ms"] == pytest.approx(roof["kernel_bound_ms"] + 8 * 0.35e-3)
    assert "phases" in result and "capture_s" not in result["phases"]


PIPELINED_GELU = """
import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _outer(x_hbm, o_hbm):
    def inner(x_ref, o_ref):
        o_ref[...] = jax.nn.gelu(x_ref[...])
    spec = pl.BlockSpec((64, 256), lambda i, j: (i, j))
    pltpu.emit_pipeline(inner, grid=(4, 2), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)


def kernel(x):
    return pl.pallas_call(_outer, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
"""


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_emit_pipeline_kernel_profiles_on_a_cpu_host(worker_pool) -> None:
    from kernels.cli_profile import profile
    from kernels.loaders import load_task

    result = await profile(load_task("gelu"), PIPELINED_GELU, "pipelined.py", {"iters": 1},
                           pool=worker_pool)
    assert result["status"] == "ok", result.get("error")
    (k,) = result["analysis"]["kernels"]
    # Its buffers come from emit_pipeline: 2 x (64, 256) f32 per operand = 2 x 128 KiB.
    assert k["vmem_bytes"] == 256 * KiB
    assert {o["bytes_kind"] for o in k["operands"]} == {"estimate"}
    assert result["top_ops"]


@pytest.mark.slow
def test_cli_profile_json_and_quiet_stderr(tmp_path: Path) -> None:
    # Turn XLA/xprof logging fully on (the worker keeps user values): the C++ lines are
    # written, and still none may reach the CLI process's stderr.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "0",
           "GLOG_minloglevel": "0", "ABSL_MIN_LOG_LEVEL": "0"}
    cmd = [sys.executable, "-m", "tui.cli", "profile", "--task", "gelu", "--json",
           "--iters", "2", "--logdir", str(tmp_path / "p"), "--trace-out",
           str(tmp_path / "timeline.json")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema"] == SCHEMA and data["task"] == "gelu"
    (k,) = data["analysis"]["kernels"]
    # gelu's kernel: (64, 256) f32 blocks over a (256, 512) array: grid (4, 2); VMEM
    # 2 x 64 KiB in + 2 x 64 KiB out = 256 KiB; 8 fetches each way = 1 MiB of traffic.
    assert k["grid"] == [4, 2] and k["vmem_bytes"] == 256 * KiB and k["bytes_total"] == MiB
    assert {"grid", "operands", "vmem_bytes", "bytes_total", "flops", "intensity",
            "warnings"} <= set(k)
    assert {"tracks", "span_us"} <= set(data["timeline"]) and data["top_ops"]
    exported = json.loads((tmp_path / "timeline.json").read_text())  # --trace-out
    assert sum(e["ph"] == "X" for e in exported["traceEvents"]) == sum(
        t["events"] for t in data["timeline"]["tracks"])
    # xprof logged C++ lines in the worker (we kept them), and none reached our stderr.
    noisy = ("profiler_session.cc", "UnifiedProfileProcessor", "xplane_to_tools_data")
    assert any(any(n in line for n in noisy) for line in data["xprof_log"])
    assert not any(n in proc.stderr for n in noisy), proc.stderr
    assert proc.stderr.strip() == ""


def test_cli_profile_bad_input(tmp_path: Path) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    base = [sys.executable, "-m", "tui.cli", "profile", "--task", "gelu"]
    missing = subprocess.run([*base, "--kernel", str(tmp_path / "nope.py")], cwd=ROOT,
                             capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and "cannot read kernel" in missing.stderr
    chip = subprocess.run([*base, "--chip", "v9z"], cwd=ROOT, capture_output=True, text=True,
                          env=env)
    assert chip.returncode == 2 and "invalid choice" in chip.stderr


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_profile_of_a_broken_candidate_says_why(worker_pool) -> None:
    from kernels.cli_profile import profile
    from kernels.loaders import load_task

    task = load_task("gelu")
    result = await profile(task, "def kernel(x):\n    return x +\n", "broken.py", {},
                           pool=worker_pool)
    assert result["status"] == "error" and result["error"]["kind"] == "syntax"
    assert "line 2" in result["error"]["message"] or result["error"]["line"] == 2



@pytest.mark.parametrize(("shape", "block"), [
    ((64, 256), (8, 128)), ((64, 256), (8, 64)), ((64, 256), (16, 256)),
    ((64, 256), (4, 128)), ((12, 256), (12, 128)), ((64, 256), (None, 256)),
    ((4096,), (1024,)), ((4096,), (384,)), ((4096,), (256,)), ((4096,), (64,)),
])
def test_alignment_rule_matches_the_tpu_lowering(shape: tuple, block: tuple) -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from profiling.static import analyze_callable

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

    # The rank-1 rule asks for the TPU's tiling: lower as if on a v5e (PLATFORM_NOTES).
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

    from profiling.static import analyze_callable

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

    from profiling.static import analyze_callable

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

    from profiling.static import analyze_callable

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

    from profiling.static import analyze_callable

    def axpy(x_ref, y_ref, o_ref):
        o_ref[...] = 2.0 * x_ref[...] + y_ref[...]

    def fn(x, y):  # no grid, no BlockSpecs: whole arrays, one step
        return pl.pallas_call(axpy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

    x = jax.ShapeDtypeStruct((16, 128), jnp.float32)
    (k,) = analyze_callable(fn, (x, x), chip=chips.get_chip("v5e"))["kernels"]
    assert k["name"] == "axpy" and k["grid"] == [] and k["steps"] == 1
    assert [o["fetches"] for o in k["operands"]] == [1, 1, 1]
    assert k["bytes_total"] == 3 * 16 * 128 * 4 and "analysis_error" not in k


def test_a_tampering_candidate_gets_its_worker_recycled() -> None:
    import numpy as np

    from kernels.harness.profile_op import profile
    from kernels.loaders import load_task

    task = load_task("gelu")
    source = (Path(__file__).parent / "fixtures" / "candidates" / "patches_numpy.py").read_text()
    saved = (np.abs, np.allclose)
    try:
        result = profile({"task": task.to_spec(), "source": source, "filename": "patch.py",
                          "options": {"static_only": True}})
    finally:
        np.abs, np.allclose = saved  # this test runs the handler in-process
    assert result.get("_recycle") is True
    clean = profile({"task": task.to_spec(), "source": task.starting_source(),
                     "filename": "kernel.py", "options": {"static_only": True}})
    assert clean["status"] == "ok" and "_recycle" not in clean


def test_report_and_digest_of_a_device_profile() -> None:
    from rich.console import Console

    from profiling.digest import digest
    from profiling.report import print_report

    trace = json.loads((PROFILES / "constructed_tpu_v5e.trace.json").read_text())
    tl = timeline_from_trace(trace)
    v5e = chips.get_chip("v5e")
    per = module_times(tl)
    roof = chips.placement(chips.bound(2 * 256 * 512 * 384, 832 * KiB, v5e), per["median_ms"])
    profile = {"schema": SCHEMA, "status": "ok", "task": "constructed", "kernel": "k.py",
               "backend": {"platform": "tpu", "mode": "native", "device_kind": "TPU v5 lite"},
               "chip": v5e.to_json(), "analysis": {"kernels": []}, "roofline": roof,
               "timeline": tl.to_json(), "top_ops": top_ops(tl), "pallas_share": pallas_share(tl),
               "per_iteration": per, "logdir": "/tmp/run"}
    console = Console(record=True, width=120)
    print_report(profile, console)
    text = console.export_text()
    assert "run on TPU v5 lite" in text and "top device ops" in text
    assert "Pallas share: 80.6%" in text and "70.00 us median over 3" in text
    # 832 KiB / 819 GB/s = 1.04 us against 70 us measured: 1.5% of the roofline.
    assert "1.5% of roofline" in text
    lines = digest(profile).splitlines()
    assert lines[0] == "analyzed for TPU v5e; ran on tpu (native)"
    assert any(line.startswith("Pallas share: 81%") for line in lines)
