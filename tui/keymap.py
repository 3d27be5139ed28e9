"""Every global action, its default keys, and the user's remapping.

Global actions use ctrl, alt and function keys: a focused editor or input line swallows
letters, and these survive SSH and tmux (no ctrl+a or ctrl+b, screen's and tmux's
prefixes; no ctrl+s/q flow-control surprises beyond textual's own ctrl+q quit). Every
action on a function key has a ctrl or alt key as well, because function keys are what
terminals, SSH clients in a browser and laptop keyboards lose first; and every action
is in the command palette (ctrl+p, or alt+p where an editor such as VS Code takes
ctrl+p). Each binding has an id so a ``[keys]`` table in the config file remaps it:
``approve = "ctrl+y,f9"``. Hints on screen name the keys in force (``say``), never a
default.
"""

from __future__ import annotations

import enum
from typing import Any

from textual.binding import Binding

from tilewright.agents.config import Config

# id -> (default keys, action, footer label, description for help and the palette)
ACTIONS: dict[str, tuple[str, str, str, str]] = {
    "approve": ("ctrl+y", "approve", "Approve", "Approve the pending proposal"),
    "reject": ("ctrl+n", "reject", "Reject", "Reject the pending proposal with a note"),
    "edit": ("f2,ctrl+o", "edit", "Edit", "Edit the proposal, a plan or the current "
             "version; press again to submit (Esc leaves the editor, nothing recorded)"),
    "toggle_diff": ("f3,alt+d", "toggle_diff", "Diff",
                    "Show the proposal as a diff or in full"),
    "run": ("ctrl+r", "run", "Run", "Evaluate the current version"),
    "profile": ("ctrl+t", "profile", "Profile", "Profile the current version"),
    "auto": ("ctrl+g", "toggle_auto", "Auto", "Switch between step and autonomous mode"),
    "cancel": ("f8,alt+x", "cancel", "Cancel",
               "Cancel the agent reply or the run (press twice)"),
    "next_pane": ("f6,alt+n", "cycle_pane(1)", "Pane", "Focus the next pane"),
    "prev_pane": ("shift+f6,alt+b", "cycle_pane(-1)", "Prev pane", "Focus the previous pane"),
    "maximize": ("f7,alt+z", "maximize", "Zoom", "Maximize or restore the focused pane"),
    "chat": ("f5,alt+m", "focus_chat", "Chat", "Type a message to the agent"),
    "help": ("f1,alt+h", "help", "Help", "Show keys and what they do"),
    "palette": ("alt+p", "app.command_palette", "Commands",
                "Open the command palette (as ctrl+p does, where ctrl+p is taken)"),
}
# Shown in the footer (the rest are in F1 help and the command palette).
FOOTER = ("approve", "reject", "edit", "run", "profile", "auto", "cancel", "next_pane",
          "maximize", "help")
# Textual's own ids a ``[keys]`` table may remap too, with their default keys.
TEXTUAL_IDS = {"quit": "ctrl+q", "command_palette": "ctrl+p"}


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
    from tilewright.agents.config import coerce

    keys = coerce(config).keys
    known = set(ACTIONS) | set(TEXTUAL_IDS) | _pane_binding_ids()
    unknown = sorted(k for k in keys if k not in known)
    if unknown:
        raise KeymapError(f"[keys] in the config names unknown action(s) {unknown}; "
                          f"known: {sorted(known)}")
    bad = sorted(k for k, v in keys.items() if not isinstance(v, str) or not v.strip())
    if bad:
        raise KeymapError(f"[keys] {bad}: each value must be a key string like \"ctrl+y\"")
    return {k: v.replace(" ", "") for k, v in keys.items()}


def _pane_binding_ids() -> set[str]:
    from tilewright.tui.widgets.history import HistoryTable
    from tilewright.tui.widgets.timeline import Timeline

    return {b.id for b in (*HistoryTable.BINDINGS, *Timeline.BINDINGS)
            if isinstance(b, Binding) and b.id}


def remapped(app: object) -> dict[str, str]:
    """The ``[keys]`` remaps an app applied (action id -> keys). Textual keeps its own
    copy private, so the apps record what they passed to ``set_keymap``; an app that
    set none (a test harness) has the defaults."""
    return dict(getattr(app, "keymap_overrides", None) or {})


def keys_of(app: object, bid: str) -> list[str]:
    """The keys that trigger action ``bid`` in ``app`` now: its remap, else its
    defaults (an action of this table, ``quit`` or ``command_palette``)."""
    default = ACTIONS[bid][0] if bid in ACTIONS else TEXTUAL_IDS[bid]
    return [k for k in remapped(app).get(bid, default).split(",") if k]


def key_name(key: str) -> str:
    """How a hint names a key: ``F2``, ``shift+F6``, ``ctrl+y``, ``alt+x``, ``Esc``."""
    parts = key.split("+")
    last = parts[-1]
    if last.startswith("f") and last[1:].isdigit():
        last = last.upper()
    elif last == "escape":
        last = "Esc"
    elif last in ("enter", "tab", "space"):
        last = last.capitalize()
    return "+".join([*parts[:-1], last])


def spoken(names: list[str]) -> str:
    """["Esc", "F1", "alt+h"] -> "Esc, F1 or alt+h"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1] \
        if names else ""


def say(app: object, bid: str, *, most: int = 2, joiner: str = " or ") -> str:
    """The keys in force for ``bid`` as a hint says them: "F2 or ctrl+o" (at most
    ``most`` of them); "(no key)" for an action remapped to nothing."""
    keys = [key_name(k) for k in keys_of(app, bid)][:most]
    return joiner.join(keys) or "(no key)"


def describe(keymap: dict[str, str]) -> list[tuple[str, str, str]]:
    """(keys, label, description) rows for the help screen, with remaps applied."""
    def names(bid: str, default: str) -> list[str]:
        return [key_name(k) for k in keymap.get(bid, default).split(",") if k]

    rows = [(", ".join(names(bid, keys)), label, description)
            for bid, (keys, _, label, description) in ACTIONS.items() if bid != "palette"]
    rows.append((", ".join(names("command_palette", TEXTUAL_IDS["command_palette"])
                           + names("palette", ACTIONS["palette"][0])),
                 "Commands", "The command palette: every action by name, help included "
                 "(alt+p where the terminal's host takes ctrl+p)"))
    rows.append((", ".join(key_name(k) for k in keymap.get(
        "quit", TEXTUAL_IDS["quit"]).split(",") if k), "Quit",
        "Save and leave (the session can be resumed)"))
    return rows


# -- terminals whose shifted function keys are other function keys -------------------
# The Linux console and rxvt send shift+F1..F10 as the codes of F11..F20 (shift+F6 is
# ``\e[29~``, F16's). Textual reads ``\e[29~`` as a kitty-protocol key (codepoint 29)
# and the F-key table never sees it; neither terminal speaks that protocol, so there
# the kitty reading is switched off and F11..F20 also trigger the shift+F1..F10
# bindings. rxvt's ``$`` suffix (shift, as in ``\e[2$`` for shift+Insert) on an F-key
# code (``\e[17$``) is read as that shifted F-key on any terminal: unread, it typed
# "[17$" into the editor.
LEGACY_FKEY_TERMS = ("linux", "rxvt", "Eterm")
# rxvt's codes of F1..F10 (``\e[11~`` .. ``\e[21~``, skipping 16).
RXVT_FKEY_CODES = (11, 12, 13, 14, 15, 17, 18, 19, 20, 21)


class ShiftedF(enum.StrEnum):
    """Key names the parser table gives (it wants enum members with a ``value``)."""

    S1, S2, S3, S4, S5 = "shift+f1", "shift+f2", "shift+f3", "shift+f4", "shift+f5"
    S6, S7, S8, S9, S10 = "shift+f6", "shift+f7", "shift+f8", "shift+f9", "shift+f10"


def legacy_fkeys(term: str | None) -> bool:
    return bool(term) and any(str(term).startswith(t) for t in LEGACY_FKEY_TERMS)


def with_shift_aliases(keys: str) -> str:
    """``shift+f6,alt+b`` -> ``shift+f6,alt+b,f16`` (F11..F20 as shift+F1..F10)."""
    out = [k for k in keys.split(",") if k]
    for key in list(out):
        name = key.removeprefix("shift+")
        if key.startswith("shift+f") and name[1:].isdigit() and 1 <= int(name[1:]) <= 10:
            alias = f"f{int(name[1:]) + 10}"
            if alias not in out:
                out.append(alias)
    return ",".join(out)


def terminal_keymap(overrides: dict[str, str], term: str | None) -> dict[str, str]:
    """The remaps to give ``set_keymap`` on terminal ``term``: the config's, plus the
    F11..F20 aliases of shifted function keys on a Linux console or rxvt."""
    if not legacy_fkeys(term):
        return dict(overrides)
    out = dict(overrides)
    for bid, (keys, *_rest) in ACTIONS.items():
        aliased = with_shift_aliases(overrides.get(bid, keys))
        if aliased != overrides.get(bid, keys):
            out[bid] = aliased
    return out


def install_terminal_keys(term: str | None) -> None:
    """Teach Textual's key parser the shifted F-key codes of ``term`` (see above)."""
    from textual import constants
    from textual._ansi_sequences import ANSI_SEQUENCES_KEYS

    for n, code in enumerate(RXVT_FKEY_CODES, start=1):
        ANSI_SEQUENCES_KEYS.setdefault(f"\x1b[{code}$", (ShiftedF(f"shift+f{n}"),))
    if legacy_fkeys(term):
        constants.DISABLE_KITTY_KEY = True  # type: ignore[misc]
