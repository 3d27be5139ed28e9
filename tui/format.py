"""How numbers read on screen, the same in every pane."""

from __future__ import annotations

from typing import Any


def format_speedup(value: Any) -> str:
    """1.42x, 0.87x; interpret-mode ratios far below 1 keep three significant digits."""
    if not isinstance(value, int | float):
        return "—"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.3g}x"
