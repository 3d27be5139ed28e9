"""No action needs a function key: each has a ctrl or alt key and a palette entry, hints
name the keys in force (a remapped keymap included), Esc leaves an edit recording
nothing, an unchanged edit is not submitted, and the shifted function keys of a Linux
console or rxvt reach the same action.

The workbench runs on the recorded session of the snapshot tests (a pending proposal
p4 over v3), resumed by the real controller with a judge that refuses to run; the
app's clock is fake, so the approval guard passes without sleeping.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from judges import RefusingJudge
from scripted_agent import ScriptedAgent
from waiting import until

from tilewright.kernels.tasks.loaders import load_task
from tilewright.sessions.log import SessionLog, load
from tilewright.tui import keymap
from tilewright.tui.app import TilewrightApp
from tilewright.tui.launch import ChipChoice, start_session
from tilewright.tui.palette import WorkbenchCommands
from tilewright.tui.screens.modals import HelpScreen
from tilewright.tui.session.link import CommandRefused, LiveLink
from tilewright.tui.widgets.panes import PaneGrid
from tilewright.tui.widgets.source import SourcePane
from tilewright.tui.widgets.status import ActivityLine, ApprovalBar

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "session_gelu"
CHIP = ChipChoice("v5e", "TPU v5e", 16 * 2**20)
FUNCTION_KEY_ACTIONS = sorted(bid for bid, (keys, *_r) in keymap.ACTIONS.items()
                              if any(k.split("+")[-1][:1] == "f" and
                                     k.split("+")[-1][1:].isdigit()
                                     for k in keys.split(",")))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def workbench(tmp_path: Path, config: dict | None = None, term: str = "xterm-256color"
              ) -> TilewrightApp:
    path = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, path)

    async def opener():
        log, loaded = SessionLog.open(path)
        link = await start_session(load_task("gelu"), ScriptedAgent([]), RefusingJudge(),
                                   config or {}, sessions_dir=tmp_path, backend=None,
                                   chip=CHIP, log=log, loaded=loaded)
        return link, CHIP

    return TilewrightApp(config or {}, opener, clock=FakeClock(), term=term)


async def opened(app: TilewrightApp, pilot) -> None:
    await app.workers.wait_for_complete()
    await until(lambda: app.link is not None, "the session to open")
    await app.link.wait_idle()
    for _ in range(3):
        await pilot.pause()
    app.clock.now += 1  # past the approval guard


def types(app: TilewrightApp) -> list[str]:
    return [e["type"] for e in load(app.link.path).events]


def notes(app: TilewrightApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


def test_every_function_key_action_has_a_key_terminals_pass() -> None:
    assert {"edit", "toggle_diff", "cancel", "next_pane", "prev_pane", "maximize", "chat",
            "help"} <= set(FUNCTION_KEY_ACTIONS)
    seen: dict[str, str] = {}
    for bid, (keys, *_rest) in keymap.ACTIONS.items():
        split = keys.split(",")
        others = [k for k in split if not k.split("+")[-1].startswith("f")
                  or not k.split("+")[-1][1:].isdigit()]
        if bid in FUNCTION_KEY_ACTIONS:
            assert others, f"{bid} has only function keys"
        for key in split:
            assert key not in seen, f"{key} is bound to {seen[key]} and {bid}"
            seen[key] = bid
            # ctrl+p is VS Code's, ctrl+a and ctrl+b screen's and tmux's prefixes,
            # ctrl+s/ctrl+q flow control, ctrl+c/z/h/i/m/j the terminal's own.
            assert key not in {"ctrl+p", "ctrl+a", "ctrl+b", "ctrl+s", "ctrl+c", "ctrl+z",
                               "ctrl+h", "ctrl+i", "ctrl+m", "ctrl+j"}, (bid, key)
    assert not set(seen) & set(keymap.TEXTUAL_IDS.values())


async def test_every_function_key_action_is_in_the_palette(tmp_path, monkeypatch) -> None:
    app = workbench(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await opened(app, pilot)
        provider = WorkbenchCommands(app.workbench)
        pending = {c.action for c in provider.commands()}
        monkeypatch.setattr(LiveLink, "busy", property(lambda self: "run"))
        busy = {c.action for c in provider.commands()}
        monkeypatch.undo()
        missing = set(FUNCTION_KEY_ACTIONS) - pending - busy
        assert not missing, f"not in the palette: {missing}"
        # Each entry's help line names the keys in force.
        for command in provider.commands():
            if command.action in FUNCTION_KEY_ACTIONS:
                assert keymap.say(app, command.action) in command.help, command
        # Help from the palette, the palette opened without ctrl+p.
        await pilot.press("alt+p")
        await pilot.pause()
        assert type(app.screen).__name__ == "CommandPalette"
        await pilot.press(*"help")
        options = app.screen.query_one("CommandList")
        await until(lambda: options.option_count and "Help" in str(  # searched in a worker
            options.get_option_at_index(0).prompt), "the palette's hits", timeout=10)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("alt+h")  # the help key closes it too
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        await app.action_quit()


async def test_the_ctrl_and_alt_keys_drive_their_actions(tmp_path) -> None:
    app = workbench(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await opened(app, pilot)
        screen = app.workbench
        grid, source = screen.query_one(PaneGrid), screen.query_one(SourcePane)
        await pilot.press("alt+h")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert source.shown == "diff"
        await pilot.press("alt+d")
        assert source.shown == "editor"
        await pilot.press("alt+d")
        assert source.shown == "diff"
        await pilot.press("alt+m")
        assert grid.focused_pane() == "chat"
        await pilot.press("alt+n")
        after_chat = grid.focused_pane()
        await pilot.press("alt+b")
        assert grid.focused_pane() == "chat" != after_chat
        await pilot.press("alt+z")
        assert screen.maximized is not None
        await pilot.press("alt+z")
        assert screen.maximized is None
        await pilot.press("alt+x")
        assert "nothing to cancel" in notes(app)
        await pilot.press("ctrl+o")
        assert source.editing and not source.editor.read_only
        await app.action_quit()


async def test_hints_follow_a_remapped_keymap(tmp_path) -> None:
    config = {"keys": {"cancel": "f10", "edit": "ctrl+e", "approve": "ctrl+l",
                       "toggle_diff": "f4", "help": "f12", "command_palette": "ctrl+k"}}
    app = workbench(tmp_path, config)
    async with app.run_test(size=(160, 40)) as pilot:
        await opened(app, pilot)
        screen = app.workbench
        assert screen.query_one(ActivityLine).cancel_hint == "F10 twice cancels"
        bar = str(screen.query_one(ApprovalBar).render())
        for said in ("ctrl+l approve", "ctrl+e edit", "F4 diff"):
            assert said in bar, bar
        for default in ("ctrl+y", "F2", "F3", "ctrl+o", "alt+d"):
            assert default not in bar, bar
        await pilot.press("ctrl+e")
        assert any("ctrl+e or ctrl+l submits it" in n for n in notes(app)), notes(app)
        await pilot.press("f12")
        assert isinstance(app.screen, HelpScreen)
        hint = str(app.screen.query(".dialog-hint").first().render())
        assert "F12 closes" in hint and "ctrl+k or alt+p opens" in hint, hint
        assert not re.search(r"\bF1\b|ctrl\+p", hint), hint
        extra = str(app.screen.query("Static")[2].render())
        assert "F4 toggles the full source" in extra and "F3" not in extra, extra
        await pilot.press("f12")
        assert not isinstance(app.screen, HelpScreen)
        await app.action_quit()


async def test_escape_leaves_an_edit_and_records_nothing(tmp_path) -> None:
    app = workbench(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await opened(app, pilot)
        before = types(app)
        source = app.workbench.query_one(SourcePane)
        await pilot.press("ctrl+o")
        assert source.editing
        await pilot.press("escape")  # nothing typed: out at once
        assert not source.editing and source.shown == "diff" and source.editor.read_only
        await pilot.press("f2")
        await pilot.press("end", *"  # mine")
        assert source.is_modified()
        await pilot.press("escape")  # typing is not dropped on one Esc ...
        assert source.editing and any("press Esc again" in n for n in notes(app))
        await pilot.press("escape")  # ... but on the second
        assert not source.editing and not source.is_modified()
        assert source.proposal == "p4" and app.link.state.pending == "p4"
        assert types(app) == before  # no decision, no version, no run
        await app.action_quit()


async def test_an_unchanged_edit_is_not_submitted(tmp_path) -> None:
    app = workbench(tmp_path)
    async with app.run_test(size=(120, 36)) as pilot:
        await opened(app, pilot)
        source = app.workbench.query_one(SourcePane)
        before = types(app)
        await pilot.press("f2")
        await pilot.press("f2")  # the proposal unchanged: nothing to submit
        assert any("nothing to submit: proposal p4 is unchanged" in n for n in notes(app))
        assert types(app) == before and not source.editing
        await pilot.press("ctrl+n")  # reject p4 without a note: nothing pending
        await pilot.pause()
        await pilot.press("enter")
        await app.link.wait_idle()
        await pilot.pause()
        assert app.link.state.pending is None and source.proposal is None
        before = types(app)
        await pilot.press("ctrl+o")
        assert source.editing
        await pilot.press("ctrl+y")  # the approve key submits an edit: there is none
        await pilot.pause()
        assert any("nothing to submit: v3 is unchanged" in n for n in notes(app))
        assert types(app) == before and 4 not in app.link.state.versions
        # The controller refuses it too, whoever sends it.
        with pytest.raises(CommandRefused, match="nothing to submit"):
            app.link.edit(source.current_source)
        await app.action_quit()


async def test_shifted_function_keys_of_a_linux_console(tmp_path) -> None:
    from textual import constants
    from textual._xterm_parser import XTermParser

    kitty = constants.DISABLE_KITTY_KEY
    try:
        app = workbench(tmp_path, term="linux")
        assert "f16" in keymap.keys_of(app, "prev_pane")

        def keys(data: str) -> list[str]:
            return [e.key for e in XTermParser().feed(data) if hasattr(e, "key")]

        assert keys("\x1b[29~") == ["f16"]  # shift+F6 on the console and in rxvt
        assert keys("\x1b[17$") == ["shift+f6"]  # rxvt's shift suffix
        async with app.run_test(size=(120, 36)) as pilot:
            await opened(app, pilot)
            grid = app.workbench.query_one(PaneGrid)
            await pilot.press("alt+m")
            assert grid.focused_pane() == "chat"
            await pilot.press("f6")
            ahead = grid.focused_pane()
            await pilot.press("f16")
            assert grid.focused_pane() == "chat" != ahead
            await app.action_quit()
    finally:
        constants.DISABLE_KITTY_KEY = kitty  # type: ignore[misc]
    assert "f16" not in keymap.keys_of(TilewrightApp({}, term="xterm"), "prev_pane")


@pytest.mark.parametrize(("environ", "said"), [
    ({"SSH_CONNECTION": "10.0.0.2 51000 10.0.0.1 22", "SSH_TTY": "/dev/pts/3"}, True),
    ({"SSH_CONNECTION": "10.0.0.2 51000 10.0.0.1 22", "TMUX": "/tmp/tmux-0/default,1,0"},
     False),
    ({"SSH_TTY": "/dev/pts/3", "STY": "123.pts-3.host"}, False),
    ({}, False),
], ids=["ssh", "ssh-in-tmux", "ssh-in-screen", "local"])
async def test_a_remote_user_is_told_once_what_a_drop_does(tmp_path, environ, said) -> None:
    from tilewright.tui.widgets.chat import ChatPane

    path = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, path)

    async def opener():
        log, loaded = SessionLog.open(path)
        link = await start_session(load_task("gelu"), ScriptedAgent([]), RefusingJudge(),
                                   {}, sessions_dir=tmp_path, backend=None, chip=CHIP,
                                   log=log, loaded=loaded)
        return link, CHIP

    app = TilewrightApp({"keys": {"cancel": "f10,ctrl+k"}}, opener, clock=FakeClock(),
                        environ=environ)
    async with app.run_test(size=(120, 36)) as pilot:
        await opened(app, pilot)
        chat = app.workbench.query_one(ChatPane)
        chat.flush()
        await pilot.pause()
        text = "\n".join(str(n.render()) for n in chat.query(".notice"))
        assert ("if the connection drops, this workbench ends" in text) is said
        if said:
            assert text.count("Over SSH") == 1 and any("over SSH" in n for n in notes(app))
            assert f"tilewright --resume {FIXTURE.name}" in text and "tmux new" in text
            assert "F10/ctrl+k cancel" in text and "F8" not in text  # the keys in force
            assert "tilewright auto --resume" in text
        await app.action_quit()
