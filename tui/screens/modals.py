"""Small modal screens: the rejection note, the plan editor, an error with its next step,
and F1 help."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static, TextArea

from tilewright.tui.keymap import key_name, spoken


class NotePrompt(ModalScreen[str | None]):
    """Ask for a note; Enter returns it (may be empty), Escape returns None."""

    CSS_PATH = "modals.tcss"
    BINDINGS = [Binding("escape", "dismiss(None)", "Back", id="modal.back")]

    def __init__(self, title: str, placeholder: str = "", value: str = "") -> None:
        super().__init__()
        self.title_text, self.placeholder, self.value = title, placeholder, value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.title_text, classes="dialog-title", markup=False)
            yield Input(self.value, placeholder=self.placeholder, id="note")
            yield Static("Enter confirms · Esc goes back", classes="dialog-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip())


class PlanEditor(ModalScreen[str | None]):
    """Edit a pending plan before approving it. The submit keys (the edit and approve
    keys, as remapped) return the edited text, which the caller records as the
    approving decision; Escape returns None and leaves the plan pending."""

    CSS_PATH = "modals.tcss"
    BINDINGS = [Binding("escape", "dismiss(None)", "Back", id="plan.back")]

    def __init__(self, title: str, plan: str, submit_keys: str = "f2,ctrl+y") -> None:
        super().__init__()
        self.title_text, self.plan = title, plan
        self.submit_keys = submit_keys
        # Priority: the editor would otherwise take ctrl+y (redo) for itself.
        self._bindings.bind(submit_keys, "submit", "Approve as edited", show=False,
                            priority=True)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -wide"):
            yield Static(self.title_text, classes="dialog-title", markup=False)
            yield TextArea(self.plan, id="plan-text", soft_wrap=True, show_line_numbers=False)
            keys = " or ".join(key_name(k) for k in self.submit_keys.split(",") if k)
            yield Static(f"{keys} approves the plan as edited · Esc goes back (the plan "
                         "stays pending)", classes="dialog-hint", markup=False)

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()

    def action_submit(self) -> None:
        text = self.query_one(TextArea).text.strip()
        if not text:
            self.notify("an edited plan needs at least one step (Esc goes back)",
                        severity="warning", timeout=4)
            return
        self.dismiss(text)


class ErrorModal(ModalScreen[str | None]):
    """An error and its next step. ``choices`` are extra keys, each returning its name
    (e.g. ``{"o": "continue with the offline agent"}`` dismisses with ``"o"``)."""

    CSS_PATH = "modals.tcss"
    BINDINGS = [Binding("escape,enter,space", "dismiss(None)", "Close", id="modal.close")]

    def __init__(self, title: str, message: str, next_step: str = "",
                 choices: dict[str, str] | None = None,
                 close_hint: str = "Enter or Esc closes") -> None:
        super().__init__()
        self.title_text, self.message, self.next_step = title, message, next_step
        self.choices = choices or {}
        self.close_hint = close_hint
        for key in self.choices:
            self._bindings.bind(key, f"dismiss({key!r})", show=False)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog -error"):
            yield Static(self.title_text, classes="dialog-title", markup=False)
            with VerticalScroll(classes="dialog-body"):
                yield Static(self.message, markup=False)
            if self.next_step:
                yield Static(self.next_step, classes="dialog-next", markup=False)
            hints = [f"{key}: {what}" for key, what in self.choices.items()]
            yield Static(" · ".join([*hints, self.close_hint]), classes="dialog-hint",
                         markup=False)


class HelpScreen(ModalScreen[None]):
    """Every key in force and what it does. ``close_keys`` close it (Esc, the help
    keys as remapped, q); the hint names them and the palette's keys."""

    CSS_PATH = "modals.tcss"

    def __init__(self, rows: list[tuple[str, str, str]], extra: str = "",
                 close_keys: list[str] | None = None, palette_keys: str = "ctrl+p") -> None:
        super().__init__()
        self.rows, self.extra = rows, extra
        self.close_keys = [k for k in (close_keys or ["escape", "f1", "q"]) if k]
        self.palette_keys = palette_keys
        self._bindings.bind(",".join(dict.fromkeys(self.close_keys)), "dismiss(None)",
                            "Close", show=False)

    def compose(self) -> ComposeResult:
        from rich.table import Table

        # A table wraps each description under itself (hanging), at any width.
        keys = Table.grid(padding=(0, 2))
        keys.add_column(no_wrap=True)
        keys.add_column(no_wrap=True)
        keys.add_column(ratio=1)
        for key, label, text in self.rows:
            keys.add_row(key, label, text)
        with Vertical(classes="dialog -wide -help"):
            yield Static("tilewright — keys", classes="dialog-title")
            with VerticalScroll(classes="dialog-body", id="help-body"):
                yield Static(keys)
                if self.extra:
                    yield Static("\n" + self.extra, markup=False)
            closing = spoken([key_name(k) for k in dict.fromkeys(self.close_keys)
                              if k != "q"])
            yield Static(f"↑/↓ PgUp/PgDn scroll · {closing} closes · {self.palette_keys} "
                         "opens the command palette", classes="dialog-hint", markup=False)

    def on_mount(self) -> None:
        # The text scrolls from the keyboard at once (at 80x24 it is longer than the
        # screen): the scroll area has the focus.
        self.query_one("#help-body", VerticalScroll).focus()
