"""The conformance suite every judge passes: ``run_conformance(make_judge, case)``.

A reusable kit in the manner of a store's conformance tests: the suite knows the
protocol (``kernels.judge.protocol``), the caller knows its judge. ``make_judge``
returns a fresh, unstarted judge; ``case`` names a task and two sources the judge must
tell apart (one it accepts as correct, one it refuses with a compile error), so an
in-process double (which judges by its own rule) and a real worker pool run the same
checks. ``run_conformance`` starts one judge (a worker pool starts once), checks its
protocol and its state changes around its whole life, and between start and close runs
the serving checks asked for (``CHECKS``, all by default: each an ``async def
check_<name>(judge, case)`` on the started judge); it returns the names passed, and a
failed one raises ``AssertionError`` naming the check.

The tests run it against ``LocalExecutor`` (real worker processes), ``RayExecutor`` (a
local Ray instance, where ray is installed), ``sessions.evaluator.PoolEvaluator`` over
a local judge, and the in-process doubles of ``tests/judges.py``.

App-side module: no JAX here.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tilewright.kernels.judge.options import EvalOptions, ProfileOptions
from tilewright.kernels.judge.protocol import (
    ESTIMATE_STATUSES,
    STATES,
    Judge,
    JudgeState,
    ProgressFrame,
)
from tilewright.kernels.judge.result import ESTIMATE_SCHEMA, Backend, EvalResult
from tilewright.kernels.tasks.task import Task
from tilewright.profiling import SCHEMA as PROFILE_SCHEMA


@dataclass(frozen=True)
class ConformanceCase:
    """What the suite judges: ``good`` must come back ``correct``; ``broken`` must come
    back ``compile_error`` (at line ``broken_line`` when that is not None). ``chips``
    are the generations of the chip check; ``api_name`` a name ``lookup_api`` knows."""

    task: Task
    good: str
    broken: str
    broken_line: int | None = 2
    options: EvalOptions = field(default_factory=lambda: EvalOptions(
        trials=1, time_budget_s=0.1, timeout_s=120.0))
    chips: tuple[str, ...] = ("v5e", "v6e")
    api_name: str = "pl.BlockSpec"


Check = Callable[[Judge, ConformanceCase], Awaitable[None]]


async def check_evaluate(judge: Judge, case: ConformanceCase) -> None:
    """The good source is correct, the broken one a compile error at its line; progress
    frames, where the judge streams them, are dicts that say what they are."""
    frames: list[ProgressFrame] = []
    good = await judge.evaluate(case.task, case.good, case.options, on_progress=frames.append)
    assert isinstance(good, EvalResult) and good.status == "correct", (good.status, good.error)
    assert good.backend is None or isinstance(good.backend, Backend)
    bad = await judge.evaluate(case.task, case.broken, case.options)
    assert bad.status == "compile_error", (bad.status, bad.error)
    if case.broken_line is not None:
        assert bad.error is not None and bad.error.line == case.broken_line, bad.error
    assert all(isinstance(f, dict) and isinstance(f.get("kind"), str) for f in frames), frames


async def check_capacity(judge: Judge, case: ConformanceCase) -> None:
    """``capacity`` evaluations at once all finish, and the judge serves again after."""
    results = await asyncio.gather(*(judge.evaluate(case.task, case.good, case.options)
                                     for _ in range(judge.capacity)))
    assert [r.status for r in results] == ["correct"] * judge.capacity, [
        (r.status, r.error) for r in results]
    again = await judge.evaluate(case.task, case.good, case.options)
    assert again.status == "correct", (again.status, again.error)


async def check_chips(judge: Judge, case: ConformanceCase) -> None:
    """One untimed evaluation per chip, in the order asked, each compiled for its chip."""
    results = await judge.evaluate_on_chips(case.task, case.good, list(case.chips),
                                            case.options)
    assert len(results) == len(case.chips), results
    for chip, result in zip(case.chips, results, strict=True):
        assert result.timing is None, (chip, result.timing)
        assert result.tpu is None or result.tpu.get("chip") == chip, (chip, result.tpu)


async def check_estimate(judge: Judge, case: ConformanceCase) -> None:
    """``tilewright.estimate/1`` for the good source, a known status for the broken one."""
    found = await judge.estimate(case.task, case.good, case.options)
    refused = await judge.estimate(case.task, case.broken, case.options)
    for answer in (found, refused):
        assert answer.get("schema") == ESTIMATE_SCHEMA, answer
        assert answer.get("status") in ESTIMATE_STATUSES, answer.get("status")
    assert found["status"] == "ok", (found["status"], found.get("error"))
    assert refused["status"] == "compile_error", (refused["status"], refused.get("error"))


async def check_profile(judge: Judge, case: ConformanceCase) -> None:
    """A static profile (nothing runs) is ``tilewright.profile/1``; the worker's output
    comes back under ``stderr`` only when asked for, never as bookkeeping."""
    with tempfile.TemporaryDirectory(prefix="tw-conformance-") as tmp:
        plain = await judge.profile(case.task, case.good, Path(tmp) / "a",
                                    ProfileOptions(static_only=True, timeout_s=120.0))
        told = await judge.profile(case.task, case.good, Path(tmp) / "b",
                                   ProfileOptions(static_only=True, timeout_s=120.0,
                                                  stderr=True))
    for answer in (plain, told):
        assert answer.get("schema") == PROFILE_SCHEMA, answer
        assert answer.get("status") == "ok", answer.get("error")
        assert "_stderr" not in answer, sorted(answer)
    assert "stderr" not in plain and isinstance(told.get("stderr"), str), sorted(told)


async def check_lookup_api(judge: Judge, case: ConformanceCase) -> None:
    """A name the installed JAX knows is answered, without bookkeeping keys."""
    answer = await judge.lookup_api(case.api_name)
    assert isinstance(answer, dict) and answer, answer
    assert not any(key.startswith("_") for key in answer), sorted(answer)


async def check_inputs(judge: Judge, case: ConformanceCase) -> None:
    """The task's input signature, one entry per shape configuration."""
    answer = await judge.inputs(case.task)
    assert not answer.get("error"), answer.get("error")
    names = [c.get("name") for c in answer.get("configs") or []]
    assert names == [s.name for s in case.task.shapes], names
    assert not any(key.startswith("_") for key in answer), sorted(answer)


CHECKS: dict[str, Check] = {
    "evaluate": check_evaluate, "capacity": check_capacity, "chips": check_chips,
    "estimate": check_estimate, "profile": check_profile, "lookup_api": check_lookup_api,
    "inputs": check_inputs,
}


async def run_conformance(make_judge: Callable[[], Judge], case: ConformanceCase,
                          checks: Iterable[str] | None = None) -> list[str]:
    """Check a fresh judge from ``make_judge`` from start to close: ``protocol`` (every
    member, before it starts), ``lifecycle`` (its state changes around its life), and
    between those the serving checks named (all of ``CHECKS`` by default). Returns the
    names passed; a failure is an ``AssertionError`` that names its check."""
    names = list(checks) if checks is not None else list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown conformance check(s) {unknown}; known: {list(CHECKS)}")
    judge = make_judge()
    kind = type(judge).__name__

    def failed(name: str, exc: AssertionError) -> AssertionError:
        return AssertionError(f"{kind} fails check {name!r}: {exc}")

    try:
        _protocol(judge)
    except AssertionError as exc:
        raise failed("protocol", exc) from exc
    heard: list[JudgeState] = []
    judge.set_state_listener(heard.append)
    passed = ["protocol"]
    try:
        await judge.start()
        try:
            assert judge.state in ("idle", "busy"), f"started, yet {judge.state}"
            backend = await judge.backend()
            assert backend is None or isinstance(backend, Backend), backend
        except AssertionError as exc:
            raise failed("lifecycle", exc) from exc
        for name in names:
            try:
                await CHECKS[name](judge, case)
            except AssertionError as exc:
                raise failed(name, exc) from exc
            passed.append(name)
    finally:
        await judge.close()  # a failed check leaves no workers behind
    try:
        assert judge.state == "stopped", f"closed, yet {judge.state}"
        assert all(state in STATES for state in heard), heard
        assert all(a != b for a, b in itertools.pairwise(heard)), \
            f"a state told twice in a row: {heard}"
        assert heard and heard[-1] == "stopped", heard
    except AssertionError as exc:
        raise failed("lifecycle", exc) from exc
    judge.set_state_listener(None)
    return [*passed, "lifecycle"]


def _protocol(judge: Judge) -> None:
    """It is a ``Judge``: every member there, a name, a capacity, a state, a description."""
    assert isinstance(judge, Judge), f"{type(judge).__name__} is not a Judge"
    assert isinstance(judge.name, str) and judge.name, judge.name
    assert isinstance(judge.capacity, int) and judge.capacity >= 1, judge.capacity
    assert judge.state in STATES, judge.state
    assert isinstance(judge.describe(), str)
