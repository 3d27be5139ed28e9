"""The replay screen with Pilot: stepping, decision jumps, speed, play, and continuing
live from a point as a new session branch (its header names the parent and its fold
equals the parent's state at that point). Runs on the recorded gelu session."""

from __future__ import annotations

import shutil
from pathlib import Path

from tilewright.sessions.log import load
from tilewright.sessions.recorded.branch import branch_session
from tilewright.sessions.state import fold
from tilewright.tui.replay_app import ReplayApp
from tilewright.tui.screens.replay import SPEEDS, ReplayScreen
from tilewright.tui.widgets.chat import ChatPane
from tilewright.tui.widgets.history import HistoryPane
from tilewright.tui.widgets.source import SourcePane

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "session_gelu"


def copy(tmp_path: Path) -> Path:
    target = tmp_path / "sessions" / FIXTURE.name
    shutil.copytree(FIXTURE, target)
    return target


async def test_step_forward_back_and_jump_between_decisions(tmp_path: Path) -> None:
    app = ReplayApp(copy(tmp_path), {})
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ReplayScreen) and screen.cursor == 0
        await pilot.press("right")
        assert screen.cursor == 1
        assert screen.query_one(SourcePane).version == 1
        await pilot.press("n")  # p1 proposed
        event = screen.events[screen.cursor - 1]
        assert event["type"] == "agent.proposal" and event["proposal"] == "p1"
        assert screen.query_one(SourcePane).proposal == "p1"
        await pilot.press("n")  # ... and approved
        assert screen.events[screen.cursor - 1]["type"] == "user.decision"
        at_decision = screen.cursor
        await pilot.press("right", "right")
        assert screen.query_one(SourcePane).version == 2
        await pilot.press("left", "left")
        assert screen.cursor == at_decision
        await pilot.press("p")
        assert screen.events[screen.cursor - 1]["proposal"] == "p1"
        chat_before = screen.query_one(ChatPane).transcript()
        await pilot.press("end")
        assert screen.cursor == len(screen.events)
        assert [r.version for r in screen.query_one(HistoryPane).rows] == [1, 2, 3]
        assert len(screen.query_one(ChatPane).transcript()) > len(chat_before)
        await pilot.press("home")
        assert screen.cursor == 0 and screen.query_one(HistoryPane).rows == []


async def test_speed_and_play(tmp_path: Path) -> None:
    app = ReplayApp(copy(tmp_path), {})
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        screen = app.screen
        start = screen.speed_index
        await pilot.press("plus", "plus")
        assert SPEEDS[screen.speed_index] > SPEEDS[start]
        await pilot.press(*["plus"] * 10)
        assert screen.speed_index == len(SPEEDS) - 1  # clamped at the fastest
        await pilot.press("space")
        await app.workers.wait_for_complete()  # plays to the end, then stops
        assert screen.cursor == len(screen.events) and not screen.playing


async def test_continue_live_writes_a_branch(tmp_path: Path) -> None:
    source = copy(tmp_path)
    app = ReplayApp(source, {})
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        screen = app.screen
        await pilot.press("n", "n", "n")  # p2 proposed (a pending tuning)
        seq = screen.state_seq
        await pilot.press("c")
        await pilot.pause()
    branch = Path(app.return_value)
    assert branch.parent == source.parent and branch != source
    parent = load(source)
    child = load(branch)
    assert child.header["parent"] == {"session": parent.header["id"], "seq": seq}
    mine = fold(child.header, [e for e in child.events if e["type"] != "marker"])
    theirs = fold(parent.header, [e for e in parent.events if e["seq"] <= seq])
    assert mine.pending == theirs.pending == "p2"
    assert mine.versions.keys() == theirs.versions.keys()
    assert {n: v.source_blob for n, v in mine.versions.items()} == \
        {n: v.source_blob for n, v in theirs.versions.items()}
    for version in mine.versions.values():  # the blobs came along
        assert (branch / "blobs" / version.source_blob).exists()


def test_branch_of_an_autonomous_point_comes_back_in_step_mode(tmp_path: Path) -> None:
    source = copy(tmp_path)
    with open(source / "events.jsonl", "a") as fh:  # a session that ended in auto mode
        fh.write('{"seq":23,"t":30.0,"type":"mode.change","mode":"auto","by":"user"}\n')
    branch = branch_session(source, 23)
    loaded = load(branch)
    assert fold(loaded.header, loaded.events).mode == "step"
