"""Snapshots of the main screens at 120x36 and 80x24, and the screens' invariants.

The content is a recorded session (``tests/fixtures/session_gelu``, made by
``tests/fixtures/record_session_gelu.py`` with the real controller and worker pool), copied to a temporary
directory and resumed by the real controller, so what is drawn is fixed: no clocks, no
running work. Nothing is evaluated while a snapshot is taken; the evaluator given to
the controller refuses to run, which also proves that resuming a session with a
pending proposal runs nothing.
Update the baselines with ``pytest tests/test_tui_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from judges import RefusingJudge
from scripted_agent import ScriptedAgent
from waiting import until

from tilewright.kernels.tasks.loaders import load_task
from tilewright.sessions.log import SessionLog, load
from tilewright.tui.app import TilewrightApp
from tilewright.tui.launch import ChipChoice, start_session
from tilewright.tui.palette import WorkbenchCommands
from tilewright.tui.replay_app import ReplayApp
from tilewright.tui.screens.replay import ReplayScreen

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "session_gelu"
CHIP = ChipChoice("v5e", "TPU v5e", 16 * 2**20)


def session_copy(tmp_path: Path) -> Path:
    target = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, target)
    return target


def workbench(tmp_path: Path) -> TilewrightApp:
    path = session_copy(tmp_path)

    async def opener():
        log, loaded = SessionLog.open(path)
        link = await start_session(load_task("gelu"), ScriptedAgent([]), RefusingJudge(),
                                   {}, sessions_dir=tmp_path, backend=None, chip=CHIP,
                                   log=log, loaded=loaded)
        return link, CHIP

    return TilewrightApp({}, opener)


async def opened(pilot) -> None:
    app = pilot.app
    await app.workers.wait_for_complete()
    await app.link.wait_idle()
    await pilot.pause()
    await pilot.pause()
    chat = app.workbench.query_one("ChatPane")
    chat.flush()
    app.workbench.query_one("#editor").cursor_blink = False
    await pilot.pause()


@pytest.mark.parametrize("size", [(120, 36), (80, 24)], ids=["120x36", "80x24"])
def test_workbench_with_a_pending_proposal(snap_compare, tmp_path, size) -> None:
    assert snap_compare(workbench(tmp_path), terminal_size=size, run_before=opened)


def test_workbench_profile_pane_narrow(snap_compare, tmp_path) -> None:
    async def profile_tab(pilot) -> None:
        await opened(pilot)
        for _ in range(3):  # Source -> Chat -> Problems -> Profile
            await pilot.press("f6")
        await pilot.pause()

    assert snap_compare(workbench(tmp_path), terminal_size=(80, 24), run_before=profile_tab)


@pytest.mark.parametrize("size", [(120, 36), (80, 24)], ids=["120x36", "80x24"])
def test_replay_at_the_rejected_tuning(snap_compare, tmp_path, size) -> None:
    async def to_decision(pilot) -> None:
        await pilot.pause()
        screen = pilot.app.screen
        assert isinstance(screen, ReplayScreen)
        while not (screen.cursor and screen.events[screen.cursor - 1].get("decision")
                   == "reject"):
            await pilot.press("n")
        pilot.app.screen.query_one("ChatPane").flush()
        pilot.app.screen.query_one("#editor").cursor_blink = False
        await pilot.pause()

    app = ReplayApp(session_copy(tmp_path), {})
    assert snap_compare(app, terminal_size=size, run_before=to_decision)


def test_help_screen(snap_compare, tmp_path) -> None:
    async def help_(pilot) -> None:
        await opened(pilot)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(workbench(tmp_path), terminal_size=(120, 36), run_before=help_)


def test_the_app_process_never_imports_jax(tmp_path) -> None:
    """The workbench, fully drawn from a session with a profile, and no jax loaded."""
    code = (
        "import asyncio, sys\n"
        "sys.path.insert(0, 'tests')\n"
        "from pathlib import Path\n"
        "import test_tui_snapshots as t\n"
        "async def main():\n"
        f"    app = t.workbench(Path({str(tmp_path)!r}))\n"
        "    async with app.run_test(size=(120, 36)) as pilot:\n"
        "        await t.opened(pilot)\n"
        "        await pilot.press('f1')\n"
        "        await pilot.pause()\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))\n")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


async def test_palette_offers_what_the_session_allows(tmp_path) -> None:
    app = workbench(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await opened(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"approve")
        options = app.screen.query_one("CommandList")
        await until(lambda: any("Approve p4" in str(options.get_option_at_index(i).prompt)
                                for i in range(options.option_count)),
                    "the palette's hits (it searches in a worker)", timeout=10)
        names = [str(options.get_option_at_index(i).prompt)
                 for i in range(options.option_count)]
        assert any("Approve p4" in n for n in names)
        await pilot.press("escape")
        await pilot.pause()
        provider_names = [c[0] for c in WorkbenchCommands(app.screen).commands()]
        assert "Switch to autonomous mode" in provider_names
        assert "Revert to v2" in provider_names and "Revert to v3" not in provider_names
        assert not any(n.startswith("Cancel") for n in provider_names)


async def test_diff_toggle_history_diff_and_revert(tmp_path) -> None:
    app = workbench(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await opened(pilot)
        source = app.workbench.query_one("SourcePane")
        assert source.shown == "diff"
        await pilot.press("f3")
        assert source.shown == "editor" and source.editor.text.count("BLOCK_ROWS = 256") == 1
        await pilot.press("f3")
        assert source.shown == "diff"
        table = app.workbench.query_one("#history-table")
        table.focus()
        await pilot.press("down")  # v2 (newest first)
        await pilot.press("d")
        await pilot.pause()
        assert type(app.screen).__name__ == "DiffScreen"
        await pilot.press("escape")
        await pilot.press("enter")  # view v2, read-only
        await pilot.pause()
        assert type(app.screen).__name__ == "SourceScreen"
        assert "BLOCK_ROWS = 128" in app.screen.query_one("TextArea").text
        await pilot.press("escape")
        await pilot.press("r")  # revert to v2
        await app.link.wait_idle()
        await pilot.pause()
        assert app.link.state.current == 2
        events = [e["type"] for e in load(app.link.path).events]
        assert events[-1] == "kernel.checkout"
