"""The Textual application: composes the screens and routes app-wide actions.

Session work lives in ``sessions``; panes live in ``tui.widgets``; what a key does on
the workbench lives in ``tui.screens.workbench``. This class only sets up the theme,
the keymap and the command palette, opens the session after the first paint, and
closes it on quit.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from textual import events, work
from textual.app import App
from textual.binding import Binding
from textual.worker import Worker, WorkerState

from tui import keymap
from tui.palette import WorkbenchCommands
from tui.screens.modals import ErrorModal, HelpScreen
from tui.screens.workbench import WorkbenchScreen
from tui.widgets.status import ActivityLine

if TYPE_CHECKING:  # sessions and kernels load after the first paint, in the opener
    from agents.config import Config
    from tui.launch import ChipChoice, LaunchOptions
    from tui.link import LiveLink

# Called with no argument, or with an agent kind ("offline") to open with another agent.
Opener = Callable[..., Awaitable[tuple["LiveLink", "ChipChoice"]]]

FULL_GC_NEVER = 10**9  # generation-2 threshold: no automatic full collections
FULL_GC_CHECK_S = 1.0
FULL_GC_QUIET_S = 1.0  # a full collection waits for this long without a key
FULL_GC_AFTER_YOUNG = 10  # ...and for as many generation-1 collections as CPython's own
FULL_GC_MAX_WAIT_S = 30.0  # but never longer than this

HELP_EXTRA = "\n".join((
    "Panes: Source (the editor; a pending proposal shows as a diff, F3 toggles the full "
    "source), Chat (Enter sends), Problems (Enter jumps to the line), Profile (the "
    "timeline: ←/→ pan, +/- zoom, [ ] select an event, 0 fits), History (Enter views, d "
    "diffs against the current version, r reverts, x exports it as a module for your "
    "code).",
    "Chat: /plan [wishes] asks for a plan, /explain [vN] [question] for an explanation.",
    "The approval keys are ignored for half a second after a proposal appears.",
    "Remap any key in the config file's [keys] table (`tilewright config` shows it).",
))


class TilewrightApp(App):
    TITLE = "tilewright"
    # Notifications at the top right: at the bottom (Textual's place) they cover the
    # decision bar, the status line and the keys exactly when a decision is due.
    CSS = """
    ToastRack { dock: top; align: right top; margin-bottom: 0; margin-top: 1;
                max-height: 55%; }
    """
    COMMANDS = App.COMMANDS | {WorkbenchCommands}
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", id="quit", priority=True)]

    def __init__(self, config: Config | dict[str, Any] | None = None,
                 opener: Opener | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.config = config or {}
        self.opener = opener
        self.clock = clock
        self.link: LiveLink | None = None
        self.session_path: Any = None  # the open session's directory, said on quit
        self.session_task: str | None = None
        self.exit_message: str | None = None  # printed after the screen is gone
        self.last_key_at = float("-inf")  # time.monotonic() of the newest key event
        self._full_gc_at = time.monotonic()
        self._gc_threshold: tuple[int, ...] | None = None  # CPython's, while ours is set
        self._theme_error = apply_theme(self, self.config)
        self._keymap_error: str | None = None
        self.keymap_overrides: dict[str, str] = {}  # read by keymap.remapped
        try:
            self.keymap_overrides = keymap.keymap_from_config(self.config)
            self.set_keymap(self.keymap_overrides)
        except keymap.KeymapError as exc:  # a typo in the config must not stop the app
            self._keymap_error = str(exc)

    async def on_mount(self) -> None:
        await self.push_screen(WorkbenchScreen(self.clock))  # mounted before a session lands
        for error in (self._keymap_error, self._theme_error):
            if error:
                self.notify(error, title="config", severity="error", timeout=15)
        if self.opener is not None:
            self._open_session()

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key):
            self.last_key_at = time.monotonic()  # streamed redraws yield to the keyboard
        await super().on_event(event)

    @work(exclusive=True, exit_on_error=False, group="open")
    async def _open_session(self, agent: str | None = None) -> None:
        assert self.opener is not None
        if agent is not None:
            self.workbench.query_one(ActivityLine).start(
                f"opening the session with the {agent} agent", cancellable=False)
        link, chip = await (self.opener(agent) if agent else self.opener())
        self.link = link
        self.session_path = link.path
        self.session_task = (link.state.header.get("task") or {}).get("name")
        screen = self.workbench
        screen.chip_label, screen.vmem_capacity = chip.label, chip.vmem_bytes
        from tui.widgets.profile import ProfilePane

        screen.query_one(ProfilePane).set_chip(chip.label, chip.vmem_bytes)
        screen.attach(link)
        # Everything built so far lives as long as the app: move it out of the garbage
        # collector's sight, so later collections stay short (they were the long tail
        # of keypress latency: 150-250 ms pauses, see benchmarks/tui_latency.py).
        gc.collect()
        gc.freeze()
        # Full collections still paused the app for 10-60 ms every couple of seconds
        # while an agent streamed (measured with gc.callbacks under load); they now run
        # when the keyboard has been quiet, and the young generations as before.
        self._gc_threshold = gc.get_threshold()
        gc.set_threshold(*self._gc_threshold[:2], FULL_GC_NEVER)
        self.set_interval(FULL_GC_CHECK_S, self._collect_when_quiet)

    def on_unmount(self) -> None:
        if self._gc_threshold is not None:  # the process may live on (tests, replay)
            gc.set_threshold(*self._gc_threshold)
            self._gc_threshold = None

    def _collect_when_quiet(self) -> None:
        now = time.monotonic()
        quiet = now - self.last_key_at >= FULL_GC_QUIET_S
        if (quiet and gc.get_count()[2] >= FULL_GC_AFTER_YOUNG) \
                or now - self._full_gc_at >= FULL_GC_MAX_WAIT_S:
            gc.collect()
            self._full_gc_at = now

    @property
    def workbench(self) -> WorkbenchScreen:
        for screen in self.screen_stack:
            if isinstance(screen, WorkbenchScreen):
                return screen
        raise LookupError("no workbench screen")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state != WorkerState.ERROR or event.worker.group != "open":
            return
        from tui.launch import LaunchError

        error = event.worker.error
        self.workbench.query_one(ActivityLine).stop()
        next_step = getattr(error, "next_step", "") or "quit with ctrl+q and try again"
        title = "Could not open the session" if isinstance(error, LaunchError) \
            else "Could not open the session (unexpected error)"
        message = str(error) if isinstance(error, LaunchError) \
            else f"{type(error).__name__}: {error}"
        choices = {"o": "open it with the offline agent"} \
            if getattr(error, "offline_fallback", False) else {}

        def chosen(choice: str | None) -> None:
            if choice == "o":
                self._open_session(agent="offline")
            elif self.link is None:
                # No session to work in: leave, and say why on the terminal, rather than
                # a workbench where every key answers "the session is still opening".
                self.exit_message = f"tilewright: {message}\n  next: {next_step}"
                self.exit()

        self.push_screen(ErrorModal(title, message, next_step, choices,
                                    close_hint="Enter or Esc quits"), chosen)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
            return
        self.push_screen(HelpScreen(keymap.describe(self.keymap_overrides), HELP_EXTRA))

    async def action_quit(self) -> None:
        busy = self.link.busy if self.link is not None else None
        if busy in ("run", "profile") and not isinstance(self.screen, ErrorModal):
            # An evaluation is running: quitting stops it, so the person is asked first.
            what = "an evaluation" if busy == "run" else "a profile"

            def chosen(choice: str | None) -> None:
                if choice == "y":
                    self.run_worker(self._quit(), group="quit")

            quit_keys = self.keymap_overrides.get("quit", "ctrl+q")
            self.push_screen(ErrorModal(
                f"Quit while {what} runs?",
                f"{what.capitalize()} is running. Quitting stops it; the session records it "
                "as interrupted and can be resumed (tilewright --resume).",
                f"y quits now; or wait for it to finish and press {quit_keys} again.",
                {"y": "quit anyway"}, close_hint="Enter or Esc stays"), chosen)
            return
        await self._quit()

    async def _quit(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            try:
                await link.close()
            except Exception as exc:  # quitting must always work; say what was lost
                self.log.error(f"closing the session failed: {exc!r}")
        self.exit()


def apply_theme(app: App, config: Config | dict[str, Any]) -> str | None:
    """The config's ``[ui] theme``; an unknown name keeps the default and says so."""
    from agents.config import coerce

    name = coerce(config).ui.theme
    if name in app.available_themes:
        app.theme = name
        return None
    return (f"[ui] theme {name!r} is not a known theme; using {app.theme!r}. "
            f"Known: {', '.join(sorted(app.available_themes))}")


def run_app(options: LaunchOptions, config: Config | dict[str, Any]) -> int:
    from tui.launch import open_live

    async def opener(agent: str | None = None) -> tuple[LiveLink, ChipChoice]:
        from dataclasses import replace

        chosen = replace(options, agent=agent) if agent else options
        return await open_live(chosen, config)

    app = TilewrightApp(config, opener)
    app.run()
    if app.exit_message:
        print(app.exit_message, file=sys.stderr)
        return 1
    if app.session_path is not None:
        print(quit_lines(app.session_path, app.session_task))
    return 0


def quit_lines(path: Any, task_name: str | None = None) -> str:
    """What the terminal says after the workbench closes: the session and how to get
    back to it, or its kernel out of it."""
    import re
    from pathlib import Path

    sid = Path(path).name
    task = re.sub(r"\W+", "_", task_name or "kernel").strip("_") or "kernel"
    return (f"session {sid} saved in {path}\n"
            f"  resume: tilewright --resume {sid}\n"
            f"  export: tilewright export {sid} best -o {task}_kernel.py --test\n"
            f"  report: tilewright report {sid} -o {task}.html")
