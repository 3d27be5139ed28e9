"""The workbench at 80x24, driven with Pilot against the real controller and one real
worker (the bundled gelu task shrunk to one block): the status bar always names the
backend, F1 help scrolls to its last line, F2 brings the Source tab forward from
another tab, the footer never shows a key without a label, and History's x exports a
version as a module."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_asyncio
from scripted_agent import ScriptedAgent, tuning
from textual.containers import VerticalScroll
from textual.widgets import Input, Tabs
from tui_apps import FakeClock, make_app, settle

from tilewright.kernels.pool.workers import WorkerPool
from tilewright.kernels.tasks.loaders import load_task
from tilewright.tui.screens.modals import HelpScreen, NotePrompt
from tilewright.tui.widgets.footer import KeyFooter
from tilewright.tui.widgets.history import HistoryPane
from tilewright.tui.widgets.status import StatusBar

pytestmark = pytest.mark.asyncio(loop_scope="module")
SIZE = (80, 24)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool():
    async with WorkerPool() as p:
        yield p


@pytest.fixture(scope="module")
def gelu():
    return load_task("gelu", {"rows": "64", "cols": "256"})


def status_text(app) -> str:
    return app.workbench.query_one(StatusBar).render().plain


async def test_the_status_bar_names_the_backend_before_and_after_a_result(
        tmp_path: Path, gelu, pool) -> None:
    app = make_app(tmp_path, gelu, ScriptedAgent([tuning(BLOCK_ROWS=128)]), pool)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        assert "CPU interp→v5e" in status_text(app)
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        assert app.link.state.versions[1].status == "correct"
        line = status_text(app)
        assert "CPU interp→v5e" in line and "best v1 est. " in line, line
        assert line.rstrip().endswith("ready") and "idle" not in line


async def test_help_scrolls_to_its_last_line(tmp_path: Path, gelu, pool) -> None:
    app = make_app(tmp_path, gelu, ScriptedAgent([]), pool)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        body = app.screen.query_one("#help-body", VerticalScroll)
        assert app.screen.focused is body and body.max_scroll_y > 0  # longer than 24 rows
        for _ in range(6):
            await pilot.press("pagedown")
        await pilot.pause()
        assert body.scroll_y == body.max_scroll_y > 0
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_f2_shows_the_source_tab(tmp_path: Path, gelu, pool) -> None:
    app = make_app(tmp_path, gelu, ScriptedAgent([]), pool)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        tabs = app.workbench.query_one("#pane-tabs", Tabs)
        await pilot.press("f5")  # the chat tab, its input focused
        await pilot.pause()
        assert tabs.active == "tab-chat"
        await pilot.press("f2")
        await pilot.pause()
        assert tabs.active == "tab-source"
        source = app.workbench.query_one("#source")
        assert source.display and source.editing


async def test_the_footer_keeps_a_label_on_every_key(tmp_path: Path, gelu, pool) -> None:
    app = make_app(tmp_path, gelu, ScriptedAgent([]), pool)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        footer = app.workbench.query_one(KeyFooter)
        text = footer.render().plain
        assert "f1 help" in text and "^q quit" in text and "^y yes" in text, text
        drawn = [item for _start, _end, item in footer._spans]
        assert drawn and all(item.description for item in drawn)
        for item in drawn:
            assert f"{item.display} {item.description}" in text


async def test_history_x_exports_a_version(tmp_path: Path, gelu, pool) -> None:
    app = make_app(tmp_path, gelu, ScriptedAgent([]), pool, clock=FakeClock())
    out = tmp_path / "out" / "gelu_v1.py"
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        app.workbench.query_one(HistoryPane).query_one("DataTable").focus()
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, NotePrompt)
        field = app.screen.query_one(Input)
        assert field.value == "gelu_v1.py"
        field.value = str(out)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert out.is_file() and (out.parent / "test_gelu_v1.py").is_file()
        module = out.read_text()
        assert "# gelu: v1 of tilewright session" in module and "def kernel(" in module
