"""A profile timeline drawn with block characters: tracks of events over time.

Keyboard only: ``left``/``right`` pan, ``+``/``-`` zoom around the selection, ``[``/``]``
select the previous/next event, ``0`` fits everything. Times are microseconds, as in
the profile JSON's timeline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from tilewright.kernels.source.printable import printable_fields

PALETTE = ("#5f87d7", "#d7875f", "#87af5f", "#af87d7", "#d7af5f", "#5fafaf", "#d75f87",
           "#87afd7")
LABEL_W = 14
PARTIAL = " ▏▎▍▌▋▊▉█"


@dataclass(frozen=True)
class Span:
    track: int
    name: str
    start_us: float
    dur_us: float
    detail: str = ""


MAX_TRACKS = 5
MAX_SPANS = 20000  # enough for the measured iterations of a small kernel


def spans_from_profile(profile: dict, base: Path | None = None) -> tuple[list[str], list[Span]]:
    """Track names and spans of a ``tilewright.profile/1`` profile.

    The profile JSON keeps per-track counts (and maybe a ``sample``); the events
    themselves are in the Chrome trace file it names (``timeline.chrome_trace``), read
    here, relative to ``base`` when the path is relative. A missing file gives no spans.
    """
    timeline = profile.get("timeline") or {}
    tracks = timeline.get("tracks", []) if isinstance(timeline, dict) else timeline
    trace_path = timeline.get("chrome_trace") if isinstance(timeline, dict) else None
    if trace_path:
        path = Path(trace_path)
        if not path.is_absolute() and base is not None:
            path = base / path
        loaded = _spans_from_chrome_trace(path)
        if loaded[1]:
            return loaded
    names: list[str] = []
    spans: list[Span] = []
    for i, track in enumerate(tracks or []):
        names.append(str(track.get("name", f"track {i}")))
        rows = track.get("events") if isinstance(track.get("events"), list) \
            else track.get("sample") or []
        for ev in rows:
            if isinstance(ev, list | tuple):
                spans.append(Span(i, str(ev[0]), float(ev[1]), float(ev[2])))
            else:
                detail = ", ".join(f"{k}={v}" for k, v in (ev.get("args") or {}).items())
                spans.append(Span(i, str(ev.get("name", "?")),
                                  float(ev.get("ts", ev.get("start_us", 0.0))),
                                  float(ev.get("dur", ev.get("dur_us", 0.0))), detail))
    spans.sort(key=lambda s: (s.start_us, s.track))
    return names, spans[:MAX_SPANS]


def _spans_from_chrome_trace(path: Path) -> tuple[list[str], list[Span]]:
    try:
        data = printable_fields(json.loads(path.read_text()))  # op names are the program's
    except (OSError, ValueError):
        return [], []
    names: dict[tuple[int, int], str] = {}
    order: list[tuple[int, int]] = []
    spans_raw: list[tuple[tuple[int, int], dict]] = []
    for ev in data.get("traceEvents", []):
        key = (ev.get("pid", 0), ev.get("tid", 0))
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[key] = str((ev.get("args") or {}).get("name", key))
        elif ev.get("ph") == "X":
            if key not in order:
                order.append(key)
            spans_raw.append((key, ev))
    index = {key: i for i, key in enumerate(order)}
    spans = [Span(index[key], str(ev.get("name", "?")), float(ev.get("ts", 0.0)),
                  float(ev.get("dur", 0.0)),
                  ", ".join(f"{k}={v}" for k, v in (ev.get("args") or {}).items())[:120])
             for key, ev in spans_raw]
    spans.sort(key=lambda s: (s.start_us, s.track))
    return [names.get(key, f"track {key[1]}") for key in order], spans[:MAX_SPANS]


def _colour(name: str) -> str:
    return PALETTE[sum(map(ord, name)) % len(PALETTE)]


def _fmt_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f}s"
    if us >= 1e3:
        return f"{us / 1e3:.2f}ms"
    return f"{us:.1f}µs"


class Timeline(Widget, can_focus=True):
    DEFAULT_CSS = "Timeline { height: auto; min-height: 3; }"

    BINDINGS = [
        Binding("left,h", "pan(-1)", "Pan", show=False, id="timeline.pan_left"),
        Binding("right,l", "pan(1)", "Pan", show=False, id="timeline.pan_right"),
        Binding("plus,equals_sign", "zoom(0.5)", "Zoom in", id="timeline.zoom_in"),
        Binding("minus", "zoom(2.0)", "Zoom out", id="timeline.zoom_out"),
        Binding("right_square_bracket", "select(1)", "Next event", id="timeline.next"),
        Binding("left_square_bracket", "select(-1)", "Prev event", id="timeline.prev"),
        Binding("0", "fit", "Fit", id="timeline.fit"),
    ]

    window: reactive[tuple[float, float]] = reactive((0.0, 1.0))
    selected: reactive[int | None] = reactive(None)

    @dataclass
    class Selected(Message):
        """The person selected ``span`` on the timeline."""

        span: Span

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.tracks: list[str] = []
        self.spans: list[Span] = []
        self.extent = (0.0, 1.0)

    def load(self, tracks: list[str], spans: list[Span]) -> None:
        if len(tracks) > MAX_TRACKS:  # keep the busiest tracks; a pane has few rows
            counts = [0] * len(tracks)
            for span in spans:
                counts[span.track] += 1
            keep = sorted(sorted(range(len(tracks)), key=lambda t: -counts[t])[:MAX_TRACKS])
            renumber = {old: new for new, old in enumerate(keep)}
            tracks = [tracks[t] for t in keep]
            spans = [Span(renumber[s.track], s.name, s.start_us, s.dur_us, s.detail)
                     for s in spans if s.track in renumber]
        spans = sorted(spans, key=lambda s: (s.start_us, -s.dur_us))  # [ and ] walk in time
        self.tracks, self.spans = tracks, spans
        if spans:
            lo = min(s.start_us for s in spans)
            hi = max(s.start_us + s.dur_us for s in spans)
            self.extent = (lo, hi if hi > lo else lo + 1.0)
        else:
            self.extent = (0.0, 1.0)
        self.window = self.extent
        # Start on the longest event that is not a whole-capture marker.
        total = self.extent[1] - self.extent[0]
        inner = [i for i, s in enumerate(spans) if s.dur_us < 0.9 * total]
        pick = max(inner, key=lambda i: spans[i].dur_us) if inner else 0
        self.selected = pick if spans else None
        self.refresh(layout=True)

    def get_content_height(self, container, viewport, width) -> int:  # type: ignore[override]
        return max(1, len(self.tracks)) + 2

    # -- actions ----------------------------------------------------------------------
    def action_pan(self, direction: int) -> None:
        lo, hi = self.window
        step = (hi - lo) * 0.2 * direction
        self.window = (lo + step, hi + step)

    def action_zoom(self, factor: float) -> None:
        lo, hi = self.window
        if self.selected is not None and self.spans:
            span = self.spans[self.selected]
            centre = span.start_us + span.dur_us / 2
        else:
            centre = (lo + hi) / 2
        half = max((hi - lo) * factor / 2, 0.01)
        self.window = (centre - half, centre + half)

    def action_fit(self) -> None:
        self.window = self.extent

    def action_select(self, step: int) -> None:
        if not self.spans:
            return
        index = 0 if self.selected is None else (self.selected + step) % len(self.spans)
        self.selected = index
        span = self.spans[index]
        lo, hi = self.window
        if span.start_us < lo or span.start_us + span.dur_us > hi:  # keep it in view
            width = hi - lo
            self.window = (span.start_us - width * 0.1, span.start_us - width * 0.1 + width)
        self.post_message(self.Selected(span))

    # -- drawing ----------------------------------------------------------------------
    def render(self) -> Text:
        width = max(10, self.size.width - LABEL_W)
        if not self.spans:
            return Text("no timeline: run a profile (ctrl+t)", style="italic dim")
        lo, hi = self.window
        per_cell = (hi - lo) / width
        out = Text(no_wrap=True, overflow="crop")
        chosen = self.spans[self.selected] if self.selected is not None else None
        for t, name in enumerate(self.tracks):
            cover = [0.0] * width  # fraction of each cell covered
            owner: list[Span | None] = [None] * width
            for span in self.spans:
                if span.track != t or span.start_us + span.dur_us < lo or span.start_us > hi:
                    continue
                a = (span.start_us - lo) / per_cell
                b = (span.start_us + span.dur_us - lo) / per_cell
                for cell in range(max(0, int(a)), min(width, int(b) + 1)):
                    part = min(b, cell + 1) - max(a, cell)
                    if part > 0:
                        cover[cell] = min(1.0, cover[cell] + part)
                        if owner[cell] is None or span is chosen:
                            owner[cell] = span
            out.append(f"{name[:LABEL_W - 2]:<{LABEL_W - 1}}│", style="dim")
            for cell in range(width):
                span = owner[cell]
                if span is None or cover[cell] <= 0:
                    out.append(" ")
                    continue
                glyph = PARTIAL[max(1, round(cover[cell] * 8))]
                style = Style(color=_colour(span.name))
                if span is chosen:
                    style = Style(color="#ffffff", bgcolor="#875f00", bold=True)
                out.append(glyph, style=style)
            out.append("\n")
        axis_l, axis_r = _fmt_us(lo - self.extent[0]), _fmt_us(hi - self.extent[0])
        gap = max(1, width - len(axis_l) - len(axis_r))
        out.append(" " * LABEL_W + axis_l + " " * gap + axis_r + "\n", style="dim")
        if chosen is not None:
            out.append(f"▸ {chosen.name}  {_fmt_us(chosen.dur_us)} at "
                       f"{_fmt_us(chosen.start_us - self.extent[0])}"
                       + (f"  {chosen.detail}" if chosen.detail else ""), style="bold")
        return out

    def watch_window(self) -> None:
        self.refresh()

    def watch_selected(self) -> None:
        self.refresh()
