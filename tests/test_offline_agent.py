"""The offline agent on the bundled tasks, judged by the real harness in a worker process.

Its templates write correct, TPU-lowering first kernels; its rules repair a seeded
misalignment and a missing accumulator initialisation; its tuner, driven through the
request history the way the controller drives it, ends with a kernel measured faster
than the one it started from (CPU, TPU interpret mode). The tuner's search itself is
also checked on its own: no configuration twice, and far fewer steps than the grid.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import pytest
from sizes import load_small, load_small_production

from tilewright import agents
from tilewright.agents.base import (
    AgentRequest,
    Failure,
    Finished,
    Proposal,
    ProposalReady,
    TextDelta,
    VersionRow,
)
from tilewright.agents.offline import OfflineAgent, decide, fixes, tuner
from tilewright.kernels.judge.rank import Rank
from tilewright.kernels.pool.workers import EvalOptions
from tilewright.kernels.source import tunables
from tilewright.kernels.tasks.loaders import load_task

QUICK = EvalOptions(trials=1, timing=False)


def _rows(entries: Any) -> tuple[VersionRow, ...]:
    """History rows as the session core builds them, from their JSON form."""
    return tuple(VersionRow.of(e) for e in entries)


@pytest.fixture(autouse=True)
def _own_lessons(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Lessons are read and written by the offline agent: never the user's own file."""
    monkeypatch.setenv("TILEWRIGHT_DATA_DIR", str(tmp_path / "data"))


async def _propose(request: AgentRequest, remember: bool = False
                   ) -> tuple[Proposal | Failure | Finished, list[Any]]:
    agent = OfflineAgent({"agent": {"remember_lessons": remember}})
    events = [e async for e in agent.propose(request)]
    assert sum(isinstance(e, ProposalReady | Failure | Finished) for e in events) == 1
    final = events[-1]
    return (final.proposal if isinstance(final, ProposalReady) else final), events


def est(speedup: float) -> dict[str, Any]:
    """A history entry's rank: the TPU compiler's estimate, the XLA reference 1 ms."""
    return Rank("tpu_estimate", speedup, "v5e", kernel_s=1e-3 / speedup).to_json()


def estimated(speedup: float) -> dict[str, Any]:
    """An eval JSON ranked by the TPU compiler's estimate (its host ratio far lower)."""
    return {"status": "correct", "timing": {"host_ratio": speedup / 50},
            "tpu": {"chip": "v5e", "compile": "ok", "estimated_speedup": speedup,
                    "kernel_time_s": 1e-3 / speedup}}


def _apply(source: str, proposal: Proposal) -> str:
    if proposal.kind == "tuning":
        return tunables.apply(source, proposal.tuning or {})
    assert proposal.kind == "kernel" and proposal.source
    return proposal.source


# -- the search on its own (no JAX) ----------------------------------------------------

def test_blocks_that_clamp_to_the_whole_dim_are_one_choice() -> None:
    source = 'BLOCK_ROWS = 8\nTUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512]}\n'
    assert tuner.search_space(source, {"BLOCK_ROWS": (64,)})["BLOCK_ROWS"] == [8, 16, 32, 64]
    # with a large shape beside the small one, the big blocks are different kernels
    assert tuner.search_space(source, {"BLOCK_ROWS": (64, 1024)})["BLOCK_ROWS"] == \
        [8, 16, 32, 64, 128, 256, 512]


def test_tuner_never_repeats_and_beats_the_grid_on_a_unimodal_cost() -> None:
    source = ('A = 8\nB = 128\nTUNABLES = {"A": [8, 16, 32, 64, 128, 256, 512], '
              '"B": [128, 256, 512, 1024, 2048]}\n')
    space = tuner.search_space(source)
    grid = list(itertools.product(space["A"], space["B"]))

    def cost(a: int, b: int) -> float:  # best at A=64, B=512; A=512 does not fit
        return math.inf if a == 512 else (math.log2(a) - 6) ** 2 + (math.log2(b) - 9) ** 2 + 1

    def timed(c: float) -> Rank:  # the kernel's estimated time: lower is better
        return Rank("tpu_estimate", 1 / c, "v5e", kernel_s=c * 1e-3)

    obs = tuner.Observations()
    current = source
    obs.add(tunables.config_of(current), "correct", timed(cost(8, 128)), None)
    seen = {(8, 128)}
    for _ in range(len(grid)):
        step = tuner.next_step(current, obs)
        if step is None:
            break
        point = (step.config["A"], step.config["B"])
        assert point not in seen, f"{point} proposed twice"
        seen.add(point)
        current = tunables.apply(current, step.changes)
        c = cost(*point)
        obs.add(step.config, "correct" if math.isfinite(c) else "compile_error",
                timed(c) if math.isfinite(c) else None, None)
    best = obs.best()
    assert best is not None and dict(best[0]) == {"A": 64, "B": 512}
    assert len(seen) <= len(grid) // 2


def test_tuner_reads_what_was_tried_from_the_history() -> None:
    source = load_task("softmax").starting_source()  # BLOCK_ROWS = 32
    history = ({"version": 1, "status": "correct", "rank": est(0.5), "tunables": {"BLOCK_ROWS": 32}},
               {"version": 2, "status": "correct", "rank": est(0.4), "tunables": {"BLOCK_ROWS": 512}})
    request = AgentRequest("tune", agents.brief(load_task("softmax")), source, 1,
                           last_eval=estimated(0.5),
                           history=history)
    proposal = decide(request)
    # 512 was worse: bisect between 32 and 512 instead of repeating anything measured.
    assert proposal.kind == "tuning" and proposal.tuning == {"BLOCK_ROWS": 128}
    assert "bisect" in proposal.rationale


def test_the_tuner_orders_configurations_by_the_rank_key() -> None:
    """Compiler ranks order by the kernel's own time at the production shape (a faster
    kernel whose reference has only a roofline beats a slower one with a higher ratio),
    and a host simulation ratio never outranks a compiler figure, however large."""
    history = (
        {"version": 1, "status": "correct", "tunables": {"B": 32},
         "rank": Rank("tpu_estimate", 1.1, "v5e", kernel_s=2e-3).to_json()},
        {"version": 2, "status": "correct", "tunables": {"B": 64},
         "rank": Rank("roofline", 0.9, "v5e", kernel_s=1.5e-3).to_json()},
        {"version": 3, "status": "correct", "tunables": {"B": 128}, "median_ms": 0.1,
         "rank": Rank("host_simulation", 40.0).to_json()},
        {"version": 4, "status": "compile_error", "tunables": {"B": 256}, "rank": None},
        {"version": 5, "status": "correct", "tunables": {"B": 512}, "rank": None})
    obs = tuner.observations_from(_rows(history), None, None, {"B"})
    best = obs.best()
    assert best is not None and dict(best[0]) == {"B": 64} and obs.version[best[0]] == 2
    assert obs.said(best[0]).startswith("≥0.90x vs XLA's roofline on v5e")
    assert set(obs.score) == {(("B", b),) for b in (32, 64, 128, 256)}  # 512: untimed
    # Without any compiler figure the host simulation ratio ranks, then the time.
    host = tuner.observations_from(_rows(history)[2:], None, None, {"B"})
    assert dict(host.best()[0]) == {"B": 128}


def test_the_tuner_seeds_from_the_lighter_of_two_tied_estimates() -> None:
    """The tuner's best is ``best_of``'s: of two tilings estimated within a percent, the
    one asking less VMEM (on a v5e the 52 MiB one ran 29% slower than the 32 MiB one)."""
    mib = 1 << 20
    history = (
        {"version": 1, "status": "correct", "tunables": {"BLOCK_N": 2048},
         "rank": Rank("tpu_estimate", 1.12, "v5e", kernel_s=2.8836e-3,
                      vmem_bytes=52 * mib).to_json()},
        {"version": 2, "status": "correct", "tunables": {"BLOCK_N": 1024},
         "rank": Rank("tpu_estimate", 1.12, "v5e", kernel_s=2.8842e-3,
                      vmem_bytes=32 * mib).to_json()})
    best = tuner.observations_from(_rows(history), None, None, {"BLOCK_N"}).best()
    assert best is not None and dict(best[0]) == {"BLOCK_N": 1024}


def test_tuner_only_proposes_blocks_that_divide_the_dims_they_tile() -> None:
    task = load_task("matmul_bias_gelu", {"k": "384"})  # 256 would leave a ragged K block
    top = {"BLOCK_M": 1024, "BLOCK_N": 1024}
    source = tunables.apply(task.starting_source(), {**top, "BLOCK_K": 1024})
    top = {**top, "F32_PASSES": 6}  # the switch's other value measured (worse)
    history = ({"version": 1, "status": "correct", "rank": est(0.5),
                "tunables": {**top, "BLOCK_K": 128}},
               {"version": 2, "status": "correct", "rank": est(0.4),
                "tunables": {**top, "BLOCK_K": 1024}},
               {"version": 3, "status": "correct", "rank": est(0.3),
                "tunables": {**top, "BLOCK_K": 1024, "F32_PASSES": 3}})
    request = AgentRequest("tune", agents.brief(task), source, 2, history=history,
                           last_eval=estimated(0.4))
    proposal = decide(request)
    assert proposal.kind == "tuning" and proposal.tuning["BLOCK_K"] == 512


def test_family_order_is_inferred_and_ends_with_the_fallback() -> None:
    """Every family is tried, the likely ones first, the universal fallback before the
    families that cannot fit; a declared family leads."""
    from tilewright.agents.offline.templates import FALLBACK, infer_families

    attention = agents.brief(load_task("causal_attention"))
    assert infer_families(attention)[:2] == ("attention", "matmul")
    assert infer_families(attention).index(FALLBACK) == 2
    undeclared = replace(agents.brief(load_task("matmul_bias_gelu")), family=None)
    order = infer_families(undeclared)
    assert order[:2] == ("matmul", FALLBACK) and set(order) >= {"elementwise", "rowwise"}


def test_unrecognised_failure_says_what_to_do() -> None:
    source = load_task("gelu").starting_source()
    request = AgentRequest("fix", agents.brief(load_task("gelu")), source, 1,
                           last_eval={"status": "runtime_error",
                                      "error": {"kind": "runtime", "message": "boom"}})
    outcome = decide(request)
    assert isinstance(outcome, Failure) and "boom" in outcome.message
    assert "ANTHROPIC_API_KEY" in outcome.message


def test_vmem_overflow_shrinks_the_largest_block() -> None:
    source = tunables.apply(load_task("matmul_bias_gelu").starting_source(),
                            {"BLOCK_M": 1024, "BLOCK_N": 512})
    # The text Mosaic gives on a TPU when blocks do not fit (this host cannot compile for one).
    result = {"status": "compile_error", "error": {"kind": "compile", "message":
              "RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem while allocating "
              "on stack for %pallas_call. Scoped allocation with size 20.00M and limit 16.00M "
              "exceeded scoped vmem limit by 4.00M."}}
    request = AgentRequest("fix", agents.brief(load_task("matmul_bias_gelu")), source, 3,
                           last_eval=result)
    proposal = decide(request)
    assert proposal.kind == "tuning" and proposal.tuning == {"BLOCK_M": 512}
    assert "VMEM" in proposal.rationale


async def test_convergence_is_remembered_and_seeds_the_next_session() -> None:
    from tilewright.agents import memory

    task = load_task("softmax")
    source = tunables.apply(task.starting_source(), {"BLOCK_ROWS": 256})
    measured = [(32, 0.3), (512, 0.5), (128, 0.4), (256, 0.6)]
    history = tuple({"version": n, "status": "correct", "rank": est(s),
                     "tunables": {"BLOCK_ROWS": b}} for n, (b, s) in enumerate(measured, 1))
    done = AgentRequest("tune", agents.brief(task), source, 4, history=history, chip="v5e",
                        last_eval=estimated(0.6))
    await _propose(done)  # by default nothing is remembered
    assert memory.list_lessons() == []
    outcome, events = await _propose(done, remember=True)
    # Converged is the end of the tuner's search, not an error.
    assert isinstance(outcome, Finished)
    assert "converged at BLOCK_ROWS=256 (v4, est. 0.60x on v5e (TPU compiler))" in outcome.message
    assert any(getattr(e, "text", "").startswith("remembered for later sessions") for e in events)
    [lesson] = memory.list_lessons()
    assert lesson.config == {"BLOCK_ROWS": 256} and lesson.family == "rowwise"
    longer = (*history, {"version": 5, "status": "correct", "rank": est(0.1),
                         "tunables": {"BLOCK_ROWS": 8}})
    await _propose(replace(done, history=longer), remember=True)  # same best: not stored twice
    assert len(memory.list_lessons()) == 1

    # A later session on another row-wise task starts from what was learned.
    rms = load_task("rmsnorm")
    fresh = AgentRequest("tune", agents.brief(rms), rms.starting_source(), 1, chip="v5e",
                         last_eval=estimated(0.2))
    proposal, _ = await _propose(fresh, remember=True)
    assert proposal.kind == "tuning" and proposal.tuning == {"BLOCK_ROWS": 256}
    assert "lesson from an earlier session" in proposal.rationale
    # ... but not on another chip, and not when lessons are off.
    other_chip = replace(fresh, chip="v6e")
    assert (await _propose(other_chip, remember=True))[0].tuning == {"BLOCK_ROWS": 512}
    assert (await _propose(fresh))[0].tuning == {"BLOCK_ROWS": 512}


def test_a_fix_that_would_repeat_a_measured_configuration_searches_on() -> None:
    task = load_task("matmul_bias_gelu")
    source = tunables.apply(task.starting_source(), {"BLOCK_M": 1024})
    vmem = {"status": "compile_error", "error": {"kind": "compile", "message":
            "RESOURCE_EXHAUSTED: exceeded scoped vmem limit"}}
    history = ({"version": 1, "status": "correct", "rank": est(0.5),
                "tunables": {"BLOCK_M": 512, "BLOCK_N": 128, "BLOCK_K": 128, "F32_PASSES": 6}},
               {"version": 2, "status": "compile_error", "rank": None,
                "tunables": {"BLOCK_M": 1024, "BLOCK_N": 128, "BLOCK_K": 128,
                             "F32_PASSES": 6}})
    request = AgentRequest("fix", agents.brief(task), source, 2, last_eval=vmem, history=history)
    proposal = decide(request)
    # Shrinking BLOCK_M back to 512 would only repeat v1: move on from v1 instead. The
    # step applies to v1 (its base), so its change and title are read against v1's values.
    assert proposal.kind == "tuning" and proposal.meta["via"] == "tuner"
    assert proposal.meta["base"] == 1 and len(proposal.tuning) == 1
    (name, value), = proposal.tuning.items()
    v1 = history[0]["tunables"]
    assert proposal.summary.startswith(f"tune {name} {v1[name]} -> {value} on v1 (")


# -- through the real harness ----------------------------------------------------------

SMALL_PRODUCTION = {"gelu": {"rows": 1024, "cols": 1024},
                    "softmax": {"rows": 1024, "cols": 1024},
                    "rmsnorm": {"rows": 1024, "cols": 1024},
                    "matmul_bias_gelu": {"m": 512, "k": 512, "n": 512},
                    "causal_attention": {"batch": 1, "heads": 2, "seq": 512, "head_dim": 128}}


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", sorted(SMALL_PRODUCTION))
async def test_template_writes_a_correct_first_kernel(worker_pool: Any, name: str) -> None:
    # This test is about the template's correctness, so its production shape is small: a
    # 4096x4096x14336 production compile of a 128-block matmul costs minutes, the XLA
    # attention's at 4x32x4096x128 a minute of CPU (cold cache).
    task = load_small_production(name, **SMALL_PRODUCTION[name])
    proposal, events = await _propose(AgentRequest("implement", agents.brief(task), None))
    assert isinstance(proposal, Proposal) and proposal.kind == "kernel", proposal
    assert any(isinstance(e, TextDelta) for e in events)  # the rationale is streamed
    assert "TUNABLES" in proposal.source and "pallas_call" in proposal.source
    result = await worker_pool.evaluate(task, proposal.source, QUICK)
    assert result.status == "correct", (result.error, result.correctness)
    assert result.lowering["tpu"] == "ok"


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_matmul_template_is_correct_when_k_is_not_a_multiple_of_the_block(
        worker_pool: Any) -> None:
    task = load_small("matmul_bias_gelu", m=128, k=384, n=256)
    proposal, _ = await _propose(AgentRequest("implement", agents.brief(task), None))
    source = tunables.apply(proposal.source, {"BLOCK_K": 256})  # 384 = 256 + a ragged 128
    result = await worker_pool.evaluate(task, source, EvalOptions(trials=1, timing=False,
                                                                  shapes=["small"]))
    assert result.status == "correct", result.correctness


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_fixes_a_seeded_misalignment(worker_pool: Any) -> None:
    task = load_task("softmax")
    broken = tunables.apply(task.starting_source(), {"BLOCK_ROWS": 12})
    first = await worker_pool.evaluate(task, broken, QUICK)
    assert first.status == "compile_error" and first.lowering["tpu"] == "error"
    request = AgentRequest("fix", agents.brief(task), broken, 2, last_eval=first.to_json())
    proposal, _ = await _propose(request)
    assert proposal.kind == "tuning" and proposal.meta["rule"] == "misalignment"
    assert proposal.tuning["BLOCK_ROWS"] % 8 == 0
    fixed = await worker_pool.evaluate(task, _apply(broken, proposal), QUICK)
    assert fixed.status == "correct" and fixed.lowering["tpu"] == "ok"


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_fixes_a_missing_accumulator_init(worker_pool: Any) -> None:
    task = load_small_production("matmul_bias_gelu", m=512, k=512, n=512)
    source = task.starting_source()
    broken = source.replace("    @pl.when(k == 0)\n    def _init():\n"
                            "        acc_ref[...] = jnp.zeros_like(acc_ref)\n\n", "")
    assert broken != source
    first = await worker_pool.evaluate(task, broken, EvalOptions(trials=1, timing=False,
                                                                 shapes=["small"]))
    assert first.status == "incorrect"
    request = AgentRequest("fix", agents.brief(task), broken, 2, last_eval=first.to_json())
    proposal, _ = await _propose(request)
    assert proposal.kind == "kernel" and proposal.meta["rule"] == "accumulator_init"
    fixed = await worker_pool.evaluate(task, proposal.source, QUICK)
    assert fixed.status == "correct", (fixed.error, fixed.correctness)


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_tuning_makes_the_kernel_faster(worker_pool: Any) -> None:
    task = load_task("gelu")
    timed = EvalOptions(trials=1, time_budget_s=1.0, shapes=["small"])
    source = task.starting_source()  # 64 x 256 blocks: 8 grid steps on the small shape
    version, history = 1, []
    start = await worker_pool.evaluate(task, source, timed)
    assert start.status == "correct" and start.timing
    result = start

    def record() -> None:
        history.append({"version": version, "status": result.status,
                        "rank": result.rank.to_json(), "median_ms": (result.timing or {}).get("median_ms"), "summary": "",
                        "tunables": tunables.config_of(source)})

    for _ in range(3):
        record()
        request = AgentRequest("tune", agents.brief(task), source, version,
                               last_eval=result.to_json(), history=tuple(history))
        proposal, _ = await _propose(request)
        if isinstance(proposal, Failure | Finished):
            break
        assert proposal.kind == "tuning" and len(proposal.rationale) > 40
        source, version = _apply(source, proposal), version + 1
        result = await worker_pool.evaluate(task, source, timed)
    else:
        record()
    best = max((h for h in history[1:] if h["status"] == "correct"),
               key=lambda h: Rank.from_json(h["rank"]).key())  # the one ordering
    # better by the number that ranks (the TPU compiler's estimate at production); the
    # interpreter's wall time on this host is no measure of that (and varies with load)
    assert Rank.from_json(best["rank"]).better_than(start.rank), (history, start.timing)


# -- tasks that declare no family (JAXBench, MaxKernel) ---------------------------------

FIXTURE_TASKS = __import__("pathlib").Path(__file__).parent / "fixtures" / "tasks"


@pytest.mark.parametrize(("task_dir", "family"), [
    ("maxkernel_row_scale", "elementwise"),   # x * s + offset
    ("maxkernel_gemm_relu", "matmul"),        # relu(x @ w + b)
])
def test_a_family_is_inferred_from_the_reference(task_dir: str, family: str) -> None:
    from tilewright.agents.offline.templates import infer_families

    brief = agents.brief(load_task(FIXTURE_TASKS / task_dir))
    assert brief.family is None
    order = infer_families(brief)
    assert order[0] == family
    assert sorted(order) == ["attention", "conv", "cross_entropy", "elementwise",
                             "gated_mlp", "matmul", "rowwise", "whole"]


def test_a_failed_guess_moves_on_to_the_next_family() -> None:
    brief = agents.brief(load_task(FIXTURE_TASKS / "maxkernel_row_scale"))
    failed = {"status": "compile_error", "error": {"kind": "trace", "message": "boom"}}
    history = ({"version": 1, "status": "compile_error", "rank": None,
                "summary": "elementwise template from the reference"},)
    proposal = decide(AgentRequest("fix", brief, "def computation(x): ...", 1, failed,
                                   history=history))
    assert isinstance(proposal, Proposal) and proposal.summary.startswith("rowwise template")
    assert "earlier guesses failed: elementwise" in proposal.rationale


@pytest.mark.asyncio(loop_scope="module")
async def test_template_handles_static_scalar_arguments(worker_pool: Any) -> None:
    """MaxKernel static args (here a Python float offset) stay out of the pallas_call,
    and the XLA reference is compiled with them for the estimate (it once was not: every
    MaxKernel task with static args ranked by host simulation time)."""
    task = load_task(FIXTURE_TASKS / "maxkernel_row_scale")
    proposal, _ = await _propose(AgentRequest("implement", agents.brief(task), None))
    assert isinstance(proposal, Proposal), proposal
    result = await worker_pool.evaluate(task, proposal.source, QUICK)
    assert result.status == "correct", (result.error, result.correctness)
    assert result.lowering["tpu"] == "ok"
    assert result.tpu["estimated_speedup"] is not None, result.tpu


WHOLE_TASK = """
import jax
import jax.numpy as jnp

CONFIG = {'rows': 64, 'cols': 256}


def create_inputs(dtype=jnp.float32):
    k1, k2 = jax.random.split(jax.random.key(0))
    return (jax.random.normal(k1, (64, 256), dtype), jax.random.normal(k2, (256, 128), dtype))


def workload(hidden, weight):
    logits = jnp.dot(hidden, weight)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1))


def benchmark():
    return None
"""


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_universal_fallback_handles_a_scalar_output(worker_pool: Any,
                                                           tmp_path: Any) -> None:
    """A loss (0-d output) after a matmul fits no family template; the fallback puts the
    reference's math in one whole-array block and is correct, and carries only what the
    reference uses (no benchmark helper)."""
    from tilewright.agents.offline.templates import FALLBACK, write_template

    root = tmp_path / "loss"
    root.mkdir()
    (root / "baseline.py").write_text(WHOLE_TASK)
    task = load_task(root)
    source, _why = write_template(agents.brief(task), FALLBACK)
    assert "def benchmark" not in source and "create_inputs" not in source
    result = await worker_pool.evaluate(task, source, QUICK)
    assert result.status == "correct", (result.error, result.correctness)
    assert "compute_outside_kernel" not in result.integrity["flags"]


# Two attention references as the public Pallas tasks write them (MaxKernel 2p and 4p,
# in small float32 form): grouped k/v heads shared by consecutive query heads, one in a
# (batch, seq, heads, dim) layout with a scale, one head-major with no scale at all.
ATTENTION_GQA = {
    "seq_major_scaled": """
import jax
import jax.numpy as jnp

CONFIG = {'batch': 1, 'seq': 128, 'hq': 2, 'hkv': 1, 'dim': 128}


def create_inputs(dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(ks[0], (1, 128, 2, 128), dtype),
            jax.random.normal(ks[1], (1, 128, 1, 128), dtype),
            jax.random.normal(ks[2], (1, 128, 1, 128), dtype))


def workload(query, key, value):
    B, S, Hq, D = query.shape
    G = Hq // key.shape[2]
    key = jnp.repeat(key[:, :, :, None, :], G, axis=3).reshape(B, S, Hq, D)
    value = jnp.repeat(value[:, :, :, None, :], G, axis=3).reshape(B, S, Hq, D)
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (query, key, value))
    attn = jnp.einsum('bhqd,bhkd->bhqk', q, k) * D ** -0.5
    attn = jnp.where(jnp.tril(jnp.ones((S, S))), attn, -1e9)
    out = jnp.einsum('bhqk,bhkd->bhqd', jax.nn.softmax(attn, axis=-1), v)
    return out.transpose(0, 2, 1, 3)
""",
    "head_major_unscaled": """
import jax
import jax.numpy as jnp

CONFIG = {'batch': 1, 'seq': 128, 'hq': 2, 'hkv': 1, 'dim': 128}


def create_inputs(dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(ks[0], (1, 2, 128, 128), dtype) * 0.1,
            jax.random.normal(ks[1], (1, 1, 128, 128), dtype) * 0.1,
            jax.random.normal(ks[2], (1, 1, 128, 128), dtype))


def workload(q, k, v):
    g = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)
    attn = jnp.einsum('bhqd,bhkd->bhqk', q, k)
    attn = jnp.where(jnp.tril(jnp.ones((q.shape[2],) * 2, dtype=bool)), attn, -1e30)
    return jnp.einsum('bhqk,bhkd->bhqd', jax.nn.softmax(attn, axis=-1), v)
""",
}


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("variant", sorted(ATTENTION_GQA))
async def test_attention_template_reads_grouped_heads_layout_and_scale(
        worker_pool: Any, tmp_path: Any, variant: str) -> None:
    from tilewright.agents.offline.templates import write_template

    root = tmp_path / variant
    root.mkdir()
    (root / "baseline.py").write_text(ATTENTION_GQA[variant])
    task = load_task(root)
    source, _why = write_template(agents.brief(task), "attention")
    assert ("SEQ_MAJOR = True" in source) == (variant == "seq_major_scaled")
    assert ("SCALED = True" in source) == (variant == "seq_major_scaled")
    result = await worker_pool.evaluate(task, source, QUICK)
    assert result.status == "correct", (result.error, result.correctness)


def test_a_template_that_does_not_fit_moves_on_to_the_next_family() -> None:
    """A reference whose matmul is not `x @ w` of two of its arguments (here `(2 * x) @ w`)
    cannot take the matmul template: the agent writes the next family's kernel instead of
    failing the turn. (`x @ w.T` does fit since the template takes a transposed weight.)"""
    brief = replace(agents.brief(load_task("matmul_bias_gelu")), family=None,
                    reference_source="import jax.numpy as jnp\n\n"
                                     "def reference(x, w):\n    return jnp.tanh((2 * x) @ w)\n")
    outcome = decide(AgentRequest("implement", brief, None))
    assert isinstance(outcome, Proposal), outcome
    assert not outcome.summary.startswith("matmul")


def test_the_diagnosed_grow_stops_at_blocks_that_fit_vmem_at_the_production_shape() -> None:
    """Per-step overhead says "larger blocks"; at 4096x4096 f32 the compiler measured
    2.1 MiB of VMEM for 32-row blocks, so 512 rows (~34 MiB) cannot fit the 16 MiB scoped
    limit: the move goes to the largest that does, and the plain search skips the rest."""
    source = ('BLOCK_ROWS = 32\nTUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512]}\n')
    obs = tuner.Observations()
    obs.add({"BLOCK_ROWS": 32}, "correct", Rank.from_json(est(1.2)), None, 1)
    dims = {"BLOCK_ROWS": (4096,)}
    numbers = {"vmem_bytes": 2.1 * 2**20, "vmem_limit_bytes": 16 * 2**20, "compile": "ok"}
    model = tuner.vmem_model(_rows(({"version": 1, "tunables": {"BLOCK_ROWS": 32},
                               "numbers": numbers},)), None, None, dims)
    assert model is not None and not model.fits({"BLOCK_ROWS": 512})
    # Another kernel's figure (other tunables) says nothing of this one.
    assert tuner.vmem_model(_rows(({"version": 1, "tunables": {"BLOCK_M": 128},
                              "numbers": numbers},)), None, source, dims) is None
    assert model.fits({"BLOCK_ROWS": 128}) and not model.fits({"BLOCK_ROWS": 256})
    diagnosis = {"version": 1, "kind": "per_step_overhead", "summary": "steps cost"}
    grow = tuner.diagnosed_step(source, obs, dims, diagnosis, None, model)
    assert grow is not None and grow.config == {"BLOCK_ROWS": 128}
    assert "fit VMEM" in grow.summary and "of 16 MiB of VMEM" in grow.rationale
    # Without the model (no production figure yet) the heuristic alone goes to the top.
    assert tuner.diagnosed_step(source, obs, dims, diagnosis).config == {"BLOCK_ROWS": 512}
    # The coordinate search never proposes a configuration the model rules out.
    obs.add({"BLOCK_ROWS": 128}, "correct", Rank.from_json(est(1.5)), None, 2)
    step = tuner.next_step(source, obs, dims, None, model)
    assert step is not None and step.config == {"BLOCK_ROWS": 64}  # 256 would not fit
    assert tuner.next_step(source, obs, dims).config == {"BLOCK_ROWS": 512}  # unmodelled


async def test_the_end_of_tuning_says_what_happened_to_each_neighbour() -> None:
    """A configuration the person rejected never ran: the tuner's last word counts it
    as rejected, not as measured."""
    task = load_task("softmax")
    source = tunables.apply(task.starting_source(), {"BLOCK_ROWS": 256})
    measured = [(512, 0.5), (128, 0.4), (256, 0.6)]
    history = tuple({"version": n, "status": "correct", "rank": est(s),
                     "tunables": {"BLOCK_ROWS": b}} for n, (b, s) in enumerate(measured, 1))
    rejected = ({"proposal": "p9", "kind": "tuning", "tuning": {"BLOCK_ROWS": 32},
                 "config": {"BLOCK_ROWS": 32}, "by": "user", "note": None},)
    done = AgentRequest("tune", agents.brief(task), source, 3, history=history, chip="v5e",
                        last_eval=estimated(0.6), rejected=rejected)
    outcome, _events = await _propose(done)
    assert isinstance(outcome, Finished)
    assert "(3 measured, 1 rejected by you (not run))" in outcome.message
    assert "every neighbour" not in outcome.message


def test_a_kernel_that_raises_its_own_vmem_limit_is_tuned_up_to_the_chips_capacity() -> None:
    """The templates ask for the scoped VMEM their blocks need, up to VMEM_CAP: the tuner
    then grows blocks up to that cap (within the chip's VMEM per core), not only up to
    the limit the last compile reported."""
    from tilewright.profiling.chips import get_chip

    source = ('BLOCK_ROWS = 32\nTUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512]}\n'
              'VMEM_CAP = 67108864  # 64 MiB\n')
    assert tuner.vmem_cap(source, "v5e") == 64 * 2**20
    assert tuner.vmem_cap(source, "v4") == min(64 * 2**20, get_chip("v4").vmem_bytes)
    assert tuner.vmem_cap(source.replace("VMEM_CAP = 67108864  # 64 MiB\n", ""), "v5e") is None
    dims = {"BLOCK_ROWS": (4096,)}
    # the compile at 32 rows: 2.1 MiB used of the 16 MiB the kernel asked for
    numbers = {"vmem_bytes": 2.1 * 2**20, "vmem_limit_bytes": 16 * 2**20, "compile": "ok"}
    history = _rows(({"version": 1, "tunables": {"BLOCK_ROWS": 32}, "numbers": numbers},))
    model = tuner.vmem_model(history, None, source, dims, "v5e")
    assert model is not None and model.limit == 64 * 2**20
    assert model.fits({"BLOCK_ROWS": 512})  # ~34 MiB: over 16, within the cap
    assert not tuner.vmem_model(history, None, source.replace("67108864", "16777216"),
                                dims, "v5e").fits({"BLOCK_ROWS": 512})
    obs = tuner.Observations()
    obs.add({"BLOCK_ROWS": 32}, "correct", Rank.from_json(est(1.2)), None, 1)
    step = tuner.next_step(source, obs, dims, None, model)
    assert step is not None and step.config == {"BLOCK_ROWS": 512}


def test_a_search_sibling_of_the_likely_template_starts_from_larger_blocks() -> None:
    """A search asks for several first kernels at once. The likely family's template is
    worth a second starting point (every block a notch larger) while it has not failed;
    only then, or once it failed, does the next family get a turn."""
    brief = agents.brief(load_small("matmul_bias_gelu", m=4096, k=4096, n=4096))
    first = decide(AgentRequest("implement", brief, None))
    assert isinstance(first, Proposal) and first.summary == "matmul template from the reference"
    sibling = "already tried: v1: matmul template from the reference (not run)"
    second = decide(AgentRequest("implement", brief, None, notes=(sibling,)))
    assert isinstance(second, Proposal)
    assert second.summary == "matmul template from the reference, larger blocks"
    before, after = tunables.config_of(first.source), tunables.config_of(second.source)
    assert after != before and all(after[k] >= before[k] for k in before)
    both = (sibling, "already tried: v2: matmul template from the reference, larger blocks "
                     "(correct, est. 1.05x on v5e)")
    third = decide(AgentRequest("implement", brief, None, notes=both))
    assert isinstance(third, Proposal) and not third.summary.startswith("matmul")
    failed = ("already tried: v1: matmul template from the reference (compile_error)",)
    moved = decide(AgentRequest("implement", brief, None, notes=failed))
    assert isinstance(moved, Proposal) and not moved.summary.startswith("matmul")


def test_fixes_float32_products_off_by_the_chips_default_precision() -> None:
    """On the v5e the starting attention kernel, without ``precision=``, was incorrect
    (max abs diff 0.0129 against a HIGHEST reference: f32 products run as one bf16 pass
    there). The fix asks every product in the kernel bodies for HIGHEST; the rule does
    not fire off the chip (interpret mode computes f32 exactly) nor on bf16 inputs."""
    from tilewright.agents.offline.fixes import suggest_fix

    source = load_task("causal_attention").starting_source()
    plain = source.replace(  # its two products as plain float32 dots
        "_product(q, k_ref[...], (((1,), (1,)), ((), ())))",
        "jax.lax.dot_general(q, k_ref[...], (((1,), (1,)), ((), ())), "
        "preferred_element_type=jnp.float32)").replace(
        "_product(p, v_ref[...], (((1,), (0,)), ((), ())))",
        "jnp.dot(p, v_ref[...], preferred_element_type=jnp.float32)")
    assert plain != source and "precision=" not in plain.split("def flash_kernel")[1]
    chip = {"status": "incorrect", "backend": {"platform": "tpu"},
            "correctness": {"max_abs_diff": 0.0129},
            "tpu": {"input_shapes": ["f32[4,32,4096,128]"] * 3}}
    fix = suggest_fix(plain, chip)
    assert fix is not None and fix.rule == "dot_precision"
    body = fix.source.split("def flash_kernel")[1].split("@jax.jit")[0]
    assert body.count("precision=jax.lax.Precision.HIGHEST") == 2
    compile(fix.source, "kernel.py", "exec")
    assert suggest_fix(fix.source, chip) is None or suggest_fix(fix.source, chip).rule \
        != "dot_precision"  # applied once
    assert suggest_fix(plain, {**chip, "backend": {"platform": "cpu"}}) is None
    bf16 = {**chip, "tpu": {"input_shapes": ["bf16[4,32,4096,128]"] * 3}}
    assert suggest_fix(plain, bf16) is None


def test_blocks_over_the_scoped_limit_but_within_the_core_ask_for_more_vmem() -> None:
    """On the v5e the bundled matmul at 1024-cubed f32 blocks needs 28 MiB of a 16 MiB
    default scoped limit (the chip's words, 2026-12-06); a core has 128 MiB, so the fix
    raises vmem_limit_bytes instead of shrinking the blocks that make it fast."""
    import ast

    task = load_task("matmul_bias_gelu")
    source = tunables.apply(task.starting_source(),
                            {"BLOCK_M": 1024, "BLOCK_N": 1024, "BLOCK_K": 1024})
    message = ("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Ran out of memory in "
               "memory space vmem while allocating on stack for %tw_pallas_0.1. Scoped "
               "allocation with size 28.01M and limit 16.00M exceeded scoped vmem limit by "
               "12.01M.")
    result = {"status": "compile_error", "error": {"kind": "compile", "message": message},
              "tpu": {"chip": "v5e", "vmem_capacity_bytes": 128 * 2**20}}
    proposal = decide(AgentRequest("fix", agents.brief(task), source, 2, last_eval=result))
    assert proposal.kind == "kernel" and "raise vmem_limit_bytes to 96 MiB" in proposal.summary
    assert "vmem_limit_bytes=96 * 2**20" in proposal.source
    ast.parse(proposal.source)
    assert tunables.config_of(proposal.source) == tunables.config_of(source)  # blocks kept
    # asked already: a second refusal at the raised limit shrinks instead
    again = {**result, "error": {"kind": "compile", "message": message.replace(
        "limit 16.00M", "limit 96.00M").replace("28.01M", "120.00M")}}
    shrink = decide(AgentRequest("fix", agents.brief(task), proposal.source, 3, last_eval=again))
    assert shrink.kind == "tuning" and shrink.summary.startswith("shrink")
    # a kernel that computes its own limit is not edited
    computed = source.replace("CompilerParams(", "CompilerParams(vmem_limit_bytes=_limit(), ")
    assert fixes.fix_vmem_limit(computed, result) is None


def test_pressure_against_a_limit_the_kernel_sized_itself_does_not_shrink_its_blocks() -> None:
    """A template asks for its blocks' need plus a quarter (``VMEM_CAP`` the ceiling), so
    the compiler's figure nearly fills the limit it compiled under by design. On a v5e
    search (20k, 4096x8192 @ 8192x8192 bf16) "VMEM 82% of the 16 MiB scoped budget" for
    512x1024x1024 blocks (13.1 MiB) shrank them three times in seven evaluations; the
    cap, 64 MiB, is the wall. Near the cap it still shrinks; a kernel without a cap too."""
    from tilewright.profiling.diagnose import diagnose

    mib = 2**20
    capped = ('BLOCK_M = 512\nBLOCK_N = 1024\nVMEM_CAP = 67108864\n'
              'TUNABLES = {"BLOCK_M": [256, 512, 1024], "BLOCK_N": [512, 1024, 2048]}\n')
    plain = capped.replace("VMEM_CAP = 67108864\n", "")
    dims = {"BLOCK_M": (4096,), "BLOCK_N": (8192,)}
    diagnosis = {"version": 1, "kind": "vmem_pressure", "summary": "VMEM 82% of 16 MiB"}

    def step(source: str, vmem_mib: float):
        obs = tuner.Observations()
        config = {"BLOCK_M": 512, "BLOCK_N": 1024}
        obs.add(config, "correct", Rank.from_json(est(1.09)), None, 1)
        numbers = {"vmem_bytes": vmem_mib * mib, "vmem_limit_bytes": 16 * mib, "compile": "ok"}
        model = tuner.vmem_model(_rows(({"version": 1, "tunables": config, "numbers": numbers},)),
                                 None, source, dims, "v5e")
        return tuner.diagnosed_step(source, obs, dims, diagnosis, None, model)

    assert step(capped, 13.1) is None
    shrink = step(capped, 52.0)  # 52 of 64 MiB: a real wall
    assert shrink is not None and shrink.config == {"BLOCK_M": 256, "BLOCK_N": 512}
    assert step(plain, 13.1) is not None  # the default limit is its wall

    # The diagnosis measures the compiler's figure against what the kernel can ask for.
    profile = {"chip": {"name": "v5e"}, "roofline": {"chip": "v5e", "bound_by": "compute",
                                                     "intensity": 315.0, "ridge_intensity": 241.0}}
    own = {"vmem_bytes": int(13.1 * mib), "vmem_limit_bytes": 18 * mib,
           "vmem_limit_source": "the kernel's vmem_limit_bytes",
           "vmem_capacity_bytes": 128 * mib}
    assert diagnose(profile, {"tpu": own})["kind"] == "compute_bound"
    default = {**own, "vmem_limit_source": "the chip's default scoped limit",
               "vmem_limit_bytes": 16 * mib}
    found = diagnose(profile, {"tpu": default})
    assert found["kind"] == "vmem_pressure"
    assert "of the 16 MiB scoped limit at the production shape" in found["summary"]


def test_a_switch_is_measured_once_per_value_and_never_grown() -> None:
    """``TUNABLE_SWITCHES`` names a tunable that sizes nothing (F32_PASSES: 6 or 3 MXU
    passes per float32 product). Its other value is measured from the best
    configuration before any block is bisected; afterwards it stays where the best is;
    a diagnosis that grows the blocks leaves it alone, and it counts for no VMEM."""
    source = ('BLOCK_M = 128\nF32_PASSES = 6\nTUNABLES = {"BLOCK_M": [128, 256, 512], '
              '"F32_PASSES": [6, 3]}\nTUNABLE_SWITCHES = ("F32_PASSES",)\n')
    obs = tuner.Observations()
    obs.add({"BLOCK_M": 128, "F32_PASSES": 6}, "correct", Rank.from_json(est(0.3)), None, 1)
    diagnosis = {"version": 1, "kind": "per_step_overhead", "summary": "steps cost"}
    grow = tuner.diagnosed_step(source, obs, {}, diagnosis)
    assert grow is not None and grow.config == {"BLOCK_M": 512, "F32_PASSES": 6}
    obs.add(grow.config, "correct", Rank.from_json(est(1.0)), None, 2)
    step = tuner.next_step(source, obs)
    assert step is not None and step.config == {"BLOCK_M": 512, "F32_PASSES": 3}
    assert "not a block size" in step.rationale
    obs.add(step.config, "correct", Rank.from_json(est(2.0)), None, 3)
    step = tuner.next_step(tunables.apply(source, step.changes), obs)
    # the switch stays at the best's 3 (6 was measured); the blocks are bisected
    assert step is not None and step.config == {"BLOCK_M": 256, "F32_PASSES": 3}
    model = tuner.VmemModel({"BLOCK_M": 512, "F32_PASSES": 6}, 8.0 * 2**20, 16.0 * 2**20,
                            {}, tunables.switches(source))
    assert model.bytes_for({"BLOCK_M": 512, "F32_PASSES": 3}) == 8.0 * 2**20


def test_no_whole_array_kernel_where_the_production_arrays_exceed_the_chips_vmem() -> None:
    """Before any evaluation (a search's root candidates, proposed side by side) the
    brief's production arrays decide: JAXBench's 4096x8192 @ 8192x8192 bf16 GEMM (192 MiB
    of inputs, 64 MiB out) cannot be one block in a v5e core's 128 MiB of VMEM, so the
    whole-array fallback is not a starting point; small arrays, or no chip, say nothing."""
    from tilewright.agents.offline import _whole_array_too_big

    brief = agents.brief(load_task("softmax"))

    def request(arrays: list, outputs: list, chip: str = "v5e") -> AgentRequest:
        production = {"name": "production", "params": {}, "inputs": arrays,
                      "outputs": outputs}
        return AgentRequest("implement", replace(brief, production=production), None,
                            chip=chip)

    gemm = request([[[4096, 8192], "bfloat16"], [[8192, 8192], "bfloat16"]],
                   [[[4096, 8192], "bfloat16"]])
    assert _whole_array_too_big(gemm) == ("its arrays (256 MiB at the production shape) "
                                          "exceed the 128 MiB of VMEM a v5e core has")
    assert _whole_array_too_big(request([[[64, 256], "float32"]], [])) is None
    assert _whole_array_too_big(request([[[8192, 8192], "float32"]], [], chip="cpu")) is None
    assert _whole_array_too_big(request([[[8192, 8192], "float9"]], [])) is None
