"""Two parts of ``WorkbenchScreen`` (``tui.screens.workbench``), as mixins: plain
methods and workers only (a mixin's ``@on`` handlers would not be collected), on the
screen's ``link``.

- ``VersionCommands``: one ``LiveLink`` call at a time from a key (``_command``), and the
  two that report back in the chat: writing a version as a module for the user's code
  (``ask_export``) and compiling it for other TPU generations (``check_chips``).
- ``KeyHints``: the keys in force (as the user remapped them) in what the screen says:
  the next-step hint, the decision bar's keys, an example note for a rejection.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from textual import work

from tilewright.tui import keymap
from tilewright.tui.screens.modals import NotePrompt
from tilewright.tui.session.link import CommandRefused, LiveLink
from tilewright.tui.session.presenter import chip_line
from tilewright.tui.session.view import SessionView
from tilewright.tui.widgets.chat import ChatPane
from tilewright.tui.widgets.status import ActivityLine


class VersionCommands:
    """What ``WorkbenchScreen`` runs on its live session for a key or a pane's pick."""

    link: LiveLink | None
    app: Any
    notify: Any
    query_one: Any
    run_worker: Any

    def ask_export(self, version: int | None) -> None:
        """Ask where to write a version as a module (and its test), then write it."""
        if self.link is None:
            self.notify("the session is still opening", severity="warning", timeout=3)
            return
        state = self.link.state
        number = version if version is not None else state.best
        if number is None:
            self.notify("no correct version yet; pick one in History (x exports it)",
                        severity="warning", timeout=5)
            return
        task = (state.header.get("task") or {}).get("name") or "kernel"
        slug = "".join(c if c.isalnum() else "_" for c in task).strip("_") or "kernel"
        default = f"{slug}_v{number}.py"

        def done(path: str | None) -> None:
            if path:
                self._export(number, path)

        import os

        self.app.push_screen(NotePrompt(
            f"Export v{number} as a module for your code (a pytest file test_<name>.py "
            f"is written beside it; a relative path is under {os.getcwd()}):",
            "path/to/module.py", default), done)

    @work(exclusive=True, exit_on_error=False, group="export")
    async def _export(self, version: int, path_text: str) -> None:
        from pathlib import Path

        assert self.link is not None
        path = Path(path_text).expanduser()
        if path.suffix != ".py":
            path = path.with_suffix(".py")
        activity = self.query_one(ActivityLine)
        activity.start(f"exporting v{version} (checking the simplified module)",
                       cancellable=False)
        try:
            exported, written = await self.link.export(version, path)
        except CommandRefused as exc:
            self.notify(str(exc), severity="warning", timeout=8)
            return
        except OSError as exc:
            self.notify(f"cannot write {path}: {exc.strerror or exc}", severity="error",
                        timeout=8)
            return
        finally:
            activity.stop()
        done = ", ".join(str(p) for p in written)
        simplified = f" · {', '.join(exported.simplified)} taken out" \
            if exported.simplified else ""
        self.notify(f"wrote {done}{simplified}", title=f"exported v{version}", timeout=10)
        self.query_one(ChatPane).add_notice(
            f"exported v{version} to {done}{simplified} ({exported.verified})")

    def _command(self, call: Callable[[LiveLink], Any]) -> None:
        """Run one ``LiveLink`` command, e.g. ``lambda link: link.approve()``."""
        if self.link is None:
            self.notify("the session is still opening", severity="warning", timeout=3)
            return
        self._run_command(call)

    @work(exclusive=False, exit_on_error=False, group="commands")
    async def _run_command(self, call: Callable[[LiveLink], Any]) -> None:
        assert self.link is not None
        try:
            result = call(self.link)
            if inspect.isawaitable(result):
                await result
        except CommandRefused as exc:  # the user asked for something not possible now
            self.notify(str(exc), severity="warning", timeout=6)

    @work(exclusive=True, exit_on_error=False, group="chips")
    async def check_chips(self, version: int, chips: list[str]) -> None:
        """Which TPU generations accept ``version``: one line per chip in the chat."""
        if self.link is None:
            self.notify("the session is still opening", severity="warning", timeout=3)
            return
        activity = self.query_one(ActivityLine)
        activity.start(f"compiling v{version} for {', '.join(chips)}", cancellable=False)
        try:
            results = await self.link.check_chips(version, chips)
        except Exception as exc:  # the worker failed, not the kernel: say so, carry on
            self.notify(f"chip check failed: {exc}; try `tilewright eval --chips "
                        f"{','.join(chips)}` to see the worker's output", severity="error")
            return
        finally:
            activity.stop()
        lines = [chip_line(chip, r.to_json()) for chip, r in zip(chips, results, strict=True)]
        accepted = [c for c, r in zip(chips, results, strict=True)
                    if (r.tpu or {}).get("compile") == "ok"]
        self.query_one(ChatPane).add_notice(f"v{version} on TPU chips:\n" + "\n".join(lines))
        self.notify(f"v{version}: accepted on {', '.join(accepted) or 'none'} of "
                    f"{', '.join(chips)}", timeout=8,
                    severity="information" if len(accepted) == len(chips) else "warning")


class KeyHints:
    """The keys in force in the workbench's words."""

    link: LiveLink | None
    app: Any

    def _next_hint(self, view: SessionView) -> str | None:
        """What to press next when no decision is due and nothing runs: on the first
        screen (a version not evaluated yet), and after the person's own edit failed."""
        s = view.state
        if self.link is None or self.link.busy or s.current is None:
            return None
        v = s.versions.get(s.current)
        if v is None:
            return None
        if v.status is None:
            return (f"{self._key('run')} evaluates v{v.number} · {self._key('chat')} chat "
                    f"(/plan, /tune) · {self._key('auto')} autonomous")
        if v.origin == "user-edit" and v.failed:
            parent = s.versions.get(v.parent) if v.parent else None
            revert = keymap.remapped(self.app).get("history.revert", "r").split(",")[0]
            back = (f" · History: {revert} reverts to v{parent.number}"
                    if parent is not None and not parent.failed else "")
            agent = str((s.header or {}).get("agent") or "")
            fix = (f"{self._key('chat')} asks the offline agent (its rule-based fixes know "
                   "alignment, block and shape errors, not every failure)"
                   if "offline" in agent else f"{self._key('chat')} asks the agent to fix it")
            return (f"v{v.number}, your edit, failed: {self._key('edit')} edits it "
                    f"again{back} · {fix}")
        return None

    def _key(self, bid: str) -> str:
        keys = keymap.ACTIONS[bid][0]
        return keymap.remapped(self.app).get(bid, keys).split(",")[0]

    def _keys(self, *ids: str) -> str:
        """"ctrl+y approve  F2/ctrl+o edit": the keys in force, as remapped."""
        return "  ".join(f"{keymap.say(self.app, bid, joiner='/')} "
                         f"{keymap.ACTIONS[bid][2].lower()}" for bid in ids)

    def _key_list(self, bid: str) -> list[str]:
        return keymap.keys_of(self.app, bid)

    def _note_example(self) -> str:
        """An example note in the proposal's own words: a tuning's own tunable and value
        (the rejection bounds the tuner's search), else a change of approach."""
        link = self.link
        pending = link.state.pending_proposal if link is not None else None
        tuning = pending.tuning if pending is not None and pending.tuning else None
        for name, value in (tuning or {}).items():
            if isinstance(value, int) and not isinstance(value, bool):
                return f"e.g. keep {name} at {value * 2} or above"
            return f"e.g. keep {name} as it was"
        return "e.g. keep the block sizes; fuse the epilogue into the kernel instead"
