"""The History pane: every kernel version with its status and what ranks it.

Enter views a version, ``d`` diffs it against the current one, ``r`` reverts to it,
``x`` exports it as a module for your code (the table holds no text input, so letter
keys are safe here).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable

from tilewright.sessions.state import Rank
from tilewright.tui.format import compile_verdict, format_vmem, rank_at_length, status_mark


@dataclass(frozen=True)
class VersionRow:
    version: int
    origin: str
    summary: str
    status: str | None = None  # latest evaluation status, None when never run
    # What ranks it (``kernels.judge.rank.Rank``), of its latest evaluation; None when never run
    rank: Rank | None = None
    current: bool = False
    best: bool = False
    chip: str | None = None
    tpu_compile: str | None = None  # the TPU compiler's verdict: ok | error | unavailable
    vmem_bytes: int | None = None
    vmem_limit_bytes: int | None = None


def tpu_cell(row: VersionRow) -> str:
    """"v5e ✓ 2.0/16.0M": the chip, the compiler's verdict, VMEM of the scoped limit."""
    if not row.tpu_compile:
        return ""
    mark = compile_verdict(row.tpu_compile)[0]
    vmem = format_vmem(row.vmem_bytes, row.vmem_limit_bytes).removeprefix("VMEM ")
    return " ".join(x for x in (row.chip, mark, vmem.replace(" MiB", "M")) if x)


class HistoryTable(DataTable):
    BINDINGS = [
        Binding("d", "diff", "Diff vs current", id="history.diff"),
        Binding("r", "revert", "Revert", id="history.revert"),
        Binding("x", "export", "Export", id="history.export"),
    ]

    def action_diff(self) -> None:
        self.parent.request("diff")  # type: ignore[union-attr]

    def action_export(self) -> None:
        self.parent.request("export")  # type: ignore[union-attr]

    def action_revert(self) -> None:
        self.parent.request("revert")  # type: ignore[union-attr]


class HistoryPane(Vertical):
    ALLOW_MAXIMIZE = True  # F7 zooms a whole pane
    DEFAULT_CSS = "HistoryPane DataTable { height: 1fr; }"

    class Picked(Message):
        """``what`` is view, diff, revert or export."""

        def __init__(self, what: str, version: int) -> None:
            super().__init__()
            self.what = what
            self.version = version

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: list[VersionRow] = []
        self.border_title = "History"

    def compose(self) -> ComposeResult:
        table = HistoryTable(id="history-table", cursor_type="row")
        # "rank": the number that ranks versions, worded by where it comes from
        # (``Rank.words``, short: "est. 1.80x" the TPU compiler's estimate, "≥0.87x
        # roofline" against XLA's roofline, "host sim 0.0278" never a speedup).
        table.add_columns("ver", "origin", "status", "rank", "TPU", "summary")
        yield table

    def show(self, rows: list[VersionRow]) -> None:
        if rows == self.rows:
            return
        self.rows = list(rows)
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        table.clear()
        for row in reversed(self.rows):  # newest first
            look = getattr(self.app, "look", None)
            draw = look.mark if look is not None else str
            mark = draw(("▶" if row.current else " ") + ("★" if row.best else " "))
            status = f"{draw(status_mark(row.status))} {row.status or 'not run'}"
            speed = row.rank.words(short=True) if row.rank is not None else "-"
            summary = row.summary if len(row.summary) <= 48 else \
                row.summary[:47] + draw("…")
            table.add_row(f"{mark}v{row.version}", row.origin, status, speed,
                          draw(tpu_cell(row)),
                          Text(summary), key=str(row.version))  # never read as markup
        if self.rows:
            table.move_cursor(row=min(cursor, len(self.rows) - 1))
        self.border_title = f"History · {len(self.rows)} version(s)"
        self._subtitle()

    def _subtitle(self) -> None:
        """The highlighted version's ranking number in full words (the table shortens
        it), with how far a compiler figure can be trusted: "v2: est. 1.80x on v5e
        (TPU compiler) · compute-bound v5e: median 0.96 of measured, 10 programs"."""
        try:
            version = self.selected_version()
        except IndexError:  # the cursor left the table while it was refilled
            version = None
        row = next((r for r in self.rows if r.version == version), None)
        rank = row.rank if row is not None else None
        self.border_subtitle = f"v{row.version}: {rank_at_length(rank)}" \
            if row is not None and rank is not None and rank.said else ""

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self._subtitle()

    def selected_version(self) -> int | None:
        table = self.query_one(DataTable)
        if not self.rows:
            return None
        return list(reversed(self.rows))[table.cursor_row].version

    def request(self, what: str) -> None:
        version = self.selected_version()
        if version is not None:
            self.post_message(self.Picked(what, version))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.request("view")
