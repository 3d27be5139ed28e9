"""Text from candidates, models and tasks, made safe to print or to write into a file.

What a candidate prints or raises, what a model writes in a summary, what a task's
files say, reaches terminals (``tilewright eval`` on a TTY, ``auto``'s progress,
``replay --headless``), the workbench, logs, reports and generated Python. A control
character there is an instruction to the terminal (OSC 52 writes the clipboard, ESC c
clears the screen, a title escape renames the window) or, in a file, a line break Python
honours (a carriage return ends a comment). ``printable`` removes every C0 and C1
control character but newline and tab, and DEL; ``one_line`` also folds newlines and
tabs into spaces, for a single line (a comment, a table cell, a progress line).

Pure text: any layer may import this.
"""

from __future__ import annotations

import re
from typing import Any

# C0 controls but \t (09) and \n (0a), DEL, and the C1 range (which includes NEL, 0x85,
# a line break to some readers).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Unicode's own line and paragraph separators (a line break to editors and some terminals).
_SEPARATORS = re.compile(r"[\u2028\u2029]")


def printable(text: str) -> str:
    """``text`` without control characters (newlines and tabs kept)."""
    if not isinstance(text, str):
        text = str(text)
    return _SEPARATORS.sub("\n", _CONTROL.sub("", text))


def one_line(text: str) -> str:
    """``text`` as one printable line: control characters removed, newlines and tabs
    (and runs of spaces) folded into single spaces."""
    return " ".join(printable(text).split())


def printable_fields(value: Any) -> Any:
    """``value`` (an event, a JSON object) with every string in it ``printable``."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {k: printable_fields(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(printable_fields(v) for v in value)
    return value


class PrintableStream:
    """A text stream that writes ``printable`` text to ``stream`` (what a CLI prints from
    a session log: a forged or older log may hold raw control characters)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(printable(text))

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())
