"""Tampered sessions are caught, a second writer is refused, write failures are clear.

One real headless run (offline agent, budget 1) is copied and tampered with in each
test: an edited rank, a deleted approval, a binary line, a deleted blob. The checks
(``sessions.recorded.replay.audit``) need no worker; one end-to-end ``replay --verify`` shows
the exit code and that nothing raises a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tilewright.sessions.log import (
    SessionLockedError,
    SessionLog,
    SessionWriteError,
    load,
)
from tilewright.sessions.recorded.replay import audit
from tilewright.sessions.state import fold

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--trials", "1", "--time-budget", "0.2", "--set", "rows=64", "--set", "cols=256"]


def tw(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TILEWRIGHT_CONFIG="/nonexistent/config.toml")
    env.pop("ANTHROPIC_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "tilewright.tui.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("sessions")
    proc = tw("auto", "--task", "gelu", "--agent", "offline", "--budget", "1",
              "--session-dir", str(base), "--json", *FAST)
    assert proc.returncode == 0, proc.stderr
    return Path(json.loads(proc.stdout)["session"])


def copy(session: Path, tmp_path: Path) -> Path:
    dest = tmp_path / session.name
    shutil.copytree(session, dest)
    (dest / ".lock").unlink(missing_ok=True)
    return dest


def problems(path: Path) -> list[str]:
    loaded = load(path)
    return audit(loaded, fold(loaded.header, loaded.events))


def edit_events(path: Path, edit) -> None:
    events = path / "events.jsonl"
    lines = events.read_text().splitlines(keepends=True)
    events.write_text("".join(edit(lines)))


def test_the_untouched_session_passes_the_audit(session: Path) -> None:
    assert problems(session) == []
    state = fold(load(session).header, load(session).events)
    assert all(state.authorized(n) for n in state.versions)


def test_an_edited_rank_fails_verification(session: Path, tmp_path: Path) -> None:
    tampered = copy(session, tmp_path)

    def fifty_x(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            if '"type":"run.result"' in line and '"status":"correct"' in line:
                event = json.loads(line)
                event["rank"] = {**event["rank"], "value": 50.0, "kernel_s": 1e-9}
                line = json.dumps(event, separators=(",", ":")) + "\n"
            out.append(line)
        return out

    edit_events(tampered, fifty_x)
    found = problems(tampered)
    assert any("rank.value=50.0" in p and "edited" in p for p in found), found
    assert any("rank.kernel_s=1e-09" in p for p in found), found
    proc = tw("replay", str(tampered), "--headless", "--verify", "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] is False and report["problems"]
    assert "did NOT reproduce" in proc.stderr


def test_a_deleted_approval_breaks_the_chain(session: Path, tmp_path: Path) -> None:
    tampered = copy(session, tmp_path)
    edit_events(tampered, lambda lines: [ln for ln in lines
                                         if '"type":"user.decision"' not in ln])
    found = problems(tampered)
    assert any("no user.decision approved it" in p for p in found), found
    assert any("sequence numbers" in p for p in found)  # the hole shows too


def test_a_binary_line_is_reported_and_skipped(session: Path, tmp_path: Path) -> None:
    tampered = copy(session, tmp_path)
    with open(tampered / "events.jsonl", "r+b") as fh:
        data = fh.read()
        first = data.index(b"\n") + 1
        fh.seek(0)
        fh.write(data[:first] + b"\xff\xfe\x00garbage\x89PNG\n" + data[first:])
        fh.truncate()
    loaded = load(tampered)  # no exception
    assert any("binary line" in w and ":2:" in w for w in loaded.warnings)
    assert len(loaded.events) == len(load(session).events)
    assert any("binary line" in p for p in problems(tampered))


def test_a_deleted_blob_is_named(session: Path, tmp_path: Path) -> None:
    tampered = copy(session, tmp_path)
    version = json.loads(next(ln for ln in (tampered / "events.jsonl").read_text()
                              .splitlines() if '"type":"kernel.version"' in ln))
    sha = version["source_blob"]
    (tampered / "blobs" / sha).unlink()
    found = problems(tampered)
    assert any(sha in p and "missing" in p for p in found), found


def test_an_altered_blob_is_caught(session: Path, tmp_path: Path) -> None:
    tampered = copy(session, tmp_path)
    run = json.loads(next(ln for ln in (tampered / "events.jsonl").read_text().splitlines()
                          if '"type":"run.result"' in ln and '"result_blob":"' in ln))
    blob = tampered / "blobs" / run["result_blob"]
    blob.write_text(blob.read_text().replace('"status": "correct"', '"status": "correct" '))
    assert any("altered" in p for p in problems(tampered))


def test_a_second_writer_is_refused_by_name(session: Path, tmp_path: Path) -> None:
    target = copy(session, tmp_path)
    log, _ = SessionLog.open(target)
    try:
        with pytest.raises(SessionLockedError, match=f"pid {os.getpid()}"):
            SessionLog.open(target)
        proc = tw("auto", "--resume", str(target), "--agent", "offline", "--budget", "1",
                  timeout=120)
        assert proc.returncode == 2
        assert f"open for writing in another process (pid {os.getpid()}" in proc.stderr
        assert "Traceback" not in proc.stderr
    finally:
        log.close()
    before = load(target).events
    again, _ = SessionLog.open(target)  # released: the next writer may open it
    again.close()
    assert load(target).events == before


def test_a_full_disk_is_a_clear_error_and_stops_the_log(session: Path, tmp_path: Path) -> None:
    target = copy(session, tmp_path)
    log, loaded = SessionLog.open(target)
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, log._fd)  # the kernel answers every write with ENOSPC
        with pytest.raises(SessionWriteError, match="the disk is full"):
            log.append("marker", label="x")
        with pytest.raises(SessionWriteError):  # no later event can leave a gap
            log.append("marker", label="y")
        assert log.write_error is not None
    finally:
        os.close(full)
        log.close()
    assert load(target).events == loaded.events


def test_an_unwritable_session_dir_is_a_clear_error(tmp_path: Path) -> None:
    base = tmp_path / "ro"
    base.mkdir()
    base.chmod(0o500)
    if os.access(base, os.W_OK):  # root ignores modes: a directory nobody may write to
        base = Path("/sys/fs")
    try:
        with pytest.raises(SessionWriteError, match="cannot create a session directory"):
            SessionLog.create(base, task={"name": "t"}, backend=None, agent="a",
                              app_version="0")
        proc = tw("auto", "--task", "gelu", "--agent", "offline", "--budget", "1",
                  "--session-dir", str(base), *FAST)
        assert proc.returncode != 0
        assert "cannot create a session directory" in proc.stderr
        assert "Traceback" not in proc.stderr
    finally:
        (tmp_path / "ro").chmod(0o700)
