"""The errors a session command raises, importable without loading the engine (the TUI
catches them from its first paint, before any session is open)."""

from __future__ import annotations


class ControllerError(Exception):
    """A command that cannot be carried out now; the message says what to do instead."""


class ControllerBusy(ControllerError):
    pass


class ApprovalRequired(ControllerError):
    pass
