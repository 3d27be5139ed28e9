"""How numbers read on screen, the same in every pane."""

from __future__ import annotations

from typing import Any


def format_speedup(value: Any) -> str:
    """1.42x, 0.87x; interpret-mode ratios far below 1 keep three significant digits."""
    if not isinstance(value, int | float):
        return "—"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.3g}x"


def format_mib(value: Any) -> str:
    return f"{value / 2**20:.1f}" if isinstance(value, int | float) else "?"


def format_vmem(used: Any, limit: Any) -> str:
    """"VMEM 2.0/16.0 MiB": what the TPU compiler allocated of the chip's scoped limit."""
    if not isinstance(used, int | float):
        return ""
    if not isinstance(limit, int | float):
        return f"VMEM {format_mib(used)} MiB"
    return f"VMEM {format_mib(used)}/{format_mib(limit)} MiB"


def format_rank(source: str | None, label: str | None, value: Any,
                short: bool = False) -> str:
    """How a ranking number reads: an estimate always says "est." and whose estimate,
    a measurement says "measured", and interpret-mode time on a CPU host is a "host
    sim." ratio, never a speedup. ``source``/``label`` come from
    ``kernels.result.ranking`` (None in logs older than the TPU compile)."""
    if source is None or not label:
        return format_speedup(value)
    if not short:
        return label
    if source == "tpu_estimate":
        return f"est. {format_speedup(value)}"
    if source == "device_time":
        return f"{format_speedup(value)} meas."
    if source == "host_simulation":
        return f"host sim {value:.3g}" if isinstance(value, int | float) else "host sim"
    if source == "disqualified":
        return "not ranked"
    return "—"
