"""Our own ``Timeline`` model: tracks of ordered events, op summaries and exports.

A ``Timeline`` is what the profile pane draws and what the agent reads: a few tracks
(a device's "XLA Ops" line, a host thread, ...) each holding events ordered by start,
times in microseconds relative to the start of the capture. ``op_summary`` ranks
operations by total and self time inside the measured region (the timed iterations);
``to_chrome_trace`` writes a JSON file Perfetto and chrome://tracing open; ``summary``
is the compact text form. Pure Python: no JAX, no xprof.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Track kinds: device op lines hold the kernels; module lines hold whole programs;
# host threads hold dispatch (and, on a CPU backend, the ops themselves).
TRACK_KINDS = ("device_ops", "device_stream", "device_modules", "device_other", "host_thread",
               "steps")


@dataclass
class Event:
    name: str
    start_us: float
    dur_us: float
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass
class Track:
    name: str
    kind: str  # one of TRACK_KINDS
    process: str = ""  # e.g. "/device:TPU:0" or "/host:CPU"
    events: list[Event] = field(default_factory=list)

    def sort(self) -> None:
        # Parents before children: same start, longer first.
        self.events.sort(key=lambda e: (e.start_us, -e.dur_us))

    @property
    def span(self) -> tuple[float, float] | None:
        if not self.events:
            return None
        return (min(e.start_us for e in self.events), max(e.end_us for e in self.events))


@dataclass
class OpStat:
    name: str
    total_us: float
    self_us: float
    count: int
    share: float  # self time over the measured region's duration
    example: str = ""  # one full event name of this group (e.g. "fusion.3")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "total_ms": self.total_us / 1e3, "self_ms": self.self_us / 1e3,
                "count": self.count, "share": self.share, "example": self.example}


@dataclass
class Timeline:
    tracks: list[Track] = field(default_factory=list)
    source: str = ""  # "device" (TPU/GPU planes) or "host" (CPU threads)
    measured: tuple[float, float] | None = None  # the timed iterations, in us
    meta: dict[str, Any] = field(default_factory=dict)

    # -- shape -----------------------------------------------------------------
    @property
    def span(self) -> tuple[float, float] | None:
        spans = [t.span for t in self.tracks if t.span]
        if not spans:
            return None
        return (min(s[0] for s in spans), max(s[1] for s in spans))

    @property
    def region(self) -> tuple[float, float] | None:
        """The measured region, or the whole span when no region was marked."""
        return self.measured or self.span

    def event_counts(self) -> dict[str, int]:
        return {t.name: len(t.events) for t in self.tracks}

    def tracks_of(self, *kinds: str) -> list[Track]:
        return [t for t in self.tracks if t.kind in kinds]

    # -- analysis --------------------------------------------------------------
    def op_summary(self, kinds: tuple[str, ...] = ("device_ops",), is_op: Any = None,
                   group: str = "name", limit: int | None = 20) -> list[OpStat]:
        """Top operations by self time within the measured region.

        ``is_op(event)`` selects op events (default: every event on the tracks of
        ``kinds``); self time subtracts the time of events nested inside an op on
        the same track, whatever they are. ``group="family"`` folds numbered
        instances (``copy.4``, ``copy.9``) into one row.
        """
        region = self.region
        if region is None:
            return []
        stats: dict[str, list[Any]] = {}
        for track in self.tracks_of(*kinds):
            for event, self_us in _self_times(track.events):
                if event.end_us <= region[0] or event.start_us >= region[1]:
                    continue
                if is_op is not None and not is_op(event):
                    continue
                key = op_family(event.name) if group == "family" else event.name
                row = stats.setdefault(key, [0.0, 0.0, 0, event.name])
                row[0] += event.dur_us
                row[1] += self_us
                row[2] += 1
        length = max(region[1] - region[0], 1e-9)
        rows = [OpStat(k, v[0], v[1], v[2], v[1] / length, v[3]) for k, v in stats.items()]
        rows.sort(key=lambda r: (-r.self_us, -r.total_us, r.name))
        return rows[:limit] if limit else rows

    def busy_us(self, kinds: tuple[str, ...], match: Any = None) -> float:
        """Time inside the measured region covered by events, nesting counted once per
        track and tracks (one per device) added up."""
        region = self.region
        if region is None:
            return 0.0
        total = 0.0
        for track in self.tracks_of(*kinds):
            intervals = []
            for e in track.events:
                if match is not None and not match(e):
                    continue
                lo, hi = max(e.start_us, region[0]), min(e.end_us, region[1])
                if hi > lo:
                    intervals.append((lo, hi))
            total += _union_length(intervals)
        return total

    # -- exports ---------------------------------------------------------------
    def to_json(self, max_events: int = 0) -> dict[str, Any]:
        """Compact JSON: tracks with event counts and spans (and up to ``max_events`` events each)."""
        span = self.span
        out: dict[str, Any] = {
            "source": self.source,
            "span_us": list(span) if span else None,
            "measured_us": list(self.measured) if self.measured else None,
            "tracks": [],
            "meta": self.meta,
        }
        for t in self.tracks:
            tspan = t.span
            row: dict[str, Any] = {"name": t.name, "kind": t.kind, "process": t.process,
                                   "events": len(t.events), "span_us": list(tspan) if tspan else None}
            if max_events:
                row["sample"] = [[e.name, round(e.start_us, 3), round(e.dur_us, 3)]
                                 for e in t.events[:max_events]]
            out["tracks"].append(row)
        return out

    def to_chrome_trace(self) -> dict[str, Any]:
        """Chrome/Perfetto trace JSON (``traceEvents``, microsecond ``ts``/``dur``)."""
        events: list[dict[str, Any]] = []
        pids: dict[str, int] = {}
        for tid, track in enumerate(self.tracks, start=1):
            process = track.process or self.source or "tilewright"
            if process not in pids:
                pids[process] = len(pids) + 1
                events.append({"ph": "M", "name": "process_name", "pid": pids[process],
                               "args": {"name": process}})
            pid = pids[process]
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": track.name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
            for e in track.events:
                row = {"ph": "X", "name": e.name, "pid": pid, "tid": tid,
                       "ts": e.start_us, "dur": e.dur_us}
                if e.args:
                    row["args"] = e.args
                events.append(row)
        if self.measured:
            events.append({"ph": "i", "s": "g", "name": "measured start", "pid": 1, "tid": 1,
                           "ts": self.measured[0]})
            events.append({"ph": "i", "s": "g", "name": "measured end", "pid": 1, "tid": 1,
                           "ts": self.measured[1]})
        return {"traceEvents": events, "displayTimeUnit": "ns",
                "otherData": {"producer": "tilewright", **{k: str(v) for k, v in self.meta.items()}}}

    def summary(self, top: int = 5) -> str:
        """A few lines a person (or an agent) reads at a glance."""
        span = self.span
        if span is None:
            return "timeline: empty (no events captured)"
        region = self.region or span
        lines = [f"timeline ({self.source}): {len(self.tracks)} tracks, "
                 f"{sum(self.event_counts().values()):,} events, span {_ms(span[1] - span[0])}, "
                 f"measured {_ms(region[1] - region[0])}"]
        for t in self.tracks:
            lines.append(f"  {t.kind:<14} {t.name}: {len(t.events):,} events")
        if self.source == "device":
            has_ops = any(t.events for t in self.tracks_of("device_ops"))
            kinds, is_op, group = ("device_ops",) if has_ops else ("device_stream",), None, "name"
        else:
            kinds, is_op, group = ("host_thread",), (lambda e: "hlo_op" in e.args), "family"
        ops = self.op_summary(kinds, is_op=is_op, group=group, limit=top)
        if ops:
            lines.append("  top ops by self time:")
            for op in ops:
                lines.append(f"    {op.name:<32} {_ms(op.self_us):>10} self {_ms(op.total_us):>10} "
                             f"total x{op.count:<5} {op.share:6.1%}")
        return "\n".join(lines)


def op_family(name: str) -> str:
    """``copy.4`` -> ``copy``; ``cond.7.clone.3`` -> ``cond``."""
    return re.sub(r"(\.(\d+|clone))+$", "", name)


def _self_times(events: list[Event]) -> list[tuple[Event, float]]:
    """Each event with its self time (duration minus directly nested events) on one track."""
    ordered = sorted(events, key=lambda e: (e.start_us, -e.dur_us))
    out: list[tuple[Event, float]] = []
    stack: list[list[Any]] = []  # [event, child_time]
    for e in ordered:
        while stack and stack[-1][0].end_us <= e.start_us + 1e-9:
            done = stack.pop()
            out.append((done[0], max(done[0].dur_us - done[1], 0.0)))
        if stack:
            parent = stack[-1]
            parent[1] += min(e.end_us, parent[0].end_us) - e.start_us
        stack.append([e, 0.0])
    while stack:
        done = stack.pop()
        out.append((done[0], max(done[0].dur_us - done[1], 0.0)))
    return out


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f} ms" if us < 1e6 else f"{us / 1e6:.2f} s"
