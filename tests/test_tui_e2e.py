"""End to end: the real ``tilewright`` command in a pseudo-terminal (pexpect).

Opens the workbench on the bundled gelu task with the offline agent and a real JAX
worker, runs v1, approves two proposals, switches to autonomous mode (which stops on
its iteration budget), quits, then replays the session in the replay screen and
headless. Keys go in as a terminal sends them; what happened is read back from the
session log (the screen's escape sequences are only searched for the replay's
position line and for anything JAX/XLA might have printed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect", reason="pexpect is needed to drive a pseudo-terminal")

ROOT = Path(__file__).resolve().parent.parent
TILEWRIGHT = str(Path(sys.executable).parent / "tilewright")
# where the package is only on the path (a copy on a TPU VM), ``python -m`` runs the same CLI
COMMAND = ((TILEWRIGHT, []) if os.path.exists(TILEWRIGHT)
           else (sys.executable, ["-m", "tilewright.tui.cli"]))
CTRL = {"r": "\x12", "y": "\x19", "g": "\x07", "q": "\x11"}
GUARD_S = 0.7  # the approval prompt ignores keys for 0.5 s after it appears
JAX_NOISE = (b"Failed to find host bounds", b"TF_CPP", b"absl::", b"libtpu", b"Traceback")


def _env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "config.toml"
    config.write_text('[eval]\ntrials = 1\ntime_budget_s = 0.05\n\n'
                      '[budgets]\niterations = 1\n\n[agent]\nkind = "offline"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
    env.update(TILEWRIGHT_CONFIG=str(config), JAX_PLATFORMS="cpu", TERM="xterm-256color",
               TILEWRIGHT_DATA_DIR=str(tmp_path / "data"))
    env.pop("COLORTERM", None)  # 256 colours, as over a plain ssh session
    return env


class Terminal:
    def __init__(self, args: list[str], env: dict[str, str], size=(40, 140)) -> None:
        self.child = pexpect.spawn(COMMAND[0], COMMAND[1] + args, env=env, cwd=str(ROOT),
                                   dimensions=size, timeout=5)
        self.output = bytearray()

    def drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._read(0.1)

    def _read(self, timeout: float) -> None:
        try:
            self.output += self.child.read_nonblocking(1 << 16, timeout=timeout)
        except (pexpect.TIMEOUT, pexpect.EOF):
            pass

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 240) -> None:
        end = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > end or not self.child.isalive():
                tail = bytes(self.output[-3000:]).decode(errors="replace")
                pytest.fail(f"timed out waiting for {what}; screen tail:\n{tail}")
            self._read(0.2)

    def send(self, key: str) -> None:
        self.child.send(CTRL.get(key, key))

    def finish(self, timeout: float = 60) -> int:
        self.wait("the app to exit", lambda: not self.child.isalive(), timeout)
        self.child.close()
        return self.child.exitstatus


def _events(sessions: Path) -> list[dict]:
    found = sorted(sessions.glob("*/events.jsonl"))
    if not found:
        return []
    return [json.loads(line) for line in found[-1].read_text().splitlines()[1:]
            if line.strip()]


def _has(sessions: Path, **fields) -> Callable[[], bool]:
    return lambda: any(all(e.get(k) == v for k, v in fields.items())
                       for e in _events(sessions))


def _approve(term: Terminal, sessions: Path, pid: str) -> None:
    """Wait for proposal ``pid`` on screen, past the half-second guard, and approve it."""
    term.wait(f"proposal {pid}", _has(sessions, type="agent.proposal", proposal=pid))
    term.wait("the decision bar", lambda: f"proposal {pid}:".encode() in term.output)
    term.drain(GUARD_S)
    term.send("y")
    term.wait(f"{pid} approved", _has(sessions, type="user.decision", proposal=pid,
                                      decision="approve", by="user"))


@pytest.mark.slow
def test_approve_twice_go_autonomous_quit_and_replay(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    env = _env(tmp_path)
    term = Terminal(["--task", "gelu", "--session-dir", str(sessions)], env)
    term.wait("the starting kernel", _has(sessions, type="kernel.version", version=1))
    term.drain(1.0)  # the screen attaches to the session
    term.send("r")
    _approve(term, sessions, "p1")
    _approve(term, sessions, "p2")
    term.wait("v3 evaluated", _has(sessions, type="run.result", version=3))
    term.send("g")
    term.wait("autonomous mode", _has(sessions, type="mode.change", mode="auto"))
    term.wait("the budget stop", _has(sessions, type="auto.stop", reason="budget:iterations"))
    term.drain(0.5)
    term.send("q")
    assert term.finish() == 0
    events = _events(sessions)
    assert events[-1]["type"] == "session.end"
    assert any(e["type"] == "user.decision" and e["by"] == "auto" for e in events)
    for noise in JAX_NOISE:
        assert noise not in term.output, f"{noise!r} reached the screen"

    session_id = next(sessions.iterdir()).name
    replay = Terminal(["replay", session_id, "--session-dir", str(sessions)], env)
    replay.wait("the replay screen", lambda: b"start of the session" in replay.output, 60)
    replay.send("n")  # the first decision point: proposal p1
    replay.wait("a step to p1", lambda: re.search(rb"proposal p1", replay.output) is not None,
                30)
    replay.send("n")  # the next: its approval
    replay.wait("the approval of p1",
                lambda: re.search(rb"approve p1", replay.output) is not None, 30)
    replay.send("\x1b[F")  # End: the last event
    total = len(events)
    replay.wait("the end", lambda: f"event {total}/{total}".encode() in replay.output, 30)
    replay.send("q")
    assert replay.finish() == 0

    headless = subprocess.run([TILEWRIGHT, "replay", session_id, "--session-dir",
                               str(sessions), "--headless"], env=env, capture_output=True,
                              text=True, timeout=60)
    assert headless.returncode == 0, headless.stderr[-2000:]
    assert "p1" in headless.stdout
