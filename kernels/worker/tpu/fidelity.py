"""How far the estimate can be trusted: the program's class and the measured record.

The TPU compiler's static estimate has been compared with public device-time
measurements (``benchmarks/estimates/estimate_fidelity.py``: upstream JAXBench's v6e-1 times, the
Pallas TPU matmul guide's v5e times, and the user's own ``tilewright calibrate`` pairs).
How good it is depends on the kind of program: compute-bound matmuls land within a few
percent, memory-bound and manually-DMAing programs come out several times too fast
(the estimator prices HBM traffic at ~0 and counts data-dependent loops as not run).
So every estimate carries ``tpu.fidelity``: the program's class and, for the chip,
what the benchmark measured for that class (median ratio estimate / measured, the share
within 2x, how many rows, the source), read from ``kernels/data/fidelity.json`` (the
benchmark's last run, shipped with the package) plus the user's calibration file.
On v7x, which has no published clock and so no estimated seconds to compare, it also
carries ``speedups``: the estimated speedups against tokamax's measured ones
(``benchmarks/estimates/tokamax_v7x.py --write``).

Classes (``program_class``): ``collective`` (all-reduce and kin), ``grouped_matmul``
(the reference is a ragged dot: an MoE layer's matmul, measured against tokamax's TPU
times), ``convolution`` (the reference convolves: the estimator prices XLA's convolutions
erratically: 0.22 and 3.4 of two references' device times on a v5e, and a kernel's
program with them), ``pallas_manual_dma``
(a kernel with memory_space=ANY operands or scalar-prefetch-indexed blocks),
``gather_scatter`` (the reference gathers or scatters), else ``compute_bound`` or
``memory_bound`` by the reference's FLOP per byte against the chip's ridge point for
the inputs' dtype.

The memory floor (``kernel_traffic``, ``floor``, ``floored_speedup``) bounds what the
estimate may claim: the seconds the bytes that must cross between HBM and the chip take
at the chip's bandwidth, for the kernel's program (every input and output once, and
what its blocks re-read) and for the reference (every input and output once: its
compulsory bytes); a speedup is the ratio of the larger of estimate and floor on each
side, and the kernel's time that orders candidates (``kernel_time``) is the larger of its
estimate and its floor. Pure data: no JAX here.
"""

from __future__ import annotations

import json
import math
import os
from functools import cache
from pathlib import Path
from typing import Any

from tilewright.kernels.pool.env import CALIBRATION

TABLE = Path(__file__).resolve().parents[2] / "data" / "fidelity.json"  # kernels/data
CALIBRATION_ENV = CALIBRATION  # the user's calibration pairs (JSON lines)
CLASSES = ("compute_bound", "memory_bound", "pallas_manual_dma", "gather_scatter",
           "collective", "grouped_matmul", "convolution")
_COLLECTIVES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                "collective-permute"}


def program_class(reference_cost: dict[str, Any] | None,
                  reference_opcodes: dict[str, int] | None,
                  kernel_opcodes: dict[str, int] | None, plans: list[dict[str, Any]],
                  dtype: str | None, chip: str, convolves: bool = False) -> str | None:
    """The class of a program (see the module docstring); None when nothing is known.
    ``convolves``: the reference, as written, has a convolution (the compiled opcodes
    cannot say: compiled for a TPU, XLA writes many dots as convolutions)."""
    ops = {**(reference_opcodes or {}), **(kernel_opcodes or {})}
    if _COLLECTIVES & set(ops):
        return "collective"
    if any(str(op).startswith(("ragged-dot", "ragged_dot")) for op in reference_opcodes or {}):
        return "grouped_matmul"  # an MoE layer's matmul: tokamax's measured v5e pairs
    if convolves:
        return "convolution"  # XLA's convolutions: priced at 0.22 and 3.4 of two v5e times
    if any(p.get("data_dependent") for p in plans):
        return "pallas_manual_dma"
    if {"gather", "scatter"} & set(reference_opcodes or {}):
        return "gather_scatter"
    cost = reference_cost or {}
    from tilewright.profiling.chips import bound_by, get_chip

    try:
        spec = get_chip(chip)
    except KeyError:
        return None
    side = bound_by(spec, cost.get("flops"), cost.get("bytes_accessed"),
                    dtype in ("float32", "f32"))
    return f"{side}_bound" if side else None


@cache
def _table() -> dict[str, Any]:
    try:
        return json.loads(TABLE.read_text())
    except (OSError, ValueError):
        return {}


def efficiency(chip: str) -> float:
    """The share of the chip's HBM bandwidth the memory floor assumes: 1.0 (the physical
    bound) unless the shipped table carries a measured one for the chip."""
    value = (_table().get("efficiency") or {}).get(chip)
    return float(value) if isinstance(value, int | float) and 0 < value <= 1 else 1.0


def _calibration(chip: str, klass: str) -> list[float]:
    """The user's own estimate/measured ratios for the chip and class (calibrate)."""
    path = os.environ.get(CALIBRATION_ENV)
    if not path:
        return []
    ratios = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if row.get("chip") == chip and row.get("class") == klass and \
                        isinstance(row.get("ratio"), int | float) and row["ratio"] > 0:
                    ratios.append(float(row["ratio"]))
    except OSError:
        return []
    return ratios


def lookup(chip: str, klass: str | None, basis: str | None = None) -> dict[str, Any] | None:
    """What the record says of estimates for ``klass`` on ``chip`` (with the memory
    floor when ``basis`` is memory_floor): ``{class, chip, median_ratio, within_2x,
    rows, source, note}``; the nearest measured chip when this one has no rows."""
    if klass is None:
        return None
    table = _table()
    chips = table.get("chips") or {}
    key = "with_floor" if basis in ("memory_floor", "roofline") else "compiler"
    found, measured_on = None, chip
    if klass in ((chips.get(chip) or {}).get(key) or {}):
        found = chips[chip][key][klass]
    else:
        for other, data in chips.items():
            if klass in (data.get(key) or {}):
                found, measured_on = data[key][klass], other
                break
    own = _calibration(chip, klass)
    # a chip measured only as speedups (v7x: no published clock, so no seconds to
    # compare): estimated speedups against measured ones, whatever the class
    speedups = (table.get("speedups") or {}).get(chip)
    if found is None and not own:
        out = {"class": klass, "chip": chip, "median_ratio": None, "within_2x": None,
               "rows": 0, "source": table.get("source"),
               "note": "no public measurement of this class of program"}
        if speedups:
            out["speedups"] = speedups
        return out
    out = {"class": klass, "chip": measured_on, **(found or {}),
           "source": table.get("source")}
    if speedups:
        out["speedups"] = speedups
    if measured_on != chip:
        out["note"] = f"measured on {measured_on}; no measurement for {chip}"
    if own:
        import statistics

        out["calibration"] = {"rows": len(own),
                              "median_ratio": round(statistics.median(own), 3),
                              "within_2x": round(sum(0.5 <= r <= 2 for r in own) / len(own), 3)}
    return out


# -- the memory floor -------------------------------------------------------------------------

FLOOR_SOURCE = ("bytes that must cross between HBM and the chip (inputs and outputs once, "
                "plus the kernel's block re-reads) / the chip's HBM bandwidth")


def kernel_traffic(plans: list[dict[str, Any]]) -> tuple[int, bool]:
    """Bytes the Pallas kernels move between HBM and VMEM over their grids, and whether
    that count is complete. A block is fetched (or written back) whenever its index
    changes between consecutive steps: over a row-major grid, once per distinct prefix
    of the axes up to the innermost one it follows (an index that follows no axis: once).
    Blocks of manually copied (``memory_space=ANY``) or scalar-prefetch-indexed operands
    move data-dependent amounts: not counted (the count is then incomplete)."""
    total, complete = 0, True
    for plan in plans:
        grid = [int(g) for g in plan.get("grid") or []]
        for block in plan.get("blocks") or []:
            follows = block.get("follows")
            if block.get("manual") or follows is None:
                complete = False
                continue
            last = max(follows) if follows else -1
            fetches = math.prod(grid[:last + 1]) if last >= 0 else 1
            total += fetches * int(block.get("block_bytes") or 0)
    return total, complete


def floor(chip: str, kernel_bytes: float, reference_bytes: float | None,
          efficiency: float = 1.0) -> dict[str, Any] | None:
    """The memory system's floor for the kernel's program and for the reference: the
    seconds their bytes take at the chip's HBM bandwidth (times ``efficiency``, the share
    of it a program achieves: 1.0, the physical bound, unless measured)."""
    from tilewright.profiling.chips import get_chip

    try:
        bandwidth = get_chip(chip).hbm_bytes_per_s * efficiency
    except KeyError:
        return None
    if bandwidth <= 0:
        return None
    return {"kernel_s": kernel_bytes / bandwidth, "kernel_bytes": int(kernel_bytes),
            "reference_s": reference_bytes / bandwidth if reference_bytes else None,
            "reference_bytes": int(reference_bytes) if reference_bytes else None,
            "bandwidth_bytes_per_s": bandwidth, "efficiency": efficiency,
            "source": FLOOR_SOURCE}


def kernel_time(kernel: dict[str, Any], found: dict[str, Any] | None) -> float | None:
    """The kernel's time at the production shape that orders candidates: the larger of
    the compiler's estimate and the kernel's memory floor (seconds; None on a chip the
    table has no clock for)."""
    seconds = kernel.get("seconds")
    if not seconds:
        return None
    return max(float(seconds), float((found or {}).get("kernel_s") or 0.0))


def roofline_floor(roofline: dict[str, Any] | None) -> float | None:
    """The reference's roofline as a floor under its estimate, where its peak is known:
    bf16 FLOPs at the chip's published peak. An f32 roofline's peak is a guess (a third
    of bf16's, where XLA may run an f32 product as one bf16 pass): no floor from it."""
    if not roofline or roofline.get("dtype") != "bf16" or roofline.get("peak_estimated"):
        return None
    seconds = roofline.get("seconds")
    return float(seconds) if seconds else None


def floored_speedup(kernel: dict[str, Any], reference: dict[str, Any],
                    found: dict[str, Any] | None, reference_roofline_s: float | None = None
                    ) -> tuple[float, str]:
    """(speedup, basis): the reference's time over the kernel's, each the larger of the
    compiler's estimate and its memory floor, the reference's also at least its roofline
    (its FLOPs at the chip's peak: no program computing it is faster); ``basis`` says
    which decided: ``compiler`` when no floor is above its estimate, ``roofline`` when
    the reference's roofline is (an XLA convolution of 18k's on v5e was estimated at
    2.2x below its FLOPs at peak), else ``memory_floor``. On a chip without a clock the
    same, in cycles, the floors at ``profiling.chips.SLOWEST_CLOCK_HZ`` (v7x: XLA's
    normalization over the leading axis of bf16[128,384,384] is priced at 235 cycles,
    three of its five fusions at 0; its bytes need 8,700 cycles at 0.85 GHz, and tokamax
    measured 58 us)."""
    if not found:
        return reference["cycles"] / kernel["cycles"], "compiler"
    k_s, r_s = kernel.get("seconds"), reference.get("seconds")
    if k_s is None or r_s is None:  # no clock: compare cycles, floors at the slowest clock
        from tilewright.profiling.chips import SLOWEST_CLOCK_HZ

        k_s, r_s = kernel["cycles"] / SLOWEST_CLOCK_HZ, reference["cycles"] / SLOWEST_CLOCK_HZ
    k = max(k_s, found.get("kernel_s") or 0.0)
    r = max(r_s, found.get("reference_s") or 0.0)
    if reference_roofline_s and reference_roofline_s > r:
        return reference_roofline_s / k, "roofline"
    basis = "memory_floor" if (k > k_s or r > r_s) else "compiler"
    return r / k, basis
