"""Kernels nobody here wrote, and users' own functions, work as they are.

jax's own Pallas TPU matmul (512-blocks) and flash attention (a ``custom_vjp`` around its
``pallas_call``s) brought in with ``tilewright new --kernel`` are judged correct without
``--set``: the check shapes are fitted to their blocks (batch-like dimensions shrunk
first) and every ``pallas_call`` the program reaches runs interpreted. Block sizes passed
to constructors and calls are tunables; two tasks made from one module stay apart in one
worker; the offline agent's first version of a user's matmul with an epilogue is correct
and compiles at the production shape.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tilewright.kernels.source import inferred, tunables
from tilewright.kernels.tasks import shapes as new_shapes
from tilewright.kernels.worker.tpu import tpu_compile

ROOT = Path(__file__).resolve().parent.parent
needs_libtpu = pytest.mark.skipif(tpu_compile.libtpu_path() is None,
                                  reason="libtpu not installed (pip install 'jax[tpu]')")
ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

MATMUL_MODEL = """
import jax.numpy as jnp

def mm(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)
"""
JAX_MATMUL = """
from jax.experimental.pallas.ops.tpu import matmul as pallas_matmul

def mm(x, y):
    return pallas_matmul.matmul(x, y, block_shape=(512, 512), block_k=512)
"""
ATTENTION_MODEL = """
import jax
import jax.numpy as jnp

def attention(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v,
                      preferred_element_type=jnp.float32).astype(q.dtype)
"""
JAX_FLASH = """
from jax.experimental.pallas.ops.tpu import flash_attention as fa

BLOCKS = fa.BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1,
                       block_q_major_dkv=128, block_k_major_dkv=128, block_k_dkv=128,
                       block_q_dkv=128, block_k_major_dq=128, block_k_dq=128, block_q_dq=128)

def attention(q, k, v):
    return fa.flash_attention(q, k, v, block_sizes=BLOCKS)
"""
TWO_FUNCTIONS = """
import jax
import jax.numpy as jnp

def add_scale(x, r):
    return (x + r) * 0.5

def mm_bias_gelu(x, w, b):
    return jax.nn.gelu(x @ w + b)
"""


def tw(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "tilewright.tui.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def new(where: Path, name: str, model: str, kernel: str | None, fn: str,
        shapes: list[str]) -> dict:
    where.mkdir(parents=True, exist_ok=True)
    (where / "model.py").write_text(model)
    args = ["new", name, "--from", f"model.py:{fn}", "--json"]
    if kernel is not None:
        (where / "mine.py").write_text(kernel)
        args += ["--kernel", f"mine.py:{fn}"]
    for shape in shapes:
        args += ["--shape", shape]
    made = tw(*args, cwd=where)
    assert made.returncode == 0, made.stdout + made.stderr
    return json.loads(made.stdout)


# -- check shapes a user's kernel can run (no worker) ---------------------------------------

def test_check_shapes_fit_the_kernels_blocks_and_shrink_batches_first() -> None:
    attention = new_shapes.parse_shapes(["q=bf16[4,16,4096,128]", "k=bf16[4,16,4096,128]",
                                         "v=bf16[4,16,4096,128]"])
    # batch and heads go first (down to 2), then the sequence, a multiple of block_q
    check = new_shapes.derive_check(attention, granules={"q_2": 128})
    assert check == {"q_0": 2, "q_1": 2, "q_2": 256, "q_3": 128}
    matmul = new_shapes.parse_shapes(["x=bf16[4096,4096]", "y=bf16[4096,4096]"])
    operands = [{"shape": [4096, 4096], "block": [512, 512]} for _ in range(3)]
    granules = new_shapes.block_granules(matmul, operands)
    assert granules == {"x_0": 512}
    assert new_shapes.derive_check(matmul, granules=granules) == {"x_0": 512}
    assert new_shapes.derive_check(matmul) == {"x_0": 256}  # without the kernel's blocks
    notes = new_shapes.check_notes(matmul, {"x_0": 512}, granules)
    assert notes["x_0"] == "shrunk from 4096 (a whole multiple of the kernel's 512-blocks)"


def test_block_sizes_in_constructors_and_calls_are_tunables() -> None:
    source, choices = inferred.infer(JAX_FLASH)
    assert {"BLOCK_Q", "BLOCK_K_MAJOR", "BLOCK_K"} <= set(choices)
    assert "block_q=BLOCK_Q" in source and "BLOCK_Q = 128" in source
    again = tunables.apply(source, {"BLOCK_Q": 256})
    assert "BLOCK_Q = 256" in again and "block_q=BLOCK_Q" in again
    source, choices = inferred.infer(JAX_MATMUL)
    assert set(choices) == {"BLOCK_SHAPE_ROWS", "BLOCK_SHAPE_COLS", "BLOCK_K"}
    assert "block_shape=(BLOCK_SHAPE_ROWS, BLOCK_SHAPE_COLS), block_k=BLOCK_K" in source
    assert tunables.alignment(source) == {"BLOCK_SHAPE_ROWS": 8, "BLOCK_SHAPE_COLS": 128,
                                          "BLOCK_K": 128}


# -- through the CLI and a worker --------------------------------------------------------------

@needs_libtpu
def test_jax_matmul_with_512_blocks_is_judged_correct_without_set(tmp_path: Path) -> None:
    made = new(tmp_path, "mm", MATMUL_MODEL, JAX_MATMUL, "mm",
               ["x=bf16[4096,4096]", "y=bf16[4096,4096]"])
    check = next(c for c in made["configs"] if c["name"] == "check")
    assert check["sizes"] == {"x_0": 512}  # one block: the kernel's grid is not empty
    assert "512-blocks" in made["shrunk"]["x_0"]
    done = tw("eval", "--task", "mm", "--json", "--no-timing", cwd=tmp_path)
    result = json.loads(done.stdout)
    assert result["status"] == "correct", (result.get("error"), result.get("correctness"))
    assert result["tpu"]["estimated_speedup"] > 0  # ranked at 4096^3 against XLA's


@needs_libtpu
@ON_MODULE_LOOP
async def test_jax_flash_attention_custom_vjp_runs_interpreted(tmp_path: Path,
                                                                worker_pool) -> None:
    from tilewright.kernels.pool.workers import EvalOptions
    from tilewright.kernels.tasks.loaders import load_task

    made = new(tmp_path, "fa", ATTENTION_MODEL, JAX_FLASH, "attention",
               ["q=bf16[2,4,1024,128]", "k=bf16[2,4,1024,128]", "v=bf16[2,4,1024,128]"])
    check = next(c for c in made["configs"] if c["name"] == "check")["sizes"]
    assert check["q_2"] % 128 == 0 and check["q_2"] >= 128  # block_q fits
    task = load_task(str(tmp_path / "fa"))
    result = await worker_pool.evaluate(task, (tmp_path / "fa" / "kernel.py").read_text(),
                                        EvalOptions(trials=3, timeout_s=300, timing=False),
                                        filename=str(tmp_path / "fa" / "kernel.py"))
    assert result.status == "correct", (result.error, result.correctness)
    assert result.lowering["tpu"] == "ok" and result.tpu["compile"] == "ok"


@needs_libtpu
@ON_MODULE_LOOP
async def test_two_tasks_from_one_module_stay_apart_in_one_worker(tmp_path: Path,
                                                                  worker_pool) -> None:
    from tilewright.kernels.tasks.loaders import load_task

    new(tmp_path, "add_scale", TWO_FUNCTIONS, None, "add_scale", ["x=f32[256,512]",
                                                                 "r=f32[256,512]"])
    new(tmp_path, "mm_bias_gelu", TWO_FUNCTIONS, None, "mm_bias_gelu",
        ["x=f32[512,512]", "w=f32[512,512]", "b=f32[512]"])
    # each task copied what it needs into its own model.py: one worker serves both
    for name in ("add_scale", "mm_bias_gelu", "add_scale"):
        answer = await worker_pool.request("inputs", {
            "task": load_task(str(tmp_path / name)).to_spec()})
        assert "error" not in answer, answer.get("error")
        assert answer["configs"][0]["outputs"]


@needs_libtpu
@ON_MODULE_LOOP
async def test_the_offline_agents_first_matmul_is_correct_at_4096(tmp_path: Path,
                                                                  worker_pool) -> None:
    """A user's matmul + bias + gelu, f32 at 4096: the offline agent reads the copied
    function (the reference only calls it) and writes its tiled matmul template."""
    from tilewright.agents import brief
    from tilewright.agents.base import AgentRequest, ProposalReady
    from tilewright.agents.offline import OfflineAgent
    from tilewright.kernels.pool.workers import EvalOptions
    from tilewright.kernels.tasks.loaders import load_task

    new(tmp_path, "mbg", TWO_FUNCTIONS, None, "mm_bias_gelu",
        ["x=f32[4096,4096]", "w=f32[4096,4096]", "b=f32[4096]"])
    task = load_task(str(tmp_path / "mbg"))
    request = AgentRequest(role="implement", task=brief(task), current_source=None)
    replies = [e async for e in OfflineAgent({}).propose(request)]
    proposal = next(e.proposal for e in replies if isinstance(e, ProposalReady))
    assert "matmul" in proposal.summary
    result = await worker_pool.evaluate(task, proposal.source,
                                        EvalOptions(trials=3, timeout_s=300, timing=False),
                                        filename="kernel.py")
    assert result.status == "correct", (result.error, result.correctness)
    assert result.tpu["compile"] == "ok" and result.tpu["shape_label"].startswith("4096x4096")
    # chosen for f32 at 4096: 1024-square output tiles, a 512 K block, the scoped VMEM
    # asked for (within VMEM_CAP)
    assert "BLOCK_M = 1024" in proposal.source and "BLOCK_K = 512" in proposal.source
    assert result.tpu["vmem_limit_bytes"] <= 64 * 2**20
