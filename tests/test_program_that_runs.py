"""The verdict is for the program that will run, at the size it runs.

Correctness is checked at small shapes; the production program is compiled and
estimated. A candidate whose production program is not the one checked is rejected: a
grid that writes only part of the output at the production size, a program that
depends on when or from where it is traced. A kernel asking for more VMEM than the chip
has does not compile. A shortened grid never leaves work unpriced: a kernel whose work
sits behind ``pl.when`` on a grid step the short grids drop is estimated on its whole
grid, and an estimate below the kernel's own compute bound is never ranked. Through
``eval`` (a worker pool) and through a session (an agent's proposals in autonomous
mode). Real workers, the real TPU compiler for an abstract v5e.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tilewright.kernels.judge.rank import ranking
from tilewright.kernels.pool.workers import EvalOptions
from tilewright.kernels.tasks.loaders import load_task
from tilewright.kernels.worker.tpu import tpu_compile

pytestmark = pytest.mark.skipif(tpu_compile.libtpu_path() is None,
                                reason="libtpu not installed (pip install 'jax[tpu]')")
ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
QUICK = EvalOptions(trials=3, timeout_s=240.0, timing=False)

REFERENCE = """
import jax
import jax.numpy as jnp

def make_inputs(key, rows, cols):
    return (jax.random.normal(key, (rows, cols), jnp.float32),)

def reference(x):
    return jnp.tanh(x) * 2.0
"""

# A tiled 2*tanh(x); CHEAT is replaced by what a dishonest version does first.
TILED = """
import inspect
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR, BC = 64, 256
LIMIT = None
TRACES = []

def _body(x_ref, o_ref):
    o_ref[...] = jnp.tanh(x_ref[...]) * 2.0

def kernel(x):
    rows, cols = x.shape
    br, bc = min(BR, rows), min(BC, cols)
    grid = (rows // br, cols // bc)
    CHEAT
    spec = pl.BlockSpec((br, bc), lambda i, j: (i, j))
    return pl.pallas_call(
        _body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
        in_specs=[spec], out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=LIMIT))(x)
"""
HONEST = TILED.replace("CHEAT", "pass")
# Beyond the check shapes, one row of blocks: 8 of the output's 256 blocks.
SHAPE_BRANCH = TILED.replace("CHEAT", "if rows > 256:\n        grid = (1, grid[1])")
# A caller frame that says "production" (the op the harness serves) would shrink it too.
STACK_SNIFF = TILED.replace(
    "CHEAT", 'if any("production" in f.function for f in inspect.stack()):\n'
             "        grid = (1, grid[1])")
# Honest at every size except on the first trace of a shape (a count, not a shape).
TRACE_COUNT = TILED.replace(
    "CHEAT", "TRACES.append(rows)\n"
             "    if rows > 256 and TRACES.count(rows) == 1:\n"
             "        grid = (1, grid[1])")
OVER_VMEM = HONEST.replace("LIMIT = None", "LIMIT = 200 * 2**20")  # v5e has 128 MiB

# A matmul whose work sits behind pl.when on one grid step; WHEN picks the step.
STEP_MATMUL = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

STEPS = 48

def _body(x_ref, w_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    @pl.when(pl.program_id(0) == WHEN)
    def _():
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

def kernel(x, w):
    m, k = x.shape
    return pl.pallas_call(
        _body, out_shape=jax.ShapeDtypeStruct((m, w.shape[1]), jnp.float32),
        grid=(STEPS,),
        in_specs=[pl.BlockSpec((m, k), lambda i: (0, 0)),
                  pl.BlockSpec((k, w.shape[1]), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((m, w.shape[1]), lambda i: (0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)))(x, w)
"""
MATMUL_REFERENCE = """
import jax
import jax.numpy as jnp

def make_inputs(key, m, k, n):
    a, b = jax.random.split(key)
    return (jax.random.normal(a, (m, k), jnp.float32), jax.random.normal(b, (k, n), jnp.float32))

def reference(x, w):
    return jnp.dot(x, w, preferred_element_type=jnp.float32)
"""


def _task(root: Path, name: str, reference: str, toml: str) -> Path:
    root.mkdir(parents=True)
    (root / "task.toml").write_text(f'name = "{name}"\n' + textwrap.dedent(toml))
    (root / "reference.py").write_text(reference)
    return root


@pytest.fixture(scope="module")
def tanh_task(tmp_path_factory) -> Path:
    return _task(tmp_path_factory.mktemp("runs") / "tanh2", "tanh2", REFERENCE, """
        atol = 1e-5
        rtol = 1e-5
        [shapes.small]
        rows = 64
        cols = 256
        [shapes.wide]
        rows = 256
        cols = 512
        [shapes.prod]
        rows = 2048
        cols = 2048
        size = "large"
        production = true
    """)


@pytest.fixture(scope="module")
def matmul_task(tmp_path_factory) -> Path:
    return _task(tmp_path_factory.mktemp("runs") / "mm", "mm", MATMUL_REFERENCE, """
        atol = 1e-3
        rtol = 1e-3
        [shapes.small]
        m = 128
        k = 256
        n = 256
        [shapes.prod]
        m = 512
        k = 1024
        n = 1024
        size = "large"
        production = true
    """)


async def evaluate(pool, task_dir: Path, source: str, options: EvalOptions = QUICK):
    return await pool.evaluate(load_task(str(task_dir)), source, options,
                               filename=str(task_dir / "kernel.py"))


@ON_MODULE_LOOP
async def test_a_grid_that_covers_less_at_production_is_rejected(worker_pool,
                                                                  tanh_task) -> None:
    honest = await evaluate(worker_pool, tanh_task, HONEST)
    assert honest.status == "correct", honest.error
    cheat = await evaluate(worker_pool, tanh_task, SHAPE_BRANCH)
    assert cheat.correctness["correct"]  # correct where it was checked
    assert cheat.status == "rejected" and cheat.error.kind == "partial_coverage"
    assert "writes 8 of the 256 blocks of its output 0 (2048x2048)" in cheat.error.message
    assert "partial_coverage" in cheat.integrity["flags"]
    assert ranking(cheat.to_json()).key() < ranking(honest.to_json()).key()


@ON_MODULE_LOOP
async def test_a_kernel_cannot_tell_the_production_trace_from_its_caller(worker_pool,
                                                                          tanh_task) -> None:
    """Every trace is made the same way: a frame named "production" is never on the
    stack, so the sniffing kernel is judged as the honest one it then is."""
    honest = await evaluate(worker_pool, tanh_task, HONEST)
    sniff = await evaluate(worker_pool, tanh_task, STACK_SNIFF)
    assert sniff.status == "correct", sniff.error
    assert sniff.tpu["kernels"] == honest.tpu["kernels"]  # the production grid, whole
    assert sniff.tpu["estimate"]["cycles"] == honest.tpu["estimate"]["cycles"]


@ON_MODULE_LOOP
async def test_a_program_that_depends_on_when_it_is_traced_is_rejected(worker_pool,
                                                                        tanh_task) -> None:
    counted = await evaluate(worker_pool, tanh_task, TRACE_COUNT)
    assert counted.status == "rejected" and counted.error.kind == "trace_dependent"
    assert "trace_dependent" in counted.integrity["flags"]


@ON_MODULE_LOOP
async def test_a_vmem_limit_beyond_the_chip_is_a_compile_error(worker_pool, tanh_task) -> None:
    over = await evaluate(worker_pool, tanh_task, OVER_VMEM)
    assert over.correctness["correct"]
    assert over.status == "compile_error" and over.tpu["compile"] == "error"
    assert "200.0 MiB" in over.error.message and "128 MiB" in over.error.message
    assert over.tpu["vmem_capacity_bytes"] == 128 * 2**20
    honest = await evaluate(worker_pool, tanh_task, HONEST.replace("LIMIT = None",
                                                                  "LIMIT = 64 * 2**20"))
    assert honest.status == "correct"
    # VMEM against the limit in force (the kernel's own) and the chip's capacity
    assert honest.tpu["vmem_limit_bytes"] == 64 * 2**20
    assert honest.tpu["vmem_limit_source"] == "the kernel's vmem_limit_bytes"


@ON_MODULE_LOOP
async def test_work_behind_a_late_grid_step_is_priced(worker_pool, matmul_task) -> None:
    """48 steps, shortened to 16 and 32 for the estimate: the matmul on step 40 would
    never be compiled. The kernel is estimated on its whole grid instead, and costs what
    the same kernel doing its matmul on step 1 costs."""
    late = await evaluate(worker_pool, matmul_task, STEP_MATMUL.replace("WHEN", "40"))
    early = await evaluate(worker_pool, matmul_task, STEP_MATMUL.replace("WHEN", "1"))
    for result in (late, early):
        assert result.status == "correct", result.error
    (plan,) = late.tpu["kernels"]
    assert plan["axis"] is None  # compiled whole
    assert "estimated on its whole grid" in late.tpu["estimate"]["detail"]
    assert early.tpu["estimate"]["method"] == "scaled"  # even: shortened as usual
    ratio = late.tpu["estimate"]["cycles"] / early.tpu["estimate"]["cycles"]
    assert 0.8 < ratio < 1.25, (late.tpu["estimate"], early.tpu["estimate"])
    assert late.tpu["kernel_bound_s"] > 0 and late.tpu["implausible"] is None


def test_an_estimate_below_the_kernels_own_work_is_not_believed() -> None:
    from tilewright.kernels.worker.tpu.production_run import ProductionRun

    run = ProductionRun.__new__(ProductionRun)
    run.chip = "v5e"
    plans = [{"dot_flops": 2 * 512 * 1024 * 1024 * 48, "work_exact": True}]
    # 48 matmuls of 1 GFLOP at 197 TFLOP/s: at least 0.26 ms; priced at 1,000 cycles
    low = {"cycles": 1000, "seconds": 1000 / 1.5e9,
           "ops": [{"name": "k", "kind": "pallas", "cycles": 1000}]}
    assert "misses work the grid does" in run._implausible(low, plans)
    fair = {"cycles": 600_000, "seconds": 0.4e-3,
            "ops": [{"name": "k", "kind": "pallas", "cycles": 600_000}]}
    assert run._implausible(fair, plans) is None
    # run-time data decides the work: no bound is claimed
    assert run._implausible(low, [{**plans[0], "work_exact": False}]) is None


def test_a_program_priced_at_zero_cycles_in_all_is_not_ranked_on_it() -> None:
    """JAXBench's 9p_SwiGLU_MLP baseline submitted as its kernel: the estimator priced
    its three HBM-moving fusions at 0 cycles, and the estimate read 0.0 s (the reason
    given was "no estimate for the XLA reference", which had one)."""
    from tilewright.kernels.worker.tpu.production_run import ProductionRun

    zero = {"cycles": 0, "seconds": 0.0, "ops": [{"name": "fusion", "kind": "xla", "cycles": 0}],
            "incomplete": {"ops": ["fusion"], "count": 3, "bytes": 939524096}}
    said = ProductionRun._all_zero(zero)
    assert said is not None and "0 cycles" in said and "3 ops move 896 MiB" in said
    assert ProductionRun._all_zero({"cycles": 10, "ops": []}) is None


# -- through a session: an agent's proposals in autonomous mode ---------------------------

@ON_MODULE_LOOP
async def test_auto_never_crowns_a_rejected_program(worker_pool, tanh_task,
                                                    tmp_path: Path) -> None:
    from scripted_agent import ScriptedAgent, kernel

    from tilewright.agents import brief
    from tilewright.sessions.autonomy import Budgets, ControllerSettings
    from tilewright.sessions.control.controller import Controller
    from tilewright.sessions.evaluator import PoolEvaluator
    from tilewright.sessions.log import SessionLog

    task = load_task(str(tanh_task))
    agent = ScriptedAgent([kernel(SHAPE_BRANCH, "one row of blocks at production"),
                           kernel(HONEST, "tiled")])
    log = SessionLog.create(tmp_path, task={"name": task.name, "root": str(task.root),
                                            "layout": task.layout},
                            backend=None, agent=agent.name, app_version="test")
    controller = Controller(log, task, brief(task), agent,
                            PoolEvaluator(worker_pool, QUICK),
                            ControllerSettings(budgets=Budgets(iterations=2)))
    await controller.start()
    controller.set_mode("auto")
    await controller.wait_idle()
    state = controller.state
    cheat = next(v for v in state.versions.values() if v.summary.startswith("one row"))
    honest = next(v for v in state.versions.values() if v.summary == "tiled")
    assert cheat.status == "rejected" and not cheat.crownable
    assert honest.status == "correct"
    assert state.best != cheat.number
    await controller.close()
