"""Executors: local worker processes and Ray tasks, with real JAX workers on the CPU.

The Ray tests share one local Ray instance (2 CPUs, no dashboard) started once for the
module and shut down at its end; they cover a correct and a broken candidate, a task
directory shipped to a node that lacks it, cancellation, and a search that evaluates
through Ray.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tilewright.kernels.judge.conformance import CHECKS, ConformanceCase, run_conformance
from tilewright.kernels.judge.result import Backend
from tilewright.kernels.pool import (
    ExecutorError,
    Judge,
    LocalExecutor,
    RayExecutor,
    combined_state,
    local_worker_count,
    make_executor,
    usable_cores,
)
from tilewright.kernels.pool.ray import _pack_task, _unpack_task
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.tasks.loaders import load_task

SUITE = Path(__file__).parent / "fixtures" / "suite"
FAST = EvalOptions(trials=1, time_budget_s=0.2, timeout_s=60.0)
BROKEN = "def kernel(x):\n    return x +\n"  # a syntax error on line 2
# the payload: a kernel that hangs (the executor's timeout ends it, never the sleep)
SLOW = "import time\n\ndef kernel(x):\n    time.sleep(600)\n    return x\n"


@pytest.fixture(scope="module")
def task():
    return load_task(SUITE / "native_scale_shift", {"rows": 16})


def test_worker_count_is_bounded_by_cores() -> None:
    assert local_worker_count(1) == 1
    assert local_worker_count(10_000) == usable_cores()
    with pytest.raises(ExecutorError, match="at least 1"):
        local_worker_count(0)


def test_make_executor_rejects_bad_usage() -> None:
    with pytest.raises(ExecutorError, match="unknown executor 'gpu'"):
        make_executor("gpu")
    with pytest.raises(ExecutorError, match="--address only applies"):
        make_executor("local", address="10.0.0.1:6379")
    assert isinstance(make_executor("ray", workers=1), RayExecutor)


def test_several_pools_report_their_most_pressing_state() -> None:
    assert combined_state([]) == "stopped"
    assert combined_state(["idle", "idle"]) == "idle"
    assert combined_state(["idle", "busy"]) == "busy"
    assert combined_state(["busy", "restarting", "idle"]) == "restarting"
    assert combined_state(["stopped", "starting"]) == "starting"


def test_every_judge_follows_its_protocol() -> None:
    from tilewright.sessions.evaluator import PoolEvaluator

    assert isinstance(LocalExecutor(1), Judge)
    assert isinstance(WorkerPool(1), Judge)  # a session judges through its pool
    assert isinstance(RayExecutor(workers=1), Judge)
    assert isinstance(PoolEvaluator(LocalExecutor(1)), Judge)
    assert RayExecutor(workers=1).state == "stopped"


async def test_local_executor_runs_evaluations_side_by_side(task) -> None:
    states: list[str] = []
    executor = LocalExecutor(workers=2)
    assert executor.state == "stopped"
    assert await executor.backend() is None  # nothing to ask yet
    executor.set_state_listener(states.append)
    async with executor:
        assert executor.capacity == min(2, usable_cores())
        assert executor.state == "idle" and states[-1] == "idle"
        good, bad = await asyncio.gather(
            executor.evaluate(task, task.starting_source(), FAST),
            executor.evaluate(task, BROKEN, FAST))
        assert good.status == "correct", good.error
        assert good.backend is not None and good.backend.mode == "tpu-interpret"
        backend = await executor.backend()
        assert isinstance(backend, Backend) and backend.is_interpret
        assert bad.status == "compile_error"
        assert bad.error is not None and bad.error.line == 2
        assert "starting" in states and "busy" in states
        assert states[-1] != "busy"  # both evaluations are done
        # both slots are free again: a third evaluation does not wait forever
        again = await asyncio.wait_for(executor.evaluate(task, task.starting_source(), FAST), 120)
        assert again.status == "correct"
    assert executor.state == "stopped" and states[-1] == "stopped"
    assert all(a != b for a, b in itertools.pairwise(states))  # changes only


def test_task_files_travel_to_a_node_without_them(task, tmp_path) -> None:
    copy = tmp_path / "scale_shift"
    shutil.copytree(task.root, copy)
    packed = _pack_task(load_task(copy))
    assert set(packed["files"]) == {"task.toml", "reference.py", "kernel.py"}
    shutil.rmtree(copy)  # the "remote" node has no such directory
    rebuilt = _unpack_task(packed)
    assert rebuilt.root != copy and rebuilt.root.is_dir()
    assert rebuilt.reference_path.read_text() == (task.root / "reference.py").read_text()
    assert rebuilt.kernel_path is not None and rebuilt.kernel_path.parent == rebuilt.root
    assert [s.name for s in rebuilt.shapes] == [s.name for s in task.shapes]


# -- Ray ------------------------------------------------------------------------------

async def test_unreachable_ray_cluster_fails_fast() -> None:
    pytest.importorskip("ray")
    with pytest.raises(ExecutorError, match=r"cannot reach a Ray cluster at 127\.0\.0\.1:1"):
        await RayExecutor(address="127.0.0.1:1").start()


ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def ray_executor(ray_loop):
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    executor = RayExecutor(workers=2, num_cpus=2)
    ray_loop.run_until_complete(executor.start())
    yield executor
    ray_loop.run_until_complete(executor.close())
    assert not ray.is_initialized()


def test_ray_executor_evaluates_in_a_worker_process(ray_executor, ray_loop, task) -> None:
    assert ray_executor.capacity == 2
    assert ray_executor.resources == {"CPU": 1.0}
    assert ray_executor.state == "idle"
    states: list[str] = []
    ray_executor.set_state_listener(states.append)

    async def both():
        return await asyncio.gather(
            ray_executor.evaluate(task, task.starting_source(), FAST),
            ray_executor.evaluate(task, BROKEN, FAST))

    good, bad = ray_loop.run_until_complete(both())
    ray_executor.set_state_listener(None)
    assert states == ["busy", "idle"]  # busy while either ran
    assert good.status == "correct", good.error
    assert good.extra["executor"]["name"] == "ray"
    backend = ray_loop.run_until_complete(ray_executor.backend())
    assert isinstance(backend, Backend) and backend.is_interpret
    assert good.backend is not None and good.backend.mode == "tpu-interpret"
    assert bad.status == "compile_error" and bad.error.line == 2


def test_ray_cancellation_frees_the_slot(ray_executor, ray_loop, task) -> None:
    async def cancel_then_run():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ray_executor.evaluate(task, SLOW, FAST), timeout=5.0)
        return await ray_executor.evaluate(task, task.starting_source(), FAST)

    assert ray_loop.run_until_complete(cancel_then_run()).status == "correct"


def test_ray_conforms(ray_executor, ray_loop, task) -> None:
    """The judge protocol's conformance suite, on the Ray instance the module shares (a
    second executor on it, so the first keeps its state)."""
    # two evaluations at once on two Ray workers of a 2-core machine (the capacity check):
    # a deadline for a loaded host, not for speed
    case = ConformanceCase(task=task, good=task.starting_source() or "", broken=BROKEN,
                           options=replace(FAST, timeout_s=180.0))
    passed = ray_loop.run_until_complete(run_conformance(lambda: RayExecutor(workers=2), case))
    assert passed == ["protocol", *CHECKS, "lifecycle"]
    assert ray.is_initialized()  # not the second executor's to shut down


def test_search_evaluates_through_ray(ray_executor, ray_loop, tmp_path) -> None:
    """The controller side (agent, decisions, session log) stays in this process; only
    the evaluations go to Ray."""
    from tilewright.agents import brief, make_agent
    from tilewright.sessions.log import load
    from tilewright.sessions.search import Search
    from tilewright.sessions.search.graph import Budget, SearchConfig

    task = load_task("softmax", {"rows": 16, "cols": 256})  # a bundled task, shrunk
    config = SearchConfig(beam_width=2, branching=2, max_rounds=1, budget=Budget(nodes=2))

    async def search():
        s = Search.create(tmp_path, task, brief(task), make_agent("offline"), ray_executor,
                          config, eval_options=FAST)
        try:
            return s, await s.run()
        finally:
            s.close()

    s, summary = ray_loop.run_until_complete(search())
    assert summary.reason == "budget:nodes" and summary.evaluations == 3
    assert summary.best_status == "correct"
    events = load(s.log.path).events
    blobs = [e["result_blob"] for e in events if e["type"] == "run.result"]
    import json

    for blob in blobs:  # every evaluation ran on a Ray worker
        data = json.loads((s.log.path / "blobs" / blob).read_text())
        assert data["extra"]["executor"]["name"] == "ray"
    # Each correct version's static analysis ran through the same judge (the session
    # core analyzes for every judge), and the new best was profiled on a Ray worker too,
    # its trace written into the session.
    analyses = [e for e in events if e["type"] == "profile.result" and e.get("static")]
    assert analyses and all(e["error"] is None for e in analyses), analyses
    profiles = [e for e in events if e["type"] == "profile.result" and not e.get("static")]
    assert profiles and profiles[0]["error"] is None, profiles
    data = json.loads((s.log.path / "blobs" / profiles[0]["profile_blob"]).read_text())
    assert data["extra"]["executor"]["name"] == "ray"
    local = s.log.path / profiles[0]["logdir"]
    assert data["logdir"] == str(local) and any(local.rglob("*.xplane.pb"))
    assert any(e["type"] == "diagnosis" for e in events)


def test_a_local_ray_instance_listens_on_loopback_only(ray_executor) -> None:
    # Ray's services have no authentication: without --address nothing may face the network.
    gcs = ray.get_runtime_context().gcs_address
    assert gcs.startswith("127.0.0.1:"), gcs
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
