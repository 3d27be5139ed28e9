"""The judge's fork server: candidate and compile processes are forks of a process that
imported JAX once, behave as processes started the ordinary way (their exit codes,
their descriptors, their environment), and are started the ordinary way when a fork
cannot be the same process (an import-time setting differs) or the zygote is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from waiting import until_now

from tilewright.kernels.pool import forks
from tilewright.kernels.worker.candidate import judge


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _fds(pid: int) -> set[int]:
    return {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}


@pytest.fixture
def server(tmp_path, monkeypatch) -> Iterator[forks.Zygote]:
    """A judge's zygote of this process's own (not the app's, which an earlier pool in
    this process started with the workers' environment)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    _forget_zygote()
    judge.start_zygote()
    server = forks.zygote()
    yield server
    _forget_zygote()


def _forget_zygote() -> None:
    server = forks.zygote()
    if server.proc is not None:
        server.proc.kill()
        server.proc.wait(10)
    forks.zygote.cache_clear()


def _ping(proc: judge.CandidateProcess) -> dict:
    reply, _ = proc.request("ping", {}, b"", time.monotonic() + 120)
    return reply


def test_a_candidate_process_is_a_fork_that_answers_and_whose_death_is_reported(server) -> None:
    proc = judge.CandidateProcess()
    proc.start()
    try:
        assert isinstance(proc.proc, forks.Forked), server.why
        assert _ping(proc)["ok"] is True
        assert _parent(proc.pid) == server.proc.pid
        # Nothing of the zygote's is open in it: stdin, stdout, the stderr pipe, and the
        # judge's socket end (confinement's own status pipe, if it made namespaces).
        assert len(_fds(proc.pid)) <= 5, _fds(proc.pid)
        child = proc.proc
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL  # as Popen says it
    finally:
        proc.kill()


def test_an_environment_that_differs_at_import_time_starts_the_ordinary_way(server) -> None:
    proc = judge.CandidateProcess(env={"JAX_ENABLE_X64": "1"})
    proc.start()
    try:
        assert isinstance(proc.proc, subprocess.Popen)
        assert server.why == forks.DIFFERS
        assert _ping(proc)["ok"] is True
    finally:
        proc.kill()


def test_what_the_import_sets_by_default_is_no_difference() -> None:
    before = {"JAX_PLATFORMS": "cpu"}
    after = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "1"}
    assert forks.same_at_import({"JAX_PLATFORMS": "cpu", "HOME": "/x"}, before, after)
    assert forks.same_at_import({"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "1"},
                                 before, after)
    assert not forks.same_at_import({"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "0"},
                                     before, after)
    assert not forks.same_at_import({"JAX_PLATFORMS": "tpu"}, before, after)
    assert not forks.same_at_import({}, before, after)


def _starts_as(kind: type) -> None:
    """A candidate process starts as ``kind`` (a fork or a Popen) and answers."""
    proc = judge.CandidateProcess()
    proc.start()
    try:
        assert isinstance(proc.proc, kind), forks.zygote().why
        assert _ping(proc)["ok"] is True
    finally:
        proc.kill()


def test_without_its_zygote_the_judge_starts_children_the_ordinary_way(server) -> None:
    assert server._ready(time.monotonic() + 120)
    server.proc.kill()
    until_now(lambda: server.dead, "the judge to notice the zygote is gone", 30)
    _starts_as(subprocess.Popen)
    # ... and a new zygote is ready for the children after that one.
    until_now(lambda: server.pid is not None and not server.dead, "a new zygote", 120)
    _starts_as(forks.Forked)


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as fh:
        return fh.read().strip()


async def test_the_apps_workers_are_forks_of_one_zygote_that_evaluate() -> None:
    from sizes import load_small

    from tilewright.kernels.pool.workers import EvalOptions, WorkerPool

    task = load_small("gelu", rows=8, cols=128)
    assert task.starting_source(), "the bundled gelu has a starting kernel"
    quick = EvalOptions(trials=1, timeout_s=60.0, timing=False, lowering=False)
    parents = []
    for _ in range(2):  # a second pool (or a replaced worker) forks from the same one
        async with WorkerPool(size=1) as pool:
            (worker,) = pool._workers.values()
            assert _comm(worker.proc.pid) == "tw-worker", forks.zygote().why
            parents.append(_parent(worker.proc.pid))
            good = await pool.evaluate(task, task.starting_source() or "", quick)
            assert good.status == "correct", good.error
    assert parents == [forks.zygote().proc.pid] * 2


async def test_a_pool_whose_jax_settings_differ_starts_its_worker_the_ordinary_way() -> None:
    from tilewright.kernels.pool.workers import WorkerPool

    async with WorkerPool(size=1, env_overrides={"JAX_ENABLE_X64": "1"}) as pool:
        (worker,) = pool._workers.values()
        assert _comm(worker.proc.pid) != "tw-worker"
        assert forks.zygote().why == forks.DIFFERS
