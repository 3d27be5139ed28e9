"""The one place the TUI meets the session engine.

A ``LiveLink`` gives screens the folded state, blob reads, a subscription to events
and the controller's commands. ``LiveLink`` wraps a running ``sessions`` controller;
the replay screen folds recorded events itself and needs no link.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the controller module is imported once a session opens, not at start
    from sessions.controller import Controller
    from sessions.state import SessionState

__all__ = ["LiveLink"]


class LiveLink:
    def __init__(self, controller: Controller, agent_label: str = "agent",
                 chip: str | None = None, on_close: Callable[[], Any] | None = None) -> None:
        self.controller = controller
        self.agent_label = agent_label
        self.chip = chip
        self._on_close = on_close

    @property
    def state(self) -> SessionState:
        return self.controller.state

    @property
    def path(self):
        return self.controller.log.path

    @property
    def busy(self) -> str | None:
        return self.controller.busy

    @property
    def worker_state(self) -> str:
        evaluator = self.controller.evaluator
        return str(getattr(evaluator, "state", "idle"))

    def read_blob(self, sha: str) -> bytes:
        return self.controller.log.get_blob(sha)

    def subscribe(self, callback: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        return self.controller.subscribe(callback)

    async def command(self, name: str, *args: Any) -> Any:
        """Call a controller command; its ``ControllerError`` reaches the caller."""
        result = getattr(self.controller, name)(*args)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def check_chips(self, version: int, chips: list[str]) -> list[Any]:
        """Evaluate ``version`` once per TPU generation (nothing is recorded in the
        session: the verdicts answer a question, they do not rank the version)."""
        evaluator = self.controller.evaluator
        if not hasattr(evaluator, "evaluate_on_chips"):
            raise RuntimeError("this session's evaluator cannot compile for other chips")
        source = self.controller.log.get_blob(
            self.state.versions[version].source_blob).decode()
        return await evaluator.evaluate_on_chips(self.controller.task, source, chips)

    async def close(self) -> None:
        await self.controller.close("user quit")
        if self._on_close is not None:
            result = self._on_close()
            if inspect.isawaitable(result):
                await result
