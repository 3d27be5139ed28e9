"""xprof trace data -> our ``Timeline``; the op table and the Pallas share.

``trace_events(xplane)`` runs xprof's own converter
(``raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer", {})``) with the C++
log output of that call held in a temporary file instead of the process's stderr (run
it in a worker anyway: importing xprof is heavy). ``timeline_from_trace`` reads the
Chrome-trace JSON it returns along two paths:

- device planes (``/device:TPU:N``, ``/device:GPU:N``): the ``XLA Ops`` line holds
  one event per HLO op executed on the chip, a Pallas kernel being the Mosaic custom
  call (``custom_call_target="tpu_custom_call"``, named ``pallas_call.N``); the
  ``XLA Modules`` line holds whole programs. A GPU plane may only have its CUDA
  streams (``Stream #N(...)``), whose kernel events carry ``hlo_op``: they stand in for
  ``XLA Ops`` there. Device time inside Pallas kernels over device op time is the
  Pallas share.
- host threads (``/host:CPU``): on a CPU backend the ops run on host threads (events
  carrying ``hlo_op``/``hlo_module``). A TPU kernel in interpret mode is simulated by
  many host ops, so no share can honestly be attributed to "the kernel" there.

The measured region is the ``tilewright.measured`` annotation ``profiling.capture``
puts around the timed iterations.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tilewright.profiling.timeline import Event, Timeline, Track

MEASURED = "tilewright.measured"
ITERATION = "tilewright.iter"
_DEVICE_LINES = {"xla ops": "device_ops", "xla modules": "device_modules", "steps": "steps"}


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Send file descriptor 2 (C++ logging included) to a temporary file for the block."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())


def trace_events(xplane: str | Path) -> tuple[dict[str, Any], list[str]]:
    """xprof's trace_viewer JSON for one xplane file, and what xprof logged meanwhile."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with captured_stderr() as log:
        from xprof.convert import raw_to_tool_data as rtd

        data, _content_type = rtd.xspace_to_tool_data([str(xplane)], "trace_viewer", {})
    if isinstance(data, bytes):
        data = data.decode()
    if not data:
        raise ValueError(f"xprof returned no trace data for {xplane}")
    return json.loads(data), log


def timeline_from_trace(trace: dict[str, Any]) -> Timeline:
    """Build a ``Timeline`` from Chrome-trace JSON as xprof's trace_viewer writes it."""
    events = trace.get("traceEvents", [])
    processes: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    for e in events:
        if e.get("ph") != "M":
            continue
        if e.get("name") == "process_name":
            processes[e.get("pid")] = str(e.get("args", {}).get("name", ""))
        elif e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))

    tracks: dict[tuple[Any, Any], Track] = {}
    for e in events:
        if e.get("ph") != "X" or "ts" not in e:
            continue
        key = (e.get("pid"), e.get("tid"))
        if key not in tracks:
            process = processes.get(key[0], str(key[0]))
            kind = _track_kind(process, threads.get(key, ""))
            if kind is None:
                continue
            tracks[key] = Track(name=threads.get(key, f"thread {key[1]}"), kind=kind,
                                process=process)
        track = tracks.get(key)
        if track is None:
            continue
        track.events.append(Event(str(e.get("name", "")), float(e["ts"]), float(e.get("dur", 0.0)),
                                  dict(e.get("args") or {})))

    ordered = sorted(tracks.values(), key=_track_order)
    origin = min((ev.start_us for t in ordered for ev in t.events), default=0.0)
    for t in ordered:
        for ev in t.events:
            ev.start_us -= origin
        t.sort()
    device = any(t.kind in ("device_ops", "device_stream") and t.events for t in ordered)
    timeline = Timeline(tracks=ordered, source="device" if device else "host",
                        meta={"origin_us": origin})
    timeline.measured = _measured_region(ordered)
    timeline.meta["iterations"] = sum(1 for t in ordered for ev in t.events
                                      if ev.name.startswith(ITERATION))
    return timeline


def _track_kind(process: str, thread: str) -> str | None:
    if process.startswith("/device:"):
        line = thread.strip().lower()
        if line.startswith("stream"):
            return "device_stream"
        return _DEVICE_LINES.get(line, "device_other")
    if process.startswith("/host:CPU"):
        return "host_thread"
    return None  # metadata planes, task environment


def _track_order(t: Track) -> tuple[int, str, str]:
    rank = {"device_ops": 0, "device_stream": 1, "device_modules": 2, "steps": 3,
            "device_other": 4, "host_thread": 5}
    return (rank.get(t.kind, 9), t.process, t.name)


def _measured_region(tracks: Iterable[Track]) -> tuple[float, float] | None:
    spans = [(e.start_us, e.end_us) for t in tracks if t.kind == "host_thread"
             for e in t.events if e.name == MEASURED]
    if not spans:
        return None
    return (min(s[0] for s in spans), max(s[1] for s in spans))


# -- what the tables and the integrity check read --------------------------------------

def op_kinds(timeline: Timeline) -> tuple[str, ...]:
    """The tracks holding device ops: ``XLA Ops`` lines, else (GPU) the CUDA streams."""
    if any(t.events for t in timeline.tracks_of("device_ops")):
        return ("device_ops",)
    return ("device_stream",)


def is_pallas_event(event: Event, kernel_names: Iterable[str] = ()) -> bool:
    """A device op event that is a Pallas kernel (Mosaic TPU, Mosaic GPU or Triton call)."""
    long_name = str(event.args.get("long_name", ""))
    hlo_op = str(event.args.get("hlo_op", ""))
    name = event.name
    lowered = (name + " " + long_name).lower()
    if "tpu_custom_call" in lowered or "mosaic" in lowered or "triton" in lowered:
        return True
    names = set(kernel_names)
    for candidate in (name, hlo_op):
        base = re.sub(r"(\.\d+)+$", "", candidate)
        if base == "pallas_call" or (base and base in names):
            return True
    return False


def pallas_share(timeline: Timeline, kernel_names: Iterable[str] = ()) -> dict[str, Any]:
    """Share of device op time (inside the measured region) spent in Pallas kernels."""
    names = list(kernel_names)
    if timeline.source != "device":
        return {"value": None, "pallas_ms": None, "device_ms": None, "kernels": {},
                "basis": None,
                "reason": "no device plane: on a CPU host the TPU kernel runs in interpret "
                          "mode as many host ops, so no device time can be attributed to it"}
    kinds = op_kinds(timeline)
    device_us = timeline.busy_us(kinds)
    pallas_us = timeline.busy_us(kinds, lambda e: is_pallas_event(e, names))
    per_kernel: dict[str, float] = {}
    region = timeline.region or (0.0, 0.0)
    for t in timeline.tracks_of(*kinds):
        for e in t.events:
            if e.end_us > region[0] and e.start_us < region[1] and is_pallas_event(e, names):
                per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.dur_us / 1e3
    return {
        "value": (pallas_us / device_us) if device_us else None,
        "pallas_ms": pallas_us / 1e3,
        "device_ms": device_us / 1e3,
        "kernels": per_kernel,
        "basis": ("device XLA Ops time" if kinds == ("device_ops",) else
                  "device stream (kernel) time") + " in the measured region",
        "reason": None if device_us else "no device ops inside the measured region",
    }


def top_ops(timeline: Timeline, limit: int = 15) -> list[dict[str, Any]]:
    """The op table: device ops by name, or on a CPU host XLA ops folded by family."""
    if timeline.source == "device":
        rows = timeline.op_summary(op_kinds(timeline), group="name", limit=limit)
    else:
        rows = timeline.op_summary(("host_thread",), is_op=lambda e: "hlo_op" in e.args,
                                   group="family", limit=limit)
    return [r.to_json() for r in rows]


def module_times(timeline: Timeline) -> dict[str, Any]:
    """Per-iteration time: device module executions, or host iteration annotations."""
    region = timeline.region
    if region is None:
        return {"count": 0, "mean_ms": None, "basis": None}
    if timeline.source == "device":
        durs = [e.dur_us for t in timeline.tracks_of("device_modules") for e in t.events
                if e.end_us > region[0] and e.start_us < region[1]]
        basis = "device XLA Modules events"
    else:
        durs = [e.dur_us for t in timeline.tracks_of("host_thread") for e in t.events
                if e.name.startswith(ITERATION)]
        basis = "host wall time per iteration (profiler on)"
    if not durs:
        return {"count": 0, "mean_ms": None, "basis": basis}
    durs.sort()
    return {"count": len(durs), "mean_ms": sum(durs) / len(durs) / 1e3,
            "median_ms": durs[len(durs) // 2] / 1e3, "basis": basis}
