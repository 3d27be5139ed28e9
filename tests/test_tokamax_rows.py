"""tokamax's measured TPU times, read from its wheel's autotuning data (benchmarks/)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "lib"))

import tokamax_data

SPEC_A = {"lhs": "bf16[512,256]", "rhs": "bf16[4,256,512]", "group_sizes": [128] * 4}
SPEC_B = {"lhs": "bf16[1024,256]", "rhs": "bf16[4,256,512]", "group_sizes": [256] * 4}


def _config(tm: int) -> str:
    return json.dumps({"tile_m": tm, "tile_k": 256, "tile_n": 512})


def test_pairs_are_the_specs_timed_for_both_with_the_fastest_config(tmp_path) -> None:
    root = tmp_path / "tokamax"
    v5e = root / "data" / "autotuning" / "tpu_v5_lite"
    v5e.mkdir(parents=True)
    (root.parent / "tokamax-9.9.9.dist-info").mkdir()
    (v5e / "pallas_mosaic_tpu_ragged_dot.json").write_text(json.dumps({
        json.dumps(SPEC_A): {_config(128): {"evaluation_times_ms": [2.0, 2.2, 2.1]},
                             _config(256): {"evaluation_times_ms": [1.0, 1.2, 1.1]},
                             _config(512): {"compile_time_ms": 9.0}},  # never timed
        json.dumps(SPEC_B): {_config(128): {"evaluation_times_ms": [3.0]}}}))
    (v5e / "ragged_dot.json").write_text(json.dumps({
        json.dumps(SPEC_A): {"{}": {"evaluation_times_ms": [3.3, 3.3]}}}))  # B: not timed
    v7x = root / "data" / "autotuning" / "tpu7x"
    v7x.mkdir()
    (v7x / "pallas_mosaic_tpu_ragged_dot.json").write_text(json.dumps({
        json.dumps(SPEC_A): {_config(128): {"evaluation_times_ms": [0.5]}}}))
    (v7x / "ragged_dot.json").write_text('{"lhs" "broken"}')  # as the 0.0.12 wheel ships it
    found, problems = tokamax_data.pairs(root)
    assert len(found) == 1, found
    pair = found[0]
    assert (pair.chip, pair.what) == ("v5e", "grouped matmul")
    assert pair.pallas.config["tile_m"] == 256 and pair.pallas.median_ms == pytest.approx(1.1)
    assert pair.measured_speedup == pytest.approx(3.3 / 1.1)
    assert pair.provenance["wheel"] == "tokamax 9.9.9"
    assert pair.provenance["pallas_file"] == "tpu_v5_lite/pallas_mosaic_tpu_ragged_dot.json"
    assert json.loads(pair.provenance["spec"]) == SPEC_A
    assert problems and "tpu7x/ragged_dot.json is not readable JSON" in problems[0]
    assert tokamax_data.array("bf16[4,256,512]") == ("bf16", (4, 256, 512))


def test_the_installed_wheel_has_the_pairs_the_issue_counted() -> None:
    root = tokamax_data.find()
    if root is None:
        pytest.skip("tokamax is not installed (./dev setup tokamax)")
    found, problems = tokamax_data.pairs(root)
    by = {}
    for pair in found:
        by.setdefault((pair.chip, pair.op), []).append(pair)
    ragged = by[("v5e", "pallas_mosaic_tpu_ragged_dot")]
    assert len(ragged) == 16
    assert all(1.1 < p.measured_speedup < 4.5 for p in ragged)  # Pallas faster in all
    assert len(by[("v7x", "pallas_mosaic_tpu_flash_attention")]) == 76
    assert any("tpu7x/ragged_dot.json" in p for p in problems)


def test_xla_ops_timed_alone_are_singles_with_their_fastest_time(tmp_path) -> None:
    """tokamax times its XLA normalization on TPU7x with no Pallas TPU kernel beside it:
    each spec is a ``Single`` (its implied clock is all there is to compare), never a
    pair; an op of no such kind, or a GPU's folder, gives none."""
    root = tmp_path / "tokamax"
    v7x = root / "data" / "autotuning" / "tpu7x"
    v7x.mkdir(parents=True)
    spec = {"x": "bf16[384,384,64]", "scale": "f32[64]", "offset": "f32[64]", "axis": -1}
    (v7x / "normalization.json").write_text(json.dumps({
        json.dumps(spec): {"{}": {"evaluation_times_ms": [0.034, 0.033, 0.035]}},
        json.dumps({**spec, "axis": 0}): {}}))  # listed, never timed
    (v7x / "normalization_vjp.json").write_text("{not json")
    gpu = root / "data" / "autotuning" / "nvidia_h100_80gb_hbm3"
    gpu.mkdir()
    (gpu / "normalization.json").write_text(json.dumps({
        json.dumps(spec): {"{}": {"evaluation_times_ms": [0.01]}}}))
    found, problems = tokamax_data.singles(root)
    assert [(s.chip, s.op, s.what) for s in found] == [("v7x", "normalization", "normalization")]
    assert found[0].spec == spec and found[0].xla.median_ms == pytest.approx(0.034)
    assert found[0].provenance["xla_file"] == "tpu7x/normalization.json"
    assert problems and "normalization_vjp.json is not readable JSON" in problems[0]
    assert tokamax_data.pairs(root)[0] == []  # no Pallas op: no pair
