"""What a front end may do with a live search: ``SearchLink``, the one typed seam.

The search view (``tui.screens.search_view``) follows a live search's events, shows its
state, and in a human-in-the-loop search decides the proposals that wait for the person
and prunes branches; it does this through this protocol, never the engine itself.
``sessions.search.Search`` is the implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from tilewright.sessions import events as ev
from tilewright.sessions.search.graph import SearchState

__all__ = ["SearchLink"]


class SearchLink(Protocol):
    @property
    def state(self) -> SearchState:
        """The folded search (tree, beams, the session's versions)."""
        ...

    @property
    def path(self) -> Path:
        """The search session's directory."""
        ...

    def subscribe(self, callback: ev.Subscriber) -> Callable[[], None]:
        """Every event the search writes, as it is written; returns the unsubscribe."""
        ...

    def awaiting(self) -> list[str]:
        """Proposals waiting for the person's decision, oldest first."""
        ...

    def approve(self, proposal: str) -> None: ...

    def reject(self, proposal: str, note: str | None = None) -> None: ...

    def prune(self, version: int, reason: str = "pruned by the user",
              by: str = "user") -> None:
        """Take ``version`` and its branch out of the beam (its waiting children go)."""
        ...
