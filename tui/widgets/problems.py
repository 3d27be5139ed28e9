"""The Problems pane: compile, lowering and runtime errors and integrity flags.

Selecting a row with a line number posts ``ProblemsPane.Jump`` so the screen can move
the editor there.
"""

from __future__ import annotations

import textwrap

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from tilewright.tui.problems import Problem


class ProblemsPane(Vertical):
    ALLOW_MAXIMIZE = True  # F7 zooms a whole pane
    MAX_LINES = 4  # lines a message may take in the pane (zoomed: many more)
    DEFAULT_CSS = """
    ProblemsPane DataTable { height: 1fr; }
    ProblemsPane #problems-hint { color: $text-muted; height: auto; max-height: 50%; }
    ProblemsPane #problems-tpu { color: $text-muted; height: auto; max-height: 50%;
                                 display: none; }
    ProblemsPane #problems-tpu.-shown { display: block; }
    """

    class Jump(Message):
        def __init__(self, line: int) -> None:
            super().__init__()
            self.line = line

    def __init__(self, filename: str = "kernel.py", **kwargs) -> None:
        super().__init__(**kwargs)
        self.filename = filename
        self.problems: list[Problem] = []
        self.border_title = "Problems"

    def compose(self) -> ComposeResult:
        table: DataTable = DataTable(id="problems-table", cursor_type="row", zebra_stripes=False)
        table.add_columns(" ", "kind", "where", "message")
        yield table
        yield Static("", id="problems-hint", markup=False)
        yield Static("", id="problems-tpu", markup=False)

    def show(self, problems: list[Problem], tpu: str | None = None) -> None:
        """``tpu``: the current version's TPU compile in one line (chip, verdict, VMEM of
        the limit, ranking number in words, trust), under the table's border when it fits
        there, else its start there and the whole of it wrapped below the table (a
        border cuts what is longer than the pane)."""
        if tpu is not None:
            self.tpu = tpu
            self._place_tpu()
        if problems == self.problems:
            return
        self.problems = list(problems)
        self._fill()

    tpu = ""

    def _place_tpu(self) -> None:
        room = (self.size.width or 80) - 6
        below = self.query_one("#problems-tpu", Static)
        if len(self.tpu) <= room:
            self.border_subtitle = self.tpu
            below.remove_class("-shown")
            return
        self.border_subtitle = " · ".join(self.tpu.split(" · ")[:2])
        below.update(self.tpu)
        below.add_class("-shown")

    def on_resize(self) -> None:
        if self.tpu:
            self._place_tpu()
        if self.problems:
            self._fill()  # messages wrap to the new width

    def _fill(self) -> None:
        """One row per problem, its message wrapped at word boundaries to the width the
        other columns leave (a row grows, up to ``MAX_LINES``; F7 zooms for more)."""
        table = self.query_one(DataTable)
        table.clear()
        rows = []
        look = getattr(self.app, "look", None)
        draw = look.mark if look is not None else str
        for p in self.problems:
            where = f"{self.filename}:{p.line}" if p.line else (f"v{p.version}" if p.version else "")
            rows.append((draw(p.icon), p.kind, where, p.message))
        fixed = sum(max([len(r[c]) for r in rows] + [len(h)]) + 2
                    for c, h in enumerate((" ", "kind", "where")))
        width = max(20, (self.content_size.width or 80) - fixed - 3)
        limit = self.MAX_LINES if not self.is_maximized else 40
        zoom = _zoom_key(self.app)
        for i, (icon, kind, where, message) in enumerate(rows):
            lines = textwrap.wrap(" ".join(message.split()), width) or [""]
            if len(lines) > limit:  # cut: say where the rest is
                more = f"… ({zoom} shows all)"
                lines = lines[:limit]
                lines[-1] = lines[-1][:max(0, width - len(more))] + more
            # Plain Text cells: a message is often the candidate's own words, and a str
            # cell would be parsed as console markup ([link=...], [bold]...).
            table.add_row(icon, Text(kind), Text(where), Text("\n".join(lines)),
                          height=len(lines), key=str(i))
        errors = sum(p.severity == "error" for p in self.problems)
        flags = len(self.problems) - errors
        self.border_title = f"Problems · {errors} error(s), {flags} other" if self.problems \
            else "Problems · none"
        self._hint(0 if self.problems else None)

    def _hint(self, index: int | None) -> None:
        hint = self.problems[index].hint if index is not None and index < len(self.problems) \
            else None
        self.query_one("#problems-hint", Static).update(f"hint: {hint}" if hint else "")

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._hint(event.cursor_row)

    @on(DataTable.RowSelected)
    def _selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        problem = self.problems[event.cursor_row]
        if problem.line:
            self.post_message(self.Jump(problem.line))
        else:
            self.app.notify(problem.message, title=problem.kind, timeout=6, markup=False)


def _zoom_key(app: object) -> str:
    """The key that zooms a pane, as the keymap in force says it."""
    try:
        from tilewright.tui import keymap

        return keymap.say(app, "maximize", joiner="/")  # type: ignore[arg-type]
    except Exception:  # an app without a keymap (a widget test's host)
        return "zoom"
