"""Nothing lost on a drop: a stop by SIGHUP (the terminal went away) or SIGTERM records
the run it cut short as interrupted by it and stops autonomous mode in its name; the
editor's unsaved text is kept as a draft the resumed session offers back; scratch
folders of apps that are gone are removed.

The controller tests use the in-process ``MarkedJudge`` held by a gate (a run in
flight, deterministically). The last test is the real ``tilewright`` in a
pseudo-terminal whose master is closed (the kernel sends the app SIGHUP, as when an SSH
connection drops), then resumed in a new one.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from judges import MarkedJudge
from scripted_agent import ScriptedAgent, kernel
from sizes import load_small
from waiting import until, until_now

from tilewright.agents import brief
from tilewright.kernels.pool.process import SCRATCH_PREFIX, sweep_scratch
from tilewright.kernels.tasks.task import Task
from tilewright.sessions.autonomy import ControllerSettings
from tilewright.sessions.control.controller import Controller
from tilewright.sessions.drafts import drop_draft, last_stop, load_draft, save_draft
from tilewright.sessions.log import SessionLog, load

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gelu() -> Task:
    return load_small("gelu", rows=64, cols=256)


def make(tmp_path: Path, task: Task, agent: ScriptedAgent, judge: MarkedJudge,
         log: SessionLog | None = None) -> Controller:
    log = log or SessionLog.create(tmp_path, task={"name": task.name, "root": str(task.root),
                                                   "layout": task.layout},
                                   backend=None, agent=agent.name, app_version="test")
    return Controller(log, task, brief(task), agent, judge, ControllerSettings())


def src(tag: str) -> str:
    return f"def kernel(x):\n    return x  # eval: correct 1.5 {tag}\n"


async def test_a_run_cut_short_by_a_disconnect_says_so_on_resume(tmp_path, gelu) -> None:
    gate = asyncio.Event()
    c = make(tmp_path, gelu, ScriptedAgent(), MarkedJudge(gate))
    await c.start()
    c.run()
    await until(lambda: any(r.status is None for r in c.state.runs.values()), "a run to start")
    await c.close("stopped: disconnect", "disconnect")
    events = load(c.log.path).events
    result = next(e for e in events if e["type"] == "run.result")
    assert result["cancelled"] and result["interrupted"] and result["cause"] == "disconnect"
    assert events[-1] == {**events[-1], "type": "session.end", "reason": "stopped: disconnect"}
    stop = last_stop(events)
    assert stop is not None and stop.runs == (("r1", 1, "eval"),) and not stop.auto
    assert stop.words().startswith("the connection dropped during run r1 (v1, evaluation)")

    # Resumed: still said (the resume's own marker does not hide it); a person's quit
    # afterwards ends the story.
    log, _loaded = SessionLog.open(c.log.path)
    again = make(tmp_path, gelu, ScriptedAgent(), MarkedJudge(), log=log)
    await again.start()
    assert last_stop(load(c.log.path).events) == stop
    await again.close("user quit")
    assert last_stop(load(c.log.path).events) is None


async def test_autonomous_mode_stopped_by_the_disconnect(tmp_path, gelu) -> None:
    gate = asyncio.Event()
    agent = ScriptedAgent([kernel(src(str(i)), f"try {i}") for i in range(3)])
    c = make(tmp_path, gelu, agent, MarkedJudge(gate))
    await c.start()
    c.set_mode("auto")
    await until(lambda: any(r.status is None for r in c.state.runs.values()), "a run to start")
    await c.close("stopped: terminated", "terminated")
    events = load(c.log.path).events
    stops = [e for e in events if e["type"] == "auto.stop"]
    assert stops[-1]["reason"] == "terminated"
    assert [e for e in events if e["type"] == "mode.change"][-1]["by"] == "terminated"
    stop = last_stop(events)
    assert stop is not None and stop.auto and stop.runs
    assert "the app was told to stop (SIGTERM) during run r" in stop.words()
    assert stop.words().endswith("autonomous mode was stopped")


def test_a_draft_round_trip(tmp_path) -> None:
    assert load_draft(tmp_path) is None
    save_draft(tmp_path, "x = 1\n", version=3, proposal=None, why="disconnect")
    draft = load_draft(tmp_path)
    assert draft is not None and draft.text == "x = 1\n" and draft.version == 3
    assert draft.words() == "an edit of v3" and draft.why == "disconnect"
    (tmp_path / "draft.json").write_text("{not json")
    assert load_draft(tmp_path) is None  # unreadable: no draft, no error
    drop_draft(tmp_path)
    drop_draft(tmp_path)
    assert not (tmp_path / "draft.json").exists()


def test_scratch_folders_of_apps_that_are_gone_are_removed(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    gone = int(done.stdout)  # exited: its pid names no process (reuse is unlikely)
    dead = tmp_path / f"{SCRATCH_PREFIX}{gone}-abc"
    alive = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-def"
    unnamed = tmp_path / f"{SCRATCH_PREFIX}q1w2e3"  # an older app's: no pid, left alone
    for folder in (dead, alive, unnamed):
        (folder / "tasks").mkdir(parents=True)
        (folder / "tasks" / "x").write_text("x")
    assert sweep_scratch(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and alive.exists() and unnamed.exists()


# -- the real app in a pseudo-terminal ---------------------------------------------------

pexpect = pytest.importorskip("pexpect", reason="pexpect drives a pseudo-terminal")
TILEWRIGHT = str(Path(sys.executable).parent / "tilewright")
MARK = "unsaved_marker_37"


def _screen(output: bytearray) -> str:
    """What a person reads: the output without its control sequences."""
    return re.sub(rb"\x1b\[[0-9;?<>=$]*[ -/]*[@-~]", b"", bytes(output)).decode(
        errors="replace")


class Terminal:
    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.child = pexpect.spawn(TILEWRIGHT, args, env=env, cwd=str(ROOT),
                                   dimensions=(40, 140), timeout=5)
        self.output = bytearray()

    def read(self, timeout: float = 0.2) -> None:
        try:
            self.output += self.child.read_nonblocking(1 << 16, timeout=timeout)
        except (pexpect.TIMEOUT, pexpect.EOF):
            pass

    def wait(self, what: str, predicate, timeout: float = 180) -> None:
        end = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > end or not self.child.isalive():
                pytest.fail(f"timed out waiting for {what}; screen tail:\n"
                            f"{_screen(self.output)[-3000:]}")
            self.read()

    def hang_up(self, timeout: float = 60) -> int:
        """Close the terminal's master side (the kernel sends SIGHUP, as when an SSH
        connection drops) and wait for the app to exit; its exit status."""
        self.child.ptyproc.fileobj.close()
        until_now(lambda: not self.child.ptyproc.isalive(), "the app to exit after the hangup",
                  timeout=timeout)
        return self.child.ptyproc.exitstatus if self.child.ptyproc.exitstatus is not None \
            else 128 + (self.child.ptyproc.signalstatus or 0)


def _events(sessions: Path) -> list[dict]:
    found = sorted(sessions.glob("*/events.jsonl"))
    if not found:
        return []
    return [json.loads(line) for line in found[-1].read_text().splitlines()[1:]
            if line.strip()]


@pytest.mark.slow
def test_a_hangup_keeps_the_unsaved_edit_and_leaves_no_scratch(tmp_path: Path) -> None:
    sessions, scratch_parent = tmp_path / "sessions", tmp_path / "tmp"
    scratch_parent.mkdir()
    config = tmp_path / "config.toml"
    config.write_text('[eval]\ntrials = 1\ntime_budget_s = 0.05\n\n[agent]\nkind = "offline"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
    env.update(TILEWRIGHT_CONFIG=str(config), JAX_PLATFORMS="cpu", TERM="xterm-256color",
               TILEWRIGHT_DATA_DIR=str(tmp_path / "data"), TMPDIR=str(scratch_parent))
    scratch = lambda: sorted(p.name for p in scratch_parent.glob(f"{SCRATCH_PREFIX}*"))  # noqa: E731

    term = Terminal(["--task", "gelu", "--session-dir", str(sessions)], env)
    term.wait("the starting kernel", lambda: any(
        e["type"] == "kernel.version" for e in _events(sessions)))
    term.wait("the worker's scratch folder", lambda: bool(scratch()), 60)
    term.wait("the source on screen", lambda: "Starting kernel for gelu" in _screen(term.output), 60)
    term.child.send("\x0f")  # ctrl+o: edit the current version
    term.wait("the edit", lambda: "editing v1" in _screen(term.output), 30)
    term.child.send(f"# {MARK}")
    term.wait("the typed text", lambda: MARK in _screen(term.output), 30)
    session = next(sessions.iterdir())
    assert not (session / "draft.json").exists()

    status = term.hang_up()
    assert status == 129, status  # 128 + SIGHUP: stopped by the hangup, not a crash
    assert _events(sessions)[-1]["reason"] == "stopped: disconnect"
    draft = load_draft(session)
    assert draft is not None and MARK in draft.text and draft.why == "disconnect"
    assert draft.version == 1 and draft.proposal is None
    assert scratch() == [], scratch()  # the worker's scratch went with it

    again = Terminal(["--resume", session.name, "--session-dir", str(sessions)], env)
    again.wait("the draft offered back",
               lambda: "draft kept" in _screen(again.output), 120)
    again.wait("the source on screen", lambda: "Starting kernel for gelu" in _screen(again.output), 60)
    assert MARK not in _screen(again.output)  # offered, not forced into the editor
    seen = len(again.output)
    again.child.send("\x0f")  # ctrl+o opens the draft
    again.wait("the draft in the editor", lambda: MARK in _screen(again.output[seen:]), 30)
    assert load_draft(session) is None  # in the editor now, its file gone
    again.child.send("\x11")  # ctrl+q: quit keeps the still-unsaved edit again
    again.wait("the app to exit", lambda: not again.child.isalive(), 60)
    again.child.close()
    assert again.child.exitstatus == 0
    assert load_draft(session) is not None and MARK in load_draft(session).text
    assert _events(sessions)[-1]["reason"] == "user quit"
    assert scratch() == []
