"""The Profile pane: timeline, top-ops table, and VMEM / roofline gauges for a chip.

Fed one ``tilewright.profile/1`` JSON object (H3's profiling layer writes it, the
session keeps it as a blob). Interpret-mode numbers are labelled as such.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from tui.widgets.timeline import Timeline, spans_from_profile

GAUGE_W = 16


def gauge(label: str, fraction: float | None, detail: str) -> Text:
    """``label ▕████░░░░▏ detail``; red past 90 %, amber past 70 %."""
    text = Text(f"{label} ", style="bold")
    if fraction is None:
        return text.append(f"▕{'·' * GAUGE_W}▏ {detail}", style="dim")
    filled = round(max(0.0, min(1.0, fraction)) * GAUGE_W)
    colour = "red" if fraction > 0.9 else "yellow" if fraction > 0.7 else "green"
    text.append("▕")
    text.append("█" * filled, style=colour)
    text.append("░" * (GAUGE_W - filled), style="dim")
    text.append(f"▏ {detail}")
    return text


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def vmem_gauge(profile: dict[str, Any], vmem_capacity: float | None) -> Text:
    kernels = (profile.get("analysis") or {}).get("kernels") or []
    used = max((k.get("vmem_bytes") or 0 for k in kernels), default=0)
    if not kernels:
        return gauge("VMEM", None, "no pallas_call analysed")
    if not vmem_capacity:
        return gauge("VMEM", None, f"{_mib(used)} MiB (chip capacity unknown)")
    return gauge("VMEM", used / vmem_capacity,
                 f"{_mib(used)}/{_mib(vmem_capacity)} MiB")


def roofline_gauge(profile: dict[str, Any]) -> Text:
    roof = profile.get("roofline") or {}
    fraction = roof.get("fraction_of_roofline", roof.get("fraction"))
    if fraction is None:
        bound = roof.get("bound")
        return gauge("roofline", None, f"{bound}-bound" if bound else "not available")
    bound = roof.get("bound", "")
    return gauge("roofline", float(fraction), f"{float(fraction) * 100:.0f}% {bound}".strip())


class ProfilePane(Vertical):
    DEFAULT_CSS = """
    ProfilePane Timeline { margin: 0 0 1 0; }
    ProfilePane #gauges { height: auto; }
    ProfilePane DataTable { height: 1fr; }
    ProfilePane #profile-note { color: $text-muted; height: auto; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "Profile"
        self.profile: dict[str, Any] | None = None
        self.chip_label = "chip?"
        self.vmem_capacity: float | None = None

    def compose(self) -> ComposeResult:
        yield Timeline(id="timeline")
        yield Static("", id="gauges")
        table: DataTable = DataTable(id="top-ops", cursor_type="row")
        table.add_columns("op", "count", "total", "%")
        yield table
        yield Static("", id="profile-note", markup=False)

    def set_chip(self, label: str, vmem_capacity: float | None) -> None:
        self.chip_label, self.vmem_capacity = label, vmem_capacity
        if self.profile is not None:
            self._render_gauges()
        self._retitle()

    def show(self, profile: dict[str, Any] | None, version: int | None = None) -> None:
        self.profile = profile
        self.version = version
        table = self.query_one(DataTable)
        table.clear()
        timeline = self.query_one(Timeline)
        if not profile:
            timeline.load([], [])
            self.query_one("#gauges", Static).update("")
            self.query_one("#profile-note", Static).update("")
            self._retitle()
            return
        timeline.load(*spans_from_profile(profile))
        for op in (profile.get("top_ops") or [])[:30]:
            total = op.get("total_us", op.get("self_us", 0.0)) or 0.0
            pct = op.get("percent", op.get("fraction", 0.0) * 100 if "fraction" in op else 0.0)
            table.add_row(str(op.get("name", "?"))[:48], str(op.get("count", "")),
                          f"{total:,.1f}µs", f"{pct:.1f}")
        self._render_gauges()
        notes = [n for n in (profile.get("notes") or []) if isinstance(n, str)]
        backend = profile.get("backend") or {}
        if backend.get("mode") == "tpu-interpret":
            notes.insert(0, "CPU TPU-interpret timings: not TPU performance")
        self.query_one("#profile-note", Static).update("\n".join(notes[:2]))
        self._retitle()

    def _render_gauges(self) -> None:
        assert self.profile is not None
        text = vmem_gauge(self.profile, self.vmem_capacity)
        text.append("   ")
        text.append_text(roofline_gauge(self.profile))
        self.query_one("#gauges", Static).update(text)

    def _retitle(self) -> None:
        version = f" · v{self.version}" if self.profile and self.version else ""
        self.border_title = f"Profile{version} · {self.chip_label}"
