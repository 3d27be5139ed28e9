"""The Source pane: the current kernel version in a code editor, or a pending proposal.

While a proposal is pending the editor is read-only and the pane shows the proposal as
a highlighted diff against the current version (``toggle_view`` shows the full
proposed source instead). ``begin_edit`` loads the proposal into the editor so the
person can change it before it runs; Esc leaves the editor again, recording nothing
(``LeaveRequested`` asks the screen, which confirms when there are changes to drop).
"""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import ContentSwitcher, TextArea

from tilewright.tui.widgets.diffview import DiffView


class Editor(TextArea):
    """The code editor. A focus change restyles a ``TextArea``, and ``TextArea`` then
    drops every rendered line; moving focus to or from the Source pane re-highlighted
    the whole visible source (the slowest F6 on the workbench). Here the rendered lines
    are kept when the styles they are drawn with did not change: what focus changes
    on its own is the cursor, which ``TextArea``'s line cache already keys on."""

    _drawn_with: tuple | None = None

    def notify_style_update(self) -> None:
        try:
            drawn_with: tuple | None = (self.rich_style, self.theme, *(
                self.get_component_rich_style(name, partial=True)
                for name in sorted(self.COMPONENT_CLASSES)))
        except KeyError:  # component styles not resolved yet (while mounting)
            drawn_with = None
        if drawn_with is None or drawn_with != self._drawn_with:
            self._drawn_with = drawn_with
            super().notify_style_update()  # TextArea's: clears its rendered lines
        else:
            super(TextArea, self).notify_style_update()  # the rest, lines kept

    async def _on_key(self, event: events.Key) -> None:
        # Esc leaves an edit (the pane decides); elsewhere it keeps TextArea's meaning
        # (the focus moves on, out of the editor's hold on Tab).
        if event.key == "escape":
            pane = next((a for a in self.ancestors if isinstance(a, SourcePane)), None)
            if pane is not None and pane.in_edit():
                event.stop()
                event.prevent_default()
                pane.post_message(SourcePane.LeaveRequested())
                return
        await super()._on_key(event)


class SourcePane(Vertical):
    ALLOW_MAXIMIZE = True  # F7 zooms a whole pane

    class LeaveRequested(Message):
        """Esc in an edit: the screen leaves it (after a confirmation if it changed)."""
    DEFAULT_CSS = """
    SourcePane ContentSwitcher { height: 1fr; }
    SourcePane TextArea, SourcePane TextArea:focus { height: 1fr; border: none; padding: 0; }
    """

    def __init__(self, filename: str = "kernel.py", **kwargs) -> None:
        super().__init__(**kwargs)
        self.filename = filename
        self.version: int | None = None
        self.current_source = ""
        self.proposal: str | None = None  # id of the pending kernel proposal
        self.proposal_base: int | None = None  # the version it applies to, when not shown
        self.base_source: str | None = None  # that version's source (the diff's left side)
        self.proposed_source: str | None = None
        self.editing = False
        self.shown = "editor"

    def compose(self) -> ComposeResult:
        with ContentSwitcher(initial="editor"):
            yield Editor.code_editor("", language="python", id="editor", soft_wrap=False)
            yield DiffView(id="diff")

    def on_mount(self) -> None:
        self._retitle()

    @property
    def editor(self) -> TextArea:
        return self.query_one("#editor", TextArea)

    # -- what the screen calls -------------------------------------------------------
    def show_version(self, version: int | None, source: str) -> None:
        """Show a kernel version; keeps an in-progress user edit of the same version."""
        if self.editing and self.proposal is None and version == self.version:
            return
        self.version, self.current_source = version, source
        if self.proposal is None:
            self.editing = False
            self._load_editor(source, read_only=False)
            self._switch("editor")
        self._retitle()

    def show_proposal(self, proposal: str, source: str, base: int | None = None,
                      base_source: str | None = None) -> None:
        """A pending proposal, drawn as a diff against the version it applies to
        (``base``, when it is not the shown one: the best version a tuning starts from)."""
        if self.proposal == proposal:
            return
        self.proposal, self.proposed_source, self.editing = proposal, source, False
        self.proposal_base = base if base is not None and base != self.version else None
        self.base_source = base_source if self.proposal_base is not None else None
        self.query_one(DiffView).show(self._diff_base(), source)
        self._load_editor(source, read_only=True)
        self._switch("diff")
        self._retitle()

    def clear_proposal(self) -> None:
        if self.proposal is None:
            return
        self.proposal = self.proposed_source = None
        self.proposal_base = self.base_source = None
        self.editing = False
        self._load_editor(self.current_source, read_only=False)
        self._switch("editor")
        self._retitle()

    def toggle_view(self) -> None:
        """Between the diff and the full proposed source (only with a proposal)."""
        if self.proposal is not None and not self.editing:
            self._switch("editor" if self.shown == "diff" else "diff")
            self._retitle()

    def begin_edit(self) -> None:
        """Make the proposal (or the current version) editable in place."""
        self.editing = True
        self.editor.read_only = False
        self._switch("editor")
        if self.proposal is not None and self.proposed_source is not None:
            first = self.query_one(DiffView).first_change_line(self._diff_base(),
                                                               self.proposed_source)
            if first:  # start where the proposal changes the code
                self.editor.move_cursor((first - 1, 0), center=True)
        self.editor.focus()
        self._retitle()

    def in_edit(self) -> bool:
        """An edit is open: the edit key opened one, or the current version's text was
        typed over (its editor is always writable)."""
        return self.editing or (self.proposal is None and self.is_modified())

    def end_edit(self) -> None:
        """Leave the edit: the proposal (read-only, as a diff) or the current version
        comes back as it was. Nothing is recorded."""
        self.editing = False
        if self.proposal is not None and self.proposed_source is not None:
            self.query_one(DiffView).show(self.current_source, self.proposed_source)
            self._load_editor(self.proposed_source, read_only=True)
            self._switch("diff")
        else:
            self._load_editor(self.current_source, read_only=False)
            self._switch("editor")
        self._retitle()

    def load_draft(self, text: str) -> None:
        """Open an edit of the current version holding ``text`` (a kept draft)."""
        self.begin_edit()
        self.editor.load_text(text)
        self._retitle()

    def edited_source(self) -> str:
        return self.editor.text

    def is_modified(self) -> bool:
        base = self.proposed_source if self.proposal is not None else self.current_source
        return self.editor.text != base

    def goto_line(self, line: int) -> None:
        self._switch("editor")
        row = max(0, min(line - 1, self.editor.document.line_count - 1))
        self.editor.move_cursor((row, 0), center=True)
        self.editor.focus()
        self._retitle()

    # -- internals --------------------------------------------------------------------
    def _diff_base(self) -> str:
        return self.base_source if self.base_source is not None else self.current_source

    def _load_editor(self, source: str, read_only: bool) -> None:
        editor = self.editor
        editor.load_text(source)
        editor.read_only = read_only

    def _switch(self, view: str) -> None:
        self.shown = view
        self.query_one(ContentSwitcher).current = view

    def _retitle(self) -> None:
        version = f"v{self.version}" if self.version is not None else "no version yet"
        title = f"Source · {self.filename} ({version}"
        if self.proposal is not None:
            if self.editing:
                title += f", editing proposal {self.proposal}"
            else:
                shown = "diff" if self.shown == "diff" else "full source"
                on = f" on v{self.proposal_base}" if self.proposal_base is not None else ""
                title += f", proposal {self.proposal}{on} pending: {shown}"
        elif self.editing:
            title += ", edited"
        self.border_title = title + ")"
