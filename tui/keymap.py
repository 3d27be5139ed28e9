"""Every global action, its default keys, and the user's remapping.

Global actions use ctrl and function keys: a focused editor or input line swallows
letters, and these survive SSH and tmux (no ctrl+a, tmux/screen's prefix; no ctrl+s/q
flow-control surprises beyond textual's own ctrl+q quit). Each binding has an id so a
``[keys]`` table in the config file remaps it: ``approve = "ctrl+y,f9"``.
"""

from __future__ import annotations

from typing import Any

from textual.binding import Binding

from agents.config import Config

# id -> (default keys, action, footer label, description for help and the palette)
ACTIONS: dict[str, tuple[str, str, str, str]] = {
    "approve": ("ctrl+y", "approve", "Approve", "Approve the pending proposal"),
    "reject": ("ctrl+n", "reject", "Reject", "Reject the pending proposal with a note"),
    "edit": ("f2", "edit", "Edit", "Edit the proposal, a plan or the current version; "
             "press again to submit"),
    "toggle_diff": ("f3", "toggle_diff", "Diff", "Show the proposal as a diff or in full"),
    "run": ("ctrl+r", "run", "Run", "Evaluate the current version"),
    "profile": ("ctrl+t", "profile", "Profile", "Profile the current version"),
    "auto": ("ctrl+g", "toggle_auto", "Auto", "Switch between step and autonomous mode"),
    "cancel": ("f8", "cancel", "Cancel", "Cancel the agent reply or the run (press twice)"),
    "next_pane": ("f6", "cycle_pane(1)", "Pane", "Focus the next pane"),
    "prev_pane": ("shift+f6", "cycle_pane(-1)", "Prev pane", "Focus the previous pane"),
    "maximize": ("f7", "maximize", "Zoom", "Maximize or restore the focused pane"),
    "chat": ("f5", "focus_chat", "Chat", "Type a message to the agent"),
    "help": ("f1", "help", "Help", "Show keys and what they do"),
}
# Shown in the footer (the rest are in F1 help and the command palette).
FOOTER = ("approve", "reject", "edit", "run", "profile", "auto", "cancel", "next_pane",
          "maximize", "help")


def global_bindings() -> list[Binding]:
    return [
        Binding(keys, action, label, show=bid in FOOTER, priority=True, id=bid,
                tooltip=description)
        for bid, (keys, action, label, description) in ACTIONS.items()
    ]


class KeymapError(ValueError):
    pass


def keymap_from_config(config: Config | dict[str, Any]) -> dict[str, str]:
    """The config's ``[keys]`` table, checked: unknown ids are an error naming them."""
    from agents.config import coerce

    keys = coerce(config).keys
    known = set(ACTIONS) | {"quit", "command_palette"} | _pane_binding_ids()
    unknown = sorted(k for k in keys if k not in known)
    if unknown:
        raise KeymapError(f"[keys] in the config names unknown action(s) {unknown}; "
                          f"known: {sorted(known)}")
    bad = sorted(k for k, v in keys.items() if not isinstance(v, str) or not v.strip())
    if bad:
        raise KeymapError(f"[keys] {bad}: each value must be a key string like \"ctrl+y\"")
    return {k: v.replace(" ", "") for k, v in keys.items()}


def _pane_binding_ids() -> set[str]:
    from tui.widgets.history import HistoryTable
    from tui.widgets.timeline import Timeline

    return {b.id for b in (*HistoryTable.BINDINGS, *Timeline.BINDINGS)
            if isinstance(b, Binding) and b.id}


def remapped(app: object) -> dict[str, str]:
    """The ``[keys]`` remaps an app applied (action id -> keys). Textual keeps its own
    copy private, so the apps record what they passed to ``set_keymap``; an app that
    set none (a test harness) has the defaults."""
    return dict(getattr(app, "keymap_overrides", None) or {})


def describe(keymap: dict[str, str]) -> list[tuple[str, str, str]]:
    """(keys, label, description) rows for the help screen, with remaps applied."""
    return [(keymap.get(bid, keys), label, description)
            for bid, (keys, _, label, description) in ACTIONS.items()]
