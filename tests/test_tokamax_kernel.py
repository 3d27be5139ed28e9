"""Google's tokamax kernels as a user brings them: `tilewright new --kernel` on a function
calling tokamax's grouped matmul, judged correct, estimated with its loop bounds pinned to
the group sizes the task gives at the production shape (needs the optional extra:
./dev setup tokamax)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilewright.kernels.judge.rank import ranking
from tilewright.kernels.pool.workers import EvalOptions
from tilewright.kernels.source import inferred
from tilewright.kernels.tasks.loaders import load_task

pytest.importorskip("tokamax")

ROOT = Path(__file__).resolve().parents[1]
ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

MODEL = """
import jax
import jax.numpy as jnp


def moe_matmul(lhs, rhs, group_sizes):
    return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16)
"""
KERNEL = """
import jax
import jax.numpy as jnp
from tokamax._src.ops.ragged_dot import pallas_mosaic_tpu_kernel as tk

TILING = (256, 256, 256)


def moe_matmul(lhs, rhs, group_sizes):
    return tk.gmm(lhs, rhs, group_sizes, precision=(jax.lax.Precision.DEFAULT,) * 2,
                  out_dtype=jnp.bfloat16, tiling=TILING)
"""


@ON_MODULE_LOOP
async def test_new_from_a_function_calling_tokamax_is_judged_and_estimated(
        tmp_path, worker_pool) -> None:
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "gmm.py").write_text(KERNEL)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    made = subprocess.run(
        [sys.executable, "-m", "tilewright.tui.cli", "new", "moe", "--from", "model.py:moe_matmul",
         "--shape", "lhs=bf16[2048,512]", "--shape", "rhs=bf16[4,512,1024]",
         "--shape", "group_sizes=int32[4]", "--kernel", "gmm.py:moe_matmul",
         "--check", "lhs_0=1024", "--check", "lhs_1=512", "--check", "rhs_2=512",
         "-o", "moe", "--no-check"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "group_sizes (int32) gets random values" in made.stdout  # said, and then:
    reference = tmp_path / "moe" / "reference.py"
    text, count = re.subn(r"group_sizes = jax\.random\.randint\(.*\)",
                          "group_sizes = jnp.full((rhs_0,), lhs_0 // rhs_0, jnp.int32)",
                          reference.read_text())
    assert count == 1, text
    reference.write_text(text)  # the group sizes the user runs: even groups
    task = load_task(tmp_path / "moe")
    source = (tmp_path / "moe" / "kernel.py").read_text()
    found = inferred.infer(source)  # tokamax's tiling= is a block size the tuner moves
    assert found is not None and "TILING_0" in found[1], found
    result = await worker_pool.evaluate(task, source, EvalOptions(
        trials=3, timeout_s=900.0, timing=False, chip="v5e"),
        filename=str(tmp_path / "moe" / "kernel.py"))
    assert result.status == "correct", result.error
    estimate = result.tpu["estimate"]
    assert estimate is not None, result.tpu["estimate_unavailable"]
    assert estimate["method"] == "pinned", estimate
    assert "gmm_megablox" in estimate["detail"] and result.tpu["unpriced"] is None
    # 2048/256 = 8 row tiles, each 2 x 4 steps: at least the dots at the chip's peak
    dot_s = 2 * 2048 * 512 * 1024 / 197e12
    assert estimate["seconds"] > dot_s, (estimate["seconds"], dot_s)
    assert ranking(result.to_json()).compiler
    assert textwrap.dedent(KERNEL).strip().splitlines()[0] in source
