"""The five panes laid out for the terminal at hand.

Wide terminals (>= ``WIDE_COLUMNS``) get a grid: Source and Chat on top, Problems and
History under Source, Profile under Chat. Narrow ones get one pane at a time behind a
tab bar. The same widget instances serve both layouts (switching only changes CSS
classes), so an edit in progress or a streaming reply survives a resize.
"""

from __future__ import annotations

from rich.style import Style
from textual import on
from textual.app import ComposeResult
from textual.color import Color
from textual.containers import Container, Vertical
from textual.geometry import Region
from textual.widget import Widget
from textual.widgets import Tab, Tabs

from tilewright.tui.widgets.chat import ChatPane
from tilewright.tui.widgets.history import HistoryPane
from tilewright.tui.widgets.problems import ProblemsPane
from tilewright.tui.widgets.profile import ProfilePane
from tilewright.tui.widgets.source import SourcePane

WIDE_COLUMNS = 120
ORDER = ("source", "chat", "problems", "profile", "history")
TITLES = {"source": "Source", "chat": "Chat", "problems": "Problems", "profile": "Profile",
          "history": "History"}


class PaneGrid(Vertical):
    DEFAULT_CSS = """
    PaneGrid { height: 1fr; }
    PaneGrid #pane-tabs { display: none; }
    PaneGrid.-narrow #pane-tabs { display: block; }
    PaneGrid #panes { height: 1fr; }
    PaneGrid .pane { border: round $primary 40%; border-title-color: $text-muted;
                     height: 1fr; padding: 0; }
    PaneGrid.-wide #panes { layout: grid; grid-size: 2 4; grid-columns: 3fr 2fr;
                            grid-rows: 1fr 1fr 1fr 1fr; }
    PaneGrid.-wide #source { row-span: 2; }
    PaneGrid.-wide #chat { row-span: 2; }
    PaneGrid.-wide #profile { row-span: 2; }
    PaneGrid DataTable { overflow-x: hidden; }
    PaneGrid.-narrow #panes { layout: vertical; }
    PaneGrid.-narrow .pane { display: none; }
    PaneGrid.-narrow .pane.-active { display: block; }
    """

    def __init__(self, filename: str = "kernel.py", **kwargs) -> None:
        super().__init__(**kwargs)
        self.filename = filename
        self.active = "source"
        self.narrow: bool | None = None
        self._lit: str | None = None

    def compose(self) -> ComposeResult:
        yield Tabs(*(Tab(TITLES[name], id=f"tab-{name}") for name in ORDER), id="pane-tabs")
        with Container(id="panes"):
            # grid placement follows this order (see DEFAULT_CSS)
            yield SourcePane(self.filename, id="source", classes="pane -active")
            yield ChatPane(id="chat", classes="pane")
            yield ProblemsPane(self.filename, id="problems", classes="pane")
            yield ProfilePane(id="profile", classes="pane")
            yield HistoryPane(id="history", classes="pane")

    def on_mount(self) -> None:
        self.set_width(self.app.size.width)

    @property
    def lit_pane(self) -> str | None:
        """The pane whose border shows it has the keyboard."""
        return self._lit

    def on_descendant_focus(self) -> None:
        # Focus can also move by Tab or a click; the pane that holds it lights up.
        self._set_lit(self.focused_pane())

    def _set_lit(self, name: str | None) -> None:
        # Inline styles on the pane alone: a :focus-within rule would re-match CSS for
        # the pane's whole subtree on every focus move, which doubled keypress latency
        # with a long chat.
        if name == self._lit:
            return
        if self._lit is not None:
            self._light(self.pane(self._lit), False)
        if name is not None:
            self._light(self.pane(name), True)
        self._lit = name

    def _light(self, pane: Widget, lit: bool) -> None:
        # The focused pane's top edge and title light up. Set as rules and repainted
        # as one row: the style properties would repaint the pane and every
        # descendant (they are shared with ``color``, which children inherit), and a
        # whole-border change would repaint the pane's every row: a frame of
        # ~20 ms per F6 on 2 cores instead of ~10 (benchmarks/host_speed/tui_latency.py).
        inline = pane.styles.inline
        if lit:
            colours = self.app.theme_variables
            edge = pane.styles.border_top[0] or "round"
            inline.set_rule("border_top", (edge, Color.parse(colours.get("accent", "orange"))))
            inline.set_rule("border_title_color",
                            Color.parse(colours.get("foreground", "#e0e0e0")))
            inline.set_rule("border_title_style", Style(bold=True))
        else:
            for rule in ("border_top", "border_title_color", "border_title_style"):
                inline.clear_rule(rule)
        offset = pane.content_offset  # a region is given relative to the content
        pane.refresh(Region(-offset.x, -offset.y, pane.outer_size.width, 1))

    def on_resize(self) -> None:
        self.set_width(self.app.size.width)

    def set_width(self, columns: int) -> None:
        narrow = columns < WIDE_COLUMNS
        if narrow == self.narrow:
            return
        self.narrow = narrow
        self.set_class(narrow, "-narrow")
        self.set_class(not narrow, "-wide")
        if narrow:
            self._show_tab(self.active)

    # -- which pane -------------------------------------------------------------------
    def pane(self, name: str) -> Widget:
        return self.query_one(f"#{name}")

    def show(self, name: str, focus: bool = True) -> None:
        """Bring a pane forward (narrow: its tab) and optionally focus it."""
        self.active = name
        if self.narrow:  # wide layouts show every pane: no classes to restyle, no tabs
            self._show_tab(name)
        if focus:
            # Lit now, with the focus request: the frame that answers the key shows
            # both (the focus event that would light it arrives a frame later).
            self._set_lit(name)
            if not self._focus_inside(self.pane(name)):
                self._set_lit(self.focused_pane())

    def _show_tab(self, name: str) -> None:
        for other in ORDER:
            self.pane(other).set_class(other == name, "-active")
        tabs = self.query_one(Tabs)
        if tabs.active != f"tab-{name}":
            tabs.active = f"tab-{name}"

    def cycle(self, step: int = 1) -> str:
        name = self.cycle_target(step)
        self.show(name)
        return name

    def cycle_target(self, step: int = 1) -> str:
        """The pane ``cycle(step)`` would focus."""
        current = self.focused_pane() or self.active
        return ORDER[(ORDER.index(current) + step) % len(ORDER)]

    def focused_pane(self) -> str | None:
        focused = self.screen.focused
        while focused is not None:
            if focused.id in ORDER and "pane" in focused.classes:
                return focused.id
            focused = focused.parent  # type: ignore[assignment]
        return None

    def _focus_inside(self, pane: Widget) -> bool:
        """Ask for focus on the pane's main widget; False when it has none to take it."""
        targets = {"source": "#editor", "chat": "#chat-input", "problems": "DataTable",
                   "profile": "Timeline", "history": "DataTable"}
        matches = pane.query(targets.get(pane.id or "", "*"))
        widget = matches.first() if matches else None
        if widget is not None and widget.display and widget.focusable:
            widget.focus()
            return True
        for child in pane.query("*"):  # the diff view stands in for the editor
            if child.focusable and child.display:
                child.focus()
                return True
        return False

    @on(Tabs.TabActivated, "#pane-tabs")
    def _tab(self, event: Tabs.TabActivated) -> None:
        event.stop()
        name = (event.tab.id or "tab-source").removeprefix("tab-")
        if name != self.active:
            self.show(name, focus=self.narrow is True)
