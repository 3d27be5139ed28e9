"""After autonomous mode the best version is current; a converged agent is said once and
in words; a question never replaces a pending proposal; an edited proposal's version
says what the person changed; rejection notes bind the offline agent. Pure logic: the
in-process ``MarkedJudge`` of test_controller."""

from __future__ import annotations

from pathlib import Path

import pytest
from controllers import NO_LIMITS, assert_replay_matches, make, src
from judges import MarkedJudge
from scripted_agent import ScriptedAgent, kernel

from tilewright import agents
from tilewright.agents.base import AgentRequest, Finished, Proposal
from tilewright.agents.offline import decide
from tilewright.kernels.tasks.loaders import load_task
from tilewright.kernels.tasks.task import Task
from tilewright.sessions.autonomy import Budgets, ControllerSettings, stop_words
from tilewright.sessions.control.controller import ControllerError
from tilewright.sessions.edits import describe_edit

ASYNC = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def gelu() -> Task:
    return load_task("gelu", {"rows": "64", "cols": "256"})


@ASYNC
async def test_autonomous_mode_ends_on_the_best_version(tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([kernel(src(speedup=s, tag=str(i)), f"try {i}")
                           for i, s in enumerate([2.0, 1.2, 1.1])])
    settings = ControllerSettings(budgets=Budgets(iterations=3, tokens=None, cost_usd=None,
                                                  wall_s=None))
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(), settings)
    await c.start()
    c.set_mode("auto")
    await c.wait_idle()
    assert c.state.best == 2 and c.state.current == 2  # not v4, the last one tried
    checkout = [e for e in seen if e["type"] == "kernel.checkout"]
    assert checkout and checkout[-1]["version"] == 2 and checkout[-1]["by"] == "auto"
    assert_replay_matches(c)
    await c.close()


@ASYNC
async def test_a_finished_agent_is_not_asked_again_and_auto_says_why(tmp_path: Path,
                                                                      gelu: Task) -> None:
    agent = ScriptedAgent([Finished("offline agent: tuning converged at BLOCK_ROWS=128.")])
    c, seen = make(tmp_path, gelu, agent, MarkedJudge())
    await c.start()
    c.run()
    await c.wait_idle()
    c.run()  # the same version again: the agent is not asked to repeat itself
    await c.wait_idle()
    assert len(agent.requests) == 1
    assert [e["type"] for e in seen].count("agent.finished") == 1
    with pytest.raises(ControllerError, match="would stop at once: tuning converged"):
        c.set_mode("auto")
    assert c.state.mode == "step"
    await c.close()


@ASYNC
async def test_a_question_never_replaces_a_pending_proposal(tmp_path: Path,
                                                            gelu: Task) -> None:
    agent = ScriptedAgent([kernel(src(tag="first"), "first"), kernel(src(tag="2nd"), "second")])
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(),
                   ControllerSettings(propose_after_run=False))
    await c.start()
    c.request_proposal()
    await c.wait_idle()
    assert c.state.pending == "p1"
    c.user_message("why is this faster?")
    await c.wait_idle()
    assert c.state.pending == "p1" and list(c.state.proposals) == ["p1"]
    said = [e for e in seen if e["type"] == "agent.message"][-1]
    assert "“second”" in said["text"] and "p1 is still waiting" in said["text"]
    assert_replay_matches(c)
    await c.close()


@ASYNC
async def test_an_edited_proposal_says_what_the_person_changed(tmp_path: Path,
                                                               gelu: Task) -> None:
    proposed = "BLOCK_ROWS = 512\n" + src(tag="agent")
    agent = ScriptedAgent([kernel(proposed, "bigger rows")])
    c, _ = make(tmp_path, gelu, agent, MarkedJudge(),
                ControllerSettings(propose_after_run=False))
    await c.start()
    c.request_proposal()
    await c.wait_idle()
    c.edit(proposed.replace("512", "256"))
    await c.wait_idle()
    summary = c.state.versions[2].summary
    assert summary.startswith("edited by the user: 1 line changed at module level")
    assert "(proposal p1: bigger rows)" in summary
    assert_replay_matches(c)
    await c.close()


def test_edit_descriptions_name_tunables_and_functions() -> None:
    before = ('BLOCK_ROWS = 512\nTUNABLES = {"BLOCK_ROWS": [128, 256, 512]}\n'
              "def _body(x):\n    return x + 1\n")
    after = before.replace("= 512", "= 256").replace("x + 1", "x + 2")
    assert describe_edit(before, after) == "BLOCK_ROWS 512 -> 256; 1 line changed in _body"
    assert describe_edit(before, before) == "no change to the proposal"


def test_stop_reasons_in_words() -> None:
    settings = ControllerSettings(budgets=Budgets(iterations=8, tokens=None, cost_usd=2.0,
                                                  wall_s=None))
    assert stop_words("budget:iterations", settings) == "its iteration budget (8) is used up"
    assert stop_words("budget:cost", settings) == "its cost budget ($2) is used up"
    assert stop_words("agent_finished") == "the agent has nothing more to try"
    assert stop_words("something_new") == "something new"
    assert NO_LIMITS.iterations is None


def _estimated(speedup: float) -> dict:
    """A history entry's rank: the TPU compiler's estimate against a 1 ms reference."""
    from tilewright.kernels.judge.rank import Rank

    return Rank("tpu_estimate", speedup, "v5e", kernel_s=1e-3 / speedup).to_json()


def test_a_rejection_note_binds_the_offline_agent() -> None:
    """"keep BLOCK_ROWS at 256 or above" after `tune BLOCK_ROWS 512 -> 128` was
    rejected: the agent proposes neither 128 again nor anything below 256."""
    task = load_task("softmax")
    source = task.starting_source().replace("BLOCK_ROWS = 32", "BLOCK_ROWS = 512")
    history = ({"version": 1, "status": "correct", "rank": _estimated(1.0), "summary": "start",
                "tunables": {"BLOCK_ROWS": 512}},)
    last = {"status": "correct", "tpu": {"chip": "v5e", "estimated_speedup": 1.0,
                                         "kernel_time_s": 1e-3}}
    rejected = ({"proposal": "p1", "kind": "tuning", "summary": "tune BLOCK_ROWS 512 -> 128",
                 "tuning": {"BLOCK_ROWS": 128}, "config": {"BLOCK_ROWS": 128},
                 "note": "keep BLOCK_ROWS at 256 or above", "by": "user"},)
    bound = decide(AgentRequest("tune", agents.brief(task), source, 1, last_eval=last,
                                history=history, rejected=rejected))
    assert isinstance(bound, Proposal) and bound.tuning == {"BLOCK_ROWS": 256}
    # Without the note, the tuner steps down to the next value below 512 (256) too; so
    # a tighter note must stop it instead of re-proposing what was refused.
    rejected_again = (*rejected, {"proposal": "p2", "kind": "tuning", "summary": "x",
                                  "tuning": {"BLOCK_ROWS": 256}, "config": {"BLOCK_ROWS": 256},
                                  "note": "no: BLOCK_ROWS >= 512", "by": "user"})
    stopped = decide(AgentRequest("tune", agents.brief(task), source, 1, last_eval=last,
                                  history=history, rejected=rejected_again))
    assert isinstance(stopped, Finished), stopped


def test_a_diagnosis_asking_for_larger_blocks_widens_the_choices() -> None:
    """Every declared choice measured, the best at the largest, and the profile says the
    step overhead dominates: a proposal that widens TUNABLES, not a stop."""
    from tilewright.kernels.source import tunables

    task = load_task("softmax")
    source = task.starting_source().replace("BLOCK_ROWS = 32", "BLOCK_ROWS = 512")
    choices = [8, 16, 32, 64, 128, 256, 512]
    history = tuple({"version": i + 1, "status": "correct", "rank": _estimated(1.0 + c / 1000),
                     "summary": f"rows {c}", "tunables": {"BLOCK_ROWS": c}}
                    for i, c in enumerate(choices))
    diagnosis = {"version": 7, "kind": "per_step_overhead",
                 "summary": "32 grid steps: fixed step cost dominates"}
    outcome = decide(AgentRequest("tune", agents.brief(task), source, 7,
                                  last_eval={"status": "correct", "tpu": {
                                      "chip": "v5e", "estimated_speedup": 1.512,
                                      "kernel_time_s": 1e-3 / 1.512}},
                                  history=history, diagnosis=diagnosis))
    assert isinstance(outcome, Proposal) and outcome.kind == "kernel", outcome
    assert outcome.summary.startswith("widen BLOCK_ROWS to 1024")
    declared = tunables.read(outcome.source)
    assert declared["BLOCK_ROWS"][0] == 1024 and declared["BLOCK_ROWS"][1][-2:] == [1024, 2048]
    without = decide(AgentRequest("tune", agents.brief(task), source, 7,
                                  last_eval={"status": "correct", "tpu": {
                                      "chip": "v5e", "estimated_speedup": 1.512,
                                      "kernel_time_s": 1e-3 / 1.512}},
                                  history=history))
    assert isinstance(without, Finished)  # no diagnosis: converged, said in words
    # The production grids say 512 rows already cover the rows axis (256: two blocks a
    # row of the grid, 512: one): no wider block can save a step, so none is proposed.
    grids = {256: [[4, 2]], 512: [[4, 1]]}
    covered = tuple({**h, "numbers": {"grids": grids[h["tunables"]["BLOCK_ROWS"]]}}
                    if h["tunables"]["BLOCK_ROWS"] in grids else h for h in history)
    stopped = decide(AgentRequest("tune", agents.brief(task), source, 7,
                                  last_eval={"status": "correct", "tpu": {
                                      "chip": "v5e", "estimated_speedup": 1.512,
                                      "kernel_time_s": 1e-3 / 1.512}},
                                  history=covered, diagnosis=diagnosis))
    assert isinstance(stopped, Finished), stopped
    # A child of v7 at 256 rows not yet measured (a search's sibling): its grid will say
    # whether 512 already covers the rows, so nothing wider is proposed beside it.
    sibling = {"version": 8, "status": None, "summary": "rows 256", "parent": 7,
               "tunables": {"BLOCK_ROWS": 256}, "awaiting_result": True}

    def beside(row: dict) -> object:
        return decide(AgentRequest("tune", agents.brief(task), source, 7,
                                   last_eval={"status": "correct", "tpu": {
                                       "chip": "v5e", "estimated_speedup": 1.512,
                                       "kernel_time_s": 1e-3 / 1.512}},
                                   history=(*history, row), diagnosis=diagnosis))

    waiting = beside(sibling)
    assert not (isinstance(waiting, Proposal) and waiting.summary.startswith("widen")), waiting
    # its run ended without a result (cancelled, the evaluator failed): nothing is held
    ended = beside({**sibling, "awaiting_result": False})
    assert isinstance(ended, Proposal) and ended.summary.startswith("widen"), ended


def test_blocks_past_the_one_covering_their_grid_axes_are_not_proposed() -> None:
    """18k's convolution (126 output rows): 64 rows ran as grid (128, 2), 128 rows as
    (128, 1). BLOCK_ROWS covers its axis at 128; the search never goes past it (it spent
    two of four evaluations on 256 and 512, the same kernel as 128)."""
    from tilewright.agents.offline import tuner
    from tilewright.kernels.judge.rank import Rank

    rows = [({"BLOCK_ROWS": 128}, [[128, 1]]), ({"BLOCK_ROWS": 64}, [[128, 2]]),
            ({"BLOCK_ROWS": 32}, None)]
    assert tuner.covering(rows, {"BLOCK_ROWS"}) == {"BLOCK_ROWS": 128}
    # the same grid at two sizes says nothing of which axis the tunable tiles
    assert tuner.covering([({"B": 128}, [[4, 1]]), ({"B": 256}, [[4, 1]])], {"B"}) == {}
    # two tunables moved at once: nothing to learn of either
    assert tuner.covering([({"B": 64, "C": 8}, [[2, 2]]), ({"B": 128, "C": 16}, [[1, 1]])],
                          {"B", "C"}) == {}
    # an axis still split at the larger value: not covered
    assert tuner.covering([({"B": 64}, [[4, 8]]), ({"B": 128}, [[4, 4]])], {"B"}) == {}
    space = {"BLOCK_ROWS": [32, 64, 128, 256, 512], "X": [1, 2]}
    assert tuner.within_cover(space, {"BLOCK_ROWS": 128}) == {
        "BLOCK_ROWS": [32, 64, 128], "X": [1, 2]}
    source = ('BLOCK_ROWS = 128\nTUNABLES = {"BLOCK_ROWS": [32, 64, 128, 256, 512]}\n')
    obs = tuner.Observations()
    obs.add({"BLOCK_ROWS": 128}, "correct", Rank.from_json(_estimated(0.73)), None, 1)
    obs.add({"BLOCK_ROWS": 64}, "correct", Rank.from_json(_estimated(0.70)), None, 2)
    assert tuner.next_step(source, obs).config == {"BLOCK_ROWS": 512}  # without the grids
    step = tuner.next_step(source, obs, covered={"BLOCK_ROWS": 128})
    assert step is None or step.config["BLOCK_ROWS"] < 128, step
