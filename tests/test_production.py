"""Check small, judge at the production shape: the size the user runs.

A native task whose check shape (64x256) fits a whole-array kernel and whose production
shape (2048x2048 f32) does not: the whole-array kernel is correct where it is checked
and a compile error where it is ranked; a tiled kernel is ranked by its estimate at the
production shape, labeled with chip and shape. Real workers, the real TPU compiler for
an abstract v5e (libtpu from jax[tpu]), TPU interpret mode for the trials.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilewright.kernels.judge.rank import ranking
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.tasks.loaders import load_task
from tilewright.kernels.worker.tpu import tpu_compile

pytestmark = pytest.mark.skipif(tpu_compile.libtpu_path() is None,
                                reason="libtpu not installed (pip install 'jax[tpu]')")
ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
ROOT = Path(__file__).resolve().parent.parent
QUICK = EvalOptions(trials=3, timeout_s=180.0, timing=False)

REFERENCE = """
import jax
import jax.numpy as jnp

def make_inputs(key, rows, cols):
    return (jax.random.normal(key, (rows, cols), jnp.float32),)

def reference(x):
    return jnp.tanh(x) * 2.0
"""
WHOLE_ARRAY = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

def _body(x_ref, o_ref):
    o_ref[...] = jnp.tanh(x_ref[...]) * 2.0

def kernel(x):
    return pl.pallas_call(_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
"""
TILED = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR, BC = 64, 256

def _body(x_ref, o_ref):
    o_ref[...] = jnp.tanh(x_ref[...]) * 2.0

def kernel(x):
    rows, cols = x.shape
    br, bc = min(BR, rows), min(BC, cols)
    spec = pl.BlockSpec((br, bc), lambda i, j: (i, j))
    return pl.pallas_call(
        _body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // br, cols // bc), in_specs=[spec], out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel")),
        NAME)(x)
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("production") / "tanh2"
    root.mkdir()
    (root / "task.toml").write_text(textwrap.dedent("""
        name = "tanh2"
        atol = 1e-5
        rtol = 1e-5
        [shapes.small]
        rows = 64
        cols = 256
        [shapes.prod]
        rows = 2048
        cols = 2048
        size = "large"
        production = true
    """))
    (root / "reference.py").write_text(REFERENCE)
    return root


def tiled(name: str | None = None) -> str:
    return TILED.replace("NAME", f"name={name!r}" if name else "")


async def evaluate(pool: WorkerPool, task_dir: Path, source: str,
                   options: EvalOptions = QUICK, **overrides: str):
    task = load_task(str(task_dir), overrides or None)
    return await pool.evaluate(task, source, options, filename=str(task_dir / "kernel.py"))


def test_set_shrinks_check_shapes_only(task_dir: Path) -> None:
    task = load_task(str(task_dir), {"rows": "32"})
    assert {s.name: s.params["rows"] for s in task.shapes} == {"small": 32, "prod": 32}
    assert task.production.name == "prod" and task.production.params == {"rows": 2048,
                                                                          "cols": 2048}
    moved = load_task(str(task_dir), {"production.rows": "1024"})
    assert moved.production.params == {"rows": 1024, "cols": 2048}
    assert {s.name: s.params["rows"] for s in moved.shapes} == {"small": 64, "prod": 2048}
    from tilewright.sessions.tasks import task_header

    header = task_header(task, {"rows": "32"})
    assert header["production"]["params"] == {"rows": 2048, "cols": 2048}
    assert [s["params"]["rows"] for s in header["shapes"]] == [32, 32]


def test_jaxbench_production_is_config_as_written(tmp_path: Path) -> None:
    task_dir = tmp_path / "wl"
    task_dir.mkdir()
    (task_dir / "baseline.py").write_text(textwrap.dedent("""
        import jax
        import jax.numpy as jnp
        CONFIG = {'name': 'wl', 'batch': 4096, 'dim': 1024}
        def create_inputs(dtype=jnp.float32):
            x = jax.random.normal(jax.random.key(0), (CONFIG['batch'], CONFIG['dim']), dtype)
            return (x,)
        def workload(x):
            return jnp.tanh(x)
    """))
    task = load_task(str(task_dir), {"batch": "64", "dtype": "bfloat16"})
    assert task.shapes[0].params == {"batch": 64, "dtype": "bfloat16"}
    assert task.production.params == {"dtype": "bfloat16"}  # dtype is not a size
    assert task.production_task().meta["config"]["batch"] == 4096
    listed = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "tasks", str(task_dir),
                             "--no-bundled", "--json", "--set", "batch=64"],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    row = json.loads(listed.stdout)["tasks"][0]
    # bfloat16, as JAXBench's harness builds them (create_inputs takes a dtype)
    assert row["inputs"]["default"]["inputs"] == [[[64, 1024], "bfloat16"]]
    assert row["production"]["inputs"] == [[[4096, 1024], "bfloat16"]]


@ON_MODULE_LOOP
async def test_whole_array_kernel_is_a_compile_error_at_production(worker_pool,
                                                                   task_dir) -> None:
    result = await evaluate(worker_pool, task_dir, WHOLE_ARRAY)
    assert result.correctness["correct"], result.correctness  # fits at the check shape
    assert result.status == "compile_error", result.error
    assert result.tpu["compile"] == "error" and result.tpu["kind"] == "vmem"
    assert result.tpu["shape"] == "prod" and result.tpu["input_shapes"] == ["f32[2048,2048]"]
    assert "at the production shape prod (f32[2048,2048])" in result.error.message
    assert result.tpu["vmem_bytes"] > result.tpu["vmem_limit_bytes"]
    rank = ranking(result.to_json())
    assert rank.value is None and rank.source == "none"  # never ranked, never best


@ON_MODULE_LOOP
async def test_tiled_kernel_is_ranked_by_its_production_estimate(worker_pool,
                                                                 task_dir) -> None:
    result = await evaluate(worker_pool, task_dir, tiled())
    assert result.status == "correct", result.error
    tpu = result.tpu
    assert tpu["compile"] == "ok" and tpu["shape_label"] == "2048x2048"
    assert tpu["kernels"][0]["grid"] == [32, 8] and tpu["grid_steps"] == 256
    estimate = tpu["estimate"]
    assert estimate["method"] == "scaled"
    # 32 repeats of the inner sweep (8 steps) in the production grid; the compiles that
    # are scaled from hold at most STEP_BUDGET (32) steps.
    kernel = tpu["kernels"][0]
    assert kernel["axis"] == 0 and kernel["units_full"] == 32
    assert max(kernel["units"]) * 8 <= 32
    assert "repeats" in estimate["detail"]
    assert tpu["reference_estimate"]["cycles"] > 0 and tpu["estimated_speedup"] > 0
    assert tpu["floor"]["kernel_bytes"] == 2 * 2048 * 2048 * 4  # read once, written once
    assert tpu["basis"] in ("compiler", "memory_floor")
    assert tpu["fidelity"]["class"] == "memory_bound"
    rank = ranking(result.to_json())
    assert rank.source == "tpu_estimate" and rank.value == tpu["estimated_speedup"]
    assert rank.label.startswith(f"est. {rank.value:.2f}x on v5e at 2048x2048 (TPU compiler")
    assert rank.shape == "2048x2048" and rank.derived
    # the check shape is what ran: a different, smaller configuration
    assert [s["name"] for s in result.extra["shapes"]] == ["small"]


@ON_MODULE_LOOP
async def test_a_rerun_hits_the_estimate_cache(task_dir, tmp_path) -> None:
    env = {"TILEWRIGHT_CACHE_DIR": str(tmp_path / "cache")}
    async with WorkerPool(size=1, env_overrides=env) as pool:
        first = await evaluate(pool, task_dir, tiled())
        assert first.status == "correct" and first.tpu["cached"] is False
    entries = list((tmp_path / "cache").rglob("*.json"))
    assert entries, "nothing was cached"
    async with WorkerPool(size=1, env_overrides=env) as pool:  # a fresh worker
        again = await evaluate(pool, task_dir, tiled())
    assert again.tpu["cached"] is True
    assert again.tpu["estimate"]["cycles"] == first.tpu["estimate"]["cycles"]
    assert again.tpu["estimated_speedup"] == first.tpu["estimated_speedup"]


@ON_MODULE_LOOP
async def test_one_compile_is_the_verdict_and_the_estimate_of_a_program_estimated_whole(
        task_dir, tmp_path) -> None:
    """A grid within the estimator's budget (4x4 steps) is estimated on the program
    itself: the estimator's compile of it is the verdict too. Told not to wait for the
    estimator (``TILEWRIGHT_VERDICT_WAIT_S=0``), the verdict compiler judges the same
    program meanwhile: the same verdict, the same figures, one compile more."""
    source = tiled("whole").replace("BR, BC = 64, 256", "BR, BC = 512, 512")
    results, kinds = {}, {}
    for wait in ("300", "0"):
        cache = tmp_path / f"cache-{wait}"
        env = {"TILEWRIGHT_CACHE_DIR": str(cache), "TILEWRIGHT_VERDICT_WAIT_S": wait}
        async with WorkerPool(size=1, env_overrides=env) as pool:
            results[wait] = result = await evaluate(pool, task_dir, source)
        assert result.status == "correct", result.error
        assert result.tpu["compile"] == "ok" and result.tpu["grid_steps"] == 16
        assert result.tpu["estimate"]["method"] == "full" and result.tpu["cached"] is False
        # what was compiled: the cache keeps every compiler's answer (the estimator's
        # with records), the reference's included, beside the reference's record
        found = [json.loads(p.read_text()) for p in (cache / "estimates" / "v1").rglob("*.json")]
        kinds[wait] = sorted("estimate" if a.get("records") is not None else "verdict"
                             for a in found if "compile_s" in a)
    shared, both = results["300"], results["0"]
    assert shared.tpu["verdict_by"] == "estimator" and both.tpu["verdict_by"] == "verdict"
    assert kinds["300"] == ["estimate", "estimate"], kinds  # the kernel's, the reference's
    assert kinds["0"] == ["estimate", "estimate", "verdict"], kinds
    for key in ("vmem_bytes", "estimated_speedup", "kernel_time_s"):
        assert shared.tpu[key] == both.tpu[key], key
    assert shared.tpu["estimate"]["cycles"] == both.tpu["estimate"]["cycles"]


@ON_MODULE_LOOP
async def test_a_compile_over_its_memory_limit_costs_the_estimate_not_the_worker(
        worker_pool, task_dir, tmp_path) -> None:
    # A limit below what a compile process needs to import JAX: every compile is killed
    # (and not tried again with more: the host's cap is as low).
    env = {"TILEWRIGHT_CACHE_DIR": str(tmp_path / "empty-cache"),
           "TILEWRIGHT_COMPILE_MEMORY_MAX_MB": "64"}
    async with WorkerPool(size=1, env_overrides=env) as pool:
        from dataclasses import replace

        starved = await evaluate(pool, task_dir, tiled("starved"),
                                 replace(QUICK, compile_memory_mb=64))
        assert starved.status == "correct", starved.error  # judged at the check shape
        assert starved.tpu["compile"] == "unavailable"
        assert "memory limit" in starved.tpu["estimate_unavailable"]
        assert ranking(starved.to_json()).source != "tpu_estimate"
        fine = await evaluate(pool, task_dir, tiled("starved"))  # the same worker goes on
        assert fine.status == "correct", fine.error
        assert fine.tpu["estimate"] is not None, fine.tpu  # the limit was this request's only
        assert fine.tpu["estimate"]["cycles"] > 0


@ON_MODULE_LOOP
async def test_a_kernel_name_too_long_for_a_file_name_is_estimated(worker_pool,
                                                                    task_dir) -> None:
    """libtpu names its dump files after the kernel and aborts past ~200 characters:
    what the compiler sees is renamed, what the user reads keeps the name."""
    long_name = "k" * 250
    result = await evaluate(worker_pool, task_dir, tiled(long_name))
    assert result.status == "correct", result.error
    assert result.tpu["estimate"]["cycles"] > 0
    assert result.tpu["kernels"][0]["name"] == long_name
    assert result.tpu["estimate"]["ops"][0]["name"] == long_name


def test_repeated_ops_count_every_op() -> None:
    """A record stands for ``num_equivalent_hlos`` identical ops, with cycles per op."""
    from tilewright.kernels.worker.tpu.compiler import op_bytes
    from tilewright.kernels.worker.tpu.estimates import estimate_of
    from tilewright.kernels.worker.tpu.tpu_compile import records

    text = textwrap.dedent("""
        hlo_op_estimate {
          hlo_op_name: "fusion.3"
          estimated_cycles: 1000
          num_equivalent_hlos: 4
          dma_instruction_type: DMA_INSTRUCTION_TYPE_LOCAL
          hlo_instruction { name: "fusion.3" }
        }
        hlo_op_estimate {
          hlo_op_name: "copy.1"
          estimated_cycles: 0
          num_equivalent_hlos: 1
          dma_instruction_type: DMA_INSTRUCTION_TYPE_REMOTE
        }
    """)
    found = records(text)
    assert [(r["name"], r["cycles"], r["count"], r["dma"]) for r in found] == [
        ("fusion.3", 1000, 4, "local"), ("copy.1", 0, 1, "remote")]
    # What each DMA op moves, read off the compiled HLO's result types.
    hlo = ("%fusion.3 = f32[8,128]{1,0} fusion(%p0), kind=kLoop\n"
           "  %copy.1 = (bf16[1024,512]{1,0}, s32[]) copy-start(%p1)\n")
    sizes = op_bytes(hlo, {"fusion.3", "copy.1"})
    assert sizes == {"fusion.3": 8 * 128 * 4, "copy.1": 1024 * 512 * 2 + 4}
    for record in found:
        record["bytes"] = sizes[record["name"]]
    estimate = estimate_of(found, "v5e")
    assert estimate["cycles"] == 4000
    incomplete = estimate["incomplete"]  # priced at 0, moves HBM data
    assert incomplete["ops"] == ["copy.1"] and incomplete["bytes"] == 1024 * 512 * 2 + 4
    moved = 4 * 8 * 128 * 4 + 1024 * 512 * 2 + 4
    assert incomplete["share_of_dma_bytes"] == round((1024 * 512 * 2 + 4) / moved, 3)


def test_no_estimator_dump_dirs_are_left_behind(task_dir, tmp_path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "JAX_PLATFORMS": "cpu",
           "TILEWRIGHT_CACHE_DIR": str(tmp_path / "cache")}
    kernel = tmp_path / "k.py"
    kernel.write_text(tiled())
    proc = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "eval", "--task", str(task_dir),
                           "--kernel", str(kernel), "--json", "--no-timing"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["tpu"]["estimate"]["cycles"] > 0
    assert not list(tmp.rglob("tilewright-llo-*"))


@ON_MODULE_LOOP
async def test_the_production_verdict_is_streamed_before_the_result(worker_pool,
                                                                    task_dir) -> None:
    heard: list[dict] = []
    task = load_task(str(task_dir))
    result = await worker_pool.evaluate(task, tiled("streamed"), QUICK, on_progress=heard.append)
    assert result.status == "correct", result.error
    # the judge says until when its production compiles may run (the app waits for it)
    deadline = next(h for h in heard if h["kind"] == "deadline")
    assert deadline["deadline_in_s"] > 0 and deadline["why"]
    kinds = [(h["kind"], h["final"]) for h in heard if h["kind"] == "production"]
    assert ("production", True) in kinds, kinds
    final = next(h["tpu"] for h in heard if h.get("final"))
    assert final["compile"] == "ok" and final["shape_label"] == "2048x2048"
    assert final["estimated_speedup"] == result.tpu["estimated_speedup"]
    from tilewright.kernels.judge.rank import production_note

    assert production_note(final).startswith("at 2048x2048 on v5e: compiles (VMEM ")


PIPELINED = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

RUN_TIME = LENGTH

def _inner(x_ref, o_ref):
    o_ref[...] = jnp.tanh(x_ref[...]) * 2.0

def kernel(x):
    rows, cols = x.shape
    br = min(64, rows)

    def body(n_ref, x_hbm, o_hbm):
        steps = n_ref[0] if RUN_TIME else rows // br  # read from SMEM, or known now
        pltpu.emit_pipeline(_inner, grid=(steps,),
                            in_specs=[pl.BlockSpec((br, cols), lambda i: (i, 0))],
                            out_specs=[pl.BlockSpec((br, cols), lambda i: (i, 0))])(x_hbm, o_hbm)

    n = STEPS
    return pl.pallas_call(
        body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY))(n, x)
"""


def pipelined(run_time: bool, steps: str = "jnp.full((1,), rows // br, jnp.int32)") -> str:
    return PIPELINED.replace("LENGTH", str(run_time)).replace("STEPS", steps)


@ON_MODULE_LOOP
async def test_a_loop_of_run_time_length_is_priced_at_the_length_the_inputs_give(
        worker_pool, task_dir) -> None:
    """An emit_pipeline whose grid is read from SMEM traces to a while loop, which the
    estimator prices at a trip count of its own choosing. Its bound follows from what
    the program computes before the kernel (here a constant; group sizes in a grouped
    matmul), so the kernel is estimated alone with that bound pinned: close to the same
    pipeline over a grid known at trace time, and ranked on it."""
    known = await evaluate(worker_pool, task_dir, pipelined(False), rows="128")
    assert known.status == "correct", known.error
    assert known.tpu["kernels"][0]["run_time_loops"] == 0
    assert known.tpu["estimate"]["method"] != "pinned"
    run_time = await evaluate(worker_pool, task_dir, pipelined(True), rows="128")
    assert run_time.status == "correct", run_time.error
    tpu = run_time.tpu
    assert tpu["kernels"][0]["run_time_loops"] >= 1
    assert tpu["estimate"]["method"] == "pinned" and tpu["estimate"]["pinned"] == [0]
    assert "pinned" in tpu["estimate"]["detail"] and tpu["unpriced"] is None
    kernel = lambda t: sum(op["cycles"] for op in t["estimate"]["ops"]  # noqa: E731
                           if op["kind"] == "pallas")
    assert 0.8 < kernel(tpu) / kernel(known.tpu) < 1.25, (kernel(tpu), kernel(known.tpu))
    assert ranking(run_time.to_json()).source == "tpu_estimate"


@ON_MODULE_LOOP
async def test_a_loop_of_run_time_length_is_never_ranked_on_its_estimate(worker_pool,
                                                                          task_dir) -> None:
    """An emit_pipeline whose grid is read from SMEM, computed from the input's values
    (which nothing knows before it runs): the estimator prices the loop at a trip count
    of its own choosing (or at 0 cycles, as tokamax's grouped matmul without its group
    sizes), so the kernel ranks on its least time (its memory floor, the reference's
    work at the peak) against the reference: a labeled upper bound below every compiler
    estimate. The same pipeline over a grid known at trace time ranks on its estimate."""
    # the bound depends on the values of x (unknown until it runs): nothing can pin it
    steps = "jnp.where(x[0, 0] > -1e30, rows // br, 1).astype(jnp.int32).reshape(1)"
    run_time = await evaluate(worker_pool, task_dir, pipelined(True, steps), rows="128")
    assert run_time.status == "correct", run_time.error
    tpu = run_time.tpu
    assert tpu["kernels"][0]["run_time_loops"] >= 1
    assert "known only at run time" in (tpu["unpriced"] or ""), (tpu["estimate"], tpu["estimate_unavailable"], run_time.integrity)
    assert tpu["estimate"] is not None and tpu["estimated_speedup"] is None
    rank = ranking(run_time.to_json())
    assert rank.source == "bound", rank
    assert rank.value == pytest.approx(tpu["bound"]["speedup"])
    assert rank.kernel_s == pytest.approx(tpu["bound"]["kernel_s"])
    assert rank.words(short=True).startswith("≤") and "not believed" in rank.words()
    assert "integrity" not in (run_time.error or "")  # not the kernel's fault: unflagged
    assert "estimate_below_roofline" not in run_time.integrity["flags"]

    known = await evaluate(worker_pool, task_dir, pipelined(False), rows="128")
    assert known.status == "correct", known.error
    assert known.tpu["kernels"][0]["run_time_loops"] == 0 and known.tpu["unpriced"] is None
    priced = ranking(known.to_json())
    assert priced.source == "tpu_estimate", priced
    assert priced.better_than(rank) and not rank.better_than(priced)


def test_a_causal_kernel_is_shortened_along_its_innermost_even_axis() -> None:
    """The bundled causal attention at 4x32x4096x128 with 1024x512 blocks does work only
    below the diagonal, so its query and key axes cannot be shortened; its heads repeat
    alike. It is estimated at one and two heads (32 and 64 steps), not at one and two of
    its 4 batches (1,024 and 2,048 steps: the estimator ran over its 8 GB on a CPU host;
    at one and two heads it priced the program at 0.96 of its v5e device time)."""
    import importlib.util

    import jax
    import jax.numpy as jnp

    from tilewright.kernels.source import tunables
    from tilewright.kernels.worker.candidate import production

    path = load_task("causal_attention").kernel_path
    source = tunables.apply(path.read_text(), {"BLOCK_Q": 1024, "BLOCK_KV": 512})
    spec = importlib.util.spec_from_file_location("causal_1024x512", path)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, str(path), "exec"), module.__dict__)
    qkv = [jax.ShapeDtypeStruct((4, 32, 4096, 128), jnp.float32)] * 3
    closed = jax.make_jaxpr(module.kernel)(*qkv)
    (plan,) = production.plan(closed)
    assert plan.grid == (4, 32, 4, 8)
    assert (plan.axis, plan.units_full, plan.units) == (1, 128, (1, 2)), plan.uneven
    assert "shortened along axis 1" in plan.uneven
