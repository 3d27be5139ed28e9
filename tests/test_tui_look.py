"""Low-colour and ASCII terminals: on 16 colours a diff's added and removed lines are
told apart without backgrounds; on the Linux console the spinner, pane corners and
status marks are ASCII. Chosen from TERM and the colour system Rich detects, or by
``[ui] colors`` / ``[ui] ascii``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from judges import RefusingJudge
from rich.color import ColorType
from scripted_agent import ScriptedAgent

from tilewright.agents.config import UIConfig
from tilewright.kernels.tasks.loaders import load_task
from tilewright.sessions.log import SessionLog
from tilewright.tui.app import TilewrightApp
from tilewright.tui.launch import ChipChoice, start_session
from tilewright.tui.look import Look, choose_look
from tilewright.tui.widgets.diffview import render_diff
from tilewright.tui.widgets.history import HistoryPane
from tilewright.tui.widgets.status import ActivityLine

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "session_gelu"
CHIP = ChipChoice("v5e", "TPU v5e", 16 * 2**20)
OLD = "a = 1\nb = 2\nc = 3\n"
NEW = "a = 1\nb = 20\nc = 3\nd = 4\n"


@pytest.mark.parametrize(("term", "system", "look"), [
    ("xterm-256color", "256", Look(False, False)),
    ("xterm", "standard", Look(True, False)),
    ("vt100", "standard", Look(True, True)),
    ("linux", "standard", Look(True, True)),
    ("xterm-256color", "truecolor", Look(False, False)),
])
def test_the_look_follows_the_terminal(term, system, look) -> None:
    assert choose_look(UIConfig(), term, system, "utf-8") == (look, None)


def test_the_config_chooses_by_hand_and_a_typo_is_said() -> None:
    forced = UIConfig(colors="16", ascii="yes")
    assert choose_look(forced, "xterm-256color", "truecolor", "utf-8") == (Look(True, True),
                                                                          None)
    full = UIConfig(colors="full", ascii="no")
    assert choose_look(full, "linux", "standard", "utf-8") == (Look(False, False), None)
    look, error = choose_look(UIConfig(colors="8"), "xterm", "standard", "utf-8")
    assert look.low_color and error and "[ui] colors '8'" in error
    assert choose_look(UIConfig(), "xterm-256color", "256", "ascii")[0].ascii  # no UTF-8


def _backgrounds(text) -> list:
    return [s for s in text.spans if getattr(s.style, "bgcolor", None) is not None] + \
        ([text.style] if getattr(text.style, "bgcolor", None) else [])


def test_a_diff_at_16_colours_has_no_backgrounds_and_says_which_line_is_which() -> None:
    rich = render_diff(OLD, NEW)
    assert _backgrounds(rich)  # the tinted rows of a full-colour terminal
    plain = render_diff(OLD, NEW, low_color=True)
    assert not _backgrounds(plain)
    lines = plain.plain.splitlines()
    assert "- b = 2" in lines[1] and "+ b = 20" in lines[2] and "+ d = 4" in lines[4]

    def colour_at(line: int) -> set[str]:
        start = sum(len(x) + 1 for x in lines[:line]) + len(lines[line]) - 2
        return {s.style.color.name for s in plain.spans
                if s.start <= start < s.end and s.style.color is not None}

    assert colour_at(1) == {"red"} and colour_at(2) == {"green"}
    for span in plain.spans:  # the 16 standard colours only: the same on every terminal
        if span.style.color is not None:
            assert span.style.color.type in (ColorType.STANDARD, ColorType.DEFAULT)


async def test_the_workbench_on_a_linux_console(tmp_path) -> None:
    path = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, path)

    async def opener():
        log, loaded = SessionLog.open(path)
        link = await start_session(load_task("gelu"), ScriptedAgent([]), RefusingJudge(),
                                   {}, sessions_dir=tmp_path, backend=None, chip=CHIP,
                                   log=log, loaded=loaded)
        return link, CHIP

    app = TilewrightApp({"ui": {"colors": "16", "ascii": "yes"}}, opener, term="linux")
    async with app.run_test(size=(120, 36)) as pilot:
        await app.workers.wait_for_complete()
        await app.link.wait_idle()
        for _ in range(3):
            await pilot.pause()
        screen = app.workbench
        assert app.look == Look(True, True)
        assert screen.query_one("#source").styles.border_top[0] == "ascii"
        assert set(screen.query_one(ActivityLine).SPINNER) <= set("|/-\\")
        body = screen.query_one("#diff-body").content
        assert not _backgrounds(body) and "+ " in body.plain
        table = screen.query_one(HistoryPane).query_one("DataTable")
        cells = " ".join(str(c) for r in range(table.row_count) for c in table.get_row_at(r))
        assert cells.isascii(), cells
        assert "correct" in cells
        await app.action_quit()


def test_the_look_reads_the_terminal_not_a_replaced_stdout(monkeypatch) -> None:
    class Capture:  # what a running Textual app puts in sys.stdout: no ``encoding``
        def write(self, text: str) -> int:
            return len(text)

    monkeypatch.setattr("sys.stdout", Capture())
    assert choose_look(UIConfig(), "linux", "standard")[0] == Look(True, True)
