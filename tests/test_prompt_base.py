"""Where the next proposal starts, and what stays in the conversation (issue 23).

After a regression the controller checks the best version out again (``kernel.checkout``
by auto, with the reason) and the next request is based on it; a version the person
checked out stays the base; a proposal that names its own ``base`` is applied to that
version's source and becomes its child. Read-only tool answers are folded into the
state and carried by every later request. The estimator's verdict overrides the
per-step heuristic (``check_with_estimates``), with figures recorded from a real run.
Pure controller logic with the in-process ``MarkedJudge`` (its speedups are exact);
every test ends by checking the live state against the state replayed from disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from controllers import assert_replay_matches, make, src
from judges import MarkedJudge
from scripted_agent import ScriptedAgent, kernel

from tilewright.agents.base import AgentRequest, Proposal, VersionRow
from tilewright.agents.prompts.context import turn_text
from tilewright.kernels.judge.rank import Rank
from tilewright.kernels.tasks.loaders import load_task
from tilewright.kernels.tasks.task import Task
from tilewright.profiling.diagnose import check_with_estimates
from tilewright.sessions.autonomy import Budgets, ControllerSettings


@pytest.fixture(scope="module")
def gelu() -> Task:
    return load_task("gelu", {"rows": "64", "cols": "256"})


TUNABLE = """import jax
BLOCK_ROWS = {rows}
TUNABLES = {{"BLOCK_ROWS": [8, 16, 32, 64]}}

def kernel(x):
    return x  # eval: correct {speed} {tag}
"""


def tunable(rows: int, speed: float, tag: str = "") -> str:
    return TUNABLE.format(rows=rows, speed=speed, tag=tag)


def settings(iterations: int) -> ControllerSettings:
    return ControllerSettings(budgets=Budgets(iterations=iterations, tokens=None,
                                              cost_usd=None, wall_s=None),
                              record_lessons=False, stop_after_no_improvement=None)


@pytest.mark.asyncio
async def test_after_a_regression_the_next_request_starts_from_the_best(
        tmp_path: Path, gelu: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TILEWRIGHT_DATA_DIR", str(tmp_path / "data"))  # no lessons
    agent = ScriptedAgent([kernel(src(speedup=2.0, tag="a"), "fast"),
                           kernel(src(speedup=1.5, tag="b"), "slower"),
                           kernel(src(speedup=1.2, tag="c"), "from the best again")])
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(), settings(3))
    await c.start()
    c.set_mode("auto")
    await c.wait_idle()
    # v1 is the task's own kernel (1.0x), v2 the fast one, v3 slower than v2.
    assert c.state.best == 2 and c.state.versions[3].rank.value == 1.5
    checkouts = [e for e in seen if e["type"] == "kernel.checkout"]
    assert checkouts and checkouts[0]["version"] == 2 and checkouts[0]["by"] == "auto"
    assert "v3" in checkouts[0]["reason"] and "slower than v2" in checkouts[0]["reason"]
    after = agent.requests[2]  # the request made after v3 regressed
    assert after.current_version == 2 and after.best_version == 2
    assert after.latest_version == 3
    assert "slower than v2" in (after.base_reason or "")
    text = turn_text(after)
    # (the in-process judge's TPU compiler estimates: Rank.words, short, as they rank)
    assert "Best so far: v2, est. 2.00x. Latest: v3, est. 1.50x." in text
    assert "Base: v2 (v3 est. 1.50x is slower than v2's est. 2.00x" in text
    assert "## Base kernel (v2: your change applies to this source)" in text
    assert "| v3 | v2 | correct | est. 1.50x |" in text
    # The base's evaluation: cycles with their time at the chip's clock, the rank in full.
    assert "kernel 750,000 cycles = 0.5 ms at 1.5 GHz, XLA reference 1,500,000 cycles = " \
           "1 ms -> est. 2.00x" in text
    assert "Ranking number: est. 2.00x on v5e at 4096x4096 (TPU compiler)." in text
    # The host simulation time is never written as a speedup.
    assert "not TPU time, not a speedup): kernel 5 ms, XLA reference 10 ms" in text
    assert "eval: correct 2.0 a" in text and "eval: correct 1.5 b" not in text  # v2's source
    # The version made from that request is a child of the best, not of the regression.
    assert c.state.versions[4].parent == 2
    persisted = [e for e in seen if not e.get("live")]
    v3_result = next(e["seq"] for e in persisted
                     if e["type"] == "run.result" and e["version"] == 3)
    third = [e["seq"] for e in persisted if e["type"] == "agent.proposal"][2]
    assert v3_result < checkouts[0]["seq"] < third  # between the regression and the ask
    assert_replay_matches(c)
    await c.close()


@pytest.mark.asyncio
async def test_a_version_the_person_checked_out_stays_the_base(tmp_path: Path,
                                                                 gelu: Task) -> None:
    agent = ScriptedAgent([kernel(src(speedup=2.0, tag="a")), kernel(src(speedup=1.5, tag="b")),
                           kernel(src(speedup=1.1, tag="c"))])
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(),
                   ControllerSettings(propose_after_run=False, record_lessons=False))
    await c.start()
    for _ in range(2):
        c.request_proposal("implement")
        await c.wait_idle()
        c.approve()
        await c.wait_idle()
    assert c.state.best == 2 and c.state.current == 3
    c.revert(3)  # the person keeps working on the slower v3 on purpose
    await c.wait_idle()
    c.request_proposal("tune")
    await c.wait_idle()
    request = agent.requests[-1]
    assert request.current_version == 3 and "checked out by the person" in request.base_reason
    assert not [e for e in seen if e["type"] == "kernel.checkout" and e["by"] == "auto"]
    assert_replay_matches(c)
    await c.close()


@pytest.mark.asyncio
async def test_a_proposal_may_name_its_base(tmp_path: Path, gelu: Task) -> None:
    """propose_tuning with ``base``: applied to that version's source, a child of it."""
    from tilewright.agents.base import ToolCall
    from tilewright.agents.prompts.parsing import _tuning

    agent = ScriptedAgent([kernel(tunable(8, 2.0, "a"), "rows 8"),
                           kernel(tunable(16, 3.0, "b"), "rows 16")])
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(),
                   ControllerSettings(propose_after_run=False, record_lessons=False))
    await c.start()
    for _ in range(2):
        c.request_proposal("implement")
        await c.wait_idle()
        c.approve()
        await c.wait_idle()
    assert c.state.current == 3 and c.state.best == 3
    from tilewright.sessions.control.agent_request import build_request

    request = build_request(c.state, c.log, c.brief, "tune", None, "v5e")
    parsed = _tuning(ToolCall("propose_tuning", {"changes": {"BLOCK_ROWS": 32}, "base": 2,
                                                 "rationale": "from v2"}, "t1"), "", request)
    assert parsed.proposal is not None and parsed.proposal.meta["base"] == 2
    bad = _tuning(ToolCall("propose_tuning", {"changes": {"BLOCK_COLS": 32}, "base": 2},
                           "t2"), "", request)
    assert bad.proposal is None and "declares no tunable BLOCK_COLS" in bad.followup
    gone = _tuning(ToolCall("propose_tuning", {"changes": {"BLOCK_ROWS": 32}, "base": 9},
                            "t3"), "", request)
    assert gone.proposal is None and "versions: v1, v2, v3" in gone.followup
    agent.add(parsed.proposal)
    c.request_proposal("tune")
    await c.wait_idle()
    proposal = [e for e in seen if e["type"] == "agent.proposal"][-1]
    assert proposal["base_version"] == 2 and proposal["base_chosen"] is True
    c.approve()
    await c.wait_idle()
    v4 = c.state.versions[4]
    assert v4.parent == 2  # a child of the base it named, not of the current v3
    source = c.log.get_blob(v4.source_blob).decode()
    assert "BLOCK_ROWS = 32" in source and "correct 2.0 a" in source  # v2's source, tuned
    assert_replay_matches(c)
    await c.close()


@pytest.mark.asyncio
async def test_read_only_tool_answers_stay_for_the_session(tmp_path: Path, gelu: Task) -> None:
    """A lookup made while proposing v2 is in the requests for v3 and later."""
    from tilewright.agents.base import (
        ProposalReady,
        TextDelta,
        ToolCall,
        ToolResult,
        Usage,
        UsageReport,
    )

    class Looking(ScriptedAgent):
        async def propose(self, request: AgentRequest):  # type: ignore[override]
            self.requests.append(request)
            if len(self.requests) == 1:
                yield ToolCall("lookup_api", {"name": "pl.BlockSpec"}, "call-1")
                yield ToolResult("call-1", "lookup_api", "BlockSpec(block_shape, index_map)")
            yield TextDelta("ok")
            yield UsageReport(Usage(input_tokens=10, output_tokens=5))
            yield ProposalReady(Proposal(kind="kernel", summary=f"k{len(self.requests)}",
                                         source=src(speedup=1.0 + len(self.requests),
                                                    tag=str(len(self.requests)))))

    agent = Looking()
    c, _ = make(tmp_path, gelu, agent, MarkedJudge(), settings(3))
    await c.start()
    c.set_mode("auto")
    await c.wait_idle()
    assert len(agent.requests) == 3
    assert agent.requests[0].lookups == ()
    for later in agent.requests[1:]:
        (lookup,) = later.lookups
        assert lookup["name"] == "lookup_api" and lookup["input"] == {"name": "pl.BlockSpec"}
        text = turn_text(later)
        assert "## Read-only tool answers earlier in this session" in text
        assert 'lookup_api({"name": "pl.BlockSpec"})\nBlockSpec(block_shape, index_map)' in text
    assert_replay_matches(c)
    await c.close()


def test_lookups_keep_the_newest_within_the_budget() -> None:
    from tilewright.agents.prompts.context import MAX_LOOKUP_CHARS, lookups_text

    calls = tuple({"name": "lookup_api", "input": {"name": f"n{i}"}, "output": "x" * 5000}
                  for i in range(10))
    newest = {"name": "lookup_api", "input": {"name": "n0"}, "output": "newest answer for n0"}
    text = lookups_text((*calls, newest))
    assert len(text) < MAX_LOOKUP_CHARS + 500
    assert "newest answer for n0" in text and '"n9"' in text  # the newest are kept
    assert '"n1"' not in text and "older ones left out" in text


# Figures recorded from a real run (12p_RMSNorm at batch=2, seq_len=128, emb_dim=256 on
# v5e): BLOCK_ROWS 128 (2 steps) 2,616 cycles, 256 (1 step) 2,916, 64 (4 steps) 4,122.
RMSNORM_ROWS = tuple(VersionRow.of(r) for r in (
    {"version": 1, "status": "correct", "steps": 2, "steps_source": "static",
     "tunables": {"BLOCK_ROWS": 128}, "numbers": {"cycles": 2616}},
    {"version": 2, "status": "correct", "steps": 1, "steps_source": "static",
     "tunables": {"BLOCK_ROWS": 256}, "numbers": {"cycles": 2916}},
    {"version": 3, "status": "correct", "steps": 4, "steps_source": "static",
     "tunables": {"BLOCK_ROWS": 64}, "numbers": {"cycles": 4122}},
))


def test_a_heuristic_the_estimator_contradicts_is_marked_and_no_longer_leads() -> None:
    v1 = {"version": 1, "kind": "per_step_overhead", "summary": "per step overhead: ...",
          "evidence": {"steps": 2},
          "findings": [{"kind": "per_step_overhead", "reason": "2 grid steps"},
                       {"kind": "memory_bound", "reason": "intensity 0.62"}]}
    checked = check_with_estimates(v1, RMSNORM_ROWS)
    (step, memory) = checked["findings"]
    assert "v2, with fewer grid steps (1 vs 2), slower: 2,916 vs 2,616" in step["contradicted"]
    assert "contradicted" not in memory
    assert checked["kind"] == "memory_bound" and checked["contradicted"] == ["per_step_overhead"]
    assert checked["evidence"]["estimator_steps"] == [
        {"steps": 1, "cycles": 2916.0, "version": 2}, {"steps": 2, "cycles": 2616.0, "version": 1},
        {"steps": 4, "cycles": 4122.0, "version": 3}]
    assert v1["kind"] == "per_step_overhead"  # the recorded diagnosis is not changed
    # v3's own per-step finding stands: the version with fewer steps (v1) is faster.
    v3 = {**v1, "version": 3, "evidence": {"steps": 4}}
    assert "contradicted" not in check_with_estimates(v3, RMSNORM_ROWS)
    text = turn_text(AgentRequest("tune", _brief(), "x = 1\n", 1, diagnosis=checked,
                                  history=RMSNORM_ROWS))
    assert "[CONTRADICTED by the estimator: the TPU compiler estimates v2" in text
    assert "1 step 2,916 (v2), 2 steps 2,616 (v1), 4 steps 4,122 (v3)" in text
    # The offline tuner does not grow the blocks on a contradicted per-step finding.
    from tilewright.agents.offline import tuner

    obs = tuner.Observations()
    obs.add({"BLOCK_ROWS": 128}, "correct", Rank("tpu_estimate", 1.26, "v5e", kernel_s=2e-6),
            None, 1)
    source = "BLOCK_ROWS = 128\nTUNABLES = {'BLOCK_ROWS': [64, 128, 256]}\n"
    grow = tuner.diagnosed_step(source, obs, None, v1)  # the heuristic alone: grow
    assert grow is not None and grow.changes == {"BLOCK_ROWS": 256}
    assert tuner.diagnosed_step(source, obs, None, checked) is None


def _brief():
    from tilewright.agents import brief

    return brief(load_task("gelu"))


# -- one evaluation's numbers, from a recorded real eval JSON -----------------------------

RECORDED = Path(__file__).parent / "fixtures" / "evals" / "matmul_gelu_softmax_v4.json"


def test_an_evaluation_says_its_numbers_and_never_a_host_speedup() -> None:
    import json

    from tilewright.agents.prompts.context import eval_text

    result = json.loads(RECORDED.read_text())
    text = eval_text(result, version=4)
    assert "## Evaluation of v4: correct" in text
    # Cycles with their time beside them, at the chip's clock.
    assert "TPU compiler estimate (TPU v5e, at shape default): kernel 2,778 cycles = 1.85 us " \
           "at 1.5 GHz, XLA reference 3,080 cycles = 2.05 us -> est. 1.11x." in text
    assert "Ranking number: est. 1.11x on v5e (TPU compiler)." in text
    assert "VMEM 0.38 MiB of the 16 MiB scoped limit (compiler)." in text
    # The tolerance as enforced: atol 0.01 capped at 5% of the softmax's largest value.
    assert "Enforced: |out - ref| <= 0.000325 + 0.01 * |ref| value by value" in text
    assert "Host simulation time (TPU interpret mode on the CPU: checks correctness; not " \
           "TPU time, not a speedup)" in text
    assert "speedup=" not in text and f"{result['timing']['speedup']:.3g}" not in text


def _floor_line(tpu: dict) -> str:
    import json

    from tilewright.agents.prompts.context import eval_text

    result = json.loads(RECORDED.read_text())
    result["tpu"].update(tpu)
    text = eval_text(result, version=4)
    return next(line.strip() for line in text.splitlines()
                if line.strip().startswith("memory floor"))


def test_the_memory_floor_line_says_only_what_is_true() -> None:
    """The floor against the compiler's figures (kernel 1.85 us, reference 2.05 us in the
    recorded evaluation): "decided" only where the harness's basis says so, with both
    figures; "below both" only where it is; nothing comparative without a figure."""
    floor = {"kernel_bytes": 2 * 2**20, "reference_bytes": 3 * 2**20, "efficiency": 1.0}
    above = {**floor, "kernel_s": 2.5e-6, "reference_s": 3e-6}
    decided = _floor_line({"floor": above, "basis": "memory_floor", "compiler_speedup": 1.1087,
                           "estimated_speedup": 1.2, "kernel_time_s": 2.5e-6})
    assert decided.endswith(
        "It decided the ranking number (the compiler's cycles alone say 1.11x): the "
        "kernel's floor 2.5 us is above its compiler estimate 1.85 us; the XLA reference's "
        "floor 3 us is above its compiler estimate 2.05 us.")
    # The reference's floor alone above its estimate: only that side is named.
    one = _floor_line({"floor": {**floor, "kernel_s": 1e-6, "reference_s": 3e-6},
                       "basis": "memory_floor", "compiler_speedup": 1.1087})
    assert "the XLA reference's floor 3 us is above its compiler estimate 2.05 us." in one
    assert "kernel's floor" not in one
    # Above both, but no basis said (an older harness): the comparisons, no verdict.
    old = _floor_line({"floor": above, "basis": None})
    assert "below both" not in old and "decided" not in old
    assert old.endswith("Against the compiler's estimates: the kernel's floor is above its "
                        "1.85 us; the XLA reference's floor is above its 2.05 us.")
    # Between them: never "below both".
    between = _floor_line({"floor": {**floor, "kernel_s": 1e-6, "reference_s": 3e-6},
                           "basis": None})
    assert "below both" not in between and "kernel's floor is not above its 1.85 us" in between
    # No estimate for the reference: nothing said about the reference's side.
    alone = _floor_line({"floor": {**floor, "kernel_s": 1e-6, "reference_s": 3e-6},
                         "reference_estimate": None, "estimated_speedup": None, "basis": None})
    assert "reference's floor" not in alone and "below both" not in alone
    # No compiler figure at all: the floor, nothing comparative.
    bare = _floor_line({"floor": {**floor, "kernel_s": 1e-6, "reference_s": 3e-6},
                        "estimate": {"cycles": 2778}, "reference_estimate": None,
                        "estimated_speedup": None, "basis": None})
    assert bare.endswith("XLA reference 3 us (3 MiB).")


def test_a_roofline_rank_says_what_the_reference_is_priced_by_and_why() -> None:
    """No compiler estimate for the XLA reference: the kernel's estimate is held against
    the reference's roofline, and the text says so, with the reason and the figures."""
    import json

    from tilewright.agents.prompts.context import eval_text, ranking_text

    result = json.loads(RECORDED.read_text())
    why = "the estimator aborted on the XLA reference (Check failed)"
    result["tpu"].update(
        reference_estimate=None, estimated_speedup=None, estimate_unavailable=why,
        kernel_time_s=1.852e-6, roofline_ratio=0.81,
        reference_roofline={"seconds": 1.5e-6, "flops": 8.6e9, "bytes": 3 * 2**20,
                            "compute_s": 1.3e-7, "memory_s": 1.5e-6, "bound_by": "memory"})
    text = eval_text(result, version=4)
    assert "kernel 2,778 cycles = 1.85 us at 1.5 GHz, XLA reference not estimated -> " \
           "≥0.81x roofline." in text
    assert f"No TPU compiler estimate for the XLA reference: {why}. So your kernel is ranked " \
           "by its own compiler estimate against the reference's roofline: its 8.6 GFLOP at " \
           "the chip's peak = 0.13 us, its compulsory 3 MiB (inputs read and outputs written " \
           "once) at the HBM bandwidth = 1.5 us; the larger, 1.5 us, is a time XLA cannot " \
           "beat, so the ratio is a lower bound of the speedup." in text
    assert "Ranking number: ≥0.81x vs XLA's roofline on v5e" in text
    rule = ranking_text(AgentRequest("tune", _brief(), "x = 1\n", 4, last_eval=result,
                                     chip="v5e"))
    assert "against the XLA reference's roofline: the reference has no compiler estimate " \
           f"({why})" in rule and "a lower bound of the speedup" in rule


def test_the_production_shape_fields_are_read_when_present() -> None:
    """The eval JSON's production-shape fields (tpu.shape_label, input_shapes,
    estimate.ops and .method, grid_steps, floor, fidelity), added to the recorded
    evaluation in the documented format, reach the evaluation, the table and the rule."""
    import json

    from tilewright.agents.prompts.context import eval_text, history_text, ranking_text
    from tilewright.agents.prompts.evalfacts import version_numbers

    result = json.loads(RECORDED.read_text())
    tpu = result["tpu"]
    tpu.update(shape="production", shape_label="4096x8192, 8192x8192, 8192",
               input_shapes=["f32[4096,8192]", "f32[8192,8192]", "f32[8192]"],
               grid_steps=64, basis="compiler",
               floor={"kernel_s": 1.5e-6, "kernel_bytes": 2 * 2**20, "reference_s": 1.8e-6,
                      "reference_bytes": 3 * 2**20, "efficiency": 1.0},
               fidelity={"class": "matmul + epilogue", "median_ratio": 0.95,
                         "within_2x": 0.91, "rows": 33, "source": "JAXBench v6e"})
    tpu["estimate"].update(method="scaled", detail="8 of 64 steps, times 8",
                           ops=[{"name": "_kernel", "kind": "pallas", "cycles": 2600,
                                 "count": 1},
                                {"name": "copy.3", "kind": "xla", "cycles": 89, "count": 2}])
    tpu["reference_estimate"]["ops"] = [{"name": "fusion.1", "kind": "xla",
                                         "cycles": 3080, "count": 1}]
    text = eval_text(result, version=4)
    assert "at 4096x8192, 8192x8192, 8192): kernel 2,778 cycles" in text
    assert "scaled: 8 of 64 steps, times 8" in text
    assert "kernel's ops: _kernel (Pallas kernel) 2,600, copy.3 (XLA) 89 x2" in text
    assert "reference's ops: fusion.1 (XLA) 3,080" in text
    assert "memory floor (bytes through HBM at the chip's bandwidth): kernel 1.5 us " \
           "(2 MiB), XLA reference 1.8 us (3 MiB). It is below both compiler estimates " \
           "(kernel 1.85 us, XLA reference 2.05 us): the compiler's figures rank." in text
    # How far the compiler's figures hold for this class of program, beside the rank.
    assert "Ranking number: est. 1.11x on v5e at 4096x8192, 8192x8192, 8192 (TPU compiler, " \
           "scaled). How far such compiler figures hold, measured: matmul + epilogue v5e: " \
           "median 0.95 of measured, 33 programs, 91% within 2x." in text
    assert "64 grid steps" in text
    numbers = version_numbers(result)
    assert (numbers["pallas_cycles"], numbers["outside_cycles"]) == (2600, 178)
    assert numbers["grids"] is None  # this JSON lists no kernels
    tpu["kernels"] = [{"name": "_kernel", "grid": [8, 8], "steps": 64}]
    assert version_numbers(result)["grids"] == [[8, 8]]
    tpu["kernels"] = [{"name": "_kernel", "grid": [8, None]}]  # a grid read at run time
    assert version_numbers(result)["grids"] is None
    del tpu["kernels"]
    row = VersionRow(4, "correct", numbers["rank"], summary="k", parent=3, numbers=numbers,
                     steps=64, steps_source="tpu")
    table = history_text((row,), best=4, base=4)
    assert "| v4 (best, base) | v3 | correct | est. 1.11x | 2,778 | 3,080 | 2,600 / 178 | " \
           "0.38 / 16 MiB | 64 | k |" in table
    from dataclasses import replace

    # A brief without a production shape of its own: the eval JSON's words name it.
    rule = ranking_text(AgentRequest("tune", replace(_brief(), production=None), "x = 1\n", 4,
                                     last_eval=result, chip="v5e"))
    assert "at the production shape 4096x8192, 8192x8192, 8192 (f32[4096,8192], " \
           "f32[8192,8192], f32[8192])" in rule
    assert "program class matmul + epilogue; median estimate/measured 0.95; 91% within 2x" \
           in rule
