"""The XLA reference every candidate is ranked against, worked out once per task and chip.

A task brought in with ``tilewright new`` from a plain function (no size parameter of
its own) still gets its reference estimated at the production shape: scaled along an
axis of its inputs whose halving halves the output. The record is kept on disk, so a
fresh worker reads it instead of compiling; where no size of the reference can be
scaled, candidates are ranked by their own compiler figures against the reference's
roofline, never by host simulation. Real workers, the real TPU compiler for an abstract
v5e, TPU interpret mode for the trials. The estimator's budget is lowered
(``TILEWRIGHT_REFERENCE_BUDGET_GFLOP``) so small programs take the path big ones take.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilewright.kernels.judge.rank import Rank, ranking
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.tasks.loaders import load_task
from tilewright.kernels.worker.tpu import reference, tpu_compile

pytestmark = pytest.mark.skipif(tpu_compile.libtpu_path() is None,
                                reason="libtpu not installed (pip install 'jax[tpu]')")
ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
ROOT = Path(__file__).resolve().parent.parent
QUICK = EvalOptions(trials=3, timeout_s=240.0, timing=False)

MODEL = """
import jax.numpy as jnp

def mm(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)

def total(x):
    return jnp.sum(jnp.tanh(x.astype(jnp.float32)))
"""

TILED_MATMUL = """
import functools
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BM, BN, BK = 128, 128, 128

def _body(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)
    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)

def mm(x, y):
    m, k = x.shape
    n = y.shape[1]
    bm, bn, bk = min(BM, m), min(BN, n), min(BK, k)
    return pl.pallas_call(
        _body, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, l: (i, l)),
                  pl.BlockSpec((bk, bn), lambda i, j, l: (l, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, l: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")))(x, y)
"""

TILED_SUM = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BR = 64

def _body(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)
    o_ref[...] += jnp.sum(jnp.tanh(x_ref[...].astype(jnp.float32)), keepdims=True)

def total(x):
    rows, cols = x.shape
    br = min(BR, rows)
    out = pl.pallas_call(
        _body, out_shape=jax.ShapeDtypeStruct((1, 1), jnp.float32), grid=(rows // br,),
        in_specs=[pl.BlockSpec((br, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((1, 1), lambda i: (0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)))(x)
    return out[0, 0]
"""


def new_task(where: Path, name: str, fn: str, shapes: list[str], kernel: str) -> Path:
    """``tilewright new`` as a user runs it: a task from their function and kernel."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "model.py").write_text(MODEL)
    (where / "mine.py").write_text(kernel)
    args = [sys.executable, "-m", "tilewright.tui.cli", "new", name, "--from", f"model.py:{fn}",
            "--kernel", f"mine.py:{fn}"]
    for shape in shapes:
        args += ["--shape", shape]
    made = subprocess.run(args, cwd=where, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    return where / name


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reference")


@pytest.fixture(scope="module")
def matmul_task(workspace: Path) -> Path:
    return new_task(workspace, "mm", "mm", ["x=bf16[1024,1024]", "y=bf16[1024,1024]"],
                    TILED_MATMUL)


def pool(cache: Path, budget_gflop: float = 0.5) -> WorkerPool:
    return WorkerPool(size=1, env_overrides={
        "TILEWRIGHT_CACHE_DIR": str(cache),
        "TILEWRIGHT_REFERENCE_BUDGET_GFLOP": str(budget_gflop)})


async def evaluate(judge: WorkerPool, task_dir: Path):
    task = load_task(str(task_dir))
    source = (task_dir / "kernel.py").read_text()
    return await judge.evaluate(task, source, QUICK, filename=str(task_dir / "kernel.py"))


@ON_MODULE_LOOP
async def test_a_new_task_from_a_plain_matmul_gets_a_number_worked_out_once(
        matmul_task: Path, workspace: Path) -> None:
    cache = workspace / "cache"
    async with pool(cache) as judge:
        first = await evaluate(judge, matmul_task)
    assert first.status == "correct", (first.error, first.correctness)
    tpu = first.tpu
    ref = tpu["reference_estimate"]
    assert ref is not None, tpu["estimate_unavailable"]
    # no size parameter halves the output of mm(x, y) with x_0 shared by every axis:
    # the rows of x do
    assert ref["method"] == "scaled" and "x[0]" in ref["detail"], ref["detail"]
    record = tpu["reference_record"]
    assert record["cached"] is False and record["scaling"]["kind"] == "axes"
    rank = ranking(first.to_json())
    assert rank.source == "tpu_estimate" and rank.value == tpu["estimated_speedup"]
    assert rank.shape == "1024x1024, 1024x1024" and rank.kernel_s == tpu["kernel_time_s"]
    # the floor: every input read and every output written once (bf16)
    compulsory = 3 * 1024 * 1024 * 2
    assert tpu["floor"]["reference_bytes"] == compulsory
    assert tpu["floor"]["kernel_bytes"] >= compulsory  # and what its blocks re-read
    # 128-blocks over 1024: x is fetched once per column of blocks (8), y once per row
    assert tpu["floor"]["kernel_bytes"] == 8 * 1024 * 1024 * 2 * 2 + 1024 * 1024 * 2

    async with pool(cache) as judge:  # a fresh worker: the record comes from disk
        again = await evaluate(judge, matmul_task)
    assert again.status == "correct"
    assert again.tpu["reference_record"]["cached"] is True
    assert again.tpu["reference_estimate"]["cycles"] == ref["cycles"]
    assert again.tpu["estimated_speedup"] == tpu["estimated_speedup"]


@ON_MODULE_LOOP
async def test_a_reference_that_cannot_be_scaled_ranks_by_its_roofline(
        workspace: Path) -> None:
    """The sum of a matrix: no size of it halves a scalar. The kernel's own compiler
    figure ranks it, against the reference's roofline; never the host's simulation."""
    task_dir = new_task(workspace / "sum", "total", "total", ["x=f32[2048,1024]"], TILED_SUM)
    async with pool(workspace / "cache", budget_gflop=0.001) as judge:
        result = await judge.evaluate(load_task(str(task_dir)),
                                      (task_dir / "kernel.py").read_text(),
                                      EvalOptions(trials=3, timeout_s=240.0),
                                      filename=str(task_dir / "kernel.py"))
    assert result.status == "correct", (result.error, result.correctness)
    tpu = result.tpu
    assert tpu["reference_estimate"] is None
    assert "halves its output" in tpu["estimate_unavailable"]
    roof = tpu["reference_roofline"]
    assert roof["bytes"] == 2048 * 1024 * 4 + 4 and roof["seconds"] > 0
    assert tpu["roofline_ratio"] == pytest.approx(roof["seconds"] / tpu["kernel_time_s"])
    assert result.timing["host_ratio"] > 0 and result.timing["speedup"] is None
    rank = ranking(result.to_json())
    assert rank.source == "roofline" and rank.value == tpu["roofline_ratio"]
    assert rank.words(short=True).startswith("≥") and "roofline" in rank.words()
    # a compiler figure outranks any host simulation ratio, however large
    host = Rank("host_simulation", 1e6)
    assert rank.key() > host.key() and rank.better_than(host)


def test_batch_axes_find_the_size_that_halves_the_output() -> None:
    import jax
    import jax.numpy as jnp

    from tilewright.kernels.worker.tpu import shrink

    def avals(*shapes):
        return [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]

    def matmul(x, y):
        return x @ y

    def layer_norm(x, g):
        return (x - x.mean(-1, keepdims=True)) * g

    def attention(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, -1), v)

    def scalar(x):
        return jnp.sum(x)

    assert shrink.batch_axes(matmul, avals((4096, 4096), (4096, 4096)), []) == (((0, 0),),
                                                                                4096)
    assert shrink.batch_axes(layer_norm, avals((4096, 1024), (1024,)), []) == (((0, 0),),
                                                                                4096)
    # the queries of an attention (the longest axis that halves the output alone)
    qkv = avals((2, 4, 2048, 128), (2, 4, 2048, 128), (2, 4, 2048, 128))
    assert shrink.batch_axes(attention, qkv, []) == (((0, 2),), 2048)
    assert shrink.batch_axes(scalar, avals((1024, 1024)), []) is None
    assert shrink.axes_name(((0, 2),), ["q", "k", "v"]) == "q[2]"


def _bf16_matmul_task(where: Path) -> Path:
    """x bf16[m, 8192] @ w bf16[8192, 8192], 4096 rows at production."""
    task = where / "mm_bf16"
    task.mkdir()
    (task / "task.toml").write_text(textwrap.dedent("""
        name = "mm_bf16"
        family = "matmul"
        [shapes.small]
        m = 64
        [shapes.production]
        m = 4096
        size = "large"
        production = true
    """))
    (task / "reference.py").write_text(textwrap.dedent("""
        import jax
        import jax.numpy as jnp

        def make_inputs(key, m=64):
            kx, kw = jax.random.split(key)
            return (jax.random.normal(kx, (m, 8192), jnp.bfloat16),
                    jax.random.normal(kw, (8192, 8192), jnp.bfloat16))

        def reference(x, w):
            return jnp.dot(x, w)
    """))
    (task / "kernel.py").write_text("def kernel(x, w):\n    return x @ w\n")
    return task


def test_a_reference_is_priced_per_row_where_its_compute_clearly_dominates(
        tmp_path: Path) -> None:
    """XLA's bf16 4096x8192 @ 8192x8192, over the estimator's budget, is priced at two
    smaller row counts by its cost per row at the larger. At 256 rows reading the
    weights takes as long as the product (compute / compulsory traffic 1.0): priced
    there it was 12% over the whole program's estimate and 9% over its time on a v5e.
    The larger size is the first with compute at least ``CLEARLY_COMPUTE`` times its
    traffic (1024 rows: 3.4), within 4x the budget; a memory-bound program (gelu) keeps
    the first pair. Exported only: nothing is compiled."""
    from tilewright.kernels.worker.tpu import reference_programs as reference

    task = _bf16_matmul_task(tmp_path)
    loaded = load_task(str(task))
    plan = reference.reference_plan(loaded.production_task().to_spec(), "v5e")
    pair = [n for n, _ in plan.scaled[plan.start:plan.start + 2]]
    assert pair == [512, 1024], [n for n, _ in plan.scaled]
    larger = plan.scaled[plan.start + 1][1].cost
    assert reference._compute_over_memory(larger, "v5e") >= reference.CLEARLY_COMPUTE
    half = plan.scaled[plan.start][1].cost  # 512 rows: short of it
    assert reference._compute_over_memory(half, "v5e") < reference.CLEARLY_COMPUTE

    gelu = load_task("gelu")
    plan = reference.reference_plan(gelu.production_task().to_spec(), "v5e")
    assert [n for n, _ in plan.scaled[plan.start:plan.start + 2]] == [512, 1024]


def test_a_reference_without_xla_cost_analysis_is_still_scaled(tmp_path: Path,
                                                               monkeypatch) -> None:
    """On the v5e's host the reference lowered for the chip came with no cost analysis:
    the 550 GFLOP product went to the estimator whole and ran out its 150 s. Its dots'
    FLOPs, read from the program, decide the scaling when XLA's count is missing."""
    from tilewright.kernels.worker.tpu import reference_programs as reference
    from tilewright.kernels.worker.tpu import shrink

    monkeypatch.setattr(shrink, "xla_cost", lambda *a: {})
    task = _bf16_matmul_task(tmp_path)
    plan = reference.reference_plan(load_task(str(task)).production_task().to_spec(), "v5e")
    assert "flops" not in plan.cost and plan.cost["dot_flops"] == 2.0 * 4096 * 8192 * 8192
    assert [n for n, _ in plan.scaled[plan.start:plan.start + 2]] == [512, 1024]


@ON_MODULE_LOOP
async def test_a_size_the_cost_does_not_grow_with_gives_way_to_one_it_does(
        workspace: Path) -> None:
    """Halving ``e`` halves the output, as halving ``t`` does, and ``e`` is the larger:
    it is tried first. But the work is a tanh over a (t, m) input that does not depend
    on ``e`` (as 9p's SwiGLU activations do not on its emb_dim, which priced it at 2.2x
    its v5e time): doubling ``e`` hardly moves the cycles, so ``t`` prices it."""
    task = workspace / "constant_in_e"
    task.mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text(textwrap.dedent("""
        name = "constant_in_e"
        [shapes.small]
        t = 64
        e = 128
        [shapes.production]
        t = 1024
        e = 2048
        size = "large"
        production = true
    """))
    (task / "reference.py").write_text(textwrap.dedent("""
        import jax
        import jax.numpy as jnp

        def make_inputs(key, t=64, e=128):
            ka, kx = jax.random.split(key)
            return (jax.random.normal(ka, (t, 4096), jnp.float32),
                    jax.random.normal(kx, (t, e), jnp.float32))

        def reference(a, x):
            return x * jnp.sum(jnp.tanh(a) * jnp.exp(a), axis=1, keepdims=True)
    """))
    (task / "kernel.py").write_text("def kernel(a, x):\n    return a\n")
    spec = load_task(str(task)).production_task().to_spec()
    async with pool(workspace / "cache-linear", budget_gflop=0.002) as judge:
        found = await judge.request("reference_estimate", {
            "task": spec, "chip": "v5e", "timeout_s": 240.0, "compile_memory_mb": 4096},
            timeout=300.0)
    estimate = found.get("estimate")
    assert estimate is not None, found.get("why")
    assert estimate["method"] == "scaled" and "with t at" in estimate["detail"], estimate
    assert found["scaling"]["name"] == "t"  # the record names the size that priced it
    doubled = float(estimate["detail"].split(
        "not by e (2 times the size multiplied the cycles by ")[1].split(")")[0])
    assert doubled < 2 * 0.9 and 2 * estimate["linearity"] > doubled, estimate["detail"]


def test_a_reference_whose_work_grows_faster_than_its_size_is_scaled_per_flop() -> None:
    """Attention along its sequence: twice the size, four times the FLOPs. Its cost per
    FLOP at the larger size scales it (causal_attention's XLA reference on a v5e: per
    unit 5.2 ms, per FLOP 41.6 ms, measured 39.2 ms); work in proportion to the size, or
    slower (its bytes still grow with it), keeps the cost per unit."""
    quadratic = reference.work_units(256, 512, 4096, (1.0e9, 4.0e9, 256.0e9))
    assert quadratic == (1.0e9, 4.0e9, 256.0e9, "FLOP")
    value, _line, _spread = reference.scale_reference(297_787, 976_103, *quadratic[:3])
    assert value == 976_103 * 64
    assert reference.work_units(256, 512, 4096, (1.0e9, 2.0e9, 16.0e9)) == (256, 512, 4096,
                                                                             "unit")
    assert reference.work_units(256, 512, 4096, (1.0e9, 1.1e9, 1.5e9))[3] == "unit"
    assert reference.work_units(256, 512, 4096, (0.0, 0.0, 0.0))[3] == "unit"


def test_rank_orders_by_the_kernel_time_and_says_what_it_is() -> None:
    est = Rank("tpu_estimate", 1.2, "v5e", "4096x4096", kernel_s=1e-3, kernel_cycles=1_500_000,
               clock_hz=1.5e9, fidelity={"class": "compute_bound", "chip": "v5e",
                                         "median_ratio": 0.96, "within_2x": 1.0, "rows": 10})
    faster = Rank("roofline", 0.9, "v5e", "4096x4096", kernel_s=0.8e-3, kernel_cycles=1_200_000)
    tie = Rank("tpu_estimate", 1.2, "v5e", kernel_s=1e-3, kernel_cycles=1_400_000)
    measured = Rank("device_time", 0.5)
    assert faster.key() > est.key()  # the kernel's own time orders compiler figures
    assert tie.key() > est.key()  # the same time (the floor): fewer cycles first
    assert measured.key() > faster.key() > Rank("host_simulation", 50.0).key()
    assert Rank("disqualified", None).key() == Rank("none", None).key()
    assert est.words(short=True) == "est. 1.20x"
    assert est.words() == "est. 1.20x on v5e at 4096x4096 (TPU compiler)"
    assert est.time_words() == "1,500,000 cycles = 1 ms at 1.5 GHz"
    assert est.trust_words() == ("compute-bound v5e: median 0.96 of measured, 10 programs, "
                                 "100% within 2x")
    assert Rank.from_json(est.to_json()) == est
    legacy = Rank.legacy("tpu_estimate", 1.5, "est. 1.50x on v5e (TPU compiler)")
    assert legacy.key() == (3, 0, 1.5, 0.0) and legacy.words() == legacy.legacy_label
    assert textwrap.dedent(Rank("host_simulation", 0.02).words()).startswith("host sim. ratio")


def test_batch_axes_skip_a_size_that_is_also_contracted() -> None:
    """A GEMM whose contracted size equals its output's columns (JAXBench's 41k: x
    4096x8192 @ w 8192x8192 + bias): halving every 8192 halves the output but quarters the
    work, so the cost per unit would not extrapolate. The rows of x are the axis."""
    import jax
    import jax.numpy as jnp

    from tilewright.kernels.worker.tpu import shrink

    def gemm_add_relu(x, w, b):
        return jax.nn.relu(x @ w + b)

    avals = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((512, 1024), (1024, 1024),
                                                            (1024,))]
    assert shrink.batch_axes(gemm_add_relu, avals, []) == (((0, 0),), 512)


GEMM_BASELINE = '''
import jax
import jax.numpy as jnp

CONFIG = {"name": "gemm_add_relu", "batch_size": 512, "in_features": 256,
          "out_features": 256}


def create_inputs():  # no dtype: float32 (JAXBench's harness would pass bfloat16)
    key = jax.random.PRNGKey(0)
    x = jax.random.uniform(key, (512, 256), dtype=jnp.float32)
    weight = jax.random.uniform(jax.random.fold_in(key, 1), (256, 256), dtype=jnp.float32)
    bias = jnp.zeros(256, dtype=jnp.float32)
    return x, weight, bias


def workload(x, weight, bias):
    return jax.nn.relu(jnp.matmul(x, weight) + bias)
'''

GEMM_KERNEL = '''
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _body(x_ref, w_ref, b_ref, o_ref):
    o_ref[...] = jnp.maximum(jnp.dot(x_ref[...], w_ref[...]) + b_ref[...], 0.0)


def kernel(x, weight, bias):
    m, n = x.shape[0], weight.shape[1]
    bm = min(128, m)
    return pl.pallas_call(
        _body, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(m // bm,),
        in_specs=[pl.BlockSpec((bm, x.shape[1]), lambda i: (i, 0)),
                  pl.BlockSpec(weight.shape, lambda i: (0, 0)),
                  pl.BlockSpec((1, n), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((bm, n), lambda i: (i, 0)))(x, weight, bias.reshape(1, n))


workload = kernel
'''


@ON_MODULE_LOOP
async def test_two_layouts_of_one_program_get_one_number_in_either_order(
        workspace: Path) -> None:
    """A JAXBench task as published and the same task converted with ``tilewright new
    --from DIR`` (its inputs written with literal shapes): the reference of each is scaled
    (a parameter of the raw layout, the rows of x of the converted one), and neither's
    record answers for the other, whichever was evaluated first."""
    raw = workspace / "gemm_raw"
    raw.mkdir()
    (raw / "baseline.py").write_text(GEMM_BASELINE)
    made = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "new", "gemm_conv",
                           "--from", str(raw)], cwd=workspace, capture_output=True,
                          text=True, timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    layouts = {"raw": load_task(str(raw)), "converted": load_task(str(workspace / "gemm_conv"))}
    found: dict[str, list[dict]] = {"raw": [], "converted": []}
    for order in (("raw", "converted"), ("converted", "raw")):
        cache = workspace / f"cache-{order[0]}-first"
        async with pool(cache, budget_gflop=0.01) as judge:
            for name in order:
                reply = await judge.estimate(layouts[name], GEMM_KERNEL,
                                             EvalOptions(timeout_s=240.0))
                assert reply["status"] == "ok", reply.get("error")
                found[name].append(reply["tpu"])
    for name, (first, second) in found.items():
        ref = first["reference_estimate"]
        assert ref is not None and ref["method"] == "scaled", (name, first["estimate_unavailable"])
        assert second["reference_estimate"]["cycles"] == ref["cycles"], name
        assert second["estimated_speedup"] == first["estimated_speedup"], name
    raw_ref = found["raw"][0]["reference_record"]["scaling"]
    conv_ref = found["converted"][0]["reference_record"]["scaling"]
    assert raw_ref["kind"] == "param" and raw_ref["name"] == "batch_size"
    assert conv_ref["kind"] == "axes" and conv_ref["value"] == 512
    raw_cycles = found["raw"][0]["reference_estimate"]["cycles"]
    conv_cycles = found["converted"][0]["reference_estimate"]["cycles"]
    assert abs(raw_cycles / conv_cycles - 1.0) < 0.05


@ON_MODULE_LOOP
async def test_a_compile_over_its_memory_limit_is_tried_again_with_what_the_host_allows(
        workspace: Path) -> None:
    """The estimator's memory grows with a program's blocks and grid: a compile killed
    at its limit (here a tiny one) is tried once more with a third of the host's memory
    (at most 12 GiB) instead of leaving the kernel without a number."""
    from sizes import load_small

    gelu = load_small("gelu", rows=256, cols=1024)
    async with pool(workspace / "cache-memory") as judge:
        reply = await judge.estimate(gelu, gelu.kernel_path.read_text(),
                                     EvalOptions(timeout_s=240.0, compile_memory_mb=260))
    tpu = reply["tpu"]
    assert reply["status"] == "ok" and tpu["compile"] == "ok", tpu.get("message")
    assert tpu["estimate"] is not None, tpu["estimate_unavailable"]


def test_a_missing_figure_says_why_in_its_table_cell_too() -> None:
    capped = Rank("host_simulation", 0.0314, why_none="the TPU compiler (estimator) "
                  "needed more than its 4096 MB memory limit")
    assert capped.words(short=True) == "host sim 0.0314 (estimator memory cap)"
    assert "4096 MB memory limit" in capped.words()
    unscalable = Rank("none", None, status="correct",
                      why_none="the XLA reference is too costly ... and no size of it (a "
                               "parameter or an input axis) halves its output when halved")
    assert unscalable.words(short=True) == "no est. (reference unscalable)"
    assert Rank("none", None, status="incorrect").words(short=True) == "-"


RAGGED_MODEL = """
import jax
import jax.numpy as jnp

def grouped(x, w, gs):
    return jax.lax.ragged_dot(x, w, gs)

def make_example():
    return (jnp.ones((1024, 512), jnp.bfloat16), jnp.ones((8, 512, 256), jnp.bfloat16),
            jnp.full((8,), 128, jnp.int32))
"""

RAGGED_KERNEL = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

def _mm(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[0],
                         preferred_element_type=jnp.float32).astype(o_ref.dtype)

def kernel(x, w, gs):
    m, k = x.shape
    g, _, n = w.shape
    rows = m // g
    return pl.pallas_call(
        _mm, out_shape=jax.ShapeDtypeStruct((m, n), x.dtype), grid=(g,),
        in_specs=[pl.BlockSpec((rows, k), lambda i: (i, 0)),
                  pl.BlockSpec((1, k, n), lambda i: (i, 0, 0))],
        out_specs=pl.BlockSpec((rows, n), lambda i: (i, 0)))(x, w)
"""


def test_the_ragged_dot_equivalent_computes_equal_groups_alike() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tilewright.kernels.worker.tpu import reference_programs as reference

    def grouped(x, w, gs):
        return jax.lax.ragged_dot(x, w, gs)

    x = jax.random.normal(jax.random.PRNGKey(0), (96, 32))
    w = jax.random.normal(jax.random.PRNGKey(1), (4, 32, 16))
    gs = jnp.full((4,), 24, jnp.int32)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, w, gs)]
    fn, static, note = reference.estimator_equivalent(jax.jit(grouped), avals, [])
    assert note == reference.RAGGED_EQUIVALENT and static == []
    np.testing.assert_allclose(fn(x, w, gs), grouped(x, w, gs), rtol=1e-5, atol=1e-5)
    # a program without one is left as it is
    plain = jax.jit(lambda a: a * 2)
    assert reference.estimator_equivalent(plain, avals[:1], [])[2] is None


@ON_MODULE_LOOP
async def test_an_xla_ragged_dot_reference_is_priced_through_its_equivalent(
        workspace: Path) -> None:
    """libtpu's estimator cannot price XLA's ragged dot ("Unsupported DMA direction"):
    the reference is priced as dense per-group matmuls of the same sizes, and says so."""
    where = workspace / "ragged"
    where.mkdir()
    (where / "model.py").write_text(RAGGED_MODEL)
    made = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "new", "rd", "--from",
                           "model.py:grouped", "--example", "model.py:make_example"],
                          cwd=where, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stdout + made.stderr
    async with pool(workspace / "cache-ragged") as judge:
        reply = await judge.estimate(load_task(str(where / "rd")), RAGGED_KERNEL,
                                     EvalOptions(timeout_s=240.0))
    tpu = reply["tpu"]
    assert reply["status"] == "ok", reply.get("error")
    ref = tpu["reference_estimate"]
    assert ref is not None, tpu["estimate_unavailable"]
    assert "dense per-group matmuls" in ref["equivalent"] and tpu["estimated_speedup"] > 0


def test_trust_borrowed_from_another_chip_says_so() -> None:
    fidelity = {"class": "memory_bound", "chip": "v6e", "median_ratio": 0.93,
                "within_2x": 0.9, "rows": 12}
    borrowed = Rank("tpu_estimate", 1.0, "v5e", fidelity=fidelity).trust_words()
    assert borrowed.startswith("memory-bound v6e: median 0.93") and "borrowed for v5e" in borrowed
    own = Rank("tpu_estimate", 1.0, "v6e", fidelity=fidelity).trust_words()
    assert "borrowed" not in own
