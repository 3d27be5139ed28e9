"""Command palette commands that depend on where the session stands.

Approve, reject and edit appear only while a proposal waits; cancel only while
something runs; the mode toggle names the mode it switches to; every version can be
viewed or reverted to by name.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from tui import keymap

# The generations the palette's chip check compiles for (abstract topologies off-TPU).
CHECK_CHIPS = ("v5e", "v6e", "v5p")


class WorkbenchCommands(Provider):
    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        screen = self.screen
        link = getattr(screen, "link", None)
        if link is None:
            return []
        state = link.state
        keys = keymap.remapped(self.app)

        def key(bid: str) -> str:
            return keys.get(bid, keymap.ACTIONS[bid][0]).split(",")[0]

        run = screen.run_action  # type: ignore[attr-defined]
        out: list[tuple[str, str, Callable[[], object]]] = []
        if state.pending:
            prop = state.proposals[state.pending]
            out += [
                (f"Approve {prop.id}", f"{prop.summary} ({key('approve')})",
                 partial(run, "approve")),
                (f"Reject {prop.id} with a note", f"the agent sees the note ({key('reject')})",
                 partial(run, "reject")),
                (f"Edit {prop.id}", f"change it before it runs ({key('edit')})",
                 partial(run, "edit")),
            ]
        if link.busy:
            out.append((f"Cancel the {link.busy}", "stops it now",
                        partial(screen._command, "cancel")))  # type: ignore[attr-defined]
        else:
            out += [("Run the current version", f"evaluate v{state.current} ({key('run')})",
                     partial(run, "run")),
                    ("Profile the current version", f"timeline and top ops ({key('profile')})",
                     partial(run, "profile"))]
            if state.current is not None:
                chips = ",".join(CHECK_CHIPS)
                out.append((f"Check v{state.current} on TPU chips {chips}",
                            "which generations' TPU compiler accepts it (VMEM, estimate); "
                            "like `tilewright eval --chips`",
                            partial(screen.check_chips, state.current,  # type: ignore[attr-defined]
                                    list(CHECK_CHIPS))))
        target = "step" if state.mode == "auto" else "autonomous"
        out.append((f"Switch to {target} mode", f"({key('auto')})", partial(run, "toggle_auto")))
        out += [("Maximize or restore the focused pane", key("maximize"),
                 partial(run, "maximize")),
                ("Next pane", key("next_pane"), partial(run, "cycle_pane(1)"))]
        out.append(("Show the version tree", "every version with its score, as a search "
                    "would see it", partial(self._version_tree, link.path)))
        export = getattr(screen, "ask_export", None)
        if export is not None and not link.busy:
            if state.best is not None:
                out.append((f"Export the best version (v{state.best}) to a module",
                            "a clean .py for your code and a pytest file beside it; like "
                            "`tilewright export`", partial(export, state.best)))
            if state.current is not None and state.current != state.best:
                out.append((f"Export the current version (v{state.current}) to a module",
                            "a clean .py for your code and a pytest file beside it",
                            partial(export, state.current)))
        for number in sorted(state.versions, reverse=True):
            version = state.versions[number]
            if number != state.current:
                out.append((f"Revert to v{number}", version.summary,
                            partial(screen._command, "revert", number)))  # type: ignore[attr-defined]
        return out

    def _version_tree(self, session: object) -> None:
        from tui.screens.search_view import SearchScreen

        self.app.push_screen(SearchScreen(session=session))

    async def discover(self) -> Hits:
        for name, help_text, callback in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
