"""The Chat pane: the conversation with the agent.

Agent replies stream in as Markdown. Text deltas arrive far faster than a screen can
redraw, so they are buffered and flushed on a short timer (one redraw per tick whatever
the token rate). Each reply is one widget holding a Rich Markdown renderable: a
textual ``Markdown`` widget mounts a child widget per block, and at 100+ tokens/s that
stream of mounts (CSS, layout) starves the keyboard. Tool calls are collapsible entries
updated in place; the input line at the bottom sends a message to the agent.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Collapsible, Input, Static

FLUSH_INTERVAL_S = 0.1
MAX_ENTRIES = 300


STREAM_TAIL_CHARS = 1500  # while streaming, redraw only the tail (a pane shows less)


def RichMarkdown(text: str):
    from rich.markdown import Markdown

    return Markdown(text)


class RenderedMarkdown:
    """Rich Markdown that is rendered once per width and then replayed.

    Textual renders a widget's content twice per change (once to measure its height
    for layout, once to paint); Markdown parsing and wrapping is the costly part, so
    the segments of the last width are kept.
    """

    def __init__(self, text: str) -> None:
        self.markdown = RichMarkdown(text)
        self._width: int | None = None
        self._segments: list[Segment] = []

    def segments(self, console: Console, options: ConsoleOptions) -> list[Segment]:
        if options.max_width != self._width:
            self._segments = list(console.render(self.markdown, options))
            self._width = options.max_width
        return self._segments

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        return self.segments(console, options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.markdown)


class Reply(Static):
    """One agent reply: Markdown text drawn by Rich, appended to while it streams."""

    def __init__(self, text: str = "") -> None:
        super().__init__("", classes="reply")
        self.text = text
        self.pending: list[str] = []
        self.final: str | None = None
        self._lines: int | None = None  # height of what is shown, when known
        if text:
            self.update(RichMarkdown(text))

    def draw(self) -> bool:
        """Apply what streamed (or the final text); False when nothing changed."""
        if self.final is not None:
            self.text, self.final, self.pending = self.final, None, []
            self._show(self.text)
            return True
        if not self.pending:
            return False
        self.text += "".join(self.pending)
        self.pending.clear()
        shown = self.text if len(self.text) <= STREAM_TAIL_CHARS \
            else "…" + self.text[-STREAM_TAIL_CHARS:]
        self._show(shown)
        return True

    def _show(self, text: str) -> None:
        # A relayout reflows the whole screen (tens of ms); a streamed delta often
        # fills the last line without adding one, and then a repaint is enough.
        rendered = RenderedMarkdown(text)
        width = self.content_size.width
        layout = True
        if width > 0:
            app = self.app
            options = app.console_options.update_width(width).update(highlight=False)
            lines = sum(seg.text.count("\n") for seg in rendered.segments(app.console, options))
            layout = lines != self._lines
            self._lines = lines
        self.update(rendered, layout=layout)


class ChatPane(Vertical):
    ALLOW_MAXIMIZE = True  # F7 zooms a whole pane
    DEFAULT_CSS = """
    ChatPane #log { height: 1fr; scrollbar-size-vertical: 1; }
    ChatPane .user { color: $text; background: $boost; padding: 0 1; margin: 1 0 0 0; }
    ChatPane .agent-label { color: $accent; text-style: bold; margin: 1 0 0 0; }
    ChatPane .reply { margin: 0; padding: 0 1; }
    ChatPane .notice { color: $text-muted; padding: 0 1; }
    ChatPane .notice.-warning { color: $warning; }
    ChatPane .notice.-error { color: $error; }
    ChatPane Collapsible { margin: 0; padding: 0; border: none; background: transparent; }
    ChatPane Collapsible Static { padding: 0 2; color: $text-muted; }
    ChatPane Input { dock: bottom; }
    """

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "Chat"
        self._stream: Reply | None = None  # the reply being streamed now
        self._replies: list[Reply] = []  # replies with text not yet drawn
        self._tools: dict[str, Collapsible] = {}
        self._tool_count = 0

    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="log")
        yield Input(placeholder="message the agent (Enter sends)", id="chat-input")

    def on_mount(self) -> None:
        self.set_interval(FLUSH_INTERVAL_S, self.flush)
        # Anchored: layout itself keeps the newest entry in view. A deferred scroll_end
        # alone raced with replies whose height is only known at the next layout, so the
        # last entry was sometimes left below the fold.
        self.entries.anchor()

    @property
    def entries(self) -> VerticalScroll:
        return self.query_one("#log", VerticalScroll)

    def set_agent_label(self, label: str) -> None:
        self.border_title = f"Chat · {label}"

    # -- entries ----------------------------------------------------------------------
    def add_user(self, text: str) -> None:
        self._mount(Static(f"you: {text}", classes="user", markup=False))

    def add_notice(self, text: str, level: str = "info") -> None:
        self._mount(Static(text, classes=f"notice -{level}", markup=False))

    def add_agent(self, text: str, label: str = "agent") -> None:
        """A complete agent message (from the log); it replaces the streamed text."""
        if self._stream is not None:
            self._stream.final = text
            self._stream = None
            return
        self._mount(Static(label, classes="agent-label", markup=False))
        self._mount(Reply(text))

    def stream_delta(self, text: str, label: str = "agent") -> None:
        if self._stream is None:
            self._mount(Static(label, classes="agent-label", markup=False))
            self._stream = Reply()
            self._replies.append(self._stream)
            self._mount(self._stream)
        self._stream.pending.append(text)

    def end_stream(self) -> None:
        """A reply ended without a final message (cancelled, failed): keep what came."""
        self._stream = None

    def transcript(self) -> str:
        """The text of every reply so far (what a reader sees, for tests and copying)."""
        return "\n\n".join(r.text + "".join(r.pending) for r in self.query(Reply))

    def tool_call(self, key: str, name: str, detail: dict[str, Any] | str,
                  status: str = "") -> None:
        body = detail if isinstance(detail, str) else json.dumps(detail, indent=2)[:4000]
        title = f"tool: {name}" + (f" ({status})" if status else "")
        if key in self._tools:
            entry = self._tools[key]
            entry.title = title
            entry.query_one(Static).update(body)
            return
        self._tool_count += 1
        entry = Collapsible(Static(body, markup=False), title=title, collapsed=True)
        self._tools[key] = entry
        self._mount(entry)

    def clear(self) -> None:
        self._stream = None
        self._replies.clear()
        self._tools.clear()
        self.entries.remove_children()

    # -- internals --------------------------------------------------------------------
    def _mount(self, widget) -> None:
        log = self.entries
        log.mount(widget)
        extra = len(log.children) - MAX_ENTRIES
        if extra > 0:
            for old in list(log.children)[:extra]:
                old.remove()
        self._scroll()

    def _scroll(self) -> None:
        self.entries.scroll_end(animate=False, immediate=False)

    def flush(self) -> None:
        """Draw what streamed since the last tick: one update per reply."""
        changed = False
        for reply in list(self._replies):
            changed |= reply.draw()
            if reply is not self._stream and reply.final is None and not reply.pending:
                self._replies.remove(reply)
        if changed:
            self._scroll()

    @on(Input.Submitted, "#chat-input")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if text:
            event.input.value = ""
            self.post_message(self.Submitted(text))
