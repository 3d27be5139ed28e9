"""How far a compiler figure can be trusted, as it travels with a rank: the brief of the
fidelity record an evaluation carries (``tpu.fidelity``), and a chip's measured speedups
in words. Pure data."""

from __future__ import annotations

from typing import Any


def fidelity_brief(found: Any) -> dict[str, Any] | None:
    """What a rank keeps of ``tpu.fidelity``: its class, chip, figures and notes."""
    if not isinstance(found, dict):
        return None
    return {k: found.get(k) for k in ("class", "chip", "median_ratio", "within_2x", "rows",
                                      "note", "speedups") if found.get(k) is not None} or None


def speedup_words(found: Any) -> str | None:
    """A chip's estimated speedups against measured ones (``fidelity.speedups``), in a
    phrase: "v7x speedups: 1 of 12 tokamax pairs estimated, 0.89 of measured"."""
    if not isinstance(found, dict) or not found.get("pairs"):
        return None
    said = (f"{found.get('chip') or 'this chip'} speedups: {found.get('estimated') or 0} "
            f"of {found['pairs']} tokamax pairs estimated")
    if isinstance(found.get("median_ratio"), int | float):
        said += f", {found['median_ratio']:.2f} of measured"
    return said
