"""Full-screen views from History: a diff of two versions (``d``) and one version's
source, read-only (Enter)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static, TextArea

from tilewright.tui.widgets.diffview import DiffView


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


class SourceScreen(ModalScreen[None]):
    CSS_PATH = "diff.tcss"
    BINDINGS = [Binding("escape", "dismiss(None)", "Close", id="source.close")]

    def __init__(self, title: str, source: str) -> None:
        super().__init__()
        self.title_text, self.source = title, source

    def compose(self) -> ComposeResult:
        yield Static(f"{self.title_text}   (read-only · Esc closes)", id="diff-title",
                     markup=False)
        yield TextArea.code_editor(self.source, language="python", read_only=True,
                                   id="diff-full")

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()
