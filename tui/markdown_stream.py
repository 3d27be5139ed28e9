"""Streaming Markdown in pieces: find where complete blocks end, render each piece once.

An agent reply grows at its end. Re-parsing and re-wrapping the whole reply on every
redraw costs time proportional to its length; here a reply is cut at block boundaries
into pieces that are rendered once (per width) and never again, and only the open last
block is re-rendered as tokens arrive.

A cut is made only where it cannot change the rendering: at a line that starts a new
top-level block after a blank line, outside fenced code. Rich ends a document with
blank lines and puts one blank line between blocks, so a piece drops its trailing
blank lines, and a piece after another starts with one blank line unless its first
block draws its own (an ``h2`` does) or it goes on with the list the piece above
ends with (Rich draws one list's items without blank lines between them). With these rules the
pieces draw line for line what the whole text draws; tests/test_markdown_stream.py
checks that on every prefix of sample replies.

Textual's own streaming, ``Markdown.get_stream`` (Textual 8.2.8: one stream per reply,
written once per flush tick), was measured against this with
``JAX_PLATFORMS=cpu python benchmarks/host_speed/tui_latency.py`` ("streaming only" line; 2 shared
CPUs, medians of 5 alternating runs each). On the benchmark's reply, one long loose
list, a key waited p50 179 ms, p95 617 ms (ours: 16 ms, 33 ms), the app took 69% of a
CPU (ours: 22%), and the agent's own 150 tok/s fell to 63-84 (2 runs); writing every
delta straight to the stream was no better (p50 148 ms, p95 524 ms, 3 runs).
``Markdown.append`` re-parses the open top-level block and, unless it is a paragraph, a
code fence or a table, removes and re-mounts it: a growing list is rebuilt, item by
item, on every write. On a reply of plain paragraphs the two were on par (p50 14-20 ms
against 16-18 ms, 2 runs each), and at 80x24 they look alike. So this module stays.
"""

from __future__ import annotations

import re

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.segment import Segment

_LIST_ITEM = re.compile(r"([-*+]|\d{1,9}[.)])(\s|$)")
_FENCES = ("```", "~~~")


def block_starts(text: str, start: int = 0) -> list[int]:
    """Offsets in ``text`` (after ``start``) where a new top-level block begins.

    Only complete lines are considered (the last line may still be growing), and
    ``start`` must itself be a block start (or 0): scanning begins outside any fence.
    """
    starts: list[int] = []
    fence: str | None = None
    previous_blank = False
    offset = start
    end = text.rfind("\n") + 1  # complete lines only
    while offset < end:
        newline = text.index("\n", offset)
        line = text[offset:newline]
        stripped = line.lstrip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            previous_blank = False
        else:
            if previous_blank and line and not line[0].isspace():
                starts.append(offset)
            if stripped.startswith(_FENCES):
                fence = stripped[:3]
            previous_blank = not stripped
        offset = newline + 1
    return starts


def continues_list(text: str, offset: int) -> bool:
    """Whether the block at ``offset`` is an item of the list that ``text[:offset]``
    ends with (its last unindented line is an item with the same kind of marker)."""
    end = text.find("\n", offset)
    kind = _list_kind(text[offset:] if end < 0 else text[offset:end])
    if kind is None:
        return False
    stop = offset
    while stop > 0:
        begin = text.rfind("\n", 0, stop - 1) + 1
        line = text[begin:stop].rstrip("\n")
        if line.strip() and not line[0].isspace():
            return _list_kind(line) == kind
        stop = begin
    return False


def _list_kind(line: str) -> str | None:
    """``-``, ``*`` or ``+`` for a bullet item, ``.`` or ``)`` for a numbered one."""
    match = _LIST_ITEM.match(line)
    if match is None:
        return None
    marker = match.group(1)
    return marker if marker in "-*+" else marker[-1]


NOTHING, BLOCK, SAME_LIST = "nothing", "block", "same list"  # what is drawn above


def above(text: str, offset: int) -> str:
    """What a piece starting at ``offset`` of ``text`` has drawn above it."""
    if offset == 0:
        return NOTHING
    return SAME_LIST if continues_list(text, offset) else BLOCK


class MarkdownPiece:
    """Rich Markdown for a run of whole blocks, rendered once per width.

    ``above`` is what is drawn above the piece: nothing (drawn as Rich draws it), a
    block (then the piece begins with the blank line Rich puts between blocks), or
    the start of the list the piece goes on with (then it begins with no blank line).
    """

    def __init__(self, text: str, above: str = NOTHING) -> None:
        from rich.markdown import Markdown  # Markdown pulls in markdown-it: load on use

        self.text = text
        self.above = above
        self.markdown = Markdown(text)
        self._width: int | None = None
        self._lines: list[list[Segment]] = []

    def lines(self, console: Console, options: ConsoleOptions) -> list[list[Segment]]:
        if options.max_width != self._width:
            rendered = list(console.render(self.markdown, options))
            lines = list(Segment.split_lines(rendered))
            while lines and _blank(lines[-1]):
                lines.pop()
            if self.above == SAME_LIST:
                while lines and _blank(lines[0]):
                    lines.pop(0)
            elif self.above == BLOCK and lines and not _blank(lines[0]):
                lines.insert(0, [])
            self._lines, self._width = lines, options.max_width
        return self._lines

    def height(self, console: Console, options: ConsoleOptions) -> int:
        return len(self.lines(console, options))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        newline = Segment.line()
        for line in self.lines(console, options):
            yield from line
            yield newline

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.markdown)


def _blank(line: list[Segment]) -> bool:
    return not any(segment.text for segment in line)
