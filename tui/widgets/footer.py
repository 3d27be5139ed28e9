"""A key footer that switches between ready-made rows instead of rebuilding one.

Textual's ``Footer`` recomposes (unmounts and mounts a widget per key, restyles each,
relayouts the whole screen) on every bindings signal, and every focus move sends one.
The profile of F6 through the panes showed every layout pass of an idle workbench
coming from that rebuild. ``SteadyFooter`` keeps one composed ``Footer`` per set of
shown keys (the panes have a handful) and shows the one that matches: a focus move
that keeps the keys costs nothing, one that changes them flips ``display`` on two
rows (one layout pass, no mounting or restyling of a dozen new widgets).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

MAX_ROWS = 8  # distinct key sets kept composed (panes x approval states)


class _FrozenFooter(Footer):
    """A ``Footer`` composed once, for the bindings active when it mounts."""

    def __init__(self) -> None:
        super().__init__()
        self.set_reactive(Footer._bindings_ready, True)

    def bindings_changed(self, screen: Screen) -> None:
        pass  # SteadyFooter picks the row that matches


class SteadyFooter(Widget):
    """The workbench footer: one ready ``Footer`` row per distinct set of keys."""

    DEFAULT_CSS = """
    SteadyFooter { dock: bottom; height: 1; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._rows: dict[tuple, _FrozenFooter] = {}  # least recently shown first
        self._shown: tuple | None = None

    def compose(self) -> ComposeResult:
        return []

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _signature(self) -> tuple:
        """Everything ``Footer.compose`` reads, in a comparable form."""
        app = self.app
        active = self.screen.active_bindings
        keys = tuple(
            (binding.key, app.get_key_display(binding), binding.description,
             binding.action, enabled, tooltip, binding.tooltip,
             (binding.group.description, binding.group.compact) if binding.group else None)
            for (_, binding, enabled, tooltip) in active.values() if binding.show)
        palette = active.get(app.COMMAND_PALETTE_BINDING)
        palette_key = None if palette is None else \
            (palette[1].key, app.get_key_display(palette[1]), palette[1].description,
             palette[2], palette[1].tooltip)
        return (keys, palette_key, app.ENABLE_COMMAND_PALETTE)

    def _bindings_changed(self, screen: Screen) -> None:
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen:
            self.call_after_refresh(self._update)

    async def _update(self) -> None:
        if not self.is_attached:
            return
        signature = self._signature()
        if signature == self._shown:
            return
        row = self._rows.pop(signature, None)
        if row is None:
            row = _FrozenFooter()
            await self.mount(row)
        self._rows[signature] = row  # now the most recently shown
        for other in self._rows.values():
            other.display = other is row
        self._shown = signature
        while len(self._rows) > MAX_ROWS:
            oldest = next(iter(self._rows))
            await self._rows.pop(oldest).remove()
