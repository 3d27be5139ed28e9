"""The workbench at 80x24: notifications never cover the decision bar, the
status line or the keys; a proposal that applies to another version than the shown one
is drawn against that version and says so; ctrl+q during an evaluation asks first.
The real app through ``run_test`` with the real controller and the in-process
``MarkedJudge`` (its verdict is a marker in the source: no worker needed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from judges import MarkedJudge
from scripted_agent import ScriptedAgent, kernel
from textual.widgets._toast import Toast
from waiting import until

from tilewright.kernels.tasks.loaders import load_task
from tilewright.tui.app import TilewrightApp
from tilewright.tui.launch import start_session
from tilewright.tui.screens.modals import ErrorModal
from tilewright.tui.widgets.diffview import DiffView
from tilewright.tui.widgets.footer import KeyFooter
from tilewright.tui.widgets.source import SourcePane
from tilewright.tui.widgets.status import ApprovalBar, StatusBar

pytestmark = pytest.mark.asyncio
SIZE = (80, 24)

SOURCE = """import jax
BLOCK_ROWS = {rows}
TUNABLES = {{"BLOCK_ROWS": [8, 16, 32, 64, 128]}}

def kernel(x):
    return x  # eval: correct {speed} {tag}
"""


def tunable(rows: int, speed: float, tag: str = "") -> str:
    return SOURCE.format(rows=rows, speed=speed, tag=tag)


def make_app(tmp_path: Path, agent: ScriptedAgent, judge: MarkedJudge) -> TilewrightApp:
    from tui_apps import CHIP

    config = {"controller": {"propose_after_run": False}}

    async def opener():
        link = await start_session(load_task("gelu", {"rows": "64", "cols": "256"}), agent,
                                   judge, config, sessions_dir=tmp_path, chip=CHIP,
                                   backend={"platform": "cpu", "mode": "tpu-interpret",
                                            "label": "CPU (TPU interpret)"})
        return link, CHIP

    return TilewrightApp(config, opener)


async def opened(app: TilewrightApp, pilot) -> None:
    await app.workers.wait_for_complete()
    await until(lambda: app.link is not None, "the session to open")
    await app.link.wait_idle()
    for _ in range(3):
        await pilot.pause()


async def test_notifications_never_cover_the_decision_bar_or_the_keys(tmp_path: Path) -> None:
    app = make_app(tmp_path, ScriptedAgent([kernel(tunable(32, 2.0), "rows 32")]),
                   MarkedJudge())
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await opened(app, pilot)
        controller = app.link._controller
        controller.request_proposal("tune")
        await opened(app, pilot)
        for i in range(3):  # several at once, long ones
            app.workbench.notify(f"notice {i}: " + "words " * 30, timeout=30)
        await until(lambda: list(app.screen.query(Toast)), "the notices on screen")
        bars = [app.workbench.query_one(w) for w in (ApprovalBar, StatusBar, KeyFooter)]
        assert app.workbench.query_one(ApprovalBar).region.height > 0  # a decision is due
        # What is drawn on every cell of the bars is the bar, never a notification.
        for bar in bars:
            region = bar.region
            for y in range(region.y, region.bottom):
                for x in range(region.x, region.right):
                    top, _ = app.screen.get_widget_at(x, y)
                    assert not isinstance(top, Toast) and \
                        not any(isinstance(n, Toast) for n in top.ancestors), (x, y, top)


async def test_a_proposal_on_another_version_is_drawn_against_it(tmp_path: Path) -> None:
    agent = ScriptedAgent([kernel(tunable(32, 2.0, "a"), "rows 32"),
                           kernel(tunable(128, 1.5, "b"), "rows 128"),
                           kernel(tunable(64, 2.5, "c"), "rows 64")])
    app = make_app(tmp_path, agent, MarkedJudge())
    async with app.run_test(size=SIZE) as pilot:
        await opened(app, pilot)
        controller = app.link._controller
        for _ in range(2):
            controller.request_proposal("tune")
            await opened(app, pilot)
            controller.approve()
            await opened(app, pilot)
        assert controller.state.best == 2 and controller.state.current == 3
        controller.request_proposal("tune")
        await opened(app, pilot)
        pane = app.workbench.query_one(SourcePane)
        assert controller.state.current == 3  # the shown version did not move
        assert pane.version == 3 and pane.proposal_base == 2
        assert "proposal p3 on v2 pending" in str(pane.border_title)
        # The diff is drawn from v2 (rows 32), not the shown v3 (rows 128).
        drawn = str(app.workbench.query_one(DiffView).query_one("#diff-body").render())
        assert "BLOCK_ROWS = 32" in drawn and "BLOCK_ROWS = 64" in drawn
        assert "BLOCK_ROWS = 128" not in drawn


async def test_quitting_during_an_evaluation_asks(tmp_path: Path) -> None:
    gate = asyncio.Event()
    judge = MarkedJudge(gate=gate)
    app = make_app(tmp_path, ScriptedAgent([]), judge)
    async with app.run_test(size=SIZE) as pilot:
        await app.workers.wait_for_complete()
        await until(lambda: app.link is not None, "the session to open")
        await pilot.press("ctrl+r")
        await asyncio.wait_for(judge.started.wait(), 10)
        await pilot.pause()
        assert app.link.busy == "run"
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert isinstance(app.screen, ErrorModal) and "Quit while an evaluation runs" in \
            app.screen.title_text
        await pilot.press("escape")  # stays
        await pilot.pause()
        assert not isinstance(app.screen, ErrorModal) and app.link is not None
        gate.set()
        await app.link.wait_idle()
        await pilot.pause()
        await pilot.press("ctrl+q")  # idle: quits without asking
        await pilot.pause()
        assert app.link is None


async def test_the_first_screen_says_what_to_press_next(tmp_path: Path) -> None:
    agent = ScriptedAgent([kernel(tunable(32, 2.0), "rows 32")])
    app = make_app(tmp_path, agent, MarkedJudge())
    async with app.run_test(size=SIZE) as pilot:
        await opened(app, pilot)
        bar = app.workbench.query_one(ApprovalBar)
        said = str(bar.render())
        assert said.startswith("next ctrl+r evaluates v1") and "/plan" in said, said
        assert bar.region.height == 1 and bar.proposal is None  # one line; takes no key
        await pilot.press("ctrl+r")
        await opened(app, pilot)
        assert app.link.state.versions[1].status == "correct"
        # v1 is evaluated (and no proposal is asked for in this config): the hint is gone
        assert not bar.has_class("-pending") and not bar.has_class("-hint")
        app.link._controller.request_proposal("tune")
        await opened(app, pilot)
        assert bar.has_class("-pending") and not bar.has_class("-hint")
        assert str(bar.render()).startswith("decide ")


async def test_after_the_persons_failing_edit_the_bar_says_the_way_back(tmp_path: Path) -> None:
    app = make_app(tmp_path, ScriptedAgent([]), MarkedJudge())
    async with app.run_test(size=SIZE) as pilot:
        await opened(app, pilot)
        app.link._controller.edit(SOURCE.format(rows=8, speed=1.0, tag="").replace(
            "eval: correct", "eval: compile_error"))
        await opened(app, pilot)
        said = str(app.workbench.query_one(ApprovalBar).render())
        assert said.startswith("next v2, your edit, failed: f2 edits it again"), said
        assert "History: r reverts to v1" in said  # the key that does it, not enter


async def test_problems_show_the_whole_tpu_line_and_hint_at_80_columns() -> None:
    from textual.app import App
    from textual.widgets import Static

    from tilewright.tui.problems import Problem
    from tilewright.tui.widgets.problems import ProblemsPane

    tpu = ("v5e: compiles · VMEM 0.2/16.0 MiB · est. 0.35x on v5e at 8192x8192 (TPU "
           "compiler, scaled, memory floor decided; its cycles alone say 0.20x) · "
           "memory-bound v6e: median 0.81 of measured, 4 programs, 100% within 2x")
    hint = ("shrink the block: " + "the footprint is about twice the sum of the blocks " * 4
            + "END-OF-HINT")

    class Host(App):
        def compose(self):
            yield ProblemsPane()

    app = Host()
    async with app.run_test(size=SIZE) as pilot:
        pane = app.query_one(ProblemsPane)
        pane.show([Problem("error", "compile", "out of VMEM", hint=hint)], tpu)
        await pilot.pause()
        await pilot.pause()
        assert pane.border_subtitle == "v5e: compiles · VMEM 0.2/16.0 MiB"
        below = pane.query_one("#problems-tpu", Static)
        assert below.display and str(below.render()) == tpu
        shown = pane.query_one("#problems-hint", Static)
        assert shown.region.height * shown.region.width >= len(hint)  # not cut at 3 lines
        assert "END-OF-HINT" in str(shown.render())
