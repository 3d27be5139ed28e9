"""Graph search over kernel versions, as one package.

``driver`` holds ``Search`` (beam search and parallel runs against one session) and
``summarize``; ``graph`` folds the log into ``SearchState`` and holds the search's
config and budget; ``planner`` is the pure planner over that state; ``children`` makes the
children of one slot (agent proposals, tuning steps, fixes). ``Search``,
``SearchSummary`` and ``summarize`` are re-exported here so callers write
``from sessions.search import Search``.
"""

from tilewright.sessions.search.driver import Search, SearchSummary, summarize

__all__ = ["Search", "SearchSummary", "summarize"]
