"""Fidelity rows from a lent chip: what ``measure_on_chip.py`` measured beside what the
offline search estimated for the same programs, appended to
``benchmarks/data/estimate_fidelity_rows.json`` as source ``v5e_lent``
(``estimate_fidelity.py --rows ... --write`` then recomputes the shipped figures).

The kernels' estimates are the search's own (``jaxbench_offline.py --json``: each task's
crowned rank holds the kernel's estimated seconds at production, and its class); the
measured rows are device-profiled on the chip (``status == "measured"``: every input
set checked against the reference first). A kernel already in the rows (the same
workload and variant) is left as it is. The XLA references are not taken from the
search (its record may predate how the judge prices them now):
``lent_references.py`` estimates them again.

    python benchmarks/estimates/lent_rows.py MEASURED.jsonl OFFLINE.json --kernels DIR [--write]

``--kernels``: the task directories the measured kernels were read from, for each
kernel's block sizes (its ``BLOCK_M/N/K``), which name the variant. ``--smoke``: the
rows this repository keeps (``v5e_searched_2026-12-06.jsonl`` beside the search's JSON),
printed, nothing written.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository
ROWS = ROOT / "benchmarks" / "data" / "estimate_fidelity_rows.json"
CHIPS = {"TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v6 lite": "v6e", "TPU v6e": "v6e"}


def blocks(path: Path) -> str | None:
    """``BLOCK_M x BLOCK_N x BLOCK_K`` as the kernel sets them, or None."""
    try:
        text = path.read_text()
    except OSError:
        return None
    found = dict(re.findall(r"^BLOCK_([MNK]) = (\d+)", text, re.M))
    return "x".join(found[k] for k in "MNK") if len(found) == 3 else None


def rows_from(measured: list[dict[str, Any]], offline: Any,
              kernels: Path | None) -> list[dict[str, Any]]:
    """One row for each measured kernel, estimated by the search's crowned rank; kernels
    measured wrong or not at all are left out.
    ``offline``: one suite's results or a list of them, as ``--json`` writes."""
    suites = offline if isinstance(offline, list) else [offline]
    ranks = {r["task"]: r.get("best_rank") or {} for s in suites for r in s.get("rows", [])}
    out: list[dict[str, Any]] = []
    for m in measured:
        rank = ranks.get(m["task"])
        if m.get("status") != "measured" or not rank or not rank.get("kernel_s"):
            continue
        chip = CHIPS.get(m.get("chip", ""), m.get("chip"))
        if chip != rank.get("chip"):
            continue  # measured on another chip than the one estimated
        tiles = blocks(kernels / m["task"] / m["kernel"]) if kernels else None
        vmem = rank.get("vmem_bytes")
        label = "searched" + (f", blocks {tiles}" if tiles else "") + (
            f", {vmem / 2**20:.1f} MiB VMEM" if vmem else "")
        common = {"source": "v5e_lent", "chip": chip, "workload": m["task"],
                  "method": "scaled" if rank.get("derived") else "compiled", "bytes": None,
                  "flops": None, "class": (rank.get("fidelity") or {}).get("class"),
                  "why": None,
                  "incomplete": False, "shape": m.get("shape")}
        out.append({**common, "program": f"{m['task']} ({label})",
                    "variant": label.replace("searched, ", "searched ", 1),
                    "measured_s": m["kernel_ms"] / 1e3, "estimate_s": rank["kernel_s"]})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measured", type=Path, nargs="?",
                        help="measure_on_chip.py's JSON lines")
    parser.add_argument("offline", type=Path, nargs="?", help="jaxbench_offline.py's --json")
    parser.add_argument("--kernels", type=Path, help="the measured kernels' task dirs")
    parser.add_argument("--write", action="store_true", help=f"append to {ROWS.name}")
    parser.add_argument("--smoke", action="store_true", help="the kept rows, nothing written")
    args = parser.parse_args(argv)
    if args.smoke:
        data = ROOT / "benchmarks" / "data"
        args.measured = data / "v5e_searched_2026-12-06.jsonl"
        args.offline = data / "jaxbench_offline_gemm_v5e_2026-12-06.json"
        args.write = False
    if args.measured is None or args.offline is None:
        parser.error("give MEASURED.jsonl and OFFLINE.json (or --smoke)")
    measured = [json.loads(line) for line in args.measured.read_text().splitlines()
                if line.strip()]
    new = rows_from(measured, json.loads(args.offline.read_text()), args.kernels)
    stored = json.loads(ROWS.read_text())
    have = {(r["source"], r["workload"], r["variant"]) for r in stored}
    added = [r for r in new if (r["source"], r["workload"], r["variant"]) not in have]
    for r in new:
        print(f"{r['program'][:64]:<64} meas. {r['measured_s'] * 1e3:7.3f} ms  est. "
              f"{r['estimate_s'] * 1e3:7.3f} ms  {r['estimate_s'] / r['measured_s']:.3f}"
              + ("" if r in added else "  (already stored)"))
    if args.write and added:
        ROWS.write_text(json.dumps(stored + added, indent=1) + "\n")
    print(f"{len(added)} new rows" + (" written" if args.write else " (not written)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
