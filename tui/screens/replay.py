"""Replay a recorded session through the same panes as live work.

The cursor is how many events have been applied; every position is
``fold(header, events[:cursor])`` rendered by the live ``Presenter``. Play advances at
the recorded pace times the speed (gaps capped so idle minutes do not stall it); step
moves one event; n/p jump between decisions; c continues live from the cursor as a new
session branch (the app then opens it).
"""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Input, Static

from tilewright.sessions import events as ev
from tilewright.sessions.log import LoadedSession, read_blob
from tilewright.sessions.recorded.replay import detail
from tilewright.sessions.state import fold
from tilewright.tui.session.presenter import Presenter
from tilewright.tui.session.view import BlobCache, SessionView
from tilewright.tui.widgets.chat import ChatPane
from tilewright.tui.widgets.footer import KeyFooter
from tilewright.tui.widgets.panes import PaneGrid
from tilewright.tui.widgets.source import SourcePane
from tilewright.tui.widgets.status import StatusBar

SPEEDS = (0.5, 1.0, 2.0, 4.0, 8.0, 32.0)
MAX_GAP_S = 1.5  # the longest pause between two events while playing (before speed)
DECISIONS: tuple[ev.EventType, ...] = ("user.decision", "agent.proposal")


class ReplayScreen(Screen):
    CSS_PATH = "replay.tcss"
    BINDINGS = [
        Binding("space", "play", "Play/pause", priority=True, id="replay.play"),
        Binding("right,period", "step(1)", "Step", priority=True, id="replay.step"),
        Binding("left,comma", "step(-1)", "Back", priority=True, id="replay.back"),
        Binding("n", "decision(1)", "Next decision", priority=True, id="replay.next_decision"),
        Binding("p", "decision(-1)", "Prev decision", priority=True,
                id="replay.prev_decision"),
        Binding("plus,equals_sign", "speed(1)", "Faster", priority=True, id="replay.faster"),
        Binding("minus", "speed(-1)", "Slower", priority=True, id="replay.slower"),
        Binding("home", "seek(0)", "Start", show=False, priority=True, id="replay.start"),
        Binding("end", "seek(-1)", "End", show=False, priority=True, id="replay.end"),
        Binding("c", "branch", "Continue live", priority=True, id="replay.branch"),
        Binding("f6,alt+n", "cycle_pane(1)", "Pane", priority=True, id="next_pane"),
        Binding("f7,alt+z", "maximize", "Zoom", priority=True, id="maximize"),
    ]

    def __init__(self, loaded: LoadedSession) -> None:
        super().__init__()
        self.loaded = loaded
        self.events: list[ev.Event] = [e for e in loaded.events
                                       if isinstance(e.get("seq"), int)]
        self.cursor = 0
        self.playing = False
        self.speed_index = SPEEDS.index(4.0)
        self.blobs = BlobCache(lambda sha: read_blob(loaded.path, sha))
        self.presenter: Presenter | None = None

    def compose(self) -> ComposeResult:
        yield PaneGrid(id="grid")
        yield Static("", id="transport")
        yield StatusBar(id="status")
        yield KeyFooter()

    def on_mount(self) -> None:
        grid = self.query_one(PaneGrid)
        self.presenter = Presenter(grid)
        self.presenter.agent_label = str(self.loaded.header.get("agent") or "agent")
        self.presenter.base_dir = self.loaded.path
        self.query_one(ChatPane).set_agent_label(self.presenter.agent_label)
        chat_input = self.query_one("#chat-input", Input)
        chat_input.disabled = True  # a recording takes no messages; continue live (c) does
        chat_input.placeholder = "replay: press c to continue live from here"
        self.query_one(SourcePane).editor.read_only = True
        for warning in self.loaded.warnings:
            self.notify(warning, severity="warning", timeout=8)
        self.seek(0)

    # -- moving the cursor ------------------------------------------------------------
    @property
    def state_seq(self) -> int:
        return self.events[self.cursor - 1]["seq"] if self.cursor else 0

    def seek(self, cursor: int) -> None:
        cursor = max(0, min(cursor, len(self.events)))
        assert self.presenter is not None
        if cursor < self.cursor or cursor == 0:
            self.query_one(ChatPane).clear()
            start = 0
        else:
            start = self.cursor
        for event in self.events[start:cursor]:
            self.presenter.chat_entry(event)
        self.cursor = cursor
        state = fold(self.loaded.header, self.events[:cursor])
        view = SessionView(state, self.blobs)
        with self.app.batch_update():
            self.presenter.render(view)
            self.query_one(SourcePane).editor.read_only = True
            self.query_one(StatusBar).info = view.status("replay", None)
            self._draw_transport()

    def _draw_transport(self) -> None:
        total = len(self.events)
        event = self.events[self.cursor - 1] if self.cursor else None
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" ▶ playing " if self.playing else " ❚❚ paused ",
                    style="bold reverse green" if self.playing else "bold reverse")
        text.append(f" {SPEEDS[self.speed_index]:g}x · event {self.cursor}/{total}")
        if event is not None:
            text.append(f" · t={float(event.get('t', 0)):.1f}s · ")
            text.append(_describe(event), style="bold")
        else:
            text.append(" · start of the session")
        self.query_one("#transport", Static).update(text)

    # -- actions ----------------------------------------------------------------------
    def action_step(self, step: int) -> None:
        self.playing = False
        self.seek(self.cursor + step)

    def action_seek(self, where: int) -> None:
        self.playing = False
        self.seek(len(self.events) if where < 0 else where)

    def action_decision(self, direction: int) -> None:
        self.playing = False
        index = self.cursor - 1  # the event shown last
        while True:
            index += direction
            if index < 0 or index >= len(self.events):
                self.notify("no more decisions that way", timeout=2)
                return
            if self.events[index]["type"] in DECISIONS:
                self.seek(index + 1)
                return

    def action_speed(self, step: int) -> None:
        self.speed_index = max(0, min(len(SPEEDS) - 1, self.speed_index + step))
        self._draw_transport()

    def action_play(self) -> None:
        self.playing = not self.playing
        if self.playing and self.cursor >= len(self.events):
            self.seek(0)
        self._draw_transport()
        if self.playing:
            self._play()

    @work(exclusive=True, exit_on_error=False, group="replay")
    async def _play(self) -> None:
        while self.playing and self.cursor < len(self.events):
            prev = float(self.events[self.cursor - 1].get("t", 0)) if self.cursor else 0.0
            gap = float(self.events[self.cursor].get("t", 0)) - prev
            await asyncio.sleep(min(max(gap, 0.05), MAX_GAP_S) / SPEEDS[self.speed_index])
            if self.playing:
                self.seek(self.cursor + 1)
        self.playing = False
        self._draw_transport()

    def action_cycle_pane(self, step: int) -> None:
        self.query_one(PaneGrid).cycle(step)

    def action_maximize(self) -> None:
        if self.maximized is not None:
            self.minimize()
            return
        grid = self.query_one(PaneGrid)
        self.maximize(grid.pane(grid.focused_pane() or grid.active), container=False)

    def action_branch(self) -> None:
        self.playing = False
        self.app.branch_from(self.loaded.path, self.state_seq)  # type: ignore[attr-defined]


def _describe(event: ev.Event) -> str:
    """The transport line's words for the event at the cursor: the timeline's
    (``tilewright replay --print``), else its kind."""
    return detail(event) or str(event["type"])
