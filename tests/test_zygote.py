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

from tilewright.kernels.worker.candidate import judge, zygote


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _fds(pid: int) -> set[int]:
    return {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}


@pytest.fixture
def server(tmp_path, monkeypatch) -> Iterator[zygote.Zygote]:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    judge.start_zygote()
    server = zygote.zygote()
    yield server
    if server.proc is not None:
        server.proc.kill()
        server.proc.wait(10)
    zygote.zygote.cache_clear()


def _ping(proc: judge.CandidateProcess) -> dict:
    reply, _ = proc.request("ping", {}, b"", time.monotonic() + 120)
    return reply


def test_a_candidate_process_is_a_fork_that_answers_and_whose_death_is_reported(server) -> None:
    proc = judge.CandidateProcess()
    proc.start()
    try:
        assert isinstance(proc.proc, zygote.Forked), server.why
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
        assert server.why == "its environment differs at import time"
        assert _ping(proc)["ok"] is True
    finally:
        proc.kill()


def test_what_the_import_sets_by_default_is_no_difference() -> None:
    before = {"JAX_PLATFORMS": "cpu"}
    after = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "1"}
    assert zygote.same_at_import({"JAX_PLATFORMS": "cpu", "HOME": "/x"}, before, after)
    assert zygote.same_at_import({"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "1"},
                                 before, after)
    assert not zygote.same_at_import({"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "0"},
                                     before, after)
    assert not zygote.same_at_import({"JAX_PLATFORMS": "tpu"}, before, after)
    assert not zygote.same_at_import({}, before, after)


def test_without_its_zygote_the_judge_starts_children_the_ordinary_way(server) -> None:
    assert server._ready(time.monotonic() + 120)
    server.proc.kill()
    until_now(lambda: server.dead, "the judge to notice the zygote is gone", 30)
    proc = judge.CandidateProcess()
    proc.start()
    try:
        assert isinstance(proc.proc, subprocess.Popen)
        assert _ping(proc)["ok"] is True
    finally:
        proc.kill()
    # ... and a new zygote is ready for the children after that one.
    until_now(lambda: server.pid is not None and not server.dead, "a new zygote", 120)
    again = judge.CandidateProcess()
    again.start()
    try:
        assert isinstance(again.proc, zygote.Forked)
        assert _ping(again)["ok"] is True
    finally:
        again.kill()
