"""The Textual application: composes the screens and routes app-wide actions.

Session work lives in ``sessions``; panes live in ``tui.widgets``; what a key does on
the workbench lives in ``tui.screens.workbench``. This class only sets up the theme,
the keymap and the command palette, opens the session after the first paint, and
closes it on quit.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from textual import events, work
from textual.app import App
from textual.binding import Binding
from textual.worker import Worker, WorkerState

from tilewright.tui import keymap
from tilewright.tui.look import Look, choose_look
from tilewright.tui.palette import WorkbenchCommands
from tilewright.tui.screens.modals import ErrorModal, HelpScreen
from tilewright.tui.screens.workbench import WorkbenchScreen

if TYPE_CHECKING:  # sessions and kernels load after the first paint, in the opener
    from tilewright.agents.config import Config
    from tilewright.tui.launch import ChipChoice, LaunchOptions
    from tilewright.tui.session.link import LiveLink

# Called with no argument, or with an agent kind ("offline") to open with another agent.
Opener = Callable[..., Awaitable[tuple["LiveLink", "ChipChoice"]]]

FULL_GC_NEVER = 10**9  # generation-2 threshold: no automatic full collections
FULL_GC_CHECK_S = 1.0
FULL_GC_QUIET_S = 1.0  # a full collection waits for this long without a key
FULL_GC_AFTER_YOUNG = 10  # ...and for as many generation-1 collections as CPython's own
FULL_GC_MAX_WAIT_S = 30.0  # but never longer than this

# The signals that stop the app with nothing lost, and what the session records as
# their cause: the terminal went away (the SSH connection dropped), or a stop request.
STOP_SIGNALS = {"SIGHUP": "disconnect", "SIGTERM": "terminated"}
STOP_CLOSE_S = 20.0  # the session's close (a run cancelled, the worker stopped) at most
EXIT_CODES = {"disconnect": 128 + 1, "terminated": 128 + 15}

def help_extra(app: App) -> str:
    """The help screen's text below the key table, naming the keys in force."""
    say = partial(keymap.say, app)
    return "\n".join((
        f"Panes: Source (the editor; a pending proposal shows as a diff, {say('toggle_diff')} "
        "toggles the full source; Esc leaves an edit without recording it), Chat (Enter "
        "sends), Problems (Enter jumps to the line), Profile (the timeline: ←/→ pan, +/- "
        "zoom, [ ] select an event, 0 fits), History (Enter views, d diffs against the "
        "current version, r reverts, x exports it as a module for your code).",
        "Chat: /plan [wishes] asks for a plan, /explain [vN] [question] for an explanation.",
        "The approval keys are ignored for half a second after a proposal appears.",
        f"Every action is in the command palette ({say('command_palette', most=1)}, or "
        f"{say('palette', most=1)} where ctrl+p is taken), help included. Over SSH, "
        "when function keys do not arrive, use the ctrl and alt keys above (alt+letter "
        "needs the terminal to send Option/Alt as Meta).",
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
                 clock: Callable[[], float] = time.monotonic,
                 term: str | None = None, environ: Any = None) -> None:
        super().__init__()
        self.config = config or {}
        self.opener = opener
        self.clock = clock
        self.link: LiveLink | None = None
        self.session_path: Any = None  # the open session's directory, said on quit
        self.session_task: str | None = None
        self.exit_message: str | None = None  # printed after the screen is gone
        # time.monotonic() of the newest key event. Two Textual interval timers read it
        # as "quiet for how long" (the chat's flush, the full collection below); each
        # also has a deadline (MAX_WAIT_S, FULL_GC_MAX_WAIT_S) that a debounce timer
        # restarted on every key would not give, and a stamp costs a key nothing.
        self.last_key_at = float("-inf")
        self.stop_cause: str | None = None  # disconnect | terminated, once signalled
        # The environment the SSH notice reads: the process's, except in a headless
        # test run (whose machine may be reached over SSH), unless a test passes one.
        self._environ = environ
        self._ssh_said = False
        self.kept_draft_at: Any = None  # where an unsaved edit was kept on leaving
        self._signals: list[int] = []
        self._full_gc_at = time.monotonic()
        self._gc_threshold: tuple[int, ...] | None = None  # CPython's, while ours is set
        self._theme_error = apply_theme(self, self.config)
        # Colours and characters for the terminal (16 colours, the Linux console): chosen
        # on mount, once it is known whether there is one (a headless test run has none).
        self.look = Look()
        self._look_error: str | None = None
        self._term_given = term
        self._keymap_error: str | None = None
        # The terminal: which codes its shifted function keys send (Linux console, rxvt).
        self.term = term if term is not None else os.environ.get("TERM", "")
        keymap.install_terminal_keys(self.term)
        self.keymap_overrides: dict[str, str] = {}  # read by keymap.remapped
        try:
            self.keymap_overrides = keymap.keymap_from_config(self.config)
        except keymap.KeymapError as exc:  # a typo in the config must not stop the app
            self._keymap_error = str(exc)
        self.keymap_overrides = keymap.terminal_keymap(self.keymap_overrides, self.term)
        self.set_keymap(self.keymap_overrides)

    async def on_mount(self) -> None:
        from tilewright.agents.config import coerce

        ui = coerce(self.config).ui
        if self.is_headless:  # no terminal: only what the config asks for by hand
            self.look, self._look_error = choose_look(ui, "", "truecolor", "utf-8")
        else:
            term = self._term_given if self._term_given is not None else \
                os.environ.get("TERM")
            self.look, self._look_error = choose_look(ui, term, self.console.color_system)
        self._install_stop_signals()
        await self.push_screen(WorkbenchScreen(self.clock))  # mounted before a session lands
        for error in (self._keymap_error, self._theme_error, self._look_error):
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
            self.workbench.opening(f"opening the session with the {agent} agent")
        link, chip = await (self.opener(agent) if agent else self.opener())
        self.link = link
        self.session_path = link.path
        environ = self._environ if self._environ is not None else \
            ({} if self.is_headless else os.environ)
        if remote_without_multiplexer(environ) and not self._ssh_said:
            self._ssh_said = True
            keys = ", ".join(f"{keymap.say(self, bid, joiner='/')} "
                             f"{keymap.ACTIONS[bid][2].lower()}"
                             for bid in ("edit", "toggle_diff", "cancel", "next_pane",
                                         "help", "palette"))
            self.call_after_refresh(self._say_over_ssh, ssh_words(link.path, keys))
        self.session_task = (link.state.header.get("task") or {}).get("name")
        screen = self.workbench
        screen.chip = (chip.label, chip.vmem_bytes)
        screen.attach(link)
        # Everything built so far lives as long as the app: move it out of the garbage
        # collector's sight, so later collections stay short (they were the long tail
        # of keypress latency: 150-250 ms pauses, see benchmarks/host_speed/tui_latency.py).
        gc.collect()
        gc.freeze()
        # Full collections still paused the app for 10-60 ms every couple of seconds
        # while an agent streamed (measured with gc.callbacks under load); they now run
        # when the keyboard has been quiet, and the young generations as before.
        self._gc_threshold = gc.get_threshold()
        gc.set_threshold(*self._gc_threshold[:2], FULL_GC_NEVER)
        self.set_interval(FULL_GC_CHECK_S, self._collect_when_quiet)

    def _say_over_ssh(self, text: str) -> None:
        self.workbench.add_notice(text, "warning")
        self.notify("over SSH: a dropped connection ends this app (the session is kept); "
                    "tmux keeps it running (see the chat)", title="remote session",
                    timeout=10)

    def on_unmount(self) -> None:
        loop = asyncio.get_running_loop()
        for number in self._signals:
            loop.remove_signal_handler(number)
        self._signals = []
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
        from tilewright.tui.launch import LaunchError

        error = event.worker.error
        self.workbench.open_failed()
        next_step = getattr(error, "next_step", "") or \
            f"quit with {keymap.say(self, 'quit')} and try again"
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
        self.push_screen(HelpScreen(
            keymap.describe(self.keymap_overrides), help_extra(self),
            close_keys=["escape", *keymap.keys_of(self, "help"), "q"],
            palette_keys=keymap.say(self, "command_palette", most=1) + " or "
            + keymap.say(self, "palette", most=1)))

    async def action_quit(self) -> None:
        busy = self.link.busy if self.link is not None else None
        if busy in ("run", "profile") and not isinstance(self.screen, ErrorModal):
            # An evaluation is running: quitting stops it, so the person is asked first.
            what = "an evaluation" if busy == "run" else "a profile"

            def chosen(choice: str | None) -> None:
                if choice == "y":
                    self.run_worker(self._quit(), group="quit")

            quit_keys = keymap.say(self, "quit", most=1)
            self.push_screen(ErrorModal(
                f"Quit while {what} runs?",
                f"{what.capitalize()} is running. Quitting stops it; the session records it "
                "as interrupted and can be resumed (tilewright --resume).",
                f"y quits now; or wait for it to finish and press {quit_keys} again.",
                {"y": "quit anyway"}, close_hint="Enter or Esc stays"), chosen)
            return
        await self._quit()

    async def _quit(self) -> None:
        self.keep_draft("quit")
        link, self.link = self.link, None
        if link is not None:
            try:
                await link.close()
            except Exception as exc:  # quitting must always work; say what was lost
                self.log.error(f"closing the session failed: {exc!r}")
        self.exit()

    # -- stopped from outside: the terminal hung up (SIGHUP) or SIGTERM ----------------
    def _install_stop_signals(self) -> None:
        """SIGHUP and SIGTERM close the session as a quit does, with what they cut short
        recorded as theirs. Not in a headless test run (the test process keeps its
        own signals), nor where the loop cannot take them."""
        if self.is_headless:
            return
        loop = asyncio.get_running_loop()
        for name, cause in STOP_SIGNALS.items():
            number = getattr(signal, name, None)
            if number is None:
                continue
            try:
                loop.add_signal_handler(number, self.stop_for, cause)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            self._signals.append(number)

    def stop_for(self, cause: str) -> None:
        """A stop signal: keep the unsaved edit first (synchronous, before anything can
        fail), then close the session (its run recorded as interrupted by ``cause``,
        autonomous mode stopped by it, the worker and its scratch folder gone) and
        leave, restoring the terminal where it still exists. A second signal while
        that runs leaves at once."""
        if self.stop_cause is not None:
            self.exit(return_code=EXIT_CODES.get(cause, 1))
            return
        self.stop_cause = cause
        self.keep_draft(cause)
        closed = threading.Event()
        # A plain task, not a Textual worker: the app's own shutdown (its input thread
        # sees the hangup too) must not cancel the close half-way.
        self._stop_task = asyncio.get_running_loop().create_task(
            self._close_for(cause, closed))
        threading.Thread(target=self._leave_without_terminal, args=(cause, closed),
                         name="tilewright-stop", daemon=True).start()

    async def _close_for(self, cause: str, closed: threading.Event) -> None:
        link, self.link = self.link, None
        try:
            if link is not None:
                await asyncio.wait_for(link.close(cause), STOP_CLOSE_S)
        except Exception as exc:  # leaving must always work; the log says the rest
            self.log.error(f"closing the session on {cause} failed: {exc!r}")
        finally:
            closed.set()
        self.exit(return_code=EXIT_CODES.get(cause, 1))

    @staticmethod
    def _leave_without_terminal(cause: str, closed: threading.Event) -> None:
        """Once the session is closed (or the close ran out of time), leave at once if
        the terminal is gone: Textual's shutdown writes its restoring sequences to it
        and, after a hangup (SIGHUP, then SIGCONT), waits forever on its output queue.
        The session is saved and its worker, with its scratch folder, stopped; there is
        no one to tell. Where the terminal still exists, Textual restores it."""
        closed.wait(STOP_CLOSE_S + 5)
        if not terminal_alive():
            os._exit(EXIT_CODES.get(cause, 1))

    def keep_draft(self, why: str) -> None:
        """The Source editor's unsaved text, kept in the session's folder (a resumed
        session offers it back). Nothing when nothing was typed."""
        link = self.link
        if link is None:
            return
        try:
            edit = self.workbench.unsaved_edit()
            if edit is None:
                return
            text, version, proposal = edit
            self.kept_draft_at = link.save_draft(text, version=version, proposal=proposal,
                                                 why=why)
        except Exception as exc:  # a full disk must not stop the close
            self.log.error(f"keeping the draft failed: {exc!r}")


def remote_without_multiplexer(environ: Any = None) -> bool:
    """Started over SSH (``SSH_CONNECTION`` or ``SSH_TTY``) and not inside tmux or
    screen (``TMUX``, ``STY``): a dropped connection ends this app."""
    env = os.environ if environ is None else environ
    over_ssh = bool(env.get("SSH_CONNECTION") or env.get("SSH_TTY"))
    return over_ssh and not (env.get("TMUX") or env.get("STY"))


def ssh_words(session: Any, keys: str) -> str:
    """What a remote user reads once, in the chat: what a drop does and how to keep
    the work alive."""
    from pathlib import Path

    sid = Path(session).name if session is not None else "SESSION"
    return (f"Over SSH without tmux or screen: if the connection drops, this workbench "
            f"ends. The session is saved (a run it cuts short is marked interrupted) and "
            f"an unsaved edit is kept as a draft; `tilewright --resume {sid}` brings it "
            f"back. To keep working through a drop, start tilewright inside tmux "
            f"(`tmux new -s tw`, back with `tmux attach -t tw`), or let the loop run "
            f"headless (`nohup tilewright auto --resume {sid} &`) and reopen the session "
            f"here once it stops. Keys without function keys: {keys}.")


def terminal_alive() -> bool:
    """Whether the app's terminal still exists: after a hangup its settings cannot be
    read (EIO; ``isatty`` then says False as well, so it cannot tell). Standard input
    that never was a terminal counts as alive: nothing to restore, nothing to hang on."""
    import errno
    import termios

    try:
        fd = sys.__stdin__.fileno() if sys.__stdin__ is not None else -1
    except (OSError, ValueError):
        return True
    if fd < 0:
        return True
    try:
        termios.tcgetattr(fd)
    except (termios.error, OSError) as exc:
        return exc.args[0] not in (errno.EIO, errno.ENXIO)
    return True


def apply_theme(app: App, config: Config | dict[str, Any]) -> str | None:
    """The config's ``[ui] theme``; an unknown name keeps the default and says so."""
    from tilewright.agents.config import coerce

    name = coerce(config).ui.theme
    if name in app.available_themes:
        app.theme = name
        return None
    return (f"[ui] theme {name!r} is not a known theme; using {app.theme!r}. "
            f"Known: {', '.join(sorted(app.available_themes))}")


def run_app(options: LaunchOptions, config: Config | dict[str, Any]) -> int:
    from tilewright.tui.launch import open_live

    async def opener(agent: str | None = None) -> tuple[LiveLink, ChipChoice]:
        from dataclasses import replace

        chosen = replace(options, agent=agent) if agent else options
        return await open_live(chosen, config)

    app = TilewrightApp(config, opener)
    app.run()
    try:  # the terminal may be gone (a dropped connection): nobody to tell
        if app.exit_message:
            print(app.exit_message, file=sys.stderr)
            return 1
        if app.stop_cause is not None:
            print(f"tilewright: stopped ({app.stop_cause}); the session is saved",
                  file=sys.stderr)
        if app.session_path is not None:
            best = app.link.state.best if app.link is not None else None
            print(quit_lines(app.session_path, app.session_task, best is not None))
        if app.kept_draft_at is not None:
            print(f"  your unsaved edit is kept in {app.kept_draft_at}; the resumed "
                  "session offers it back")
    except OSError:
        pass
    return EXIT_CODES.get(app.stop_cause or "", 0)


def quit_lines(path: Any, task_name: str | None = None, has_best: bool = True) -> str:
    """What the terminal says after the workbench closes: the session and how to get
    back to it, or its kernel out of it (only when a correct version exists), each
    command as it can be run from here (``invocation``)."""
    import re
    from pathlib import Path

    sid = Path(path).name
    task = re.sub(r"\W+", "_", task_name or "kernel").strip("_") or "kernel"
    from tilewright.sessions.cli.invocation import invocation

    tw = invocation()
    export = (f"  export: {tw} export {sid} best -o {task}_kernel.py --test\n" if has_best
              else "  export: no correct version yet (nothing to export)\n")
    return (f"session {sid} saved in {path}\n"
            f"  resume: {tw} --resume {sid}\n"
            + export +
            f"  report: {tw} report {sid} -o {task}.html")
