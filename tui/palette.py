"""Command palette commands that depend on where the session stands.

Every action on a key has its entry (help, panes, zoom, chat, edit or submit, the
diff toggle, cancel), so no action needs a function key. Approve, reject and the diff
toggle appear only while a proposal waits; cancel only while something runs; the mode
toggle names the mode it switches to; every version can be reverted to by name.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from textual.command import DiscoveryHit, Hit, Hits, Provider

from tilewright.tui import keymap

# The generations the palette's chip check compiles for (abstract topologies off-TPU).
CHECK_CHIPS = ("v5e", "v6e", "v5p")


class Command(NamedTuple):
    name: str
    help: str
    callback: Callable[[], object]
    action: str | None = None  # the ``keymap.ACTIONS`` id it stands for, if any


class WorkbenchCommands(Provider):
    def commands(self) -> list[Command]:
        """What the palette offers now. Every action on a key is here, its keys said in
        the help line, so no action needs a function key (nor any key: help too)."""
        from tilewright.tui.screens.workbench import WorkbenchScreen

        screen = self.screen
        if not isinstance(screen, WorkbenchScreen):
            return []  # the version tree and the replay have their own keys
        link = screen.link
        app = self.app

        def key(bid: str) -> str:
            return keymap.say(app, bid)

        run = screen.run_action
        out: list[Command] = []
        # Always there, session or not: help, panes, the chat.
        out += [
            Command("Help: keys and what they do", f"({key('help')})",
                    partial(run, "help"), "help"),
            Command("Maximize or restore the focused pane", f"zoom ({key('maximize')})",
                    partial(run, "maximize"), "maximize"),
            Command("Next pane", f"({key('next_pane')})", partial(run, "cycle_pane(1)"),
                    "next_pane"),
            Command("Previous pane", f"({key('prev_pane')})", partial(run, "cycle_pane(-1)"),
                    "prev_pane"),
            Command("Chat with the agent", f"type a message ({key('chat')})",
                    partial(run, "focus_chat"), "chat"),
        ]
        if link is None:
            return out
        state = link.state
        editing = screen.editing
        if state.pending:
            prop = state.proposals[state.pending]
            out += [
                Command(f"Approve {prop.id}", f"{prop.summary} ({key('approve')})",
                        partial(run, "approve"), "approve"),
                Command(f"Reject {prop.id} with a note",
                        f"the agent sees the note ({key('reject')})",
                        partial(run, "reject"), "reject"),
            ]
            if prop.kind == "kernel" and not editing:
                out.append(Command(f"Show {prop.id} as a diff or in full",
                                   f"({key('toggle_diff')})", partial(run, "toggle_diff"),
                                   "toggle_diff"))
        kept = getattr(screen, "kept_draft", None)
        if kept is not None and not editing:
            out.append(Command("Open the kept draft", f"{kept.words()}, kept when the app "
                               f"last stopped ({key('edit')})", screen.open_draft, "edit"))
        if editing:
            out.append(Command("Submit the edit", f"it then runs ({key('edit')}); Esc "
                               "leaves the editor, recording nothing",
                               partial(run, "edit"), "edit"))
        elif state.pending:
            out.append(Command(f"Edit {state.pending}", f"change it before it runs "
                               f"({key('edit')})", partial(run, "edit"), "edit"))
        elif not link.busy:
            out.append(Command(f"Edit v{state.current}", f"your own version, then run "
                               f"({key('edit')})", partial(run, "edit"), "edit"))
        if link.busy:
            out.append(Command(f"Cancel the {link.busy}", f"stops it now (the key: "
                               f"{key('cancel')} twice)",
                               screen.cancel_now, "cancel"))
        else:
            out += [Command("Run the current version", f"evaluate v{state.current} "
                            f"({key('run')})", partial(run, "run"), "run"),
                    Command("Profile the current version", f"timeline and top ops "
                            f"({key('profile')})", partial(run, "profile"), "profile")]
            if state.current is not None:
                chips = ",".join(CHECK_CHIPS)
                out.append(Command(f"Check v{state.current} on TPU chips {chips}",
                                   "which generations' TPU compiler accepts it (VMEM, "
                                   "estimate); like `tilewright eval --chips`",
                                   partial(screen.check_chips, state.current,
                                           list(CHECK_CHIPS))))
        target = "step" if state.mode == "auto" else "autonomous"
        out.append(Command(f"Switch to {target} mode", f"({key('auto')})",
                           partial(run, "toggle_auto"), "auto"))
        out.append(Command("Show the version tree", "every version with its score, as a "
                           "search would see it", partial(self._version_tree, link.path)))
        export = getattr(screen, "ask_export", None)
        if export is not None and not link.busy:
            if state.best is not None:
                out.append(Command(f"Export the best version (v{state.best}) to a module",
                                   "a clean .py for your code and a pytest file beside it; "
                                   "like `tilewright export`", partial(export, state.best)))
            if state.current is not None and state.current != state.best:
                out.append(Command(f"Export the current version (v{state.current}) to a "
                                   "module", "a clean .py for your code and a pytest file "
                                   "beside it", partial(export, state.current)))
        for number in sorted(state.versions, reverse=True):
            version = state.versions[number]
            if number != state.current:
                out.append(Command(f"Revert to v{number}", version.summary,
                                   partial(screen.revert, number)))
        return out

    def _version_tree(self, session: object) -> None:
        from tilewright.tui.screens.search_view import SearchScreen

        self.app.push_screen(SearchScreen(session=session))

    async def discover(self) -> Hits:
        for command in self.commands():
            yield DiscoveryHit(command.name, command.callback, help=command.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for command in self.commands():
            score = matcher.match(command.name)
            if score > 0:
                yield Hit(score, matcher.highlight(command.name), command.callback,
                          help=command.help)
