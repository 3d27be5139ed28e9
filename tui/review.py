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
from pathlib import Path
from typing import Any

from textual.app import App

from tui.screens.search_view import SearchScreen


class ReviewApp(App):
    """Hosts one ``SearchScreen``; with a live search, runs it beside the screen."""

    TITLE = "tilewright review"

    def __init__(self, screen: SearchScreen, search: Any = None,
                 executor: Any = None) -> None:
        super().__init__()
        self._screen = screen
        self._search = search
        self._executor = executor
        self.summary: Any = None

    def get_default_screen(self) -> SearchScreen:
        return self._screen

    def on_mount(self) -> None:
        if self._search is not None:
            self.run_worker(self._run_search(), exit_on_error=False, name="search")

    async def _run_search(self) -> None:
        try:
            self.summary = await self._search.run()
            self.notify(f"search finished: {self.summary.reason}", timeout=8)
        except Exception as exc:  # shown, never a crash: the log keeps what was done
            self.notify(f"search stopped: {exc}", severity="error", timeout=15)

    async def on_unmount(self) -> None:
        if self._search is not None:
            self._search.close()
        if self._executor is not None:
            await self._executor.close()


def run(args: argparse.Namespace) -> int:
    if bool(args.session) == bool(args.task):
        print("tilewright review: give either a SESSION to view or --task to search",
              file=sys.stderr)
        return 2
    if args.session:
        from sessions.log import SessionError, resolve

        try:
            path = resolve(args.session, args.session_dir)
        except SessionError as exc:
            print(f"tilewright review: {exc}", file=sys.stderr)
            return 2
        ReviewApp(SearchScreen(session=path)).run()
        return 0
    return asyncio.run(_live(args))


async def _live(args: argparse.Namespace) -> int:
    from agents import brief, make_agent
    from agents.errors import NoApiKey
    from kernels.executors import LocalExecutor
    from kernels.loaders import load_task, parse_overrides
    from kernels.task import TaskError
    from sessions.log import default_sessions_dir
    from sessions.search import Search
    from sessions.search.graph import Budget, SearchConfig

    try:
        task = load_task(args.task, parse_overrides(args.overrides) or None)
        agent = make_agent(args.agent, args.config or {})
    except (TaskError, NoApiKey, ValueError) as exc:
        print(f"tilewright review: {exc}", file=sys.stderr)
        return 2
    from agents.config import coerce

    controller = coerce(args.config).controller
    config = SearchConfig(beam_width=args.beam_width, branching=args.branching,
                          max_rounds=args.rounds, approval="user",
                          budget=Budget(nodes=args.budget),
                          profile_best=controller.profile_best,
                          profile_every=controller.profile_every)
    base = Path(args.session_dir) if args.session_dir else default_sessions_dir()
    executor = LocalExecutor(workers=1)
    await executor.start()
    search = Search.create(base, task, brief(task), agent, executor, config)
    app = ReviewApp(SearchScreen(search=search), search=search, executor=executor)
    await app.run_async()
    print(f"session saved: {search.log.path}")
    return 0
