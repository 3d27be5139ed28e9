"""Every judge passes the one conformance suite (``kernels.judge.conformance``).

Here: this machine's worker processes (a ``WorkerPool``, for real: JAX workers in TPU
interpret mode; ``LocalExecutor``, which fans out over one pool per chip), a session's binding of options (``PoolEvaluator``, over an in-process
double: the binding is what is checked, the workers are above) and the in-process
doubles the controller and snapshot tests use (``tests/judges.py``). Ray passes it in
``tests/test_executors.py``, on the Ray instance those tests share. And the CLIs reach
workers only through a judge.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from judges import MarkedJudge, RefusingJudge

from tilewright.kernels.judge.conformance import CHECKS, ConformanceCase, run_conformance
from tilewright.kernels.pool import LocalExecutor
from tilewright.kernels.pool.workers import WorkerPool
from tilewright.kernels.tasks.loaders import load_task
from tilewright.sessions.evaluator import PoolEvaluator

SUITE = Path(__file__).parent / "fixtures" / "suite"
KERNELS = Path(__file__).resolve().parent.parent / "kernels"
BROKEN = "def kernel(x):\n    return x +\n"  # a syntax error on line 2


@pytest.fixture(scope="module")
def case() -> ConformanceCase:
    task = load_task(SUITE / "native_scale_shift", {"rows": 16})
    return ConformanceCase(task=task, good=task.starting_source() or "", broken=BROKEN)


@pytest.fixture(scope="module")
def marked_case(case: ConformanceCase) -> ConformanceCase:
    """The same task for a double that judges by its marker (and names no error line)."""
    from dataclasses import replace

    return replace(case, good="def kernel(x):\n    return x  # eval: correct 1.5\n",
                   broken="def kernel(x):\n    return x  # eval: compile_error 1.0\n",
                   broken_line=None)


async def test_local_worker_processes_conform(case: ConformanceCase) -> None:
    """A session's judge is its ``WorkerPool``, bound with its options: no other wrap."""
    passed = await run_conformance(lambda: WorkerPool(size=1), case)
    assert passed == ["protocol", *CHECKS, "lifecycle"]


async def test_the_local_executor_conforms(case: ConformanceCase) -> None:
    """The CLIs' judge: each request handed to a pool's worker (the operations are the
    pool's own, checked above; here one of them, its members, state and lifecycle)."""
    passed = await run_conformance(lambda: LocalExecutor(workers=1), case, checks=["inputs"])
    assert passed == ["protocol", "inputs", "lifecycle"]


async def test_the_marked_double_conforms(marked_case: ConformanceCase) -> None:
    passed = await run_conformance(MarkedJudge, marked_case)
    assert passed == ["protocol", *CHECKS, "lifecycle"]


async def test_a_session_binding_conforms(marked_case: ConformanceCase) -> None:
    """``PoolEvaluator`` binds options over any judge and is one itself."""
    from tilewright.kernels.judge.options import EvalOptions

    passed = await run_conformance(
        lambda: PoolEvaluator(MarkedJudge(), EvalOptions(trials=1)), marked_case)
    assert passed == ["protocol", *CHECKS, "lifecycle"]


async def test_the_refusing_double_conforms_without_serving(case: ConformanceCase) -> None:
    """The snapshot tests' double refuses every evaluation by design: it is a judge in
    its members, state and lifecycle."""
    assert await run_conformance(RefusingJudge, case, checks=()) == ["protocol", "lifecycle"]


async def test_a_failed_check_is_named() -> None:
    class Silent(MarkedJudge):
        async def lookup_api(self, name: str) -> dict:
            return {"_stderr": ""}

    case = ConformanceCase(task=load_task(SUITE / "native_scale_shift", {"rows": 16}),
                           good="", broken="# eval: compile_error 1", broken_line=None)
    with pytest.raises(AssertionError, match="Silent fails check 'lookup_api'"):
        await run_conformance(Silent, case, checks=["lookup_api"])


def test_the_clis_reach_workers_through_a_judge() -> None:
    """No ``tilewright`` command of the kernels layer builds a ``WorkerPool`` itself."""
    for path in sorted(KERNELS.glob("cli*.py")):
        tree = ast.parse(path.read_text())
        names = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 for a in node.names}
        assert "WorkerPool" not in names, f"{path.name} builds a WorkerPool"
