"""Talking to the agent, and autonomy that reads profiles.

A question answered without a proposal through the real ``anthropic`` SDK against the
local Messages API server, with a read-only ``lookup_api`` tool call answered by a real
worker on the way; ``/plan`` then step-by-step implementation with approvals (and a
plan edited before approval, and changes asked of the planner); ``/explain``; a new
session opening with a plan; the autonomous loop with the offline agent (profile by
``auto``, the ``diagnosis`` event, the next request carrying it, the offline move
following from it); lessons written at session end and read by the next session.
Every test checks that the live state equals the state replayed from disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from anthropic_server import MessagesServer, text_reply, tool_reply
from controllers import assert_replay_matches, make, src, types
from judges import MarkedJudge
from scripted_agent import ScriptedAgent, kernel, plan

from tilewright import agents
from tilewright.agents import memory
from tilewright.agents.base import AgentRequest
from tilewright.agents.offline import OfflineAgent
from tilewright.agents.prompts.context import turn_text
from tilewright.kernels.judge.options import ProfileOptions
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.tasks.loaders import load_task
from tilewright.kernels.tasks.task import Task
from tilewright.sessions.autonomy import Budgets, ControllerSettings
from tilewright.sessions.control.agent_request import build_request
from tilewright.sessions.evaluator import PoolEvaluator
from tilewright.sessions.log import load
from tilewright.sessions.recorded.report import markdown

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def gelu() -> Task:
    # 128x512 with the kernel's 64x256 blocks: a 2x2 grid, so per-step cost shows.
    return load_task("gelu", {"rows": "128", "cols": "512"})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool():
    async with WorkerPool() as p:
        yield p


class StaticProfileEvaluator(PoolEvaluator):
    """The real worker for evaluations and profiles; profiles are the static analysis
    and roofline only (no trace capture: seconds faster in interpret mode)."""

    async def profile(self, task: Task, source: str, logdir: Path | None,
                      options: ProfileOptions | None = None, **kwargs: Any) -> dict[str, Any]:
        result = await self.judge.profile(task, source, None,
                                          ProfileOptions(static_only=True, timeout_s=120.0))
        return {k: v for k, v in result.items() if not k.startswith("_")}


class Recording(OfflineAgent):
    """The offline agent, keeping every request it was sent."""

    def __init__(self) -> None:
        super().__init__({})
        self.requests: list[AgentRequest] = []

    def propose(self, request: AgentRequest):  # type: ignore[override]
        self.requests.append(request)
        return super().propose(request)


def _evaluator(pool: WorkerPool) -> StaticProfileEvaluator:
    return StaticProfileEvaluator(pool, EvalOptions(trials=1, time_budget_s=0.05,
                                                    timeout_s=120))


# -- a conversation through the real SDK ----------------------------------------------

async def test_a_question_is_answered_with_a_tool_call_and_no_proposal(
        tmp_path: Path, gelu: Task, pool: WorkerPool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-local")
    monkeypatch.delenv("TILEWRIGHT_MODEL", raising=False)
    with MessagesServer() as server:
        server.script(
            tool_reply("lookup_api", {"name": "pl.BlockSpec"}, text="Let me check the API."),
            text_reply("v1 is limited by per-step overhead: four 128 KiB steps."))
        agent = agents.make_agent("anthropic", {"agent": {
            "base_url": server.url, "retry_base_s": 0.01, "model": "claude-sonnet-4-5"}})
        c, seen = make(tmp_path, gelu, agent, _evaluator(pool))  # type: ignore[arg-type]
        await c.start()
        c.user_message("why is v1 slow?")
        await c.wait_idle()
        # The worker answered the tool call from the installed JAX, and the model read it.
        second = server.requests[1].body["messages"]
        result = second[-1]["content"][0]
        assert result["type"] == "tool_result" and not result["is_error"]
        assert "block_shape" in json.dumps(result["content"]) and "index_map" in \
            json.dumps(result["content"])
    message = [e for e in seen if e["type"] == "agent.message" and not e.get("live")][-1]
    assert message["answer"] is True and message["proposal"] is None
    assert "per-step overhead" in message["text"]
    assert message["tools"][0]["name"] == "lookup_api"
    assert "block_shape" in message["tools"][0]["output"]
    assert "error" not in types(seen) and "agent.proposal" not in types(seen)
    assert any(e.get("type") == "agent.tool_result" for e in seen)  # shown live, too
    assert c.state.answers == 1 and c.state.notes == [] and c.state.agent_failures == 0
    assert_replay_matches(c)
    await c.close()


async def test_lookup_api_is_answered_by_the_worker(pool: WorkerPool) -> None:
    evaluator = _evaluator(pool)
    found = await evaluator.lookup_api("pl.BlockSpec")
    assert found["resolved"] == "jax.experimental.pallas.BlockSpec"
    assert "index_map" in found["signature"] and found["jax_version"]
    gone = await evaluator.lookup_api("pltpu.TPUCompilerParams")
    assert "no attribute" in gone["error"]
    assert "jax.experimental.pallas.tpu.CompilerParams" in gone["suggestions"]


# -- /plan, step by step ---------------------------------------------------------------

async def test_plan_then_step_by_step_implementation_with_approvals(
        tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([plan("1. bigger tiles\n2. fuse the epilogue"),
                           plan("1. bigger tiles\n2. fuse the epilogue\n3. tune"),
                           kernel(src(speedup=1.2, tag="step1")),
                           kernel(src(speedup=1.5, tag="step2"))])
    c, _ = make(tmp_path, gelu, agent, MarkedJudge(),
                   ControllerSettings(propose_after_run=True))
    await c.start()
    c.request_plan("make it faster")
    await c.wait_idle()
    assert agent.requests[-1].role == "plan" and agent.requests[-1].user_message == \
        "make it faster"
    c.reject("add a tuning step")  # changes asked of the planner
    await c.wait_idle()
    assert agent.requests[-1].role == "plan"
    assert any("add a tuning step" in n for n in agent.requests[-1].notes)
    c.edit_plan("1. bigger tiles\n2. fuse the epilogue")  # the person's own wording
    await c.wait_idle()
    first = agent.requests[-1]
    assert first.role == "implement"
    assert any("step 1 of 2" in n and "bigger tiles" in n for n in first.notes)
    assert c.state.pending == "p3"  # nothing runs before approval
    c.approve()
    await c.wait_idle()
    second = agent.requests[-1]
    assert second.role == "implement" and c.state.versions[2].rank.value == 1.2
    assert any("step 2 of 2" in n and "fuse the epilogue" in n for n in second.notes)
    assert c.state.pending == "p4"
    c.approve()
    await c.wait_idle()
    assert c.state.versions[3].rank.value == 1.5 and c.state.plan_to_implement is None
    assert agent.requests[-1].role == "tune"  # the plan is done
    assert_replay_matches(c)
    await c.close()


async def test_explain_answers_about_a_version_without_a_proposal(
        tmp_path: Path, gelu: Task, pool: WorkerPool) -> None:
    agent = Recording()
    c, seen = make(tmp_path, gelu, agent, _evaluator(pool),  # type: ignore[arg-type]
                   ControllerSettings(propose_after_run=False))
    await c.start()
    c.run(1)
    await c.wait_idle()
    c.profile(1)
    await c.wait_idle()
    c.explain(1)
    await c.wait_idle()
    assert agent.requests[-1].role == "analyze" and agent.requests[-1].current_version == 1
    answer = [e for e in seen if e["type"] == "agent.message" and not e.get("live")][-1]
    assert answer["answer"] is True and answer["about"] == 1
    assert "**v1**: correct" in answer["text"] and "per step overhead" in answer["text"]
    assert "agent.proposal" not in types(seen) and "error" not in types(seen)
    assert_replay_matches(c)
    await c.close()


async def test_a_new_session_can_open_with_a_plan(tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([plan("1. write it")])
    c, _ = make(tmp_path, gelu, agent, MarkedJudge(), ControllerSettings(open_with_plan=True))
    await c.start()
    await c.wait_idle()
    assert agent.requests[0].role == "plan" and c.state.pending == "p1"
    await c.close()


# -- the loop: profile, diagnose, optimize ----------------------------------------------

async def test_auto_profiles_new_bests_and_the_diagnosis_drives_the_offline_agent(
        tmp_path: Path, gelu: Task, pool: WorkerPool) -> None:
    agent = Recording()
    settings = ControllerSettings(budgets=Budgets(iterations=1), record_lessons=False)
    c, seen = make(tmp_path, gelu, agent, _evaluator(pool), settings)  # type: ignore[arg-type]
    await c.start()
    c.set_mode("auto")
    await c.wait_idle()
    persisted = [e for e in seen if not e.get("live")]
    profiles = [e for e in persisted if e["type"] == "run.start" and e["kind"] == "profile"]
    assert profiles and profiles[0]["by"] == "auto" and profiles[0]["version"] == 1
    diagnosis = next(e for e in persisted if e["type"] == "diagnosis")
    assert diagnosis["version"] == 1 and diagnosis["kind"] == "per_step_overhead"
    # the static analysis is made at the production shape (8192x8192 in 64x256 blocks),
    # and the diagnosis says so
    assert diagnosis["evidence"]["steps"] == 128 * 32
    assert diagnosis["evidence"]["step_overhead_share"] > 0.25
    assert diagnosis["evidence"]["shape"] == "at the production shape (8192x8192)"
    assert diagnosis["summary"].startswith("at the production shape (8192x8192): ")
    # The next request carries it, in the prompt too, and the offline move follows it.
    request = agent.requests[0]
    assert request.diagnosis["kind"] == "per_step_overhead"
    assert "## Diagnosis of v1 (static analysis + TPU compiler figures)" in turn_text(request)
    proposal = next(e for e in persisted if e["type"] == "agent.proposal")
    # Every tunable at once to its largest value that is distinct at the production shape
    # (8192x8192, which the tuner aims at; at the 128x512 check shape they would clamp to
    # one block), where the plain tuner would move one tunable at a time.
    assert proposal["tuning"] == {"BLOCK_ROWS": 512, "BLOCK_COLS": 2048}
    assert "from the diagnosis" in proposal["summary"] and "per step overhead" in \
        proposal["rationale"]
    assert types(seen).index("diagnosis") < types(seen).index("agent.proposal")
    # The report shows the chain: diagnosis, change, gain, cumulative gain.
    report = markdown(load(c.log.path), c.state)
    chain = report.split("## Profile → diagnose → optimize", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in chain.splitlines() if line.startswith("| v2 (from v1)"))
    assert "per_step_overhead (v1)" in row and "from the diagnosis" in row
    v1, v2 = c.state.versions[1].rank.value, c.state.versions[2].rank.value
    assert f"{v2 / v1:.2f}x" in row  # the one speedup formatter (kernels.judge.rank.times)
    assert_replay_matches(c)
    await c.close()


# -- lessons ---------------------------------------------------------------------------

async def test_lessons_are_written_at_session_end_and_read_by_the_next_session(
        tmp_path: Path, gelu: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TILEWRIGHT_DATA_DIR", str(tmp_path / "data"))
    agent = ScriptedAgent([kernel(src(speedup=1.0, tag="a")), kernel(src(speedup=2.0, tag="b"))])
    c, seen = make(tmp_path / "s1", gelu, agent, MarkedJudge(),
                   ControllerSettings(propose_after_run=False))
    await c.start()
    for _ in range(2):
        c.request_proposal("implement")
        await c.wait_idle()
        c.approve()
        await c.wait_idle()
    await c.close("user quit")
    lessons = memory.list_lessons()
    assert len(lessons) == 1 and lessons[0].source == "session"
    assert lessons[0].family == c.brief.family and lessons[0].chip == "cpu"
    assert "at est. 2.00x vs est. 1.00x" in lessons[0].text and lessons[0].outcome == "helped"
    marker = [e for e in seen if e["type"] == "marker" and e.get("label") == "lesson"]
    assert marker and types(seen)[-1] == "session.end"
    # The next session's request for the same family and chip carries it.
    nxt, _ = make(tmp_path / "s2", gelu, ScriptedAgent(), MarkedJudge())
    await nxt.start()
    request = build_request(nxt.state, nxt.log, nxt.brief, "tune", None, "cpu")
    assert lessons[0].text in turn_text(request)
    await nxt.close()
    # Switched off: nothing more is written.
    off, _ = make(tmp_path / "s3", gelu, ScriptedAgent([kernel(src(speedup=3.0, tag="c")),
                                                       kernel(src(speedup=4.0, tag="d"))]),
                  MarkedJudge(), ControllerSettings(propose_after_run=False,
                                                        record_lessons=False))
    await off.start()
    for _ in range(2):
        off.request_proposal("implement")
        await off.wait_idle()
        off.approve()
        await off.wait_idle()
    await off.close()
    assert len(memory.list_lessons()) == 1
