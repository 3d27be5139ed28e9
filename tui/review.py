"""``tilewright review``: the search view as a program of its own.

``review --task T`` runs a human-in-the-loop graph search (beam search, every child
approved, rejected or pruned from the keyboard) with the search view on screen;
``review SESSION`` shows a recorded search (or any session's version tree) read-only.
The search itself is ``sessions.search.Search``; this module only hosts its screen.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from textual.app import App

from tilewright.tui import keymap
from tilewright.tui.screens.search_view import SearchScreen

if TYPE_CHECKING:
    from tilewright.sessions.opening import SearchSession


class ReviewApp(App):
    """Hosts one ``SearchScreen``; with a live search, runs it beside the screen."""

    TITLE = "tilewright review"

    def __init__(self, screen: SearchScreen, opened: SearchSession | None = None,
                 config: Any = None) -> None:
        super().__init__()
        self._screen = screen
        self._opened = opened
        self._search = opened.search if opened is not None else None
        self.summary: Any = None
        # The config's [keys] remaps, as in the workbench (approve and reject are the
        # same keys in both); a typo is said on mount, the defaults kept.
        self.keymap_overrides: dict[str, str] = {}  # read by keymap.remapped
        self._keymap_error: str | None = None
        try:
            self.keymap_overrides = keymap.keymap_from_config(config or {})
        except keymap.KeymapError as exc:
            self._keymap_error = str(exc)
        self.set_keymap(self.keymap_overrides)

    def get_default_screen(self) -> SearchScreen:
        return self._screen

    def on_mount(self) -> None:
        if self._keymap_error:
            self.notify(self._keymap_error, title="config", severity="error", timeout=15)
        if self._search is not None:
            self.run_worker(self._run_search(), exit_on_error=False, name="search")

    async def _run_search(self) -> None:
        try:
            self.summary = await self._search.run()
            self.notify(f"search finished: {self.summary.reason}", timeout=8)
        except Exception as exc:  # shown, never a crash: the log keeps what was done
            self.notify(f"search stopped: {exc}", severity="error", timeout=15)

    async def on_unmount(self) -> None:
        if self._opened is not None:
            await self._opened.close()


def run(args: argparse.Namespace) -> int:
    if bool(args.session) == bool(args.task):
        print("tilewright review: give either a SESSION to view or --task to search",
              file=sys.stderr)
        return 2
    if args.session:
        from tilewright.sessions.log import SessionError, resolve

        try:
            path = resolve(args.session, args.session_dir)
        except SessionError as exc:
            print(f"tilewright review: {exc}", file=sys.stderr)
            return 2
        ReviewApp(SearchScreen(session=path), config=args.config).run()
        return 0
    return asyncio.run(_live(args))


async def _live(args: argparse.Namespace) -> int:
    from tilewright.agents.config import coerce
    from tilewright.sessions.opening import OpenError, SessionRequest, open_search, parse_set
    from tilewright.sessions.search.graph import Budget, SearchConfig

    controller = coerce(args.config).controller
    config = SearchConfig(beam_width=args.beam_width, branching=args.branching,
                          max_rounds=args.rounds, approval="user",
                          budget=Budget(nodes=args.budget),
                          profile_best=controller.profile_best,
                          profile_every=controller.profile_every)
    try:
        request = SessionRequest(task=args.task, overrides=parse_set(args.overrides),
                                 sessions_dir=args.session_dir, agent=args.agent)
        opened = await open_search(request, args.config, config)
    except OpenError as exc:
        print(f"tilewright review: {exc}", file=sys.stderr)
        if exc.next_step:
            print(f"  next: {exc.next_step}", file=sys.stderr)
        return 2
    app = ReviewApp(SearchScreen(search=opened.search), opened=opened, config=args.config)
    await app.run_async()
    print(f"session saved: {opened.search.log.path}")
    return 0
