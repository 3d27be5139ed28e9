"""Retrying a model request: how long to wait, and what the user is told meanwhile.

Shared by every provider (``agents.providers.claude``, ``agents.providers.openai_chat``), so a rate limit
or a server error reads the same whichever model is behind it: a warning ``Notice``
"rate limited, retrying in 2.0 s (attempt 2/4)" while waiting, and a retryable
``Failure`` "...; gave up after 4 attempts: <the server's message>" when the attempts run
out. The SDKs' own retries are off, so each wait reaches the user. ``retrying`` is the
loop itself, which each provider runs with its own judgement of an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tilewright.agents.base import Failure, Notice

if TYPE_CHECKING:
    from tilewright.agents.providers.provider import ProviderEvent


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


@dataclass(frozen=True)
class Again:
    """Ask again at once without counting an attempt (a server that refused the tools
    is asked without them), after telling the user ``notice``."""

    notice: Notice | None = None


# What a provider makes of a failed attempt: a retry kind ("rate limited"), a Failure
# that ends the reply, or Again.
Judged = str | Failure | Again


async def retrying(attempt: Callable[[], AsyncIterator[ProviderEvent]], *, attempts: int,
                   base_s: float, max_s: float,
                   retryable: tuple[type[BaseException], ...],
                   judge: Callable[[Exception], Judged], notices: list[str],
                   sdk_error: type[BaseException], sdk: str,
                   gave_up_as: Callable[[Failure, Exception], Failure] | None = None
                   ) -> AsyncIterator[ProviderEvent]:
    """Every provider's reply loop: stream ``attempt()``; on a ``retryable`` error,
    ``judge`` it, and wait with exponential backoff (``base_s`` doubling, at most
    ``max_s``, or the server's longer ``retry-after``) before the next of ``attempts``,
    saying so each time; when they run out, the retryable failure (``gave_up_as`` may
    add a hint). Another error of the SDK (``sdk_error``) or a surprise ends the reply
    with a Failure naming ``sdk``: a model's failure never ends the session. The
    provider's pending ``notices`` (a guessed price, say) are said first, once."""
    while notices:
        yield Notice(notices.pop(0), level="warning")
    number = 1
    while number <= attempts:
        try:
            async for event in attempt():
                yield event
            return
        except retryable as exc:
            assert isinstance(exc, Exception)
            verdict = judge(exc)
            if isinstance(verdict, Again):
                if verdict.notice is not None:
                    yield verdict.notice
                continue
            if isinstance(verdict, Failure):
                yield verdict
                return
            if number == attempts:
                failure = gave_up(verdict, number, short(exc))
                yield gave_up_as(failure, exc) if gave_up_as is not None else failure
                return
            wait = wait_s(exc, base_s * 2 ** (number - 1), max_s)
            yield retry_notice(verdict, wait, number, attempts)
            await asyncio.sleep(wait)
            number += 1
        except sdk_error as exc:
            yield Failure(f"{sdk} SDK error: {exc}")
            return
        except Exception as exc:  # never let a surprise from the SDK end the session
            yield Failure(f"unexpected error from the {sdk} SDK: {type(exc).__name__}: {exc}")
            return
