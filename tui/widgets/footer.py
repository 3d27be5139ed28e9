"""A key footer drawn as one line of text and repainted in place.

Textual's ``Footer`` recomposes (unmounts and mounts a widget per key, restyles each,
relayouts the whole screen) on every bindings signal, and every focus move sends one.
Profiles of F6 through the panes showed every layout pass of an idle workbench coming
from the footer: first from that rebuild, then, with a composed row kept per key set,
from flipping ``display`` between rows. ``KeyFooter`` is one widget of fixed size that
renders the active keys itself: a focus move that keeps the keys costs nothing, one
that changes them repaints one line, and neither relayouts the screen.

It looks like Textual's footer (the same theme variables: bold key, description,
command palette key on the right, disabled keys dimmed), shortens itself to fit
narrow terminals (first the padding, then short labels, then the keys least needed at
a glance; a key never shows without its label), and a click on a key presses it.
"""

from __future__ import annotations

from typing import NamedTuple

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual import events
from textual.screen import Screen
from textual.widget import Widget


class FooterItem(NamedTuple):
    key: str  # the binding's key, pressed when the item is clicked
    display: str  # how the key is shown ("^q", "F6")
    description: str
    enabled: bool
    palette: bool = False  # the command palette key, drawn at the right edge


class KeyFooter(Widget):
    """The workbench footer: the keys of the focused context on one line."""

    ALLOW_SELECT = False
    COMPONENT_CLASSES = {"key-footer--key", "key-footer--description"}
    DEFAULT_CSS = """
    KeyFooter {
        dock: bottom;
        height: 1;
        width: 1fr;
        color: $footer-foreground;
        background: $footer-background;
        .key-footer--key {
            color: $footer-key-foreground;
            background: $footer-key-background;
            text-style: bold;
        }
        .key-footer--description {
            color: $footer-description-foreground;
            background: $footer-description-background;
        }
    }
    """

    def __init__(self) -> None:
        super().__init__()
        self._items: tuple[FooterItem, ...] = ()
        self._spans: list[tuple[int, int, FooterItem]] = []  # x ranges drawn last

    @property
    def items(self) -> tuple[FooterItem, ...]:
        return self._items

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self._bindings_changed(self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen) -> None:
        if not self.is_attached or screen is not self.screen:
            return
        items = self._collect()
        if items != self._items:
            self._items = items
            self.refresh()  # same size: a repaint of this line, no layout

    def _collect(self) -> tuple[FooterItem, ...]:
        app = self.app
        active = self.screen.active_bindings
        items: list[FooterItem] = []
        seen_actions: set[str] = set()
        for _node, binding, enabled, _tooltip in active.values():
            if not binding.show or binding.action in seen_actions:
                continue  # one entry per action, as Textual's footer shows it
            seen_actions.add(binding.action)
            items.append(FooterItem(binding.key, app.get_key_display(binding),
                                    binding.description, bool(enabled)))
        palette = active.get(app.COMMAND_PALETTE_BINDING) if app.ENABLE_COMMAND_PALETTE \
            else None
        if palette is not None:
            _node, binding, enabled, _tooltip = palette
            items = [i for i in items if i.key != binding.key]
            items.append(FooterItem(binding.key, app.get_key_display(binding),
                                    binding.description, bool(enabled), palette=True))
        return tuple(items)

    def render(self) -> Text:
        width = self.size.width
        styles = {
            True: self.get_component_rich_style("key-footer--key"),
            False: self.get_component_rich_style("key-footer--description"),
        }
        dim = Style(dim=True)
        keys = [i for i in self._items if not i.palette]
        palette = next((i for i in self._items if i.palette), None)
        palette_parts = [("▏", False), *_item_cells(palette, padded=True)] if palette else []
        if palette is not None and width < 100:
            palette = palette._replace(description=short_label(palette.description))
            palette_parts = [("▏", False), *_item_cells(palette, padded=False)]
        room = width - _cells_width(palette_parts)
        line = Text(no_wrap=True, overflow="crop", end="")
        self._spans = []
        x = 0

        def draw(item: FooterItem, parts: list[tuple[str, bool]], first: int = 0) -> None:
            nonlocal x
            start = x
            for index, (part, is_key) in enumerate(parts):
                style = styles[is_key]
                if not item.enabled or index < first:  # disabled key, or the separator
                    style += dim
                line.append(part, style)
                x += cell_len(part)
            self._spans.append((start, x, item))

        for item, parts in _fit(keys, room):
            draw(item, parts)
        if palette is not None and room >= 0:
            line.append(" " * (room - x))
            x = room
            draw(palette, palette_parts, first=1)
        return line

    def on_mouse_down(self, event: events.MouseDown) -> None:
        for start, end, item in self._spans:
            if start <= event.x < end:
                if item.enabled:
                    self.app.simulate_key(item.key)
                else:
                    self.app.bell()
                return


def _item_cells(item: FooterItem, padded: bool) -> list[tuple[str, bool]]:
    """The pieces of one key: ``[(text, is_key), ...]``."""
    if padded:
        parts = [(f" {item.display} ", True)]
        if item.description:
            parts.append((f"{item.description} ", False))
        return parts
    parts = [(item.display, True)]
    if item.description:
        parts.append((f" {item.description}", False))
    parts.append((" ", False))
    return parts


def _cells_width(parts: list[tuple[str, bool]]) -> int:
    return sum(cell_len(text) for text, _ in parts)


# Short labels for narrow terminals: a key is never shown without a word for what it
# does. Keys missing here keep their first word, at most 6 letters.
SHORT_LABELS = {"Approve": "yes", "Reject": "no", "Edit": "edit", "Diff": "diff",
                "Run": "run", "Profile": "prof", "Auto": "auto", "Cancel": "stop",
                "Pane": "pane", "Prev pane": "prev", "Zoom": "zoom", "Chat": "chat",
                "Help": "help", "Quit": "quit", "Diff vs current": "diff",
                "Revert": "revert", "Export": "export", "palette": "cmds",
                "Prune branch": "prune", "Next pending": "next"}
# Which keys give way first when even the short labels do not fit (the rest keep
# their order). Help and quit stay: everything dropped is in F1 help and the palette.
DROP_FIRST = ("Prev pane", "Zoom", "Pane", "Diff", "Chat", "Cancel", "Profile", "Edit",
              "Auto", "Run")


def short_label(description: str) -> str:
    if description in SHORT_LABELS:
        return SHORT_LABELS[description]
    word = description.split()[0] if description else ""
    return word[:6].lower()


def _fit(items: list[FooterItem], room: int) -> list[tuple[FooterItem, list]]:
    """Lay the keys out in ``room`` cells: padded if they fit, else compact, then with
    short labels ("^y yes"), then without the keys least needed at a glance (they are
    in F1 help and the palette). A key is never drawn without its label."""
    for padded in (True, False):
        laid = [(item, _item_cells(item, padded)) for item in items]
        if sum(_cells_width(p) for _, p in laid) <= room:
            return laid
    short = [item._replace(description=short_label(item.description)) for item in items]
    kept = list(range(len(short)))
    order = sorted(range(len(short)), key=lambda i: (
        DROP_FIRST.index(items[i].description) if items[i].description in DROP_FIRST
        else len(DROP_FIRST) + (len(items) - i)))
    for drop in [None, *order]:
        if drop is not None:
            kept.remove(drop)
        laid = [(short[i], _item_cells(short[i], False)) for i in kept]
        if sum(_cells_width(p) for _, p in laid) <= room:
            return laid
    return []
