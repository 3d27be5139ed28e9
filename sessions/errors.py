"""The errors a session command raises, importable without loading the controller (the TUI
catches them from its first paint, before any session is open)."""

from __future__ import annotations

from tilewright.kernels.errors import Advised


class ControllerError(Exception):
    """A command that cannot be carried out now; the message says what to do instead."""


class ControllerBusy(ControllerError):
    pass


class ApprovalRequired(ControllerError):
    pass


class OpenError(Advised):
    """A session that cannot be opened: what went wrong and what to do next."""

    def __init__(self, message: str, next_step: str = "", offline_fallback: bool = False
                 ) -> None:
        super().__init__(message, next_step)
        self.offline_fallback = offline_fallback  # the offline agent would open it
