"""The Problems pane: compile, lowering and runtime errors and integrity flags.

Selecting a row with a line number posts ``ProblemsPane.Jump`` so the screen can move
the editor there.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from tui.problems import Problem


class ProblemsPane(Vertical):
    ALLOW_MAXIMIZE = True  # F7 zooms a whole pane
    DEFAULT_CSS = """
    ProblemsPane DataTable { height: 1fr; }
    ProblemsPane #problems-hint { color: $text-muted; height: auto; max-height: 3; }
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

    def show(self, problems: list[Problem], tpu: str | None = None) -> None:
        """``tpu``: the current version's TPU compile in one line (chip, verdict, VMEM of
        the limit, ranking number in words), shown under the table's border."""
        if tpu is not None:
            self.border_subtitle = tpu
        if problems == self.problems:
            return
        self.problems = list(problems)
        table = self.query_one(DataTable)
        table.clear()
        for i, p in enumerate(self.problems):
            where = f"{self.filename}:{p.line}" if p.line else (f"v{p.version}" if p.version else "")
            # Plain Text cells: a message is often the candidate's own words, and a str cell
            # would be parsed as console markup ([link=...], [bold]...).
            table.add_row(p.icon, Text(p.kind), Text(where), Text(p.message), key=str(i))
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
