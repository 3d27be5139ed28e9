"""The Profile pane: timeline, top-ops table, and VMEM / roofline gauges for a chip.

Fed one ``tilewright.profile/1`` JSON object (H3's profiling layer writes it, the
session keeps it as a blob). Interpret-mode numbers are labelled as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from tilewright.kernels.judge.result import is_interpret
from tilewright.tui.widgets.timeline import Timeline, spans_from_profile

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


def _ms(value: Any) -> str:
    return f"{value:,.3f}" if isinstance(value, int | float) else ""


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


CompilerVmem = tuple[str | None, int | None, int | None]  # (chip, used, scoped limit)


def vmem_gauge(profile: dict[str, Any], vmem_capacity: float | None,
               compiler: CompilerVmem | None = None) -> Text:
    """The largest VMEM footprint of any pallas_call against its budget (the scoped
    limit it runs under), else against the chip's; the static analysis' figure, with
    the TPU compiler's own allocation beside it when the evaluation has one."""
    kernels = (profile.get("analysis") or {}).get("kernels") or []
    beside = ""
    if compiler is not None and isinstance(compiler[1], int | float):
        chip, used_c, limit_c = compiler
        beside = f" · compiler {_mib(float(used_c))}" + (
            f"/{_mib(float(limit_c))}" if isinstance(limit_c, int | float) else "") \
            + f" MiB{f' on {chip}' if chip else ''}"
    if not kernels:
        return gauge("VMEM", None, "no pallas_call analysed" + beside)
    worst = max(kernels, key=lambda k: k.get("vmem_bytes") or 0)
    used = float(worst.get("vmem_bytes") or 0)
    budget = worst.get("vmem_budget_bytes") or worst.get("vmem_limit_bytes") or vmem_capacity
    if not budget:
        return gauge("VMEM", None, f"{_mib(used)} MiB (capacity unknown)" + beside)
    static = "static " if beside else ""
    return gauge("VMEM", used / float(budget),
                 f"{static}{_mib(used)}/{_mib(float(budget))} MiB{beside}")


def _dims(profile: dict[str, Any] | None) -> str | None:
    """The profiled shape's first input as "256x512" (None: the profile does not say)."""
    shape = (profile or {}).get("shape") or {}
    inputs = shape.get("inputs") if isinstance(shape, dict) else None
    try:
        return "x".join(str(int(d)) for d in inputs[0][0]) or "scalar" if inputs else None
    except (TypeError, ValueError, IndexError):
        return None


def _shape_words(profile: dict[str, Any] | None) -> str:
    """" · 256x512 check" / " · 4096x4096": the shape the profile's numbers are for (a
    trace runs at a check shape; the static analysis alone can be at the production
    shape), so they are never read as the production figures beside them."""
    dims = _dims(profile)
    if dims is None:
        return ""
    production = ((profile or {}).get("shape") or {}).get("production")
    return f" · {dims}" + ("" if production else " check")


def _shape_note(profile: dict[str, Any]) -> str:
    """The note line's words on the shape: a check shape's numbers are not production's."""
    dims = _dims(profile)
    shape = profile.get("shape") or {}
    if dims is None or shape.get("production"):
        return ""
    return f"at check shape {dims}, not production"


def roofline_gauge(profile: dict[str, Any]) -> Text:
    roof = profile.get("roofline") or {}
    bound = roof.get("bound_by") or roof.get("bound") or ""
    fraction = roof.get("fraction")
    if fraction is None:
        bound_ms = roof.get("bound_ms")
        detail = f"{bound}-bound" if bound else "not available"
        if isinstance(bound_ms, int | float):
            detail += f", ≥{bound_ms * 1000:.2f}µs"
        return gauge("roofline", None, detail)
    return gauge("roofline", float(fraction), f"{float(fraction) * 100:.0f}% ({bound})")


class ProfilePane(Vertical):
    ALLOW_MAXIMIZE = True  # F7 zooms a whole pane
    DEFAULT_CSS = """
    ProfilePane Timeline { margin: 0 0 1 0; }
    ProfilePane #gauges { height: auto; }
    ProfilePane DataTable { height: 1fr; }
    ProfilePane #profile-note { color: $text-muted; height: 1; text-wrap: nowrap;
                                text-overflow: ellipsis; }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "Profile"
        self.profile: dict[str, Any] | None = None
        self.chip_label: str | None = None  # None: the chip the profile names
        self.vmem_capacity: float | None = None
        # The TPU compiler's VMEM for the profiled version's evaluation, if it ran.
        self.compiler_vmem: CompilerVmem | None = None
        self.version: int | None = None
        self.base_dir: Path | None = None

    def compose(self) -> ComposeResult:
        yield Timeline(id="timeline")
        yield Static("", id="gauges")
        table: DataTable = DataTable(id="top-ops", cursor_type="row")
        table.add_columns("op", "count", "total ms", "self ms", "share")
        yield table
        yield Static("", id="profile-note", markup=False)

    def set_chip(self, label: str | None, vmem_capacity: float | None) -> None:
        self.chip_label, self.vmem_capacity = label, vmem_capacity
        if self.profile is not None:
            self._render_gauges()
        self._retitle()

    def set_compiler_vmem(self, compiler: CompilerVmem | None) -> None:
        if compiler == self.compiler_vmem:
            return
        self.compiler_vmem = compiler
        if self.profile is not None:
            self._render_gauges()

    def show(self, profile: dict[str, Any] | None, version: int | None = None,
             base_dir: Path | None = None) -> None:
        self.profile = profile
        self.base_dir = base_dir
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
        timeline.load(*spans_from_profile(profile, self.base_dir))
        for op in (profile.get("top_ops") or [])[:30]:
            share = op.get("share")
            table.add_row(Text(str(op.get("name", "?"))[:28]), str(op.get("count", "")),
                          _ms(op.get("total_ms")), _ms(op.get("self_ms")),
                          f"{share * 100:.1f}%" if isinstance(share, int | float) else "")
        self._render_gauges()
        notes = [_shape_note(profile), str((profile.get("roofline") or {}).get("note") or "")]
        notes = [n for n in notes if n]
        backend = profile.get("backend") or {}
        if is_interpret(backend) and not notes:
            notes.insert(0, "TPU interpret mode on the CPU: timings are not TPU performance")
        self.query_one("#profile-note", Static).update(" · ".join(notes[:3]))
        self._retitle()

    def _render_gauges(self) -> None:
        assert self.profile is not None
        text = vmem_gauge(self.profile, self.vmem_capacity, self.compiler_vmem)
        text.append("\n")
        text.append_text(roofline_gauge(self.profile))
        self.query_one("#gauges", Static).update(text)

    def _retitle(self) -> None:
        """What the trace is and what it is for: "Profile · v3 · CPU interpret trace ·
        target v5e" (the timeline is the CPU interpreting the kernel, the gauges and the
        roofline are for the target chip), "Profile · v3 · TPU v5e trace" on a TPU."""
        version = f" · v{self.version}" if self.profile and self.version else ""
        chip = self.chip_label or ((self.profile or {}).get("chip") or {}).get("label") \
            or "no chip chosen"
        target = chip.removeprefix("TPU ")
        backend = (self.profile or {}).get("backend") or {}
        if not self.profile:
            what = f"target {target}"
        elif is_interpret(backend) or backend.get("platform") == "cpu":
            what = f"CPU interpret trace · target {target}"
        else:
            kind = backend.get("device_kind") or str(backend.get("platform", "")).upper()
            what = f"{kind} trace" + (f" · target {target}" if target not in kind else "")
        self.border_title = f"Profile{version}{_shape_words(self.profile)} · {what}"
