"""A proposal that is a measured version's program at the production shape is not
evaluated again: the judge says which program a source is (``EvalOptions.identity_only``,
a trace, nothing compiled), autonomous mode and the search reject the proposal before
it spends an evaluation, and the offline tuner takes that version's number for it.

On a v5e the offline agent's ``auto`` on MaxKernel's 29k spent three of four evaluations
on block sizes its fused kernel clamps back to the same program (each 3.799 ms)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from judges import MarkedJudge
from scripted_agent import ScriptedAgent

from tilewright import agents
from tilewright.agents.base import AgentRequest, Proposal
from tilewright.agents.offline import tuner, tuning
from tilewright.kernels.judge.options import EvalOptions
from tilewright.kernels.judge.rank import Rank
from tilewright.kernels.tasks.loaders import load_task
from tilewright.sessions.autonomy import Budgets, ControllerSettings
from tilewright.sessions.control.agent_request import rejected
from tilewright.sessions.core import AutoApproval, Decision, SessionCore
from tilewright.sessions.log import SessionLog, load
from tilewright.sessions.state import fold

ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")

REFERENCE = """
    import jax
    def make_inputs(key, rows, cols):
        return (jax.random.normal(key, (rows, cols)),)
    def reference(x):
        return 2.0 * x
"""


def doubling(block: int, index: str = "(i, 0)") -> str:
    """A kernel whose row block is ``min(BLOCK_ROWS, rows)``: any BLOCK_ROWS of at least
    the task's rows is the same program."""
    return textwrap.dedent(f"""
        import jax
        from jax.experimental import pallas as pl

        BLOCK_ROWS = {block}
        TUNABLES = {{"BLOCK_ROWS": [16, 32, 64, 128, 256]}}

        def _body(x_ref, o_ref):
            o_ref[...] = x_ref[...] * 2.0

        def kernel(x):
            rows = min(BLOCK_ROWS, x.shape[0])
            steps = x.shape[0] // rows
            spec = pl.BlockSpec((rows, x.shape[1]), lambda i: {index})
            return pl.pallas_call(_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                  grid=(steps,), in_specs=[spec], out_specs=spec)(x)
    """)


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Any:
    root = tmp_path_factory.mktemp("same_program") / "double"
    root.mkdir()
    (root / "task.toml").write_text('name = "double"\natol = 1e-5\nrtol = 1e-5\n'
                                    '[shapes.small]\nrows = 64\ncols = 256\n')
    (root / "reference.py").write_text(textwrap.dedent(REFERENCE))
    return load_task(str(root), {})


@ON_MODULE_LOOP
async def test_the_judge_says_which_program_a_source_is(worker_pool, task) -> None:
    """Two block sizes the kernel clamps to the task's 64 rows are one program; a smaller
    block, or the same blocks walked in another order (an index map the printed jaxpr
    leaves out), is another. Nothing is compiled: no ``tpu`` section comes back."""
    options = EvalOptions(timeout_s=120.0, chip="v5e", identity_only=True)
    found = {}
    for name, source in {"128": doubling(128), "256": doubling(256), "32": doubling(32),
                         "32 reversed": doubling(32, "(1 - i, 0)")}.items():
        reply = await worker_pool.estimate(task, source, options)
        assert reply["status"] == "ok" and reply["tpu"] is None, reply
        found[name] = reply["program"]
    assert found["128"] == found["256"]
    assert len({found["128"], found["32"], found["32 reversed"]}) == 3
    broken = await worker_pool.estimate(task, doubling(128).replace("* 2.0", "* y"), options)
    assert broken["status"] == "compile_error" and broken.get("program") is None


def open_core(tmp_path: Path, judge: MarkedJudge) -> SessionCore:
    gelu = load_task("gelu")
    log = SessionLog.create(tmp_path, task={"name": gelu.name}, backend=None, agent="x",
                            app_version="test")
    return SessionCore(log, fold(log.header, []), gelu, agents.brief(gelu), ScriptedAgent(),
                       judge, chip="v5e")  # type: ignore[arg-type]


class _Approve:
    async def decide(self, state: object, proposal: object) -> Decision:
        return Decision("approve", "user")


def tuned(block: int, program: str) -> str:
    return (f'BLOCK_ROWS = {block}\nTUNABLES = {{"BLOCK_ROWS": [8, 16, 32]}}\n\n'
            f"def kernel(x):\n    return x  # eval: correct 1.5  # program: {program}\n")


@ON_MODULE_LOOP
async def test_autonomous_mode_rejects_a_measured_program_before_it_runs(tmp_path) -> None:
    """The rejection names the version, records ``same_as``, runs nothing, and does not
    count as the agent repeating itself; another program is approved."""
    judge = MarkedJudge()
    core = open_core(tmp_path, judge)
    core.seed()  # v1, the task's own kernel: never evaluated here, so never matched
    written = core.propose(Proposal("kernel", "a tunable kernel", source=tuned(8, "A")),
                           role="tune", base=1)
    await core.decide(written, _Approve())
    first = core.apply(written, 1)
    assert first == 2
    await core.evaluate(first, "user")
    core.emit({"type": "mode.change", "mode": "auto", "by": "user"})  # type: ignore[arg-type]
    approver = AutoApproval(ControllerSettings(budgets=Budgets(iterations=None)),
                            core.log.now, same_as=core.same_program)
    # a tuning as autonomous mode gets it: no source, the change applied to its base
    same = core.propose(Proposal("tuning", "BLOCK_ROWS 8 -> 16", tuning={"BLOCK_ROWS": 16}),
                        role="tune", base=first)
    verdict = await core.decide(same, approver)
    assert isinstance(verdict, Decision) and verdict.decision == "reject"
    assert verdict.same_as == first and f"same program at the production shape as v{first}" \
        in (verdict.note or "")
    assert judge.sources == [tuned(8, "A")]  # only v1 was evaluated
    decision = [e for e in load(core.log.path).events if e["type"] == "user.decision"][-1]
    assert decision["same_as"] == first and decision["by"] == "auto"
    state = core.session
    assert state.same_program_rejections == 1 and state.auto_rejections == 0
    assert rejected(state, lambda sha: core.log.get_blob(sha).decode())[-1]["same_as"] == first
    other = core.propose(Proposal("tuning", "BLOCK_ROWS 8 -> 32", source=tuned(32, "B"),
                                  tuning={"BLOCK_ROWS": 32}), role="tune", base=first)
    assert await core.decide(other, approver) == Decision("approve", "auto")
    assert state.same_program_rejections == 0
    # a tuning that cannot apply is no "same program as its base": the rule says nothing
    # and applying it says what is wrong
    broken = core.propose(Proposal("tuning", "BLOCK_Q 8 -> 16", tuning={"BLOCK_Q": 16}),
                          role="tune", base=first)
    assert await core.same_program(core.session, core.session.proposals[broken]) is None
    # a new kernel that is v2's program is still evaluated: it can be a step of its own
    # (the offline agent declares a user's block sizes as TUNABLES so they can be tuned)
    renamed = core.propose(Proposal("kernel", "a rewrite", source="# renamed\n" + tuned(8, "A")),
                           role="tune", base=first)
    assert await core.decide(renamed, approver) == Decision("approve", "auto")
    # each source was asked once: v1's answer is remembered
    assert sorted(judge.identities) == sorted([tuned(8, "A"), tuned(16, "A"), tuned(32, "B")])
    core.close()


def est(speedup: float) -> dict[str, Any]:
    return Rank("tpu_estimate", speedup, "v5e", kernel_s=1e-3 / speedup).to_json()


def test_the_tuner_takes_the_measured_number_for_a_same_program_rejection() -> None:
    """The rejected configuration is a measured point with v1's number (not a failure),
    never the base of a step, and never proposed again."""
    from tilewright.kernels.source import tunables

    softmax = load_task("softmax")
    source = tunables.apply(softmax.starting_source(), {"BLOCK_ROWS": 128})
    history = ({"version": 1, "status": "correct", "rank": est(1.5),
                "tunables": {"BLOCK_ROWS": 128}},
               {"version": 2, "status": "correct", "rank": est(1.2),
                "tunables": {"BLOCK_ROWS": 64}})
    same = ({"proposal": "p3", "kind": "tuning", "tuning": {"BLOCK_ROWS": 512},
             "config": {"BLOCK_ROWS": 512}, "by": "auto", "note": "the same program",
             "same_as": 1},)
    request = AgentRequest("tune", agents.brief(softmax), source, 2, history=history,
                           chip="v5e", rejected=same)
    obs = tuning.observations(request, source, {"BLOCK_ROWS"})
    alias = tuner.config_key({"BLOCK_ROWS": 512})
    assert obs.score[alias] == obs.score[tuner.config_key({"BLOCK_ROWS": 128})]
    assert obs.score[alias] != tuner.FAILED and alias in obs.aliases
    assert dict(obs.best()[0]) == {"BLOCK_ROWS": 128}
    step = tuner.next_step(source, obs, {"BLOCK_ROWS": (4096,)})
    assert step is None or step.config != {"BLOCK_ROWS": 512}
    # The same entry without ``same_as`` (a person's rejection) is a failure, as before.
    refused = ({**same[0], "same_as": None, "by": "user"},)
    plain = tuning.observations(AgentRequest("tune", agents.brief(softmax), source, 2,
                                             history=history, chip="v5e", rejected=refused),
                                source, {"BLOCK_ROWS"})
    assert plain.score[alias] == tuner.FAILED
    # the tuner's last word counts it apart: not measured, not failed
    assert "1 the same program as one measured (not run)" in tuning.tried_text(request, source)
