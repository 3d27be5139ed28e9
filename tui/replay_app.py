"""``tilewright replay SESSION``: the replay screen in its own small app.

Continuing live (``c``) writes a branch session and hands over to the workbench app,
resuming that branch, once the replay app has closed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.app import App
from textual.binding import Binding

from tilewright.sessions.log import SessionError, load
from tilewright.tui import keymap
from tilewright.tui.app import apply_theme
from tilewright.tui.screens.modals import ErrorModal, HelpScreen
from tilewright.tui.screens.replay import ReplayScreen

REPLAY_HELP = [
    ("space", "Play", "Play or pause at the recorded pace times the speed"),
    ("→ / .", "Step", "One event forward"),
    ("← / ,", "Back", "One event back"),
    ("n / p", "Decision", "Next / previous proposal or decision"),
    ("+ / -", "Speed", "Faster / slower"),
    ("home / end", "Seek", "Start / end of the session"),
    ("c", "Continue", "Continue live from here as a new session branch"),
    ("F6 or alt+n", "Pane", "Next pane"),
    ("F7 or alt+z", "Zoom", "Maximize or restore the focused pane"),
    ("F1 or alt+h", "Help", "This help"),
    ("ctrl+q", "Quit", "Leave the replay"),
]


class ReplayApp(App):
    TITLE = "tilewright replay"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", id="quit", priority=True),
                Binding("f1,alt+h", "help", "Help", id="help", priority=True)]

    def __init__(self, path: Path, config: dict[str, Any] | None = None,
                 sessions_dir: Path | None = None) -> None:
        super().__init__()
        self.path = path
        self.config = config or {}
        self.sessions_dir = sessions_dir
        self._theme_error = apply_theme(self, self.config)
        self.keymap_overrides: dict[str, str] = {}  # read by keymap.remapped
        try:
            self.keymap_overrides = keymap.keymap_from_config(self.config)
            self.set_keymap(self.keymap_overrides)
        except keymap.KeymapError:
            pass  # the workbench reports keymap errors; replay keys are fixed

    def on_mount(self) -> None:
        try:
            loaded = load(self.path)
        except SessionError as exc:
            self.push_screen(ErrorModal("Cannot replay this session", str(exc),
                                        "`tilewright sessions` lists what can be replayed"),
                             lambda _: self.exit())
            return
        self.push_screen(ReplayScreen(loaded))

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        else:
            self.push_screen(HelpScreen(REPLAY_HELP, close_keys=["escape", "f1", "alt+h",
                                                                 "q"]))

    def branch_from(self, path: Path, seq: int) -> None:
        from tilewright.sessions.recorded.branch import branch_session

        try:
            branch = branch_session(path, seq, self.sessions_dir)
        except (SessionError, OSError) as exc:
            self.push_screen(ErrorModal("Could not create the branch", str(exc)))
            return
        self.exit(result=branch)


def run_replay(path: Path, config: dict[str, Any], session_dir: str | None = None) -> int:
    sessions_dir = Path(session_dir).expanduser() if session_dir else None
    branch = ReplayApp(path, config, sessions_dir).run()
    if not branch:
        return 0
    from tilewright.tui.app import run_app
    from tilewright.tui.launch import LaunchOptions

    print(f"continuing live in the branch {branch}")
    return run_app(LaunchOptions(resume=str(branch), session_dir=str(Path(branch).parent)),
                   config)
