"""Waiting on a condition instead of napping: ``until`` (in a test's event loop) and
``until_now`` (in plain code, e.g. a subprocess's files).

A test that needs "the run has started" or "the worker is gone" asks for exactly that
and goes on the moment it holds; only a condition that never holds costs the timeout,
and then the failure says what was awaited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.01


async def until(holds: Callable[[], object], what: str = "the condition",
                timeout: float = 120.0) -> None:
    """Return as soon as ``holds()`` is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not holds():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(POLL_S)


def until_now(holds: Callable[[], object], what: str = "the condition",
              timeout: float = 120.0) -> None:
    """``until`` for code outside an event loop (blocking)."""
    deadline = time.monotonic() + timeout
    while not holds():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(POLL_S)
