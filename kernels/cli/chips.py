"""``tilewright chips [--json]``: the chips a kernel can be compiled and estimated for.

For each TPU generation: its peak, HBM bandwidth, VMEM (capacity and the default scoped
limit a kernel gets), the clock cycles are turned into time at, whether libtpu's static
estimator gives a figure for it (the number that ranks kernels off-TPU) or the chip only
compiles (verdicts, VMEM, Mosaic's refusals), and how many public measurements back the
estimates on it (``kernels/data/fidelity.json``). App side: no JAX here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import textwrap
from pathlib import Path
from typing import Any

from tilewright.kernels.cli import subcommand
from tilewright.profiling.chips import CHIPS, DEFAULT_TPU, SLOWEST_CLOCK_HZ, estimator_refusal

SCHEMA = "tilewright.chips/1"
FIDELITY = Path(__file__).resolve().parents[1] / "data" / "fidelity.json"  # kernels/data


def register(sub: argparse._SubParsersAction) -> None:
    parser = subcommand(
        sub, "chips", "list the TPU generations: which estimate, which only compile", run)
    parser.add_argument("--json", action="store_true", help=f"print {SCHEMA}")


def facts() -> list[dict[str, Any]]:
    """One record per TPU generation of the chip table."""
    measured = _measured_rows()
    rows = []
    for chip in CHIPS.values():
        if chip.kind != "tpu":
            continue
        refusal = estimator_refusal(chip.name)
        rows.append({
            "chip": chip.name, "name": chip.label, "default": chip.name == DEFAULT_TPU,
            "bf16_tflops": chip.bf16_flops / 1e12, "hbm_gb_s": chip.hbm_bytes_per_s / 1e9,
            "vmem_mib": chip.vmem_bytes / (1 << 20),
            "scoped_vmem_mib": chip.scoped_vmem_bytes / (1 << 20),
            "clock_ghz": chip.clock_hz / 1e9 if chip.clock_hz else None,
            "compiles": True, "estimates": refusal is None, "why_not": refusal,
            "measured_rows": measured.get(chip.name, {}),
            "note": chip.note or None,
        })
    return rows


def _measured_rows() -> dict[str, dict[str, int]]:
    """Public measurements per chip and class of program in the shipped fidelity record."""
    try:
        table = json.loads(FIDELITY.read_text())
    except (OSError, ValueError):
        return {}
    out: dict[str, dict[str, int]] = {}
    for chip, data in (table.get("chips") or {}).items():
        classes = (data or {}).get("compiler") or {}
        out[chip] = {k: int(v.get("rows") or 0) for k, v in classes.items()
                     if k != "all" and isinstance(v, dict)}
    return out


def run(args: argparse.Namespace) -> int:
    """List the TPU generations tilewright compiles for (--chip): peak, HBM bandwidth, VMEM,
    and whether the TPU compiler's static estimate (what ranks kernels off-TPU) is available
    for each, or why only the compile verdict is."""
    rows = facts()
    width = max(40, min(shutil.get_terminal_size((100, 24)).columns, 100))

    def say(text: str) -> None:
        print(textwrap.fill(text, width, initial_indent="  ", subsequent_indent="    ",
                            break_long_words=False, break_on_hyphens=False))

    if args.json:
        print(json.dumps({"schema": SCHEMA, "chips": rows}, indent=2))
        return 0
    for r in rows:
        head = f"{r['chip']}{' (default off-TPU)' if r['default'] else ''}: {r['name']}"
        clock = f", clock {r['clock_ghz']:g} GHz" if r["clock_ghz"] else ", clock unknown"
        print(head)
        say(f"{r['bf16_tflops']:,.0f} TFLOP/s bf16, HBM {r['hbm_gb_s']:,.0f} GB/s, "
            f"VMEM {r['vmem_mib']:g} MiB (scoped default {r['scoped_vmem_mib']:g} MiB)"
            f"{clock}")
        if r["estimates"]:
            measured = r["measured_rows"]
            backing = (", ".join(f"{k.replace('_', '-')} {n}" for k, n in measured.items())
                       or "none yet")
            seconds = "" if r["clock_ghz"] else (
                " (cycles only: no clock to turn them into time; memory floors and XLA's "
                f"roofline are counted at {SLOWEST_CLOCK_HZ / 1e9:g} GHz, a clock no TPU runs "
                "below)")
            say(f"compiles and estimates{seconds}; public measurements: {backing}")
        else:
            say(f"compiles only (VMEM, Mosaic, verdicts): {r['why_not']}")
    return 0
