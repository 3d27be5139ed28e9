"""The real TPU compiler in the worker: compile verdicts per chip, the compiler's static
estimate, and ranking by it off-TPU. Probe kernels compiled for abstract v5e/v6e
topologies (libtpu from jax[tpu]; no TPU needed)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tilewright.agents.base import VersionRow
from tilewright.agents.offline.tuner import observations_from
from tilewright.kernels.judge.rank import ranking
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.tasks.loaders import load_task
from tilewright.kernels.worker.tpu import tpu_compile

pytestmark = pytest.mark.skipif(tpu_compile.libtpu_path() is None,
                                reason="libtpu not installed (pip install 'jax[tpu]')")
ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

NO_TIMING = EvalOptions(trials=3, timeout_s=120.0, timing=False)


def write_task(root: Path, reference: str, params: dict[str, int], dtype: str = "float32") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shape = "\n".join(f"{k} = {v}" for k, v in params.items())
    (root / "task.toml").write_text(f'name = "{root.name}"\natol = 1e-5\nrtol = 1e-5\n'
                                    f'[shapes.small]\n{shape}\nsize = "small"\n')
    (root / "reference.py").write_text(textwrap.dedent(reference))
    return root


def kernel(body: str) -> str:
    return textwrap.dedent("""
        import jax
        import jax.numpy as jnp
        from jax.experimental import pallas as pl
    """) + textwrap.dedent(body)


ADD_REFERENCE = """
    import jax
    def make_inputs(key, rows, cols):
        a, b = jax.random.split(key)
        return (jax.random.normal(a, (rows, cols)), jax.random.normal(b, (rows, cols)))
    def reference(x, y):
        return x + y
"""
# f32 blocks of 1024x1024, three operands double-buffered: 24 MiB of scoped VMEM (v5e
# gives a kernel 16 MiB, v6e 32 MiB).
BIG_BLOCKS = kernel("""
    def _add(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + y_ref[...]

    def kernel(x, y):
        spec = pl.BlockSpec((1024, 1024), lambda i: (i, 0))
        return pl.pallas_call(_add, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              grid=(x.shape[0] // 1024,), in_specs=[spec, spec],
                              out_specs=spec)(x, y)
""")

DOUBLE_REFERENCE = """
    import jax
    def make_inputs(key, rows, cols):
        return (jax.random.normal(key, (rows, cols)),)
    def reference(x):
        return 2.0 * x
"""


def blocked(rows: int, cols: int, body: str = "o_ref[...] = x_ref[...] * 2.0") -> str:
    return kernel(f"""
        def _body(x_ref, o_ref):
            {body}

        def kernel(x):
            spec = pl.BlockSpec(({rows}, {cols}), lambda i, j: (i, j))
            return pl.pallas_call(_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  grid=(x.shape[0] // {rows}, x.shape[1] // {cols}),
                                  in_specs=[spec], out_specs=spec)(x)
    """)


# Integer division in the body: lowering on the CPU backend asks the CPU what TPU it is.
INT_DIVISION = blocked(8, 512, "o_ref[...] = x_ref[...] * ((pl.program_id(0) * 0 + 6) // 3)")
TINY_BLOCKS = blocked(8, 128)
LARGE_BLOCKS = blocked(64, 512)
# One block, plus 40 sines that are multiplied by zero: one interpreter step (fast on
# the host), a lot of vector work on a TPU (slow by the compiler's estimate).
WASTEFUL = blocked(64, 512, "x = x_ref[...]\n            w = x\n" + "".join(
    "            w = jnp.sin(w)\n" for _ in range(40)) + "            o_ref[...] = x * 2.0 + 0.0 * w")

INT8_REFERENCE = """
    import jax
    import jax.numpy as jnp
    def make_inputs(key, rows, cols):
        a, b = jax.random.split(key)
        return (jax.random.randint(a, (rows, cols), -8, 8).astype(jnp.int8),
                jax.random.randint(b, (cols, rows), -8, 8).astype(jnp.int8))
    def reference(a, b):
        return jnp.dot(a, b, preferred_element_type=jnp.float32)
"""
# int8 x int8 with a float32 accumulator: Mosaic refuses it ("float acc with int lhs").
INT8_F32_ACC = kernel("""
    def _mm(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

    def kernel(a, b):
        return pl.pallas_call(_mm, out_shape=jax.ShapeDtypeStruct((a.shape[0], b.shape[1]),
                                                                  jnp.float32))(a, b)
""")

BF16_REFERENCE = """
    import jax
    import jax.numpy as jnp
    def make_inputs(key, rows, cols):
        a, b = jax.random.split(key)
        return (jax.random.normal(a, (rows, cols), dtype=jnp.bfloat16),
                jax.random.normal(b, (cols,), dtype=jnp.bfloat16))
    def reference(x, scale):
        return x * scale
"""
# A bf16 (1, cols) row broadcast inside the kernel: libtpu's LLO type check fails and
# aborts the compiling process (jax 0.10.2's libtpu, measured); in float32 it compiles.
BF16_ROW_BROADCAST = kernel("""
    def _scale(x_ref, s_ref, o_ref):
        o_ref[...] = (x_ref[...] CAST * s_ref[...] CAST).astype(o_ref.dtype)

    def kernel(x, scale):
        rows, cols = x.shape
        return pl.pallas_call(
            _scale, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(rows // 32,),
            in_specs=[pl.BlockSpec((32, cols), lambda i: (i, 0)),
                      pl.BlockSpec((1, cols), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((32, cols), lambda i: (i, 0)))(x, scale.reshape(1, cols))
""")

# Causal attention in bf16 at (2, 2, 128, 128): libtpu aborts compiling this XLA
# reference (an "online-softmax" fusion fails an LLO type check; measured).
ATTENTION_BF16_REFERENCE = """
    import jax
    import jax.numpy as jnp
    def make_inputs(key, seq, dim):
        keys = jax.random.split(key, 3)
        return tuple(jax.random.normal(k, (2, 2, seq, dim), dtype=jnp.bfloat16) for k in keys)
    def reference(q, k, v):
        s = q.shape[2]
        attn = jnp.einsum("bhqd,bhkd->bhqk", q, k) * q.shape[-1] ** -0.5
        attn = jnp.where(jnp.tril(jnp.ones((s, s))), attn, -1e9)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(attn, axis=-1), v)
"""
COPY_Q = kernel("""
    def _copy(q_ref, o_ref):
        o_ref[...] = q_ref[...]

    def kernel(q, k, v):
        flat = q.reshape(-1, q.shape[-1])
        out = pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(flat.shape, flat.dtype))(flat)
        return out.reshape(q.shape)
""")


async def evaluate(pool: WorkerPool, task_dir: Path, source: str, chip: str,
                   options: EvalOptions = NO_TIMING):
    from dataclasses import replace

    task = load_task(str(task_dir), {})
    return await pool.evaluate(task, source, replace(options, chip=chip),
                               filename=str(task_dir / "candidate.py"))


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tpu_tasks")
    return {"add": write_task(root / "add", ADD_REFERENCE, {"rows": 2048, "cols": 1024}),
            "double": write_task(root / "double", DOUBLE_REFERENCE, {"rows": 64, "cols": 512}),
            "int8": write_task(root / "int8", INT8_REFERENCE, {"rows": 128, "cols": 128}),
            "bf16": write_task(root / "bf16", BF16_REFERENCE, {"rows": 64, "cols": 256}),
            "attention": write_task(root / "attention", ATTENTION_BF16_REFERENCE,
                                    {"seq": 128, "dim": 128})}


@ON_MODULE_LOOP
async def test_vmem_overflow_on_v5e_compiles_on_v6e(worker_pool, tasks) -> None:
    v5e = await evaluate(worker_pool, tasks["add"], BIG_BLOCKS, "v5e")
    assert v5e.status == "compile_error", v5e.error
    assert v5e.tpu["chip"] == "v5e" and v5e.tpu["compile"] == "error"
    assert "CompileTimeScopedVmemOom" in v5e.tpu["message"]
    assert v5e.tpu["vmem_bytes"] == 24 << 20 and v5e.tpu["vmem_limit_bytes"] == 16 << 20
    assert v5e.error.kind == "tpu_compile" and v5e.error.line is not None
    assert "VMEM" in v5e.error.hint and v5e.correctness["correct"]  # interpret mode ran it
    v6e = await evaluate(worker_pool, tasks["add"], BIG_BLOCKS, "v6e")
    assert v6e.status == "correct", v6e.error
    assert v6e.tpu["compile"] == "ok" and v6e.tpu["vmem_bytes"] == 24 << 20


@ON_MODULE_LOOP
async def test_integer_division_in_the_body_is_accepted(worker_pool, tasks) -> None:
    result = await evaluate(worker_pool, tasks["double"], INT_DIVISION, "v5e")
    assert result.status == "correct", result.error
    assert result.lowering["tpu"] == "ok" and result.tpu["compile"] == "ok"


@ON_MODULE_LOOP
async def test_mosaic_refused_dtype_combination(worker_pool, tasks) -> None:
    result = await evaluate(worker_pool, tasks["int8"], INT8_F32_ACC, "v5e")
    assert result.status == "compile_error", result.error
    assert "float acc with int lhs" in result.tpu["message"]
    assert "MLIR operation" not in result.tpu["message"]  # the compiler's words, not its dump
    assert result.error.kind == "tpu_compile"


@ON_MODULE_LOOP
async def test_an_estimator_abort_costs_the_estimate_not_the_kernel(worker_pool, tasks) -> None:
    """libtpu's estimator aborts (SIGABRT, an LLO type check) on the bf16 broadcast, while
    the same program compiles without the estimate flag: the kernel is correct and
    compiles (as it would on a TPU), its estimate is unavailable with the check's line,
    and the worker goes on. The offline fixer computes the blocks in float32 instead,
    which gets the kernel an estimate."""
    (tasks["bf16"] / "task.toml").write_text(
        (tasks["bf16"] / "task.toml").read_text().replace("1e-5", "1e-2"))
    crashed = await evaluate(worker_pool, tasks["bf16"],
                             BF16_ROW_BROADCAST.replace(" CAST", ""), "v5e")
    assert crashed.status == "correct", crashed.error
    assert crashed.tpu["compile"] == "ok" and crashed.tpu["chip"] == "v5e"
    assert crashed.tpu["estimate"] is None
    why = crashed.tpu["estimate_unavailable"]
    assert "aborted" in why and "Check failed" in why and "bf16" in why, why
    rank = ranking(crashed.to_json())
    assert rank.source != "tpu_estimate" and "aborted" in rank.label
    fixed = await evaluate(worker_pool, tasks["bf16"],
                           BF16_ROW_BROADCAST.replace(" CAST", ".astype(jnp.float32)"), "v5e")
    assert fixed.status == "correct", fixed.error
    assert fixed.tpu["compile"] == "ok" and fixed.tpu["estimate"]["cycles"] > 0
    # The offline agent's fixer makes that change itself: blocks widened, stores cast back.
    from tilewright.agents.offline.fixes import suggest_fix

    fix = suggest_fix(BF16_ROW_BROADCAST.replace(" CAST", ""), crashed.to_json())
    assert fix is not None and fix.rule == "half_precision" and fix.source
    refixed = await evaluate(worker_pool, tasks["bf16"], fix.source, "v5e")
    assert refixed.status == "correct", refixed.error
    assert refixed.tpu["estimate"]["cycles"] > 0


@ON_MODULE_LOOP
async def test_a_compiler_abort_on_the_reference_costs_its_estimate_only(worker_pool,
                                                                        tasks) -> None:
    """The judge compiles the reference in a helper process: libtpu's abort there costs
    the reference estimate (unavailable, with the check's line), not the worker; the
    next evaluation says the same (the abort is remembered per task, shape and chip).
    libtpu 0.0.42 (the TPU VM's) aborts on this attention reference; 0.0.50 (jax 0.12)
    estimates it, and the estimate is then there both times."""
    from tilewright.profiling.chips import installed_libtpu

    aborts = (installed_libtpu() or "").startswith("0.0.42")
    result = await evaluate(worker_pool, tasks["attention"], COPY_Q, "v5e")
    assert result.status == "incorrect", result.error  # judged: the worker lived
    assert result.tpu["compile"] == "ok"  # a wrong kernel gets its verdict, no estimate
    task = load_task(str(tasks["attention"]), {})
    for _ in range(2):  # the estimate alone (tilewright estimate): no correctness check
        found = await worker_pool.estimate(task, COPY_Q, NO_TIMING)
        assert found["status"] == "ok", found
        tpu = found["tpu"]
        assert tpu["compile"] == "ok" and tpu["estimate"]["cycles"] > 0
        if aborts:
            assert tpu["reference_estimate"] is None
            assert "aborted on the XLA reference" in tpu["estimate_unavailable"]
            assert "Check failed" in tpu["estimate_unavailable"]
        else:
            assert tpu["reference_estimate"]["cycles"] > 0, tpu["estimate_unavailable"]


@ON_MODULE_LOOP
async def test_estimates_order_blocks_and_rank_off_tpu(worker_pool, tasks) -> None:
    timed = EvalOptions(trials=3, iters=2, timeout_s=120.0)
    results = {name: await evaluate(worker_pool, tasks["double"], source, "v5e", timed)
               for name, source in (("tiny", TINY_BLOCKS), ("large", LARGE_BLOCKS),
                                    ("wasteful", WASTEFUL))}
    for result in results.values():
        assert result.status == "correct", result.error
        assert result.tpu["estimate"]["source"] == tpu_compile.SOURCE
        assert result.tpu["reference_estimate"]["cycles"] > 0
    cycles = {n: r.tpu["estimate"]["cycles"] for n, r in results.items()}
    assert cycles["large"] < cycles["tiny"] < cycles["wasteful"], cycles
    # The interpreter's times are recorded and labelled, and rank nothing (which of them
    # is faster on this host depends on its load: no wall-clock comparison here).
    host = {n: r.timing["median_ms"] for n, r in results.items()}
    assert all(ms > 0 for ms in host.values()), host
    assert results["tiny"].timing["label"] == "host simulation time"
    # What ranks is the estimate: the result's rank, the tuner's observations.
    for result in results.values():
        rank = ranking(result.to_json())
        assert rank.source == "tpu_estimate" and rank.value == result.tpu["estimated_speedup"]
        assert rank.label.startswith("est. ") and "TPU compiler" in rank.label
    history = tuple(VersionRow(i, r.status, r.rank, median_ms=r.timing["median_ms"],
                               tunables={"BLOCK": name})
                    for i, (name, r) in enumerate(results.items()))
    obs = observations_from(history, None, None, {"BLOCK"})
    assert dict(obs.best()[0])["BLOCK"] == "large"
    worse = observations_from(history[::2], None, None, {"BLOCK"})  # tiny vs wasteful
    assert dict(worse.best()[0])["BLOCK"] == "tiny"


@ON_MODULE_LOOP
async def test_estimate_flag_unavailable_degrades(tasks) -> None:
    # A libtpu started without the estimate flag (as with a libtpu that lacks it).
    async with WorkerPool(size=1, env_overrides={tpu_compile.DISABLE_ENV: "0"}) as pool:
        result = await evaluate(pool, tasks["double"], LARGE_BLOCKS, "v5e",
                                EvalOptions(trials=3, iters=2, timeout_s=120.0))
        assert result.status == "correct", result.error
        assert result.tpu["compile"] == "ok" and result.tpu["estimate"] is None
        assert "turned off" in result.tpu["estimate_unavailable"]
        rank = ranking(result.to_json())
        assert rank.source == "host_simulation" and "not TPU performance" in rank.label
        # v4 compiles without the flag (with it, libtpu aborts)
        v4 = await evaluate(pool, tasks["double"], LARGE_BLOCKS, "v4")
        assert v4.status == "correct" and v4.tpu["compile"] == "ok", v4.tpu


@ON_MODULE_LOOP
async def test_v4_compiles_without_an_estimate_not_a_crash(worker_pool, tasks) -> None:
    """The verdict compiler has no estimate flag, so v4 (whose estimator aborts libtpu)
    gets its compile verdict; the estimate is unavailable, naming the chip."""
    result = await evaluate(worker_pool, tasks["double"], LARGE_BLOCKS, "v4")
    assert result.status == "correct", result.error
    assert result.tpu["compile"] == "ok" and result.tpu["estimate"] is None
    assert "v4" in result.tpu["estimate_unavailable"]
    again = await evaluate(worker_pool, tasks["double"], LARGE_BLOCKS, "v5e")
    assert again.tpu["compile"] == "ok" and again.tpu["estimate"]  # the same worker goes on


def test_prepare_environment_states(tmp_path) -> None:
    env: dict[str, str] = {tpu_compile.DISABLE_ENV: "0", "JAX_PLATFORMS": "cpu"}
    assert tpu_compile.prepare_environment(env) == "disabled"
    assert "LIBTPU_INIT_ARGS" not in env and env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
    env = {"JAX_PLATFORMS": "cpu"}
    assert tpu_compile.prepare_environment(env, dump_parent=str(tmp_path)) == "estimates"
    assert env["LIBTPU_INIT_ARGS"] == f"{tpu_compile.FLAG}={env[tpu_compile.DUMP_ENV]}"
    assert env[tpu_compile.DUMP_ENV].startswith(str(tmp_path))
    assert tpu_compile.vmem_from_error(
        "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: ... Scoped allocation with "
        "size 24.00M and limit 16.00M exceeded") == (24 << 20, 16 << 20)


V7X_PROBE = """
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from tilewright.kernels.worker.tpu import tpu_compile as tc

where, why = tc.target("v7x")
assert where is not None, why

def blocked(x, y):
    def body(x_ref, y_ref, o_ref, acc_ref):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)
        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
        @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
        def _():
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)
    b = 512
    return pl.pallas_call(body, grid=(2, 2, 2),
        in_specs=[pl.BlockSpec((b, b), lambda i, j, k: (i, k)),
                  pl.BlockSpec((b, b), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((b, b), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((1024, 1024), x.dtype),
        scratch_shapes=[pltpu.VMEM((b, b), jnp.float32)])(x, y)

a = jnp.zeros((1024, 1024), jnp.bfloat16)
for name, fn in (("xla", jax.jit(lambda x, y: x @ y)), ("pallas", jax.jit(blocked))):
    out = tc.compile_lowered(tc.lower(fn, (a, a), (), where), where)
    print(name, out["compile"], (out["estimate"] or {}).get("cycles"),
          (out["estimate"] or {}).get("seconds"), out["estimate_unavailable"])
"""


@pytest.mark.skipif(tpu_compile.estimator_refusal("v7x") is not None,
                    reason="this libtpu's estimator gives no v7x figure (tilewright chips)")
def test_a_v7x_compile_returns_cycles_for_xla_and_pallas(tmp_path) -> None:
    """Where libtpu's estimator handles v7x (0.0.50 with jax 0.12), an XLA matmul and a
    blocked Pallas matmul compiled for tpu7x both come back with cycles, and no seconds:
    the chip table has no v7x clock, so v7x ranks by cycle ratios."""
    import os
    import subprocess
    import sys

    from tilewright.kernels.pool.env import QUIET

    env = {**QUIET, **os.environ, "JAX_PLATFORMS": "cpu"}  # no libtpu log files in /tmp
    tpu_compile.prepare_environment(env, str(tmp_path))
    got = subprocess.run([sys.executable, "-c", V7X_PROBE], capture_output=True, text=True,
                         env=env, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in got.stdout.splitlines() if " " in line)
    for name in ("xla", "pallas"):
        compiled, cycles, seconds, _why = lines[name].split(" ", 3)
        assert compiled == "ok" and int(cycles) > 0 and seconds == "None", lines[name]
