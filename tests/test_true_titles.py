"""What a proposal says is what it does.

A tuning's "A -> B" reads A from the version the change is applied to, and that version
is the one the diff is drawn against and the new version's parent. In step mode the shown
version never moves without the person: after a regression the next proposal names the
best version as its base in the chat, and approving it is what builds on that version.
The person's own edit that fails is said to be theirs, with the way back, and the agent
is not asked behind their back. Controller logic with the in-process ``MarkedJudge``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from controllers import assert_replay_matches, make, src
from judges import MarkedJudge
from scripted_agent import ScriptedAgent, kernel

from tilewright.agents.offline import tuner
from tilewright.kernels.judge.rank import Rank
from tilewright.kernels.source import tunables
from tilewright.kernels.tasks.loaders import load_task
from tilewright.kernels.tasks.task import Task
from tilewright.sessions.autonomy import ControllerSettings

SOURCE = """import jax
BLOCK_ROWS = {rows}
TUNABLES = {{"BLOCK_ROWS": [8, 16, 32, 64, 128]}}

def kernel(x):
    return x  # eval: correct {speed} {tag}
"""


def tunable(rows: int, speed: float = 1.0, tag: str = "") -> str:
    return SOURCE.format(rows=rows, speed=speed, tag=tag)


@pytest.fixture(scope="module")
def gelu() -> Task:
    return load_task("gelu", {"rows": "64", "cols": "256"})


def test_a_tuning_from_the_best_names_the_value_of_the_version_it_applies_to() -> None:
    """The finding: "tune BLOCK_ROWS 32 -> 64" while the diff showed 128 -> 64 (the title
    from the best version, the change made to the current one)."""
    obs = tuner.Observations()
    obs.add({"BLOCK_ROWS": 32}, "correct", Rank("tpu_estimate", 2.0, "v5e"), version=1)
    obs.add({"BLOCK_ROWS": 128}, "correct", Rank("tpu_estimate", 1.0, "v5e"), version=2)
    current = tunable(128)  # v2, slower than v1
    step = tuner.next_step(current, obs)
    assert step is not None and step.base == 1
    assert step.summary == "tune BLOCK_ROWS 32 -> 64 on v1 (BLOCK_ROWS=64)"
    assert step.changes == {"BLOCK_ROWS": 64}
    # Applied to v1 the diff is exactly the title's change.
    made = tunables.apply(tunable(32), step.changes)
    removed = [line for line in tunable(32).splitlines() if line not in made.splitlines()]
    added = [line for line in made.splitlines() if line not in tunable(32).splitlines()]
    assert removed == ["BLOCK_ROWS = 32"] and added == ["BLOCK_ROWS = 64"]
    assert "applies to v1" in step.rationale


def test_a_tuning_of_the_current_version_names_no_other_base() -> None:
    obs = tuner.Observations()
    obs.add({"BLOCK_ROWS": 32}, "correct", Rank("tpu_estimate", 2.0, "v5e"), version=1)
    step = tuner.next_step(tunable(32), obs)
    assert step is not None and step.base is None
    assert step.summary == "tune BLOCK_ROWS 32 -> 128 (BLOCK_ROWS=128)"


@pytest.mark.asyncio
async def test_step_mode_never_moves_the_shown_version_after_a_regression(
        tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([kernel(tunable(32, 2.0, "a"), "rows 32"),
                           kernel(tunable(128, 1.5, "b"), "rows 128"),
                           lambda request: kernel(tunable(64, 2.5, "c"), "rows 64")])
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(),
                   ControllerSettings(propose_after_run=False, record_lessons=False))
    await c.start()
    for _ in range(2):
        c.request_proposal("tune")
        await c.wait_idle()
        c.approve()
        await c.wait_idle()
    assert c.state.best == 2 and c.state.current == 3  # v3 is slower than v2
    c.request_proposal("tune")
    await c.wait_idle()
    # Nothing moved: no checkout by auto, the shown version is still v3.
    assert not [e for e in seen if e["type"] == "kernel.checkout"]
    assert c.state.current == 3
    request = agent.requests[-1]
    assert request.current_version == 2 and "slower than v2" in (request.base_reason or "")
    prop = c.state.pending_proposal
    assert prop is not None and prop.base_version == 2 and prop.base_chosen
    said = [e for e in seen if e["type"] == "agent.message" and e.get("proposal") == prop.id]
    assert said and f"{prop.id} applies to v2, not the shown v3" in said[-1]["text"]
    assert "reject to stay on v3" in said[-1]["text"]
    c.approve()
    await c.wait_idle()
    assert c.state.versions[4].parent == 2 and c.state.current == 4
    assert_replay_matches(c)
    await c.close()


@pytest.mark.asyncio
async def test_step_mode_rejecting_the_move_back_stays(tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([kernel(tunable(32, 2.0, "a")), kernel(tunable(128, 1.5, "b")),
                           kernel(tunable(64, 2.5, "c"))])
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(),
                   ControllerSettings(propose_after_run=False, record_lessons=False))
    await c.start()
    for _ in range(2):
        c.request_proposal("tune")
        await c.wait_idle()
        c.approve()
        await c.wait_idle()
    c.request_proposal("tune")
    await c.wait_idle()
    c.reject()
    await c.wait_idle()
    assert c.state.current == 3 and not [e for e in seen if e["type"] == "kernel.checkout"]
    await c.close()


@pytest.mark.asyncio
async def test_the_persons_failing_edit_is_theirs_with_the_way_back(
        tmp_path: Path, gelu: Task) -> None:
    agent = ScriptedAgent([kernel(src(speedup=2.0, tag="fixed"))])
    c, seen = make(tmp_path, gelu, agent, MarkedJudge(),
                   ControllerSettings(record_lessons=False))
    await c.start()
    c.edit(src("compile_error", tag="mine"))
    await c.wait_idle()
    v2 = c.state.versions[2]
    assert v2.origin == "user-edit" and v2.status == "compile_error"
    assert not agent.requests and c.state.pending is None  # the agent was not asked
    notices = [e["text"] for e in seen if e["type"] == "notice"]
    told = [t for t in notices if t.startswith("v2 (your edit) does not compile")]
    assert told and "Edit it again, go back to v1 (History" in told[0]
    assert not [e for e in seen if e["type"] == "error" and e.get("where") == "agent"]
    await c.close()


# -- trust beside the numbers -----------------------------------------------------------

def floored(value: float, alone: float, cycles: int) -> dict:
    """An eval JSON whose estimate the memory floor decided (its cycles alone say less)."""
    return {"status": "correct", "tpu": {
        "chip": "v5e", "compile": "ok", "estimated_speedup": value, "basis": "memory_floor",
        "compiler_speedup": alone, "kernel_time_s": 1e-3 / value, "shape_label": "4096x4096",
        "estimate": {"cycles": cycles, "seconds": cycles / 1.5e9},
        "fidelity": {"class": "memory_bound", "chip": "v5e", "median_ratio": 0.9,
                     "within_2x": 1.0, "rows": 12}}}


def test_an_estimate_the_floor_decided_says_so_with_both_figures() -> None:
    from tilewright.kernels.judge.rank import ranking, times

    rank = ranking(floored(4.000648498535156, 1.7198, 184_352))
    words = rank.words()
    assert words.startswith("est. 4.00x on v5e at 4096x4096")
    assert "(TPU compiler, memory floor; cycles alone 1.72x)" in words
    assert rank.floor_words() == ("the memory floor decided it (est. 4.00x); the compiler's "
                                  "cycles alone say 1.72x")
    assert "memory-bound v5e: median 0.90 of measured, 12 programs" in rank.trust_words()
    assert times(4.000648498535156) == "4.00x" and times(None) == "-"


def test_the_workbench_result_line_carries_the_trust() -> None:
    from tilewright.tui.session.presenter import describe_result

    event = {"type": "run.result", "version": 3, "status": "correct", "correct": True,
             "rank": ranking_json(floored(4.0, 1.72, 184_352))}
    text, severity = describe_result(event)  # type: ignore[arg-type]
    assert severity == "information"
    assert text.startswith("v3 correct · est. 4.00x")
    assert "memory floor; cycles alone 1.72x" in text
    assert "trust: memory-bound v5e: median 0.90 of measured" in text


def ranking_json(result: dict) -> dict:
    from tilewright.kernels.judge.rank import ranking

    return ranking(result).to_json()


def test_the_tuner_says_when_the_floor_hides_a_difference() -> None:
    from tilewright.agents.offline import floor_note
    from tilewright.kernels.judge.rank import ranking

    obs = tuner.Observations()
    for version, rows, cycles in ((1, 32, 184_352), (2, 64, 190_000), (3, 128, 317_079)):
        obs.add({"BLOCK_ROWS": rows}, "correct", ranking(floored(4.0, 1.7, cycles)),
                version=version)
    best = obs.best()
    assert best is not None and obs.version[best[0]] == 1  # fewest cycles wins the tie
    note = floor_note(obs)
    assert "3 configurations tie at est. 4.00x on the memory floor" in note
    assert "v1: 184,352 cycles" in note and note.index("v1") < note.index("v3")


def test_replay_verify_writes_a_speedup_band_with_the_one_formatter() -> None:
    from tilewright.sessions.recorded.replay import _figure

    band = ("estimated_speedup", 3.6005, 4.4)
    assert _figure(band, 4.000648498535156) == "4.00x"  # not 4.000648498535156
    assert _figure(("kernel_time_s", 1e-3, 2e-3), 0.0012345678) == "0.001235"
    assert _figure(band, None) == "-"


def test_a_tuning_proposal_says_when_the_floor_hides_a_difference() -> None:
    from tilewright.agents import brief
    from tilewright.agents.base import AgentRequest, Proposal
    from tilewright.agents.offline import decide
    from tilewright.kernels.judge.rank import ranking

    task = load_task("gelu", {"rows": "1024", "cols": "1024"})
    source = task.starting_source()
    current = tunables.config_of(source)
    rows = [current["BLOCK_ROWS"], 128, 256]
    assert len(set(rows)) == 3
    history = tuple({"version": i + 1, "status": "correct",
                     "rank": ranking(floored(4.0, 1.7, 184_352 + 1000 * i)).to_json(),
                     "tunables": {**current, "BLOCK_ROWS": r}} for i, r in enumerate(rows))
    request = AgentRequest("tune", brief(task), source, 1, history=history,
                           last_eval={"status": "correct"})
    proposal = decide(request)
    assert isinstance(proposal, Proposal) and proposal.kind == "tuning"
    assert "Note: 3 configurations tie at est. 4.00x on the memory floor" in proposal.rationale
