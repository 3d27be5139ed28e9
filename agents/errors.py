"""Errors an agent raises before it can stream anything (configuration, missing key).

Once an agent is streaming, problems become ``Failure`` events instead: a session never
dies of an API error.
"""

from __future__ import annotations


class AgentError(Exception):
    """An agent that cannot be built as configured; the message says what to do."""


class NoApiKey(AgentError):
    """The Anthropic agent was asked for without ANTHROPIC_API_KEY in the environment."""

    def __init__(self) -> None:
        super().__init__(
            "No Anthropic API key: set ANTHROPIC_API_KEY in the environment to use Claude, "
            "or run with the offline agent instead (--agent offline), which needs no key."
        )
