"""Token prices and what a reply cost.

Built-in prices are USD per million tokens per model family, as published on the
vendors' pricing pages in November 2025: Anthropic (prompts up to 200k tokens, 5-minute
cache writes), OpenAI (standard tier; ``cache_read`` is the cached-input price) and
Google's Gemini API (paid tier, prompts up to 200k tokens; its cache price is left out,
so cached tokens count as input, an upper bound). A model found in none of them has an
unknown cost (``Usage.cost_known`` False), never a silent $0. They change: override them in the config file, ``[agent.prices."<model or family>"]``
with ``input``, ``output``, ``cache_read`` and ``cache_write``. The most specific key
that is a prefix of (or equal to) the model name wins.
"""

from __future__ import annotations

from typing import Any

from tilewright.agents.base import Usage

PRICES_AS_OF = "2025-11"

# family key -> USD per MTok. Keys are matched against the model id (longest first).
DEFAULT_PRICES: dict[str, dict[str, float]] = {
    "claude-opus-4-5": {"input": 5.0, "output": 25.0, "cache_read": 0.50, "cache_write": 6.25},
    "claude-opus-4": {"input": 15.0, "output": 75.0, "cache_read": 1.50, "cache_write": 18.75},
    "claude-sonnet-4": {"input": 3.0, "output": 15.0, "cache_read": 0.30, "cache_write": 3.75},
    "claude-3-7-sonnet": {"input": 3.0, "output": 15.0, "cache_read": 0.30, "cache_write": 3.75},
    "claude-haiku-4-5": {"input": 1.0, "output": 5.0, "cache_read": 0.10, "cache_write": 1.25},
    "claude-3-5-haiku": {"input": 0.80, "output": 4.0, "cache_read": 0.08, "cache_write": 1.0},
    "claude-3-haiku": {"input": 0.25, "output": 1.25, "cache_read": 0.03, "cache_write": 0.30},
    # OpenAI. Keys are prefixes too: variants priced differently have their own key.
    "gpt-5": {"input": 1.25, "output": 10.0, "cache_read": 0.125},
    "gpt-5-mini": {"input": 0.25, "output": 2.0, "cache_read": 0.025},
    "gpt-5-nano": {"input": 0.05, "output": 0.40, "cache_read": 0.005},
    "gpt-5-pro": {"input": 15.0, "output": 120.0},
    "gpt-4.1": {"input": 2.0, "output": 8.0, "cache_read": 0.50},
    "gpt-4.1-mini": {"input": 0.40, "output": 1.60, "cache_read": 0.10},
    "gpt-4.1-nano": {"input": 0.10, "output": 0.40, "cache_read": 0.025},
    "gpt-4o": {"input": 2.50, "output": 10.0, "cache_read": 1.25},
    "gpt-4o-2024-05-13": {"input": 5.0, "output": 15.0},
    "gpt-4o-mini": {"input": 0.15, "output": 0.60, "cache_read": 0.075},
    "o3": {"input": 2.0, "output": 8.0, "cache_read": 0.50},
    "o3-mini": {"input": 1.10, "output": 4.40, "cache_read": 0.55},
    "o3-pro": {"input": 20.0, "output": 80.0},
    "o4-mini": {"input": 1.10, "output": 4.40, "cache_read": 0.275},
    # Google Gemini API, through its OpenAI-compatible endpoint.
    "gemini-2.5-pro": {"input": 1.25, "output": 10.0},
    "gemini-2.5-flash": {"input": 0.30, "output": 2.50},
    "gemini-2.5-flash-lite": {"input": 0.10, "output": 0.40},
    "gemini-2.0-flash": {"input": 0.10, "output": 0.40},
    "gemini-2.0-flash-lite": {"input": 0.075, "output": 0.30},
}

# Models newer than the table: assume the family's latest published price, and say so.
FAMILY_FALLBACK = {"claude-opus": "claude-opus-4-5", "claude-sonnet": "claude-sonnet-4",
                   "claude-haiku": "claude-haiku-4-5"}


def price_for(model: str, overrides: dict[str, Any] | None = None) -> dict[str, float] | None:
    """The price row for a model: config overrides first, then the built-in table."""
    for table in (overrides or {}, DEFAULT_PRICES):
        if model in table:
            return dict(table[model])
        keys = sorted((k for k in table if model.startswith(k)), key=len, reverse=True)
        if keys:
            return dict(table[keys[0]])
    return None


def assumed_price(model: str) -> tuple[str, dict[str, float]] | None:
    """For a model the table does not know: (family, the family's latest published price)."""
    for family, known in FAMILY_FALLBACK.items():
        if model.startswith(family):
            return family, dict(DEFAULT_PRICES[known])
    return None


def cost_usd(usage: Usage, price: dict[str, float] | None) -> float:
    if not price:
        return 0.0
    return (usage.input_tokens * price.get("input", 0.0)
            + usage.output_tokens * price.get("output", 0.0)
            + usage.cache_read_tokens * price.get("cache_read", 0.0)
            + usage.cache_write_tokens * price.get("cache_write", 0.0)) / 1e6
