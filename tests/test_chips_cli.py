"""`tilewright chips`: which TPU generations estimate and which only compile, and why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tilewright.kernels.worker.tpu import tpu_compile
from tilewright.profiling.chips import CHIPS, estimator_refusal

ROOT = Path(__file__).resolve().parents[1]


def _chips(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "chips", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80"})


def test_every_tpu_generation_says_whether_it_estimates() -> None:
    done = _chips("--json")
    assert done.returncode == 0, done.stderr
    rows = {r["chip"]: r for r in json.loads(done.stdout)["chips"]}
    assert set(rows) == {c.name for c in CHIPS.values() if c.kind == "tpu"}
    assert rows["v5e"]["estimates"] and rows["v5e"]["default"]
    assert rows["v6e"]["measured_rows"].get("compute_bound", 0) > 0
    assert rows["v4"]["compiles"] and not rows["v4"]["estimates"]  # measured: it aborts
    # v7x as the libtpu in use does: 0.0.42.1 aborts, 0.0.50.1 returns cycles (no clock)
    assert rows["v7x"]["compiles"] and rows["v7x"]["estimates"] == (
        estimator_refusal("v7x") is None)
    assert rows["v7x"]["clock_ghz"] is None
    for name in ("v4", "v7x"):
        assert rows[name]["why_not"] == estimator_refusal(name)
    # the worker refuses estimates exactly where the listing says there are none
    assert set(tpu_compile.ESTIMATE_CHIPS) == {n for n, r in rows.items() if r["estimates"]}


def test_the_listing_fits_80_columns_and_names_the_reason() -> None:
    done = _chips()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    text = " ".join(line.strip() for line in lines)
    assert "v7x: TPU v7x" in text and "compiles only" in text
    assert "v5e (default off-TPU)" in text and "compiles and estimates" in text


def test_estimate_compiles_for_the_chip_the_config_names(tmp_path) -> None:
    """One chip setting: `[backend] chip` in the config decides the judge's chip for the
    kernel commands too (a flag still wins)."""
    import json
    import os

    config = tmp_path / "config.toml"
    config.write_text('[backend]\nchip = "v6e"\n')
    env = {**os.environ, "TILEWRIGHT_CONFIG": str(config)}
    base = [sys.executable, "-m", "tilewright.tui.cli", "estimate", "--task", "gelu",
            "--set", "production.rows=256", "--set", "production.cols=1024", "--json"]
    said = subprocess.run(base, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert said.returncode == 0, said.stderr[-2000:]
    assert json.loads(said.stdout)["tpu"]["chip"] == "v6e"
    flag = subprocess.run([*base, "--chip", "v5e"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)
    assert json.loads(flag.stdout)["tpu"]["chip"] == "v5e"


def test_v7x_says_what_the_libtpu_in_use_does() -> None:
    """libtpu 0.0.42.1 aborts on v7x programs and says which version estimates; 0.0.50.1
    returns cycles (no v7x clock turns them into time here, so v7x ranks by cycle
    ratios)."""
    old = estimator_refusal("v7x", "0.0.42.1")
    assert "LloOpcodeIsScalarBranch" in old and "0.0.50 or newer" in old
    assert estimator_refusal("v7x", "0.0.50.1") is None  # cycles (no clock: no seconds)
    assert estimator_refusal("v5e", "0.0.42.1") is None


def test_vmem_per_core_agrees_with_pallas_own_tpu_info() -> None:
    """The table's VMEM per core is what Pallas itself says each generation has
    (``pltpu.get_tpu_info_for_chip``, on jax 0.10.2 and 0.12 alike): the figure the
    templates' VMEM_CAP, the tuner's model and the judge's refusals are checked against."""
    import importlib

    from jax.experimental.pallas import tpu as pltpu

    for where in ("jax._src.tpu_info", "jax._src.pallas.mosaic.tpu_info"):
        try:
            versions = importlib.import_module(where).ChipVersion
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise AssertionError("no ChipVersion in this jax: where did tpu_info go?")
    names = {"v4": "TPU_V4", "v5e": "TPU_V5E", "v5p": "TPU_V5P", "v6e": "TPU_V6E",
             "v7x": "TPU_7X"}
    for chip, version in names.items():
        info = pltpu.get_tpu_info_for_chip(versions[version], 1)
        assert CHIPS[chip].vmem_bytes == info.vmem_capacity_bytes, chip
