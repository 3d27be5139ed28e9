"""``Judgement``: one value per evaluation, written into the session's event once and read
back once, with "crownable" and "failed" asked of it (kernels/judge/judgement.py)."""

from __future__ import annotations

from judges import estimated

from tilewright.kernels.judge.judgement import Judgement
from tilewright.kernels.judge.result import STATUSES, Backend, EvalError, EvalResult
from tilewright.sessions.core.core import finished_result
from tilewright.sessions.state import Version

CPU = Backend("cpu", "tpu-interpret", "cpu", "0.10.2")


def _result(status: str = "correct", flags: tuple[str, ...] = (),
            error: EvalError | None = None) -> EvalResult:
    return EvalResult(status=status, backend=CPU, tpu=estimated("v5e", 1.5, None),
                      timing={"median_ms": 2.0}, integrity={"flags": list(flags)},
                      correctness={"correct": status == "correct"}, error=error)


def test_a_judgement_survives_its_event() -> None:
    result = _result()
    judged = Judgement.of(result)
    event = finished_result("r1", 3, result, "blob")
    assert Judgement.from_event(event) == judged
    assert judged.correct and judged.crownable and not judged.failed
    assert judged.rank is not None and judged.rank.source == "tpu_estimate"
    assert judged.chip == "v5e" and judged.tpu_compile == "ok" and judged.median_ms == 2.0
    assert event["rank"] == judged.rank.to_json() and event["result_blob"] == "blob"


def test_a_disqualifying_flag_keeps_a_correct_kernel_from_the_crown() -> None:
    judged = Judgement.of(_result(flags=("compute_outside_kernel",)))
    assert judged.correct and judged.disqualified and not judged.crownable
    assert judged.rank is not None and judged.rank.disqualified
    shown = Judgement.of(_result(flags=("degenerate_reference",)))  # the task's problem
    assert shown.crownable and not shown.disqualified


def test_a_failure_says_its_kind_and_is_to_be_fixed() -> None:
    error = EvalError(kind="task", message="the reference raised\nTraceback ...", line=4)
    judged = Judgement.of(_result("runtime_error", error=error))
    assert judged.failed and not judged.correct and not judged.crownable
    assert judged.error_kind == "task" and judged.error == "task line 4: the reference raised"
    assert Judgement.from_event(finished_result("r2", 1, _result("runtime_error", error=error),
                                                "b")) == judged
    assert {s for s in STATUSES if Judgement(s).failed} == set(STATUSES) - {"correct"}


def test_an_old_log_gives_what_it_recorded() -> None:
    """A ``run.result`` written before ranks and the compile verdict were recorded."""
    old = {"type": "run.result", "run": "r1", "version": 2, "status": "correct",
           "correct": True, "speedup": 1.3, "rank_source": "tpu_estimate", "chip": "v5e"}
    judged = Judgement.from_event(old)
    assert judged.crownable and judged.rank is not None and judged.rank.value == 1.3
    assert judged.tpu_compile is None and judged.flags == ()


def test_a_version_reads_its_latest_judgement() -> None:
    v = Version(number=1, parent=None, origin="initial", proposal=None, source_blob="s",
                summary="", decision_seq=None, seq=0, t=0.0)
    assert (v.status, v.correct, v.crownable, v.failed, v.rank, v.flags) == (
        None, False, False, False, None, ())
    v.judgement = Judgement.of(_result(flags=("nondeterministic",)))
    assert v.correct and not v.crownable and v.rank is not None and v.rank.disqualified
    assert v.flags == ("nondeterministic",) and v.vmem_bytes == v.judgement.vmem_bytes


def test_the_judges_own_amendments_happen_once_each() -> None:
    """What the worker, the pool and the evaluation add after an evaluation goes through
    ``EvalResult``'s methods: a withheld verdict, a kill blamed on the task, leftovers."""
    from tilewright.kernels.worker import main as worker_main

    reply = {"result": _result().to_json(), "recycle": "the judge's own modules changed: x"}
    worker_main._withhold_verdict({"op": "eval"}, reply)
    withheld = EvalResult.from_json(reply["result"])
    assert withheld.status == "runtime_error" and withheld.timing is None
    assert withheld.error is not None and withheld.error.kind == "task"
    assert "modules changed: x" in withheld.error.message
    assert withheld.correctness == {"correct": False}
    assert Judgement.of(withheld).failed and Judgement.of(withheld).error_kind == "task"
    other = {"result": {"schema": "x"}, "recycle": "y"}
    worker_main._withhold_verdict({"op": "profile"}, other)
    assert other["result"] == {"schema": "x"}  # only an evaluation carries a verdict

    result = _result("timeout", error=EvalError(kind="timeout", message="killed"))
    result.blame_task(None)
    assert result.error is not None and result.error.kind == "timeout"
    result.blame_task(EvalError(kind="task", message="the reference alone ran out of time"))
    assert result.error.kind == "task"

    result = _result(flags=("degenerate_reference",))
    result.note_leftovers(0)
    assert "leftover_processes" not in result.extra
    result.note_leftovers(2)  # the candidate process's count, then the judge's
    result.note_leftovers(1)
    assert result.extra["leftover_processes"] == 3
    assert result.integrity["flags"] == ["degenerate_reference", "spawned_processes"]
