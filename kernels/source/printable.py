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


def visible(text: str) -> str:
    """``text`` for a screen that shows code as it is: each control character but newline
    and tab drawn as its Unicode control picture (ESC as ␛, a lone carriage return
    as ␍), so a reader sees it is there and the terminal is never told to act on it."""
    if not isinstance(text, str):
        text = str(text)
    text = text.replace("\r\n", "\n")
    return _SEPARATORS.sub("\n", _CONTROL.sub(_picture, text))


def _picture(match: re.Match[str]) -> str:
    code = ord(match.group())
    return chr(0x2400 + code) if code < 0x20 else "\u2421" if code == 0x7F else "\ufffd"


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


def source_controls(source: str) -> list[tuple[int, str]]:
    """Raw control characters in a Python source (``(line, name)`` each, at most 8):
    everything ``printable`` would remove but a carriage return ending a line (``\\r\\n``)
    and a form feed (Python's own page break)."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(source.split("\n"), start=1):
        for char in _CONTROL.findall(line.removesuffix("\r").replace("\x0c", "")):
            found.append((number, _NAMES.get(char, f"U+{ord(char):04X}")))
            if len(found) == 8:
                return found
    return found


_NAMES = {"\x1b": "ESC", "\x07": "BEL", "\r": "CR", "\x00": "NUL", "\x08": "BS",
          "\x7f": "DEL", "\x9b": "CSI", "\x9d": "OSC", "\x85": "NEL"}


def controls_text(found: list[tuple[int, str]]) -> str:
    """``source_controls``'s findings in words: "ESC at line 5, BEL at line 5"."""
    return ", ".join(f"{name} at line {line}" for line, name in found)


def comments_printable(source: str) -> str:
    """``source`` with its line breaks written as newlines and the control characters in
    its comments removed (neither changes the program). Raises ``ValueError`` naming the lines when
    raw control characters remain elsewhere (in a string literal, where removing one
    would change what the program does)."""
    import io
    import tokenize

    # Python reads a lone carriage return as a line break (in strings too): say so
    source = source.replace("\r\n", "\n").replace("\r", "\n")
    if not source_controls(source):
        return source
    lines = io.StringIO(source).readlines()  # split at \n only, as tokenize reads it
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError) as exc:
        raise ValueError(f"the source does not tokenize: {exc}") from exc
    for token in reversed(tokens):  # right to left: earlier columns stay valid
        if token.type != tokenize.COMMENT:
            continue
        row, start = token.start
        _, end = token.end
        line = lines[row - 1]
        lines[row - 1] = line[:start] + printable(line[start:end]).replace("\n", " ") \
            + line[end:]
    cleaned = "".join(lines)
    left = source_controls(cleaned)
    if left:
        raise ValueError(f"raw control characters outside comments ({controls_text(left)}); "
                         "write them as escapes in the string (\\x1b)")
    return cleaned
