"""Errors that say what to do instead: ``Advised`` carries the message and the next step
(a command to run, a flag to pass) for a front end to show beside it."""

from __future__ import annotations


class Advised(Exception):
    """An error with its ``next_step`` (empty when there is nothing better to say)."""

    def __init__(self, message: str, next_step: str = "") -> None:
        super().__init__(message)
        self.next_step = next_step
