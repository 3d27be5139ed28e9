"""A full-screen diff of two versions (History: ``d``)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.widgets.diffview import DiffView


class DiffScreen(ModalScreen[None]):
    CSS_PATH = "diff.tcss"
    BINDINGS = [Binding("escape,q", "dismiss(None)", "Close", id="diff.close")]

    def __init__(self, title: str, old: str, new: str) -> None:
        super().__init__()
        self.title_text, self.old, self.new = title, old, new

    def compose(self) -> ComposeResult:
        yield Static(f"{self.title_text}   (Esc closes)", id="diff-title", markup=False)
        yield DiffView(id="diff-full")

    def on_mount(self) -> None:
        view = self.query_one(DiffView)
        view.show(self.old, self.new)
        view.focus()
