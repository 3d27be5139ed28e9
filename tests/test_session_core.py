"""``sessions.core``: the acts the controller and the search share, and the approval
policies, each on a real session log with the in-process ``MarkedJudge`` (the verdict
is a marker in the source, so every figure is exact)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from judges import MarkedJudge
from scripted_agent import ScriptedAgent
from sizes import load_small
from waiting import until

from tilewright.agents import brief
from tilewright.agents.base import Proposal
from tilewright.kernels.tasks.task import Task
from tilewright.sessions.autonomy import Budgets, ControllerSettings
from tilewright.sessions.core import (
    AutoApproval,
    Decision,
    Halt,
    JudgeFailed,
    PersonApproval,
    SearchRules,
    SessionCore,
)
from tilewright.sessions.errors import ApprovalRequired
from tilewright.sessions.log import SessionLog, load
from tilewright.sessions.search.graph import fold_search
from tilewright.sessions.state import fold

pytestmark = pytest.mark.asyncio(loop_scope="module")

TUNED = ('BLOCK_ROWS = 8\nTUNABLES = {"BLOCK_ROWS": [8, 16]}\n\n'
         "def kernel(x):\n    return x  # eval: correct 1.5\n")


@pytest.fixture(scope="module")
def gelu() -> Task:
    return load_small("gelu", rows=64, cols=256)


def open_core(tmp_path: Path, task: Task, judge: object | None = None) -> SessionCore:
    log = SessionLog.create(tmp_path, task={"name": task.name}, backend=None, agent="x",
                            app_version="test")
    state = fold(log.header, [])
    return SessionCore(log, state, task, brief(task), ScriptedAgent(),
                       judge or MarkedJudge(), chip="v5e")  # type: ignore[arg-type]


def propose(core: SessionCore, source: str | None, *, kind: str = "kernel",
            base: int | None = 1, tuning: dict | None = None) -> str:
    return core.propose(Proposal(kind, f"{kind} proposal", source=source,  # type: ignore[arg-type]
                                 tuning=tuning), role="tune", base=base)


def types(core: SessionCore) -> list[str]:
    return [e["type"] for e in load(core.log.path).events]


async def test_seed_decide_apply_evaluate_is_one_chain(tmp_path: Path, gelu: Task) -> None:
    core = open_core(tmp_path, gelu)
    assert core.seed() == 1 and core.seed() is None  # once: a session has its v1
    pid = propose(core, "def kernel(x):\n    return x  # eval: correct 2.5\n")
    with pytest.raises(ApprovalRequired):
        core.apply(pid, 1)  # no decision, no version
    person = PersonApproval()
    waiting = asyncio.ensure_future(core.decide(pid, person))
    await until(lambda: person.awaiting() == [pid], "the person to be asked")
    person.resolve(pid, Decision("approve", "user"))
    assert await waiting == Decision("approve", "user") and person.awaiting() == []
    with pytest.raises(ValueError, match="not awaiting"):
        person.resolve(pid, Decision("approve", "user"))
    number = core.apply(pid, 1)
    assert number == 2 and core.session.versions[2].decision_seq is not None
    result = await core.evaluate(2, "user")
    assert not isinstance(result, JudgeFailed) and result.rank.value == 2.5
    rank = core.session.versions[2].rank  # what the run.result recorded, folded
    assert rank is not None and (rank.source, rank.value, rank.chip) == ("tpu_estimate", 2.5,
                                                                         "v5e")
    assert types(core)[-5:] == ["agent.proposal", "user.decision", "kernel.version",
                                "run.start", "run.result"]
    with pytest.raises(ValueError, match="not the next one"):
        core.propose(Proposal("kernel", "late"), role="tune", base=2, pid="p1")
    core.close()


async def test_the_gate_holds_for_evaluate_and_profile(tmp_path: Path, gelu: Task) -> None:
    judge = MarkedJudge()
    core = open_core(tmp_path, gelu, judge)
    core.emit({"type": "kernel.version", "version": 1, "parent": None,  # type: ignore[arg-type]
               "origin": "agent", "proposal": None, "source_blob": core.log.put_blob("x = 1\n"),
               "summary": "forged", "decision": None})
    with pytest.raises(ApprovalRequired):
        await core.evaluate(1, "user")
    with pytest.raises(ApprovalRequired):
        await core.profile(1, "user")
    assert judge.sources == [] and "run.start" not in types(core)
    core.close()


class FailingJudge(MarkedJudge):
    async def evaluate(self, *args: object, **kwargs: object):  # type: ignore[override]
        raise RuntimeError("the cluster went away")


async def test_a_failing_judge_and_a_crash_are_settled_by_the_core(tmp_path: Path,
                                                                   gelu: Task) -> None:
    core = open_core(tmp_path, gelu, FailingJudge())
    core.seed()
    # Run numbers follow the highest recorded one, whatever came before.
    core.emit({"type": "run.start", "run": "r3", "version": 1, "kind": "eval",  # type: ignore[arg-type]
               "by": "user"})
    assert core.settle_open_runs() == ["r3"]
    assert core.session.runs["r3"].interrupted and core.settle_open_runs() == []
    failed = await core.evaluate(1, "search", where="executor")
    assert failed == JudgeFailed("the cluster went away")
    events = load(core.log.path).events
    assert events[-3]["run"] == "r4"
    assert (events[-2]["status"], events[-2]["cancelled"]) == ("error", False)
    assert events[-1]["where"] == "executor" and "cluster" in events[-1]["message"]
    assert core.session.versions[1].status is None  # an error measures nothing
    core.close()


async def test_a_cancelled_evaluation_is_recorded_cancelled(tmp_path: Path, gelu: Task) -> None:
    gate = asyncio.Event()
    core = open_core(tmp_path, gelu, MarkedJudge(gate))
    core.seed()
    job = asyncio.ensure_future(core.evaluate(1, "user"))
    await until(lambda: any(r.status is None for r in core.session.runs.values()),
                "the run to start")
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    last = load(core.log.path).events[-1]
    assert (last["type"], last["status"], last["cancelled"]) == ("run.result", "cancelled", True)
    core.close()


async def test_apply_tunes_the_parent_and_says_why_it_cannot(tmp_path: Path, gelu: Task) -> None:
    core = open_core(tmp_path, gelu)
    core.seed()
    core.record(None, Decision("edit", "user", source=TUNED))
    base = core.new_version(TUNED, origin="user-edit", proposal=None, summary="tunable")
    pid = propose(core, None, kind="tuning", base=base, tuning={"BLOCK_ROWS": 16})
    await core.decide(pid, _Always())
    number = core.apply(pid, base)
    assert number is not None and "BLOCK_ROWS = 16" in core.source_of(number)
    assert core.session.versions[number].origin == "tuning"
    empty = propose(core, None)
    await core.decide(empty, _Always())
    assert core.apply(empty, number) is None
    last = load(core.log.path).events[-1]
    assert last["type"] == "error" and last["where"] == "apply" and last["proposal"] == empty
    core.close()


class _Always:
    async def decide(self, state: object, proposal: object) -> Decision:
        return Decision("approve", "user")


async def test_auto_approval_halts_on_a_budget_and_rejects_a_repeat(tmp_path: Path,
                                                                    gelu: Task) -> None:
    core = open_core(tmp_path, gelu)
    core.seed()
    repeat = propose(core, gelu.starting_source())
    settings = ControllerSettings(budgets=Budgets(iterations=None))
    assert await core.decide(repeat, AutoApproval(settings, core.log.now)) is None  # step mode
    core.emit({"type": "mode.change", "mode": "auto", "by": "user"})  # type: ignore[arg-type]
    verdict = await core.decide(repeat, AutoApproval(settings, core.log.now))
    assert isinstance(verdict, Decision) and verdict.decision == "reject"
    assert verdict.by == "auto" and "identical to v1" in (verdict.note or "")
    fresh = propose(core, "def kernel(x):\n    return x + 0  # eval: correct 1.0\n")
    spent = ControllerSettings(budgets=Budgets(cost_usd=0.0))
    before = len(types(core))
    assert await core.decide(fresh, AutoApproval(spent, core.log.now)) == Halt("budget:cost")
    assert len(types(core)) == before  # a halt records nothing
    core.close()


async def test_search_rules_reject_by_rule_and_hand_the_rest_to_the_person(
        tmp_path: Path, gelu: Task) -> None:
    log = SessionLog.create(tmp_path, task={"name": gelu.name}, backend=None, agent="x",
                            app_version="test")
    state = fold_search(log.header, [])
    core = SessionCore(log, state, gelu, brief(gelu), ScriptedAgent(), MarkedJudge(),
                       chip="v5e")  # type: ignore[arg-type]
    core.seed()
    core.emit({"type": "search.start", "config": {"approval": "user"}, "root": 1,  # type: ignore[arg-type]
               "executor": "marked", "agent": "x"})
    person = PersonApproval()
    rules = SearchRules(state, person)
    no_source = propose(core, None)
    verdict = await core.decide(no_source, rules)
    assert isinstance(verdict, Decision) and verdict.by == "auto"
    child = propose(core, "def kernel(x):\n    return x * 1  # eval: correct 1.2\n")
    waiting = asyncio.ensure_future(core.decide(child, rules))
    await until(lambda: person.awaiting() == [child], "the person to be asked")
    person.withdraw(child, "branch v1 pruned")
    assert await waiting == Decision("reject", "user", "branch v1 pruned")
    core.emit({"type": "search.prune", "version": 1, "by": "user", "reason": "x"})  # type: ignore[arg-type]
    pruned = propose(core, "def kernel(x):\n    return x * 2  # eval: correct 1.2\n")
    verdict = await core.decide(pruned, rules)
    assert isinstance(verdict, Decision) and verdict.note == "branch v1 was pruned"
    core.close()
