"""Retrying a model request: how long to wait, and what the user is told meanwhile.

Shared by every provider (``agents.claude``, ``agents.openai_chat``), so a rate limit
or a server error reads the same whichever model is behind it: a warning ``Notice``
"rate limited, retrying in 2.0 s (attempt 2/4)" while waiting, and a retryable
``Failure`` "...; gave up after 4 attempts: <the server's message>" when the attempts run
out. The SDKs' own retries are off, so each wait reaches the user.
"""

from __future__ import annotations

from agents.base import Failure, Notice


def status_kind(status: int | None) -> str | None:
    """What to tell the user about an HTTP status before retrying; None: not retryable."""
    if status == 429:
        return "rate limited"
    if status == 529:
        return "API overloaded (529)"
    if status in (500, 502, 503, 504):
        return f"server error ({status})"
    return None


def wait_s(exc: Exception, backoff: float, cap: float) -> float:
    """The backoff, or the server's longer ``retry-after`` hint; never more than ``cap``."""
    response = getattr(exc, "response", None)
    header = response.headers.get("retry-after") if response is not None else None
    try:
        hinted = float(header) if header else None
    except ValueError:
        hinted = None
    return min(cap, hinted if hinted is not None and hinted > backoff else backoff)


def short(exc: Exception) -> str:
    """The first line of an SDK error's message (at most 300 characters)."""
    message = getattr(exc, "message", None) or str(exc)
    return message.splitlines()[0][:300] if message else type(exc).__name__


def retry_notice(kind: str, wait: float, attempt: int, attempts: int) -> Notice:
    """Said before waiting ``wait`` seconds; ``attempt`` is the one that just failed."""
    shown = f"{wait:.1f}" if wait >= 1 else f"{wait:.2f}"
    return Notice(f"{kind}, retrying in {shown} s (attempt {attempt + 1}/{attempts})",
                  level="warning")


def gave_up(kind: str, attempts: int, detail: str) -> Failure:
    return Failure(f"{kind}; gave up after {attempts} attempts: {detail}", retryable=True)
