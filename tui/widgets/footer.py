"""A key footer that rebuilds only when the keys it shows change.

Textual's ``Footer`` recomposes (unmounts and mounts a widget per key, restyles them,
relayouts the whole screen) on every bindings signal, and every focus move sends one.
The profile of F6 through the panes showed every layout pass of an idle workbench
coming from that rebuild; most moves (Source, Chat, Problems) keep the same keys on
screen, so here the rebuild is skipped when the footer would come out the same.
"""

from __future__ import annotations

from typing import Any

from textual.screen import Screen
from textual.widgets import Footer


class SteadyFooter(Footer):
    """``Footer`` that skips the rebuild when the shown keys are unchanged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shown: tuple | None = None

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
        return (keys, palette_key, self.show_command_palette, app.ENABLE_COMMAND_PALETTE,
                self.compact)

    def bindings_changed(self, screen: Screen) -> None:
        self._bindings_ready = True
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen:
            self.call_after_refresh(self._recompose_if_changed)

    async def _recompose_if_changed(self) -> None:
        if not self.is_attached:
            return
        signature = self._signature()
        if signature == self._shown:
            return
        self._shown = signature
        await self.recompose()
