"""How the workbench draws on the terminal it has: colours and characters.

On a terminal of 16 colours (``TERM=xterm``, ``linux``, ``vt100``) backgrounds blur
into the nearest of a few colours, so a diff's added and removed lines, tinted by
background elsewhere, are told apart by green and red text and their ``+``/``-``
marks. On the Linux console (and vt terminals, or when the config asks) the spinner,
pane corners and status marks are ASCII: its font has no braille, rounded corners or
symbols such as ✓ and ★. ``[ui] colors`` and ``[ui] ascii`` in the config choose
either way by hand.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

COLORS = ("auto", "16", "full")
ASCII = ("auto", "yes", "no")
ASCII_TERMS = ("linux", "vt", "cons", "dumb")
LOW_COLOR_SYSTEMS = (None, "standard", "windows")

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
ASCII_SPINNER = "|/-\\"
# Status marks (History, Problems, the version tree) in ASCII.
ASCII_MARKS = {"✓": "+", "✗": "x", "⏱": "T", "☠": "X", "⚑": "!", "⊘": "-", "·": ".",
               "▶": ">", "★": "*", "…": "..."}


@dataclass(frozen=True)
class Look:
    low_color: bool = False  # 16 colours or fewer: no background tints
    ascii: bool = False  # ASCII spinner, borders and marks

    def mark(self, text: str) -> str:
        """A status mark as this terminal can draw it."""
        if not self.ascii:
            return text
        return "".join(ASCII_MARKS.get(c, c) for c in text)

    @property
    def spinner(self) -> str:
        return ASCII_SPINNER if self.ascii else SPINNER


def choose_look(ui: Any, term: str | None, color_system: str | None,
                encoding: str | None = None) -> tuple[Look, str | None]:
    """The look for ``[ui]`` (``colors``, ``ascii``) on terminal ``term`` whose colour
    system Rich detected; an error line for a value the config got wrong (the rest
    then decides as ``auto``)."""
    errors = []
    colors = getattr(ui, "colors", "auto")
    if colors not in COLORS:
        errors.append(f"[ui] colors {colors!r} is not one of {', '.join(COLORS)}; using auto")
        colors = "auto"
    ascii_ = getattr(ui, "ascii", "auto")
    if ascii_ not in ASCII:
        errors.append(f"[ui] ascii {ascii_!r} is not one of {', '.join(ASCII)}; using auto")
        ascii_ = "auto"
    term = term or ""
    low = color_system in LOW_COLOR_SYSTEMS if colors == "auto" else colors == "16"
    if encoding is None:  # the terminal's (a running app has replaced sys.stdout)
        encoding = getattr(sys.__stdout__, "encoding", None) or ""
    encoding = encoding.lower()
    if ascii_ == "auto":
        plain = term.startswith(ASCII_TERMS) or (encoding != "" and "utf" not in encoding)
    else:
        plain = ascii_ == "yes"
    return Look(low_color=low, ascii=plain), "; ".join(errors) or None
