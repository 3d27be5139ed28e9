"""A read-only, syntax-highlighted unified view of a proposal against the current source.

Removed lines are tinted red, added lines green, both keep Python highlighting, so a
kernel author reads the change as code rather than as a patch file. On a terminal of 16
colours (``low_color``) a background tint becomes black or grey, so there the lines
are told apart by their text: removed lines red, added lines green, their ``-``/``+``
marks bold.
"""

from __future__ import annotations

import difflib

from rich.style import Style
from rich.syntax import Syntax
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

ADDED = Style(bgcolor="#123d1f")
REMOVED = Style(bgcolor="#4a1518")
GUTTER = Style(color="#6c7086")
# 16 colours: the standard colours, as every such terminal draws them; no background.
LOW_ADDED = Style(color="green", bold=True)
LOW_REMOVED = Style(color="red")
LOW_GUTTER = Style(color="bright_black")


def diff_lines(old: str, new: str, context: int = 5) -> list[tuple[str, int | None, str]]:
    """(tag, new-line-number, text) rows; tag is ' ', '+', '-' or '~' (a skipped gap)."""
    a, b = old.splitlines(), new.splitlines()
    rows: list[tuple[str, int | None, str]] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        if rows:
            rows.append(("~", None, "…"))
        for op, i1, i2, j1, j2 in group:
            if op == "equal":
                rows.extend((" ", j1 + k + 1, a[i1 + k]) for k in range(i2 - i1))
                continue
            if op in ("replace", "delete"):
                rows.extend(("-", None, a[i]) for i in range(i1, i2))
            if op in ("replace", "insert"):
                rows.extend(("+", j + 1, b[j]) for j in range(j1, j2))
    return rows


def render_diff(old: str, new: str, theme: str = "monokai", low_color: bool = False) -> Text:
    rows = diff_lines(old, new)
    if not rows:
        return Text("no change against the current version", style="italic")
    if low_color:
        return _render_plain(rows)
    syntax = Syntax("", "python", theme=theme, background_color="default")
    out = Text(no_wrap=True, overflow="ellipsis")
    width = len(str(max((n or 0 for _, n, _ in rows), default=1)))
    # Changed lines are tinted across the whole row, not just their characters.
    row_width = max(100, max(len(text) for _, _, text in rows) + width + 4)
    for tag, number, text in rows:
        if tag == "~":
            line = Text(text, style=GUTTER)
        else:
            line = syntax.highlight(text)
            line.rstrip()  # in place: drop the newline highlight() adds
        gutter = Text(f"{number if number else '':>{width}} {tag} ", style=GUTTER)
        row = Text.assemble(gutter, line)
        row.pad_right(row_width - len(row))
        if tag == "+":
            row.stylize(ADDED)
        elif tag == "-":
            row.stylize(REMOVED)
        out.append_text(row)
        out.append("\n")
    out.rstrip()
    return out


def _render_plain(rows: list[tuple[str, int | None, str]]) -> Text:
    """The diff for 16 colours: no backgrounds, no syntax colours (they collapse into
    the same few); changed lines in the terminal's own red and green."""
    out = Text(no_wrap=True, overflow="ellipsis")
    width = len(str(max((n or 0 for _, n, _ in rows), default=1)))
    for tag, number, text in rows:
        style = {"+": LOW_ADDED, "-": LOW_REMOVED, "~": LOW_GUTTER}.get(tag, Style())
        gutter = f"{number if number else '':>{width}} "
        out.append(gutter, style=LOW_GUTTER)
        out.append(f"{tag} ", style=style + Style(bold=True) if tag in "+-" else LOW_GUTTER)
        out.append(text, style=style)
        out.append("\n")
    out.rstrip()
    return out


class DiffView(VerticalScroll, can_focus=True):
    """Scrollable diff; keyboard scrolling comes from VerticalScroll."""

    DEFAULT_CSS = """
    DiffView { height: 1fr; }
    DiffView > Static { width: auto; min-width: 100%; }
    """

    def compose(self):  # type: ignore[override]
        yield Static(id="diff-body")

    def show(self, old: str, new: str) -> None:
        look = getattr(self.app, "look", None)
        self.query_one("#diff-body", Static).update(
            render_diff(old, new, low_color=bool(look and look.low_color)))
        self.scroll_home(animate=False)

    def first_change_line(self, old: str, new: str) -> int | None:
        for tag, number, _ in diff_lines(old, new):
            if tag == "+" and number:
                return number
        return None
