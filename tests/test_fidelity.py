"""How far the estimate can be trusted: program classes, the shipped fidelity table,
the memory floor's arithmetic, and calibration pairs from a TPU host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tilewright.kernels.cli.calibrate import pairs, record
from tilewright.kernels.worker.tpu import fidelity, reference

ROOT = Path(__file__).resolve().parent.parent


def test_program_classes() -> None:
    plans = [{"data_dependent": False}]
    # a bf16 matmul: 2 GFLOP over 6 MiB of inputs and outputs is past v5e's ridge
    matmul = {"flops": 2.0 * 1024 ** 3, "bytes_accessed": 6.0 * 2 ** 20}
    assert fidelity.program_class(matmul, {"dot": 1}, None, plans, "bfloat16", "v5e") \
        == "compute_bound"
    rows = {"flops": 4.0 * 2 ** 20, "bytes_accessed": 8.0 * 2 ** 20}
    assert fidelity.program_class(rows, {}, None, plans, "float32", "v5e") == "memory_bound"
    assert fidelity.program_class(rows, {"gather": 2}, None, plans, "float32", "v5e") \
        == "gather_scatter"
    assert fidelity.program_class(rows, {}, None, [{"data_dependent": True}], "float32",
                                  "v5e") == "pallas_manual_dma"
    assert fidelity.program_class(rows, {"all-reduce": 1}, None, plans, "f32", "v5e") \
        == "collective"
    assert fidelity.program_class(None, None, None, plans, "f32", "v5e") is None
    # a convolution, compute-bound or not, is its own class: the estimator prices XLA's
    # convolutions erratically (18k's at 0.22 of its v5e time, 46k's at 3.4). As written:
    # compiled for a TPU, XLA writes a plain dot as a convolution too (41k's GEMM)
    assert fidelity.program_class(matmul, {"convolution": 1}, None, plans, "bfloat16",
                                  "v5e") == "compute_bound"
    assert fidelity.program_class(matmul, {"convolution": 1}, None, plans, "bfloat16",
                                  "v5e", convolves=True) == "convolution"


def test_a_convolution_is_counted_as_written() -> None:
    """What tells a convolution task from a GEMM: the reference's own program (its
    StableHLO), not the compiled one, where XLA writes dots as convolutions."""
    import jax
    import jax.numpy as jnp

    from tilewright.kernels.worker.tpu.reference_programs import export_program

    x = jax.ShapeDtypeStruct((2, 8, 16, 16), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((16, 8, 3, 3), jnp.bfloat16)
    conv = export_program(jax.jit(lambda x, w: jax.lax.conv(x, w, (1, 1), "VALID")), [x, w], [],
                          "v5e")
    assert conv.cost["convolutions"] == 1.0
    a = jax.ShapeDtypeStruct((256, 512), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16)
    assert export_program(jax.jit(jnp.dot), [a, b], [], "v5e").cost["convolutions"] == 0.0


def test_the_shipped_table_answers_for_every_class() -> None:
    table = json.loads(fidelity.TABLE.read_text())
    assert table["schema"] == "tilewright.fidelity/1" and "JAXBench" in table["source"]
    found = fidelity.lookup("v6e", "compute_bound")
    assert found["rows"] > 0 and found["median_ratio"] > 0 and found["source"]
    other = fidelity.lookup("v5p", "compute_bound")  # no measurement of its own
    assert other["chip"] != "v5p" and "no measurement for v5p" in other["note"]
    # convolutions measured on the lent v5e: priced at a third of their device times
    conv = fidelity.lookup("v5e", "convolution")
    assert conv["rows"] >= 10 and conv["chip"] == "v5e" and conv["median_ratio"] < 0.5
    unmeasured = fidelity.lookup("v6e", "collective")  # no public row of that class
    assert unmeasured["rows"] == 0 and unmeasured["median_ratio"] is None
    assert "no public measurement" in unmeasured["note"]


def test_the_floor_decides_when_above_the_compiler() -> None:
    traffic, complete = fidelity.kernel_traffic([{
        "grid": [4, 2], "blocks": [
            {"follows": [0, 1], "block_bytes": 100, "manual": False},  # every step
            {"follows": [1], "block_bytes": 10, "manual": False},      # 8 changes of j
            {"follows": [], "block_bytes": 1000, "manual": False},     # once
            {"follows": None, "block_bytes": 5, "manual": False}]}])   # data-dependent
    assert traffic == 8 * 100 + 8 * 10 + 1000 and not complete
    floor = fidelity.floor("v5e", 819e6, 819e6 * 4)  # 1 ms and 4 ms at 819 GB/s
    assert abs(floor["kernel_s"] - 1e-3) < 1e-9 and abs(floor["reference_s"] - 4e-3) < 1e-9
    kernel = {"cycles": 150_000, "seconds": 1e-4}   # the compiler: 0.1 ms
    reference = {"cycles": 300_000, "seconds": 2e-4}
    speedup, basis = fidelity.floored_speedup(kernel, reference, floor)
    assert basis == "memory_floor" and abs(speedup - 4.0) < 1e-9
    fast_floor = fidelity.floor("v5e", 1.0, 1.0)
    assert fidelity.floored_speedup(kernel, reference, fast_floor) == (2.0, "compiler")


def test_without_a_clock_the_floors_count_in_cycles_at_the_slowest_clock() -> None:
    """v7x has no clock in the table: its speedups were cycles over cycles, unguarded.
    XLA's normalization over the leading axis of bf16[128,384,384], compiled for v7x by
    libtpu 0.0.50, is priced at 235 cycles (three of its five fusions at 0); its 75.5 MB
    take 10.2 us at 7.37 TB/s, 8,700 cycles at 0.85 GHz: the floor prices it."""
    from tilewright.profiling.chips import SLOWEST_CLOCK_HZ

    floor = fidelity.floor("v7x", 75_500_000, 75_500_000)
    assert floor is not None
    reference = {"cycles": 235, "seconds": None}
    kernel = {"cycles": 20_000, "seconds": None}
    speedup, basis = fidelity.floored_speedup(kernel, reference, floor)
    assert basis == "memory_floor"
    assert abs(speedup - 75.5e6 / 7.37e12 * SLOWEST_CLOCK_HZ / 20_000) < 1e-9
    assert abs(speedup - 8_707 / 20_000) < 1e-3
    # estimates above their floors are compared as they are, as before
    priced = {"cycles": 40_000, "seconds": None}
    assert fidelity.floored_speedup(kernel, priced, floor) == (2.0, "compiler")
    assert fidelity.floored_speedup(kernel, reference, None) == (235 / 20_000, "compiler")
    from tilewright.kernels.judge.rank import Rank

    said = Rank("tpu_estimate", speedup, "v7x", basis=basis, compiler_value=235 / 20_000).how()
    assert "memory floor in cycles at 0.85 GHz; cycles alone 0.01x" in said, said
    assert "GHz" not in Rank("tpu_estimate", 1.0, "v5e", basis="memory_floor").how()


def test_the_reference_is_never_priced_below_its_roofline() -> None:
    """18k's XLA convolution on v5e: the compiler's 0.70 ms for 3.02e11 FLOPs is 2.2x
    below the FLOPs at the chip's bf16 peak (1.53 ms); the reference is priced at its
    roofline, and the basis says so. Of the 29 measured programs with estimates
    (benchmarks/data/estimate_fidelity_rows.json) none has its roofline above both its
    estimate and its memory floor: this changes none of them."""
    from tilewright.kernels.judge.rank import Rank

    floor = fidelity.floor("v5e", 843_726_848, 788_808_192)
    kernel = {"cycles": 6_782_057, "seconds": 4.521e-3}
    reference = {"cycles": 1_050_644, "seconds": 0.7004e-3}
    plain, basis = fidelity.floored_speedup(kernel, reference, floor)
    assert basis == "memory_floor" and abs(plain - 0.963 / 4.521) < 1e-3
    speedup, basis = fidelity.floored_speedup(kernel, reference, floor, 1.5316e-3)
    assert basis == "roofline" and abs(speedup - 1.5316 / 4.521) < 1e-6
    # a roofline below the estimate changes nothing
    assert fidelity.floored_speedup(kernel, reference, floor, 0.5e-3) == (plain, "memory_floor")
    rank = Rank("tpu_estimate", speedup, "v5e", basis="roofline", compiler_value=0.155)
    assert rank.floored and "XLA at its roofline; cycles alone 0.15x" in rank.how()
    assert "roofline decided it" in (rank.floor_words() or "")
    roof = {"seconds": 1.5316e-3, "dtype": "bf16", "peak_estimated": False}
    assert fidelity.roofline_floor(roof) == 1.5316e-3
    # an f32 roofline's peak is a guess (XLA may run the product as one bf16 pass)
    assert fidelity.roofline_floor({**roof, "dtype": "f32", "peak_estimated": True}) is None
    assert fidelity.roofline_floor({**roof, "dtype": "f32"}) is None
    assert fidelity.roofline_floor(None) is None
    assert fidelity.lookup("v5e", "compute_bound", "roofline") == \
        fidelity.lookup("v5e", "compute_bound", "memory_floor")


def test_scaled_references_use_the_cost_per_unit_at_the_larger_size() -> None:
    value, line, spread = reference.scale_reference(460_000, 600_000, 256, 512, 4096)
    assert value == 600_000 * 8 and line < value and 0 < spread < 1


def test_calibration_pairs_are_recorded_and_reported(tmp_path, monkeypatch) -> None:
    on_tpu = {
        "status": "correct", "backend": {"platform": "tpu", "mode": "native",
                                         "device_kind": "TPU v6 lite"},
        "timing": {"median_ms": 2.0, "baseline_median_ms": 3.0, "method": "wall_clock"},
        "tpu": {"chip": "v6e", "shape_label": "4096x4096",
                "estimate": {"seconds": 1.0e-3}, "reference_estimate": {"seconds": 3.3e-3},
                "fidelity": {"class": "memory_bound"}}}
    found = pairs("softmax", on_tpu)
    assert [(p["program"], round(p["ratio"], 2)) for p in found] == [("kernel", 0.5),
                                                                    ("reference", 1.1)]
    off_tpu = {**on_tpu, "backend": {"platform": "cpu", "mode": "tpu-interpret"}}
    assert pairs("softmax", off_tpu) == []
    path = record(found, tmp_path / "calibration.jsonl")
    monkeypatch.setenv(fidelity.CALIBRATION_ENV, str(path))
    looked = fidelity.lookup("v6e", "memory_bound")
    # The median of 0.5 and 1.1 (both within 2x of the measurement).
    assert looked["calibration"] == {"rows": 2, "median_ratio": 0.8, "within_2x": 1.0}


def test_calibrate_refuses_off_tpu(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "calibrate", "--task", "gelu"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**__import__("os").environ, "JAX_PLATFORMS": "cpu",
                               "TILEWRIGHT_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 1 and "needs a TPU host" in proc.stderr
    assert not (tmp_path / "calibration.jsonl").exists()


def test_a_v7x_estimate_shows_the_measured_v7x_speedups_beside_it() -> None:
    """v7x has no published clock, so its estimates are cycles and speedups, and no
    estimated seconds can be held against measured ones. What was measured there
    (tokamax's TPU7x times, ``benchmarks/estimates/tokamax_v7x.py --write``) goes beside every v7x
    figure: the estimated speedups against the measured ones."""
    from tilewright.agents.prompts.evalfacts import fidelity_text
    from tilewright.kernels.judge.rank import Rank
    from tilewright.kernels.judge.trust import fidelity_brief

    found = fidelity.lookup("v7x", "compute_bound")
    speedups = found["speedups"]
    assert speedups["pairs"] >= 6 and speedups["estimated"] >= 1
    assert "tokamax" in speedups["source"] and 0 < speedups["median_ratio"] < 2
    assert "speedups" not in fidelity.lookup("v5e", "compute_bound")
    words = Rank("tpu_estimate", 1.2, "v7x", fidelity=fidelity_brief(found)).trust_words()
    said = (f"v7x speedups: {speedups['estimated']} of {speedups['pairs']} tokamax pairs "
            f"estimated, {speedups['median_ratio']:.2f} of measured")  # 1 of 12, 0.89
    assert words and said in words
    assert said in (fidelity_text(found) or "")
