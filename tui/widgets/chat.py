"""The Chat pane: the conversation with the agent.

Agent replies stream in as Markdown. Text deltas arrive far faster than a screen can
redraw, so they are buffered and flushed on a short timer (one redraw per tick whatever
the token rate). A reply is a few Rich Markdown pieces of whole blocks plus the open
block being written (``Reply``): a flush re-renders only that open block. (Textual's
``Markdown`` widget mounts a child widget per block, and at 100+ tokens/s that stream
of mounts starved the keyboard.) Tool calls are collapsible entries updated in place;
the input line at the bottom sends a message to the agent.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.geometry import Size
from textual.message import Message
from textual.reactive import Reactive
from textual.widget import Widget
from textual.widgets import Collapsible, Input, Static

from tilewright.tui.markdown_stream import MarkdownPiece, above, block_starts

FLUSH_INTERVAL_S = 0.1
KEY_QUIET_S = 0.05  # a flush waits this long after a key event (the key's frame first)
MAX_WAIT_S = 0.3  # but never holds streamed text back longer than this
GROW_INTERVAL_S = 0.25  # a streaming reply gains lines (a relayout) at most this often
MAX_ENTRIES = 300
PIECE_CHARS = 2000  # a reply is drawn in pieces of about this many characters


class _Text(Static):
    """A piece of a reply. Its size comes from the layout pass that placed it, so a
    change of its virtual size needs no second layout pass (Textual's default)."""

    virtual_size = Reactive(Size(0, 0), layout=False)


class ChatLog(VerticalScroll):
    """The scrolling list of entries. The vertical scrollbar is always shown, so a
    change of the content's height never changes the width, and needs no second
    layout pass after the one that measured it."""

    DEFAULT_CSS = "ChatLog { overflow-y: scroll; }"
    virtual_size = Reactive(Size(0, 0), layout=False)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        # Entries that came before the log was in the DOM (a session's first events can
        # reach the screen while it is still being built): mounted when it is.
        self.early: list[Widget] = []

    def on_mount(self) -> None:
        early, self.early = self.early, []
        if early:
            self.mount_all(early)


@dataclass
class _Piece:
    widget: _Text
    text: str  # whole blocks; never re-rendered once the piece is full
    above: str  # what is drawn above it (see MarkdownPiece)


class Reply(Vertical):
    """One agent reply, drawn as Markdown pieces (see ``tui.markdown_stream``).

    Complete blocks go into pieces that are parsed and wrapped once; while the reply
    streams, only its open last block (``live``) is re-rendered on each flush, so a
    flush costs the same at the end of a long reply as at its start, and the whole
    reply stays on screen as it grows.
    """

    DEFAULT_CSS = """
    Reply { height: auto; }
    Reply > _Text { height: auto; }
    """
    virtual_size = Reactive(Size(0, 0), layout=False)  # as for _Text

    def __init__(self, text: str = "") -> None:
        super().__init__(classes="reply")
        self.text = ""  # what is drawn
        self.pending: list[str] = []  # streamed, not drawn yet
        self.final: str | None = None  # the complete reply, once it is known
        self._pieces: list[_Piece] = []
        self._settled = 0  # characters of ``text`` in pieces
        self._live = _Text("", classes="live")
        self._live_height: int | None = None  # as laid out
        self._grown_at = float("-inf")  # when the live block last grew (a relayout)
        self._ready = False  # mounted: pieces can be mounted beside the live block
        if text:
            self.final = text

    def compose(self) -> ComposeResult:
        if self.final is not None:  # a whole reply (from the log): its pieces, once
            self.text, self.final = self.final, None
            yield from self._settle(len(self.text))
        else:  # a reply that will stream in
            yield self._live

    def on_mount(self) -> None:
        self._ready = True
        self.draw()

    def draw(self) -> bool:
        """Apply what streamed (or the final text); False when nothing changed."""
        if not self._ready:
            return False  # drawn once mounted
        if self.final is not None:
            final, self.final, self.pending = self.final, None, []
            if not final.startswith(self.text):
                self._reset()
            self.text = final
            self._mount_pieces(self._settle(len(final)))
            self._show_live("")
            return True
        if not self.pending:
            return False
        self.text += "".join(self.pending)
        self.pending.clear()
        starts = block_starts(self.text, self._settled)
        if starts:
            self._mount_pieces(self._settle(starts[-1]))
        self._show_live(self.text[self._settled:])
        return True

    def _reset(self) -> None:
        for piece in self._pieces:
            piece.widget.remove()
        self._pieces.clear()
        self._settled = 0
        self.text = ""

    def _mount_pieces(self, widgets: list[_Text]) -> None:
        if widgets:
            self.mount(*widgets, before=self._live)

    def _settle(self, end: int) -> list[_Text]:
        """Put ``text[settled:end]`` (whole blocks) into pieces; returns the widgets of
        new pieces, for the caller to mount."""
        new: list[_Text] = []
        cuts = [*block_starts(self.text[:end], self._settled), end]
        begin = self._settled
        while begin < end:
            last = self._pieces[-1] if self._pieces else None
            if last is not None and len(last.text) < PIECE_CHARS:
                piece = last  # room left in the last piece: it takes more blocks
            else:
                piece = _Piece(_Text(), "", above(self.text, begin))
                self._pieces.append(piece)
                new.append(piece.widget)
            stop = next((c for c in cuts
                         if c > begin and len(piece.text) + c - begin >= PIECE_CHARS), end)
            piece.text += self.text[begin:stop]
            piece.widget.update(MarkdownPiece(piece.text, piece.above))
            begin = stop
        self._settled = max(self._settled, end)
        return new

    def _show_live(self, text: str) -> None:
        # A relayout reflows the screen (~10 ms here, and a keypress that lands
        # behind it waits). A delta that fills the last line is a repaint of the live
        # block; one that adds lines relayouts at most every GROW_INTERVAL_S, and
        # until then the new lines wait below the block's current edge.
        if not text.strip():
            if self._live_height != 0:
                self._live.update("")
                self._live.display = False
                self._live_height = 0
            return
        rendered = MarkdownPiece(text, above(self.text, self._settled))
        width = self.content_size.width
        height = None
        if width > 0:
            app = self.app
            options = app.console_options.update_width(width).update(highlight=False)
            height = rendered.height(app.console, options)
        now = time.monotonic()
        layout = height is None or height != self._live_height
        if layout and self._live_height and now - self._grown_at < GROW_INTERVAL_S:
            layout = False  # grows at the next flush after the interval
        else:
            self._live_height = height
        if layout:
            self._grown_at = now
        self._live.display = True
        self._live.update(rendered, layout=layout)


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

    @dataclass
    class Submitted(Message):
        """The person sent ``text`` from the chat's input."""

        text: str

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "Chat"
        self._stream: Reply | None = None  # the reply being streamed now
        self._stream_label: Static | None = None  # its label, updated when it ends
        self._replies: list[Reply] = []  # replies with text not yet drawn
        self._tools: dict[str, Collapsible] = {}
        # Each entry's body, held here: a proposal can fill in a call before the
        # Collapsible has composed its children (query_one would find nothing yet).
        self._tool_bodies: dict[str, Static] = {}
        # Tool calls still streaming: their name and raw arguments so far, and which
        # of them grew since the last tick (drawn by ``flush``, like reply text).
        self._tool_streams: dict[str, tuple[str, list[str]]] = {}
        self._tool_dirty: set[str] = set()
        self._tool_count = 0
        self._flushed_at = float("-inf")

    def compose(self) -> ComposeResult:
        yield ChatLog(id="log")
        yield Input(placeholder="message the agent (Enter sends)", id="chat-input")

    def on_mount(self) -> None:
        self.set_interval(FLUSH_INTERVAL_S, self.flush)
        # Anchored: layout itself keeps the newest entry in view. A deferred scroll_end
        # alone raced with replies whose height is only known at the next layout, so the
        # last entry was sometimes left below the fold.
        self.entries.anchor()

    @property
    def entries(self) -> ChatLog:
        return self.query_one("#log", ChatLog)

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
            if self._stream_label is not None:  # the reply's kind is known now (an answer)
                self._stream_label.update(label)
                self._stream_label = None
            return
        self._mount(Static(label, classes="agent-label", markup=False))
        self._mount(Reply(text))

    def stream_delta(self, text: str, label: str = "agent") -> None:
        if self._stream is None:
            self._stream_label = Static(label, classes="agent-label", markup=False)
            self._mount(self._stream_label)
            self._stream = Reply()
            self._replies.append(self._stream)
            self._mount(self._stream)
        self._stream.pending.append(text)

    def end_stream(self) -> None:
        """A reply ended without a final message (cancelled, failed): keep what came."""
        self._stream = self._stream_label = None

    def transcript(self) -> str:
        """The text of every reply so far (what a reader sees, for tests and copying)."""
        return "\n\n".join(r.final if r.final is not None else r.text + "".join(r.pending)
                             for r in self.query(Reply))

    def tool_call(self, key: str, name: str, detail: dict[str, Any] | str,
                  status: str = "") -> None:
        body = detail if isinstance(detail, str) else json.dumps(detail, indent=2)[:4000]
        title = f"tool: {name}" + (f" ({status})" if status else "")
        if status != "streaming":  # the whole call (or its result): streaming is over
            self._tool_streams.pop(key, None)
            self._tool_dirty.discard(key)
        if key in self._tools:
            entry = self._tools[key]
            entry.title = title
            self._tool_bodies[key].update(body)
            return
        self._tool_count += 1
        static = Static(body, markup=False)
        entry = Collapsible(static, title=title, collapsed=True)
        self._tools[key] = entry
        self._tool_bodies[key] = static
        self._mount(entry)

    def tool_stream(self, key: str, name: str, piece: str) -> None:
        """A tool call as it streams in: its entry appears with the first piece and
        shows the arguments so far; ``tool_call`` with the same key fills it in."""
        if key not in self._tool_streams:
            self._tool_streams[key] = (name, [])
            if key not in self._tools:
                self.tool_call(key, name, "", "streaming")
        known, pieces = self._tool_streams[key]
        if name and name != known:
            self._tool_streams[key] = (name, pieces)
        if piece:
            pieces.append(piece)
        self._tool_dirty.add(key)

    def _draw_tool_streams(self) -> None:
        for key in self._tool_dirty:
            if key not in self._tool_streams or key not in self._tools:
                continue
            name, pieces = self._tool_streams[key]
            raw = "".join(pieces)
            self._tools[key].title = f"tool: {name} (streaming · {len(raw)} chars)"
            self._tool_bodies[key].update(raw if len(raw) <= 4000 else raw[:4000] + " …")
        self._tool_dirty.clear()

    def clear(self) -> None:
        self._tool_streams.clear()
        self._tool_dirty.clear()
        self._stream = self._stream_label = None
        self._replies.clear()
        self._tools.clear()
        self._tool_bodies.clear()
        self.entries.remove_children()

    # -- internals --------------------------------------------------------------------
    def _mount(self, widget) -> None:
        log = self.entries
        if not log.is_attached:  # not in the DOM yet: it mounts these when it is
            log.early.append(widget)
            return
        log.mount(widget)
        extra = len(log.children) - MAX_ENTRIES
        if extra > 0:
            for old in list(log.children)[:extra]:
                old.remove()
        self._scroll()

    def _scroll(self) -> None:
        self.entries.scroll_end(animate=False, immediate=False)

    def flush(self) -> None:
        """Draw what streamed since the last tick: one update per reply.

        Keys come first: a tick within ``KEY_QUIET_S`` of a key event passes (the
        text is drawn at the next tick), so the frame that answers the key does not
        also carry a relayout of the growing reply.
        """
        now = time.monotonic()
        last_key = getattr(self.app, "last_key_at", float("-inf"))
        if now - last_key < KEY_QUIET_S and now - self._flushed_at < MAX_WAIT_S:
            return
        self._flushed_at = now
        changed = bool(self._tool_dirty)
        self._draw_tool_streams()
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
