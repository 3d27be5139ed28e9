"""The offline agent takes the person's words: a rejection note or ``/plan``
text shapes the next proposal (sizes, directions, named techniques) and the reply says
what it took; a VMEM fix never repeats a size already measured not to fit. Pure: the
agent's ``decide`` on requests as the controller builds them."""

from __future__ import annotations

from typing import Any

import pytest

from tilewright.agents import brief
from tilewright.agents.base import AgentRequest, Proposal
from tilewright.agents.offline import decide, words
from tilewright.kernels.judge.rank import Rank
from tilewright.kernels.source import tunables
from tilewright.kernels.tasks.loaders import load_task


def est(speedup: float) -> dict[str, Any]:
    return Rank("tpu_estimate", speedup, "v5e", kernel_s=1e-3 / speedup).to_json()


@pytest.fixture(scope="module")
def gelu():
    return load_task("gelu", {"rows": "1024", "cols": "1024"})


def _start(task) -> str:
    return task.starting_source()


def test_a_rejection_note_naming_a_size_is_the_next_proposal(gelu) -> None:
    source = _start(gelu)
    current = tunables.config_of(source)
    assert "BLOCK_ROWS" in current and current["BLOCK_ROWS"] != 256
    history = ({"version": 1, "status": "correct", "rank": est(1.0), "tunables": current},)
    request = AgentRequest("tune", brief(gelu), source, 1, history=history,
                           notes=("rejected p1: try 256 rows instead",),
                           last_eval={"status": "correct"})
    proposal = decide(request)
    assert isinstance(proposal, Proposal)
    made = tunables.config_of(tunables.apply(source, proposal.tuning)) \
        if proposal.kind == "tuning" else tunables.config_of(proposal.source)
    assert made["BLOCK_ROWS"] == 256  # on main: the tuner's own next step (16)
    assert proposal.summary.startswith(f"tune BLOCK_ROWS {current['BLOCK_ROWS']} -> 256")
    assert "You said “try 256 rows instead”; took: BLOCK_ROWS = 256" in proposal.rationale


def test_a_direction_moves_one_legal_notch(gelu) -> None:
    source = _start(gelu)
    current = tunables.config_of(source)
    request = AgentRequest("tune", brief(gelu), source, 1,
                           history=({"version": 1, "status": "correct", "rank": est(1.0),
                                     "tunables": current},),
                           notes=("rejected p2: smaller rows",), last_eval={"status": "correct"})
    proposal = decide(request)
    assert isinstance(proposal, Proposal) and proposal.kind == "tuning"
    assert proposal.tuning["BLOCK_ROWS"] < current["BLOCK_ROWS"]
    assert "took: smaller BLOCK_ROWS" in proposal.rationale


def test_a_size_already_measured_is_said_and_not_repeated(gelu) -> None:
    source = _start(gelu)
    current = tunables.config_of(source)
    tried = {**current, "BLOCK_ROWS": 256}
    history = ({"version": 1, "status": "correct", "rank": est(1.0), "tunables": current},
               {"version": 2, "status": "correct", "rank": est(0.5), "tunables": tried})
    request = AgentRequest("tune", brief(gelu), source, 1, history=history,
                           notes=("rejected p3: try 256 rows instead",),
                           last_eval={"status": "correct"})
    proposal = decide(request)
    assert isinstance(proposal, Proposal)
    assert "was tried already (v2, est. 0.50x" in proposal.rationale
    made = tunables.config_of(tunables.apply(source, proposal.tuning or {}))
    assert made != tried


def test_plan_text_naming_a_technique_is_answered_not_ignored(gelu) -> None:
    source = _start(gelu)
    request = AgentRequest("plan", brief(gelu), source, 1,
                           user_message="fuse the reciprocal")
    proposal = decide(request)
    assert isinstance(proposal, Proposal) and proposal.kind == "plan"
    assert proposal.plan.startswith("You asked: “fuse the reciprocal”. Taken: fusion; reciprocal.")
    assert "no rule for fusion, reciprocal" in proposal.plan
    assert "no rule for fusion, reciprocal" in proposal.summary


def test_plan_text_with_a_size_puts_it_first(gelu) -> None:
    source = _start(gelu)
    request = AgentRequest("plan", brief(gelu), source, 1,
                           user_message="go to 512 rows, then tune")
    proposal = decide(request)
    assert isinstance(proposal, Proposal) and proposal.kind == "plan"
    assert "0. First, as you asked: tune BLOCK_ROWS" in proposal.plan and "-> 512" in proposal.plan


def test_words_read_sizes_directions_and_leave_bounds_to_the_tuner() -> None:
    names = ["BLOCK_ROWS", "BLOCK_COLS"]
    assert words.read(["try 256 rows instead"], names).sizes == {"BLOCK_ROWS": 256}
    assert words.read(["use 512 columns"], names).sizes == {"BLOCK_COLS": 512}
    assert words.read(["smaller blocks"], names).directions == {"BLOCK_ROWS": "down",
                                                                "BLOCK_COLS": "down"}
    assert not words.read(["keep BLOCK_ROWS at 512 or above"], names)
    assert not words.read(["BLOCK_COLS <= 256"], names)
    assert words.read(["try 64"], ["BLOCK_ROWS"]).sizes == {"BLOCK_ROWS": 64}


def test_a_vmem_fix_never_repeats_a_size_known_not_to_fit() -> None:
    task = load_task("matmul_bias_gelu")
    source = tunables.apply(task.starting_source(), {"BLOCK_M": 1024, "BLOCK_N": 256})
    declared = tunables.read(source)
    vmem = {"status": "compile_error", "error": {"kind": "compile", "message":
            "RESOURCE_EXHAUSTED: exceeded scoped vmem limit"}}
    base = tunables.config_of(source)
    # A smaller configuration ran out of VMEM before: the one-notch shrink of the largest
    # block (BLOCK_M 1024 -> 512, with BLOCK_N 256) is at least as large in every block.
    assert declared["BLOCK_N"][0] == 256 and base["BLOCK_K"] == 128
    small_fail = {**base, "BLOCK_M": 512, "BLOCK_N": 128, "BLOCK_K": 128}
    history = ({"version": 1, "status": "compile_error", "rank": None, "tunables": small_fail,
                "numbers": {"compile": "error", "tpu_message": "exceeded scoped vmem limit"}},)
    request = AgentRequest("fix", brief(task), source, 2, last_eval=vmem, history=history)
    proposal = decide(request)
    assert isinstance(proposal, Proposal) and proposal.tuning, proposal
    made = {**base, **proposal.tuning}
    assert not all(made[k] >= small_fail[k] for k in made), made
    assert proposal.summary.startswith("shrink BLOCK_M 1024 -> 256")
    assert "would not fit either (v1 with" in proposal.rationale
