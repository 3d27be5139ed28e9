"""Opening a live session for the TUI: the command line's choices in, a ``LiveLink`` out.

``sessions.opening`` builds the session (task, agent, worker, log, controller) as it
does for every front end; this module turns the TUI's options into a request and what
can go wrong into a ``LaunchError`` the app shows in a modal, with the next step and
(when a missing key is the problem) the offer to open it with the offline agent.
Opening is slow (a JAX worker takes seconds to start), so the app paints first and
calls ``open_live`` from a worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tilewright.agents.config import Config
from tilewright.sessions.opening import DEFAULT_TASK, ChipChoice, SessionRequest
from tilewright.sessions.opening import OpenError as LaunchError
from tilewright.tui.session.link import LiveLink

if TYPE_CHECKING:
    from tilewright.sessions.opening import Session

__all__ = ["ChipChoice", "LaunchError", "LaunchOptions", "open_live", "start_session"]


@dataclass(frozen=True)
class LaunchOptions:
    task: str | None = None
    resume: str | None = None
    session_dir: str | None = None
    agent: str | None = None  # offline | anthropic | openai | auto (None: the config's)
    overrides: Mapping[str, str] = field(default_factory=dict)  # --set KEY=VALUE

    def request(self) -> SessionRequest:
        return SessionRequest(task=self.task, overrides=self.overrides, resume=self.resume,
                              sessions_dir=self.session_dir, agent=self.agent,
                              default_task=DEFAULT_TASK)


def link_for(session: Session) -> LiveLink:
    """The UI's handle on an open session; closing it releases the session's worker."""
    return LiveLink(session.controller, agent_label=session.agent.label,
                    chip=session.chip.label, on_close=session.release)


async def open_live(options: LaunchOptions, config: Config | dict[str, Any]
                    ) -> tuple[LiveLink, ChipChoice]:
    """Start (or resume) a session; the caller owns the returned link and closes it.
    Every expected failure is a ``LaunchError`` with a next step."""
    from tilewright.sessions.opening import open_session

    session = await open_session(options.request(), config)
    return link_for(session), session.chip


async def start_session(task: Any, agent: Any, evaluator: Any,
                        config: Config | dict[str, Any], *,
                        sessions_dir: Path, backend: Any = None, chip: ChipChoice,
                        log: Any = None, loaded: Any = None, on_close: Any = None) -> LiveLink:
    """A session over an evaluator the caller owns (tests and benchmarks script the
    agent and the evaluator); the same controller ``open_live`` starts."""
    from tilewright.sessions.opening import start_controller

    controller = await start_controller(task, agent, evaluator, config,
                                        sessions_dir=sessions_dir, backend=backend, chip=chip,
                                        log=log, loaded=loaded)
    return LiveLink(controller, agent_label=agent.label, chip=chip.label, on_close=on_close)
