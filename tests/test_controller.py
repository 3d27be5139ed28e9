"""The approval-driven controller with a scripted agent.

Flows that depend on real evaluation (statuses, compile errors, cancelling a run,
switching modes while a run is in flight) run the bundled ``gelu`` task in one real
``WorkerPool`` shared by the module (TPU interpret mode on the CPU, one trial, short
timing). Pure-logic tests (budgets, stop rules, reject notes, streaming cancel, the
approval gate, resume bookkeeping) use ``MarkedJudge`` (``judges.MarkedJudge``), an in-process judge that
reads the status and speedup a test wrote into the candidate's source: they need exact,
repeatable speedups that real interpret-mode timing cannot give, and a real run would
add nothing to what they check. Every test ends by checking that the live state equals
the state replayed from disk.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import pytest_asyncio
from controllers import NO_LIMITS, assert_replay_matches, make, src, types
from judges import MarkedJudge
from scripted_agent import ScriptedAgent, kernel, plan, tuning
from sizes import load_small, small_overrides
from waiting import until

from tilewright.agents import brief
from tilewright.agents.base import Failure, Finished, Usage
from tilewright.kernels.judge.result import Backend
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.tasks.loaders import load_task
from tilewright.kernels.tasks.task import Task
from tilewright.sessions.autonomy import Budgets, ControllerSettings
from tilewright.sessions.control.controller import (
    ApprovalRequired,
    Controller,
    ControllerBusy,
    ControllerError,
)
from tilewright.sessions.evaluator import PoolEvaluator
from tilewright.sessions.log import SessionLog, load
from tilewright.sessions.state import fold

pytestmark = pytest.mark.asyncio(loop_scope="module")

CPU = Backend(platform="cpu", mode="tpu-interpret", device_kind="cpu", jax_version="test")


async def test_the_test_evaluator_is_an_evaluator() -> None:
    from tilewright.kernels.pool import Judge

    assert isinstance(MarkedJudge(), Judge)  # the protocol the controller takes


@pytest.fixture(scope="module")
def gelu() -> Task:
    # Every shape shrunk to 64x256: one interpreted block per call keeps runs short.
    return load_small("gelu", rows=64, cols=256)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool():
    async with WorkerPool() as p:
        yield p


def pool_evaluator(pool: WorkerPool) -> PoolEvaluator:
    return PoolEvaluator(pool, EvalOptions(trials=1, time_budget_s=0.1, timeout_s=120))


# -- real evaluation -------------------------------------------------------------------

async def test_step_mode_waits_for_a_decision_then_applies_runs_and_asks_again(
        tmp_path: Path, gelu: Task, pool: WorkerPool) -> None:
    agent = ScriptedAgent([tuning(BLOCK_ROWS=128), tuning(BLOCK_COLS=512)])
    c, seen = make(tmp_path, gelu, agent, pool_evaluator(pool))
    await c.start()
    await c.wait_idle()
    assert types(seen) == ["kernel.version"]  # step mode: nothing runs on its own
    assert c.state.versions[1].origin == "initial"

    c.run()
    await c.wait_idle()
    assert c.state.versions[1].status == "correct"
    assert c.state.pending == "p1"  # the result went to the agent, the proposal waits
    assert agent.requests[0].last_eval["status"] == "correct"
    assert agent.requests[0].role == "tune"
    before = len(types(seen))
    await asyncio.sleep(0)  # one turn of the loop: anything scheduled would start now
    assert len(types(seen)) == before and c.busy is None  # and nothing else happens

    c.approve()
    await c.wait_idle()
    v2 = c.state.versions[2]
    assert (v2.origin, v2.parent, v2.proposal, v2.status) == ("tuning", 1, "p1", "correct")
    assert "BLOCK_ROWS = 128" in c.log.get_blob(v2.source_blob).decode()
    assert c.state.pending == "p2"
    decision = next(e for e in seen if e["type"] == "user.decision")
    assert (decision["by"], decision["decision"]) == ("user", "approve")
    assert c.state.best in (1, 2)
    assert_replay_matches(c)
    await c.close()


async def test_the_persons_compile_error_waits_for_them_then_fixer_or_revert(
        tmp_path: Path, gelu: Task, pool: WorkerPool) -> None:
    agent = ScriptedAgent([kernel(gelu.starting_source(), "fixed")])
    c, seen = make(tmp_path, gelu, agent, pool_evaluator(pool),
                   ControllerSettings(auto_fix_attempts=1))
    await c.start()
    broken = gelu.starting_source().replace("def gelu_kernel(x_ref, o_ref):",
                                            "def gelu_kernel(x_ref, o_ref)")
    c.edit(broken)
    await c.wait_idle()
    v2 = c.state.versions[2]
    assert v2.origin == "user-edit" and v2.status == "compile_error"
    # The person's own edit: no automatic fix behind their back; they are told it is
    # theirs, where it fails and the way back (issue 35).
    assert not agent.requests and c.state.pending is None
    told = [e["text"] for e in seen if e["type"] == "notice"
            and e["text"].startswith("v2 (your edit) does not compile")]
    assert told and "line" in told[0] and "go back to v1" in told[0]
    c.request_proposal()  # the person asks the fixer
    await c.wait_idle()
    assert agent.requests[-1].role == "fix"
    assert agent.requests[-1].last_eval["status"] == "compile_error"
    assert agent.requests[-1].current_source == broken
    assert c.state.pending == "p1"

    c.reject()  # no note: the agent is not asked again
    await c.wait_idle()
    assert len(agent.requests) == 1 and c.state.pending is None
    c.revert(1)
    assert c.state.current == 1
    assert types(seen)[-1] == "kernel.checkout"
    assert_replay_matches(c)
    await c.close()


async def test_cancel_a_run_replaces_the_worker(tmp_path: Path, gelu: Task,
                                                pool: WorkerPool) -> None:
    # A kernel whose load takes a minute: the run is still going when it is cancelled
    # (a 64x256 gelu is judged in well under the wait below on a warm worker).
    slow_dir = tmp_path / "slow_gelu"
    shutil.copytree(gelu.root, slow_dir, ignore=shutil.ignore_patterns("__pycache__"))
    kernel_py = slow_dir / "kernel.py"
    kernel_py.write_text("import time\ntime.sleep(60)\n"  # the payload: a load that hangs
                         + kernel_py.read_text())
    slow = load_task(str(slow_dir), small_overrides(rows=64, cols=256))
    c, seen = make(tmp_path / "session", slow, ScriptedAgent(), pool_evaluator(pool))
    await c.start()
    await pool.backend()
    pids_before = set(pool.pids)
    started = asyncio.Event()
    c.subscribe(lambda e: started.set() if e["type"] == "run.start" else None)
    c.run()
    await started.wait()
    await asyncio.sleep(0.3)  # the request is in the worker (nothing says so: the pool is
    assert c.busy == "run"    # busy from the moment it takes the request)
    assert await c.cancel()
    result = [e for e in seen if e["type"] == "run.result"][-1]
    assert result["cancelled"] and result["status"] == "cancelled"
    assert c.state.versions[1].status is None  # a cancelled run measures nothing
    await pool.backend()
    await until(lambda: pool.state == "idle", "the replacement worker (it imports JAX)", 60)
    assert pool.state == "idle" and not (set(pool.pids) & pids_before)
    assert_replay_matches(c)
    await c.close()


async def test_switch_to_auto_during_a_run_and_back_to_step(
        tmp_path: Path, gelu: Task, pool: WorkerPool) -> None:
    # (tunings that change the program at 64x256: BLOCK_ROWS=128 is the 64-row kernel
    # there, a measured program the auto-approver rejects)
    agent = ScriptedAgent([tuning(BLOCK_ROWS=16), tuning(BLOCK_COLS=128)])
    c, seen = make(tmp_path, gelu, agent, pool_evaluator(pool))
    await c.start()
    first_run, second_run = asyncio.Event(), asyncio.Event()
    c.subscribe(lambda e: (first_run if e["version"] == 1 else second_run).set()
                if e["type"] == "run.start" else None)
    c.run()
    await first_run.wait()
    assert c.busy == "run"
    c.set_mode("auto")  # mid-run: the next proposal is approved by the auto-approver
    await second_run.wait()
    c.set_mode("step")  # mid-run again: the proposal after this run waits for the user
    await c.wait_idle()
    decisions = [e for e in seen if e["type"] == "user.decision"]
    assert [(d["proposal"], d["by"]) for d in decisions] == [("p1", "auto")]
    assert c.state.pending == "p2" and c.state.mode == "step"
    assert [e["reason"] for e in seen if e["type"] == "auto.stop"] == ["user"]
    assert_replay_matches(c)
    await c.close()


# -- pure controller logic (MarkedJudge) --------------------------------------------

async def test_a_run_cannot_start_without_a_decision(tmp_path: Path, gelu: Task) -> None:
    """Forge a log in which an agent's kernel became a version without any decision: the
    resumed controller refuses to run it, and nothing reaches the evaluator."""
    log = SessionLog.create(tmp_path, task={"name": "gelu"}, backend=None, agent="x",
                            app_version="test")
    log.append("agent.proposal", proposal="p1", kind="kernel", summary="sneaky",
               rationale="", base_version=None, source_blob=log.put_blob(src()),
               plan=None, tuning=None, role="implement")
    log.append("kernel.version", version=1, parent=None, origin="agent", proposal="p1",
               source_blob=log.put_blob(src()), summary="sneaky", decision=None)
    # A decision about another proposal does not authorise this one either.
    log.append("agent.proposal", proposal="p2", kind="kernel", summary="fine",
               rationale="", base_version=1, source_blob=log.put_blob(src(tag="2")),
               plan=None, tuning=None, role="tune")
    approval = log.append("user.decision", proposal="p2", decision="approve", by="user",
                          note=None, source_blob=None)
    log.append("kernel.version", version=2, parent=1, origin="agent", proposal="p1",
               source_blob=log.put_blob(src(tag="3")), summary="borrowed approval",
               decision=approval["seq"])
    log.close()
    log, loaded = SessionLog.open(log.path)
    evaluator = MarkedJudge()
    c = Controller(log, gelu, brief(gelu), ScriptedAgent(), evaluator,
                   state=fold(loaded.header, loaded.events))
    with pytest.raises(ApprovalRequired, match="never approved"):
        c.run(1)
    with pytest.raises(ApprovalRequired, match="v2 was never approved"):
        c.run(2)
    with pytest.raises(ApprovalRequired):
        await c._run_eval(1, "user")
    with pytest.raises(ApprovalRequired):
        c._apply("p1")
    assert evaluator.sources == []
    assert not any(e["type"] == "run.start" for e in load(log.path).events)
    log.close()


async def test_a_pending_proposal_never_runs_before_approval(tmp_path: Path,
                                                             gelu: Task) -> None:
    evaluator = MarkedJudge()
    agent = ScriptedAgent([kernel(src(speedup=2.0, tag="proposed"))])
    c, _ = make(tmp_path, gelu, agent, evaluator)
    await c.start()
    c.user_message("write me a kernel")
    await c.wait_idle()
    assert c.state.pending == "p1"
    c.run()  # runs the current version, not the proposal
    await c.wait_idle()
    assert evaluator.sources and all("proposed" not in s for s in evaluator.sources)
    await c.close()


async def test_reject_with_a_note_reaches_the_next_request(tmp_path: Path,
                                                           gelu: Task) -> None:
    agent = ScriptedAgent([kernel(src(tag="a")), kernel(src(tag="b"))])
    c, _ = make(tmp_path, gelu, agent, MarkedJudge())
    await c.start()
    c.user_message("make it faster")
    await c.wait_idle()
    assert agent.requests[0].user_message == "make it faster"
    c.reject("keep BLOCK_COLS at 128")
    await c.wait_idle()
    assert len(agent.requests) == 2
    assert any("keep BLOCK_COLS at 128" in n for n in agent.requests[1].notes)
    assert c.state.pending == "p2"
    assert c.state.proposals["p1"].decision == "reject"
    assert_replay_matches(c)
    await c.close()


async def test_edit_of_a_pending_proposal_runs_the_users_source(tmp_path: Path,
                                                                 gelu: Task) -> None:
    evaluator = MarkedJudge()
    agent = ScriptedAgent([kernel(src(tag="agent"))])
    c, _ = make(tmp_path, gelu, agent, evaluator, ControllerSettings(propose_after_run=False))
    await c.start()
    c.request_proposal()
    await c.wait_idle()
    c.edit(src(speedup=1.5, tag="mine"))
    await c.wait_idle()
    v = c.state.versions[2]
    assert v.origin == "user-edit" and v.proposal == "p1" and v.rank.value == 1.5
    assert "mine" in evaluator.sources[-1]
    assert c.state.proposals["p1"].decision == "edit"
    assert_replay_matches(c)
    await c.close()


async def test_plan_approval_asks_the_implementer_with_the_plan(tmp_path: Path,
                                                                gelu: Task) -> None:
    agent = ScriptedAgent([plan("1. bigger tiles\n2. fuse"), kernel(src(speedup=1.2))])
    c, _ = make(tmp_path, gelu, agent, MarkedJudge(),
                ControllerSettings(propose_after_run=False))
    await c.start()
    c.request_proposal("plan")
    await c.wait_idle()
    c.approve()
    await c.wait_idle()
    assert agent.requests[1].role == "implement"
    assert any("bigger tiles" in n for n in agent.requests[1].notes)
    assert c.state.pending == "p2"
    c.approve()
    await c.wait_idle()
    # One approved step done; step 2 ("fuse") is what the implementer is asked for next.
    assert c.state.plan_to_implement == "p1" and c.state.plan_step == 1
    assert c.state.versions[2].rank.value == 1.2
    assert_replay_matches(c)
    await c.close()


async def test_cancel_a_streaming_answer(tmp_path: Path, gelu: Task) -> None:
    hold = asyncio.Event()
    agent = ScriptedAgent([kernel(src())], text="thinking about tiles", hold=hold)
    c, seen = make(tmp_path, gelu, agent, MarkedJudge())
    await c.start()
    c.user_message("go")
    await agent.started.wait()
    assert c.busy == "agent"
    assert [e["text"] for e in seen if e["type"] == "agent.delta"] == ["thinking"]
    assert await c.cancel()
    assert agent.closed == 1 and c.busy is None and c.state.pending is None
    message = [e for e in seen if e["type"] == "agent.message"][-1]
    assert message["cancelled"] and message["text"] == "thinking"
    assert_replay_matches(c)
    await c.close()


async def test_busy_commands_are_refused_clearly(tmp_path: Path, gelu: Task) -> None:
    gate = asyncio.Event()
    c, _ = make(tmp_path, gelu, ScriptedAgent(), MarkedJudge(gate))
    await c.start()
    c.run()
    with pytest.raises(ControllerBusy, match="run is in progress"):
        c.run()
    with pytest.raises(ControllerBusy):
        c.revert(1)
    gate.set()
    await c.wait_idle()
    with pytest.raises(ControllerError, match=r"no version 9 \(versions: v1\)"):
        c.revert(9)
    with pytest.raises(ControllerError, match="no pending proposal"):
        c.approve()
    await c.close()
    with pytest.raises(ControllerError, match="closed"):
        c.user_message("anyone?")


def _auto_agent(n: int, speedups: list[float] | None = None,
                usage: Usage | None = None) -> ScriptedAgent:
    speedups = speedups or [1.0 + 0.1 * i for i in range(1, n + 1)]
    return ScriptedAgent([kernel(src(speedup=s, tag=str(i)), f"try {i}")
                          for i, s in enumerate(speedups)], usage=usage)


async def _auto(tmp_path: Path, gelu: Task, agent: ScriptedAgent,
                settings: ControllerSettings) -> tuple[Controller, list[dict]]:
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(), settings)
    await c.start()
    c.set_mode("auto")
    await c.wait_idle()
    assert c.state.mode == "step"
    assert_replay_matches(c)
    return c, seen


def _stops(seen: list[dict]) -> list[str]:
    return [e["reason"] for e in seen if e["type"] == "auto.stop"]




async def test_auto_iterations_budget(tmp_path: Path, gelu: Task) -> None:
    settings = ControllerSettings(budgets=Budgets(iterations=3, tokens=None, cost_usd=None,
                                                  wall_s=None))
    c, seen = await _auto(tmp_path, gelu, _auto_agent(10), settings)
    assert _stops(seen) == ["budget:iterations"]
    assert c.state.auto_spent.iterations == 3 and len(c.state.versions) == 4
    decisions = [e for e in seen if e["type"] == "user.decision"]
    assert decisions and all(d["by"] == "auto" for d in decisions)
    assert c.state.best == 4 and c.state.versions[1].status == "correct"  # baseline ran too
    await c.close()


async def test_auto_token_budget(tmp_path: Path, gelu: Task) -> None:
    settings = ControllerSettings(budgets=Budgets(iterations=None, tokens=1000,
                                                  cost_usd=None, wall_s=None))
    agent = _auto_agent(10, usage=Usage(input_tokens=300, output_tokens=100))
    c, seen = await _auto(tmp_path, gelu, agent, settings)
    assert _stops(seen) == ["budget:tokens"]
    assert c.state.auto_spent.tokens == 1200 and len(agent.requests) == 3
    await c.close()


async def test_auto_cost_budget(tmp_path: Path, gelu: Task) -> None:
    settings = ControllerSettings(budgets=Budgets(iterations=None, tokens=None,
                                                  cost_usd=0.05, wall_s=None))
    agent = _auto_agent(10, usage=Usage(input_tokens=1, cost_usd=0.02))
    c, seen = await _auto(tmp_path, gelu, agent, settings)
    assert _stops(seen) == ["budget:cost"]
    assert len(agent.requests) == 3 and c.state.auto_spent.cost_usd == pytest.approx(0.06)
    await c.close()


async def test_auto_wall_budget(tmp_path: Path, gelu: Task) -> None:
    settings = ControllerSettings(budgets=Budgets(iterations=None, tokens=None,
                                                  cost_usd=None, wall_s=0.0))
    c, seen = await _auto(tmp_path, gelu, _auto_agent(5), settings)
    assert _stops(seen) == ["budget:wall"]
    assert len(c.state.versions) == 1  # not one proposal was asked for
    await c.close()


async def test_auto_stops_without_improvement(tmp_path: Path, gelu: Task) -> None:
    settings = ControllerSettings(budgets=NO_LIMITS, stop_after_no_improvement=2)
    agent = _auto_agent(10, speedups=[2.0, 1.5, 1.9, 3.0])
    c, seen = await _auto(tmp_path, gelu, agent, settings)
    assert _stops(seen) == ["no_improvement"]
    assert c.state.best == 2 and c.state.best_rank.value == 2.0
    assert len(c.state.versions) == 4  # baseline, 2.0, then two without improvement
    await c.close()


async def test_auto_stops_at_the_target_speedup(tmp_path: Path, gelu: Task) -> None:
    settings = ControllerSettings(budgets=NO_LIMITS, target_speedup=1.25)
    c, seen = await _auto(tmp_path, gelu, _auto_agent(10), settings)
    assert _stops(seen) == ["target_reached"]
    assert c.state.best_rank.source == "tpu_estimate"
    assert c.state.best_rank.value == pytest.approx(1.3)
    await c.close()


async def test_no_roofline_bound_or_host_ratio_reaches_the_target(tmp_path: Path,
                                                                 gelu: Task) -> None:
    """The target is a speedup: a roofline rank (a lower bound) or a host simulation
    ratio never reaches it, however large; the iteration budget ends the run instead."""
    agent = ScriptedAgent([kernel(src(speedup=5.0, tag="roofline"), "bound"),
                           kernel(src(speedup=9.0, tag="host"), "host only")])
    settings = ControllerSettings(budgets=Budgets(iterations=2, tokens=None, cost_usd=None,
                                                  wall_s=None), target_speedup=1.25)
    c, seen = await _auto(tmp_path, gelu, agent, settings)
    assert _stops(seen) == ["budget:iterations"]
    assert c.state.versions[2].rank.source == "roofline"
    assert c.state.versions[3].rank.source == "host_simulation"
    assert c.state.best == 2  # a compiler figure ranks above any host ratio
    await c.close()


async def test_auto_stops_when_the_agent_keeps_failing(tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([Failure("overloaded", retryable=True)] * 3)
    settings = ControllerSettings(budgets=NO_LIMITS, max_agent_failures=3)
    c, seen = await _auto(tmp_path, gelu, agent, settings)
    assert _stops(seen) == ["agent_failed"]
    assert [e["where"] for e in seen if e["type"] == "error"] == ["agent"] * 3
    await c.close()


async def test_auto_stops_at_once_when_the_agent_says_retrying_is_futile(
        tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([Failure("no template for this family", retryable=False),
                           kernel(src())])
    c, seen = await _auto(tmp_path, gelu, agent, ControllerSettings(budgets=NO_LIMITS))
    assert _stops(seen) == ["agent_failed"] and len(agent.requests) == 1
    await c.close()


async def test_an_agent_with_nothing_left_to_try_ends_autonomous_mode_calmly(
        tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([Finished("tuning converged at BLOCK_ROWS=128"), kernel(src())])
    c, seen = await _auto(tmp_path, gelu, agent, ControllerSettings(budgets=NO_LIMITS))
    assert _stops(seen) == ["agent_finished"] and len(agent.requests) == 1
    assert [e["message"] for e in seen if e["type"] == "agent.finished"] == [
        "tuning converged at BLOCK_ROWS=128"]
    assert not [e for e in seen if e["type"] == "error"]  # not an error
    assert c.state.agent_finished and c.state.agent_failures == 0
    await c.close()


async def test_auto_rejects_duplicates_and_moves_on(tmp_path: Path, gelu: Task) -> None:
    same = src(speedup=1.5, tag="dup")
    agent = ScriptedAgent([kernel(same), kernel(same), kernel(src(speedup=2.0))])
    settings = ControllerSettings(budgets=Budgets(iterations=2, tokens=None, cost_usd=None,
                                                  wall_s=None))
    c, seen = await _auto(tmp_path, gelu, agent, settings)
    rejected = [e for e in seen if e["type"] == "user.decision" and e["decision"] == "reject"]
    assert len(rejected) == 1 and "identical to v2" in rejected[0]["note"]
    assert c.state.best_rank.value == 2.0
    await c.close()


async def test_auto_stops_when_the_agent_keeps_repeating_itself(tmp_path: Path,
                                                                  gelu: Task) -> None:
    """Without this rule an agent stuck on one kernel burns the token budget on
    proposals the auto-approver can only reject."""
    same = src(speedup=1.5, tag="dup")
    agent = ScriptedAgent([kernel(same)] * 10)
    settings = ControllerSettings(budgets=NO_LIMITS, max_agent_failures=3)
    c, seen = await _auto(tmp_path, gelu, agent, settings)
    rejected = [e for e in seen if e["type"] == "user.decision" and e["decision"] == "reject"]
    assert _stops(seen) == ["agent_repeating"]
    assert len(rejected) == 3 and len(agent.requests) == 4  # one applied, three repeats
    await c.close()


async def test_auto_fix_streak_returns_to_the_best_version(tmp_path: Path,
                                                          gelu: Task) -> None:
    agent = ScriptedAgent([kernel(src(speedup=2.0, tag="good")),
                           kernel(src("compile_error", 1.0, "bad1")),
                           kernel(src("compile_error", 1.0, "bad2")),
                           kernel(src(speedup=2.5, tag="better"))])
    settings = ControllerSettings(budgets=Budgets(iterations=4, tokens=None, cost_usd=None,
                                                  wall_s=None), auto_fix_attempts=1)
    c, seen = await _auto(tmp_path, gelu, agent, settings)
    roles = [r.role for r in agent.requests]
    assert roles == ["tune", "tune", "fix", "tune"]
    checkout = [e for e in seen if e["type"] == "kernel.checkout"]
    assert checkout and checkout[0]["version"] == 2 and checkout[0]["by"] == "auto"
    assert c.state.versions[5].parent == 2 and c.state.best == 5
    await c.close()


async def test_tuning_that_cannot_be_applied_is_an_error_the_agent_hears_about(
        tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([tuning(NOT_A_TUNABLE=3), kernel(src())])
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(),
                   ControllerSettings(propose_after_run=False))
    await c.start()
    c.request_proposal()
    await c.wait_idle()
    c.approve()
    await c.wait_idle()
    error = [e for e in seen if e["type"] == "error"][-1]
    assert error["where"] == "apply" and "NOT_A_TUNABLE" in error["message"]
    assert c.state.unapplied_approval() is None and len(c.state.versions) == 1
    c.request_proposal()
    await c.wait_idle()
    assert any("could not be applied" in n for n in agent.requests[-1].notes)
    await c.close()


async def test_resume_settles_an_interrupted_run_and_applies_an_approved_proposal(
        tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([kernel(src(speedup=1.7, tag="p1"))])
    c, _ = make(tmp_path, gelu, agent, MarkedJudge(),
                ControllerSettings(propose_after_run=False))
    await c.start()
    c.request_proposal()
    await c.wait_idle()
    # What a crash leaves: a decision written, no version; a run started, no result.
    c.log.append("user.decision", proposal="p1", decision="approve", by="user", note=None,
                 source_blob=None)
    c.log.append("run.start", run="r1", version=1, kind="eval", by="user")
    c.log.close()

    log, loaded = SessionLog.open(c.log.path)
    state = fold(loaded.header, loaded.events)
    assert state.active_run is not None and state.unapplied_approval().id == "p1"
    evaluator = MarkedJudge()
    resumed = Controller(log, gelu, brief(gelu), ScriptedAgent(), evaluator,
                         ControllerSettings(propose_after_run=False), state=state)
    await resumed.start()
    await resumed.wait_idle()
    events = load(log.path).events
    # ... and the correct v2 gets its static analysis (a run of its own) after its result.
    assert [e["type"] for e in events][-7:] == ["marker", "run.result", "kernel.version",
                                                "run.start", "run.result", "run.start",
                                                "profile.result"]
    assert events[-6]["interrupted"] and events[-6]["run"] == "r1"
    assert events[-2]["kind"] == "analysis" and events[-1]["static"]
    assert resumed.state.versions[2].rank.value == 1.7 and resumed.state.active_run is None
    assert_replay_matches(resumed)
    await resumed.close()


async def test_subscribers_see_live_notifications_and_persisted_events(
        tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([kernel(src())], text="two words")
    c, seen = make(tmp_path, gelu, agent, MarkedJudge())
    await c.start()
    c.user_message("hi")
    await c.wait_idle()
    live = [e for e in seen if e.get("live")]
    assert {"agent.start", "agent.delta", "agent.usage", "controller.idle"} <= \
        {e["type"] for e in live}
    assert all("seq" not in e for e in live)
    persisted = [e for e in seen if not e.get("live")]
    assert persisted == load(c.log.path).events
    await c.close()


async def test_profile_is_recorded_and_reaches_the_agent(tmp_path: Path, gelu: Task,
                                                         pool: WorkerPool) -> None:
    agent = ScriptedAgent([tuning(BLOCK_ROWS=8)])
    c, seen = make(tmp_path, gelu, agent, pool_evaluator(pool),
                   ControllerSettings(propose_after_run=False))
    await c.start()
    c.profile()
    await c.wait_idle()
    result = [e for e in seen if e["type"] == "profile.result"][-1]
    assert result["error"] is None and result["logdir"] == "profiles/r1"
    data = json.loads(c.log.get_blob(result["profile_blob"]))
    assert data["schema"] == "tilewright.profile/1" and data["status"] == "ok"
    assert (c.log.path / "profiles" / "r1").is_dir()
    assert c.state.versions[1].profile_blob == result["profile_blob"]
    c.request_proposal()
    await c.wait_idle()
    assert agent.requests[-1].profile_summary["status"] == "ok"
    assert_replay_matches(c)
    await c.close()


async def test_a_message_sent_while_the_agent_answers_reaches_its_next_request(
        tmp_path: Path, gelu: Task) -> None:
    hold = asyncio.Event()
    agent = ScriptedAgent([kernel(src(tag="a")), kernel(src(tag="b"))], hold=hold)
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(),
                   ControllerSettings(propose_after_run=False))
    await c.start()
    c.user_message("first")
    await agent.started.wait()
    c.user_message("also: keep it simple")  # the agent is busy: queued for next time
    assert any(e["type"] == "notice" for e in seen)
    hold.set()
    await c.wait_idle()
    assert c.state.notes == ["user: also: keep it simple"]
    c.reject()
    c.request_proposal()
    await c.wait_idle()
    assert "user: also: keep it simple" in agent.requests[-1].notes
    assert c.state.notes == []
    assert_replay_matches(c)
    await c.close()


async def test_switch_modes_while_the_agent_streams(tmp_path: Path, gelu: Task) -> None:
    hold = asyncio.Event()
    agent = ScriptedAgent([kernel(src(speedup=1.5, tag="a")), kernel(src(tag="b"))],
                          hold=hold)
    settings = ControllerSettings(budgets=Budgets(iterations=1, tokens=None, cost_usd=None,
                                                  wall_s=None))
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(), settings)
    await c.start()
    c.user_message("go")
    await agent.started.wait()
    c.set_mode("auto")  # mid-stream: this proposal will be decided by the auto-approver
    hold.set()
    await c.wait_idle()
    decisions = [(e["proposal"], e["by"]) for e in seen if e["type"] == "user.decision"]
    assert decisions == [("p1", "auto")] and c.state.versions[2].rank.value == 1.5
    assert _stops(seen) == ["budget:iterations"]

    hold.clear()
    agent.started.clear()
    c.set_mode("auto")  # a fresh allowance; the next answer streams ...
    await agent.started.wait()
    c.set_mode("step")  # ... and is now left for the user
    hold.set()
    await c.wait_idle()
    assert c.state.pending == "p2" and c.state.mode == "step"
    assert [e["by"] for e in seen if e["type"] == "user.decision"] == ["auto"]
    assert_replay_matches(c)
    await c.close()
