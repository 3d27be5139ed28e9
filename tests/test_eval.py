"""The evaluation contract: JSON schema, timing, integrity flags, the three layouts,
and ``tilewright eval`` end to end (exit codes, --json, the readable summary)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
from sizes import load_small

from tilewright.kernels.judge.result import EvalResult
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.tasks.loaders import load_task

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ROOT / "tests" / "fixtures" / "candidates"
TASKS = ROOT / "tests" / "fixtures" / "tasks"
SCHEMA = json.loads((ROOT / "kernels" / "eval_schema.json").read_text())
ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
QUICK = EvalOptions(trials=3, timeout_s=60.0, timing=False, shapes=["small"])


def validate(data: dict) -> None:
    jsonschema.validate(data, SCHEMA)
    json.dumps(data, allow_nan=False)  # strict JSON: no NaN/Infinity anywhere


@pytest.fixture(scope="module")
def gelu():
    return load_small("gelu", rows=64, cols=256)


async def run(pool: WorkerPool, task, path: Path, options: EvalOptions = QUICK) -> EvalResult:
    return await pool.evaluate(task, path.read_text(), options, filename=str(path))


def write_task(root: Path, reference: str, toml: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "task.toml").write_text(toml or 'name = "t"\natol = 1e-5\nrtol = 1e-5\n'
                                    '[shapes.small]\nrows = 64\ncols = 256\n')
    (root / "reference.py").write_text(textwrap.dedent(reference))
    return root


IDENTITY_KERNEL = textwrap.dedent("""
    import jax
    from jax.experimental import pallas as pl

    def _copy(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 1e-9

    def kernel(x):
        return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
""")


@ON_MODULE_LOOP
async def test_bundled_kernel_is_correct_with_timing_and_speedup(worker_pool, gelu) -> None:
    options = EvalOptions(trials=3, iters=5, timeout_s=120.0)
    result = await run(worker_pool, gelu, gelu.kernel_path, options)
    assert result.status == "correct", result.error
    timing = result.timing
    assert timing["method"] == "wall_clock" and timing["mode"] == "tpu-interpret"
    assert "not TPU performance" in timing["note"]
    assert timing["iters"] == 5 and timing["warmup"] >= 1
    assert timing["p10_ms"] <= timing["median_ms"] <= timing["p90_ms"]
    assert timing["baseline_median_ms"] > 0
    # interpret mode: the ratio is the host's, never a speedup (kernels.judge.rank.ranking)
    assert timing["speedup"] is None
    assert timing["host_ratio"] == pytest.approx(timing["baseline_median_ms"]
                                                 / timing["median_ms"])
    assert timing["shape"] in {s.name for s in gelu.visible_shapes()}
    assert timing["flops"] == 9.0 * 64 * 256
    # every small configuration was checked, the held-out one without its parameters
    shapes = {s["name"]: s for s in result.extra["shapes"]}
    assert set(shapes) == {s.name for s in gelu.shapes_for("cpu")}
    assert shapes["held_out"]["held_out"] and "params" not in shapes["held_out"]
    assert all(s["trials"] == 3 and s["correct"] for s in shapes.values())
    validate(result.to_json())


@ON_MODULE_LOOP
@pytest.mark.parametrize("name", ["wrong_values.py", "syntax_error.py", "oob_index_map.py",
                                  "misaligned_block.py", "no_pallas.py", "infinite_loop.py"])
async def test_every_status_validates_against_the_schema(worker_pool, gelu, name) -> None:
    result = await run(worker_pool, gelu, CANDIDATES / name,
                       EvalOptions(**{**QUICK.__dict__, "timeout_s": 5.0}))
    assert result.status != "correct"
    validate(result.to_json())
    assert EvalResult.from_json(result.to_json()).to_json() == result.to_json()


@ON_MODULE_LOOP
async def test_same_inputs_different_bits_is_flagged_nondeterministic(worker_pool, gelu) -> None:
    result = await run(worker_pool, gelu, CANDIDATES / "nondeterministic.py")
    assert "nondeterministic" in result.integrity["flags"]
    assert "nondeterministic" not in (await run(
        worker_pool, gelu, CANDIDATES / "good_gelu.py")).integrity["flags"]


@ON_MODULE_LOOP
async def test_near_zero_reference_is_judged_at_its_own_scale(worker_pool, tmp_path) -> None:
    """Outputs of 1e-9 sit far inside atol=1e-5: the kernel that computes them passes, one
    that returns zeros does not (the absolute tolerance is capped at 5% of the output's
    scale), and a constant reference is flagged degenerate every time."""
    root = write_task(tmp_path / "tiny", """
        import jax, jax.numpy as jnp
        def make_inputs(key, rows=64, cols=256):
            return (jax.random.normal(key, (rows, cols), jnp.float32),)
        def reference(x):
            return x * 1e-9
    """)
    task = load_task(root)
    (tmp_path / "k.py").write_text(IDENTITY_KERNEL)
    result = await run(worker_pool, task, tmp_path / "k.py")
    assert result.status == "correct" and not result.integrity["flags"]
    (tmp_path / "zeros.py").write_text(IDENTITY_KERNEL.replace("* 1e-9", "* 0.0"))
    zeros = await run(worker_pool, task, tmp_path / "zeros.py")
    assert zeros.status == "incorrect" and "atol capped" in zeros.correctness["reason"]
    assert zeros.correctness["max_rel_diff"] == 1.0  # off by 100%, not 0.0

    constant = write_task(tmp_path / "constant", """
        import jax, jax.numpy as jnp
        def make_inputs(key, rows=64, cols=256):
            return (jax.random.normal(key, (rows, cols), jnp.float32),)
        def reference(x):
            return x * 0.0
    """)
    for _ in range(2):
        flagged = await run(worker_pool, load_task(constant), tmp_path / "zeros.py")
        assert flagged.status == "correct"
        assert "degenerate_reference" in flagged.integrity["flags"]


@ON_MODULE_LOOP
async def test_implausible_speedup_is_flagged(worker_pool, tmp_path) -> None:
    # A reference made slow on purpose (a host callback that sleeps): any kernel "wins" big.
    root = write_task(tmp_path / "slow", """
        import time, jax, jax.numpy as jnp
        def make_inputs(key, rows=64, cols=256):
            return (jax.random.normal(key, (rows, cols), jnp.float32),)
        def _nap(x):
            time.sleep(1.0)  # ~70x the identity kernel's timed call at 8x128, interpreted
            # on a CPU host (14 ms, round trip included): over the flag's 10x even if load
            # slows it sevenfold
            return x
        def reference(x):
            return jax.pure_callback(_nap, jax.ShapeDtypeStruct(x.shape, x.dtype), x) * 1e-9
    """, toml='name = "slow"\n[shapes.small]\nrows = 8\ncols = 128\n')
    task = load_task(root)
    (tmp_path / "k.py").write_text(IDENTITY_KERNEL)
    result = await run(worker_pool, task, tmp_path / "k.py",
                       EvalOptions(trials=1, iters=1, timeout_s=120.0))
    assert result.status == "correct"
    assert result.timing["host_ratio"] > 10, result.timing  # interpret mode: the host's ratio
    assert "suspicious_speedup" in result.integrity["flags"]


@ON_MODULE_LOOP
async def test_maxkernel_layout_with_static_args(worker_pool, tmp_path) -> None:
    task = load_task(TASKS / "maxkernel_row_scale")
    path = tmp_path / "cand.py"
    path.write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp
        from jax.experimental import pallas as pl

        def computation(x, s, offset):
            def body(x_ref, s_ref, o_ref):
                o_ref[...] = x_ref[...] * s_ref[...] + jnp.float32(offset)
            return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, s)
    """))
    result = await run(worker_pool, task, path, EvalOptions(trials=3, timing=False))
    assert result.status == "correct", result.error or result.correctness
    assert len(result.extra["shapes"]) == 2
    assert [s["atol"] for s in result.extra["shapes"]] == [1e-6, 1e-5]
    # a candidate ignoring the static argument is wrong on both configurations
    path.write_text(path.read_text().replace("+ jnp.float32(offset)", ""))
    assert (await run(worker_pool, task, path, EvalOptions(trials=3, timing=False))
            ).status == "incorrect"


@ON_MODULE_LOOP
async def test_jaxbench_layout(worker_pool) -> None:
    task = load_task(TASKS / "jaxbench_scaled_tanh", {"rows": "64", "cols": "256"})
    result = await run(worker_pool, task, TASKS / "jaxbench_scaled_tanh" / "optimized.py",
                       EvalOptions(trials=3, timing=False))
    assert result.status == "correct", result.error or result.correctness


def tilewright(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
           "COLUMNS": "120"}
    return subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "eval", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


SMALL = ("--set", "rows=64", "--set", "cols=256", "--shape", "small")


def test_cli_json_for_a_correct_kernel_exits_0() -> None:
    proc = tilewright("--task", "gelu", "--json", "--iters", "3", *SMALL)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    validate(data)
    assert data["status"] == "correct" and data["timing"]["iters"] == 3
    assert data["backend"] == {**data["backend"], "platform": "cpu", "mode": "tpu-interpret"}


def test_cli_summary_says_what_each_number_is() -> None:
    """The text summary: the rank in its words with the compiler's cycles and their time,
    and the interpreter's host ratio, which is never called a speedup."""
    proc = tilewright("--task", "gelu", "--iters", "3", *SMALL)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())  # the table wraps long rows
    assert "host ratio" in out and "(not a speedup)" in out and "· speedup" not in out
    if "compiles" in out and "cycles =" in out:  # the TPU compiler estimated the kernel
        assert "kernel" in out and " ms at " in out
        assert "est. " in out or "≥" in out


def test_cli_summary_for_an_incorrect_kernel_exits_1() -> None:
    proc = tilewright("--task", "gelu", "--kernel", str(CANDIDATES / "misaligned_block.py"),
                      "--no-timing", *SMALL)
    assert proc.returncode == 1, proc.stderr
    assert "COMPILE_ERROR" in proc.stdout
    assert "CPU (TPU interpret)" in proc.stdout
    assert "divisible by 8 and 128" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (("--task", "gelu", "--kernel", "/no/such/kernel.py"), "cannot read kernel"),
    (("--task", "no_such_task", "--kernel", "x.py"), "no such task directory"),
    (("--task", "gelu", "--set", "rows"), "expected KEY=VALUE"),
    (("--task", "gelu", "--shape", "nope"), "unknown --shape"),
    (("--task", "gelu", "--trials", "1"), "at least 3"),
])
def test_cli_bad_usage_exits_2_with_a_clear_message(args, message) -> None:
    proc = tilewright(*args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_cli_malformed_task_exits_2(tmp_path) -> None:
    (tmp_path / "task.toml").write_text("name = [unclosed\n")
    (tmp_path / "reference.py").write_text("def make_inputs(key):\n    return ()\n")
    proc = tilewright("--task", str(tmp_path), "--kernel", str(CANDIDATES / "good_gelu.py"))
    assert proc.returncode == 2
    assert "task.toml" in proc.stderr
