"""On a TPU host: each program measured on the chip beside its off-TPU estimate.

For every bundled task (its starting kernel) and every task named on the command line
(a JAXBench, MaxKernel or native task directory, ``DIR`` or ``DIR:KERNEL.py``; without a
kernel the task's own starting kernel, or for JAXBench its baseline run as the kernel),
one ``estimate`` request to a worker on this host: the production program is compiled
for the chip, estimated by the TPU compiler (the number that ranks kernels off a TPU),
and run on the chip by the judge, which holds it (device time from the profiler's
device plane, or pipelined calls where no trace can be had: the method is printed).
Printed per program: the XLA reference and the kernel as measured and as estimated, the
estimate over the measurement for each, and the speedup both ways, with the chip, the
shape and the date.

    python benchmarks/on_chip/on_tpu.py [DIR[:KERNEL] ...] [--only gelu softmax] [--json OUT]

Off a TPU it still runs (``--allow-cpu``): the estimates only, each measured column
saying why it is empty; without ``--allow-cpu`` it says it needs a TPU host and exits 2.

``--smoke``: gelu with its production shape shrunk to 256x1024, on whatever host this
is (off a TPU: the estimate alone): that it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

from tilewright.kernels.judge.options import EvalOptions
from tilewright.kernels.pool import local_tpu_chips
from tilewright.kernels.pool.workers import WorkerPool
from tilewright.kernels.tasks.loaders import bundled_names, load_task


def _ms(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _seconds_ms(section: Any) -> float | None:
    if not isinstance(section, dict):
        return None
    seconds = section.get("seconds")
    return float(seconds) * 1e3 if isinstance(seconds, int | float) else None


def row(name: str, reply: dict[str, Any], on_tpu: bool) -> dict[str, Any]:
    """One program's figures from an ``estimate`` reply (``on_tpu``: this host has a
    chip, so a missing measurement has another reason than no TPU)."""
    tpu = reply.get("tpu") or {}
    measured = tpu.get("measured") or {}
    kernel_est = _seconds_ms(tpu.get("estimate"))
    ref_est = _seconds_ms(tpu.get("reference_estimate"))
    kernel_ms, ref_ms = _ms(measured.get("median_ms")), _ms(measured.get("baseline_median_ms"))
    return {
        "task": name, "status": reply.get("status"), "chip": tpu.get("chip"),
        "shape": " ".join(str(x) for x in (tpu.get("shape"), tpu.get("input_shapes")
                                            or measured.get("shape_label")) if x),
        "method": measured.get("method"),
        "why_not_measured": measured.get("unavailable")
        or (None if kernel_ms is not None else
            f"not measured: the estimate's status was {reply.get('status')}" if on_tpu
            else "no TPU on this host"),
        "reference_ms": ref_ms, "reference_est_ms": ref_est,
        "reference_est_over_measured": ref_est / ref_ms if ref_est and ref_ms else None,
        "kernel_ms": kernel_ms, "kernel_est_ms": kernel_est,
        "kernel_est_over_measured": kernel_est / kernel_ms if kernel_est and kernel_ms else None,
        "speedup_measured": ref_ms / kernel_ms if ref_ms and kernel_ms else None,
        "speedup_estimated": tpu.get("estimated_speedup"),
        "error": (reply.get("error") or {}).get("message"),
    }


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def print_table(rows: list[dict[str, Any]], chip: str, when: str) -> None:
    print(f"on_tpu: {chip}, {when}; ms per call (measured: device time unless the method "
          "says otherwise); est/meas = estimate over measurement")
    head = ("task", "method", "ref ms", "ref est", "est/meas", "kernel ms", "kernel est",
            "est/meas", "speedup", "est. speedup")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([
            r["task"], _fmt(r["method"]), _fmt(r["reference_ms"]), _fmt(r["reference_est_ms"]),
            _fmt(r["reference_est_over_measured"], 2), _fmt(r["kernel_ms"]),
            _fmt(r["kernel_est_ms"]), _fmt(r["kernel_est_over_measured"], 2),
            _fmt(r["speedup_measured"], 2), _fmt(r["speedup_estimated"], 2)]))
        said = r["error"] or r["why_not_measured"]
        if said:
            print(f"    {r['task']}: {r['status']}: {said[:300]}")
        if r["shape"]:
            print(f"    {r['task']}: shape {r['shape']}")


def targets(args: argparse.Namespace) -> list[tuple[str, Any, str]]:
    """(name, task, kernel source) for the bundled tasks and the named directories."""
    found = []
    names = args.only or bundled_names()
    if not args.no_bundled:
        for name in names:
            task = load_task(name)
            if task.kernel_path is not None and Path(task.kernel_path).is_file():
                found.append((name, task, Path(task.kernel_path).read_text()))
    for item in args.tasks:
        directory, _, kernel = item.partition(":")
        task = load_task(directory)
        path = Path(kernel) if kernel else task.kernel_path
        if path is None or not Path(path).is_file():
            if task.layout == "jaxbench":  # the baseline judged as its own kernel
                path = Path(directory) / "baseline.py"
            else:
                print(f"{item}: no kernel (name one: DIR:KERNEL.py)", file=sys.stderr)
                continue
        found.append((Path(directory).name, task, Path(path).read_text()))
    return found


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", nargs="*", help="task directories, DIR or DIR:KERNEL.py")
    parser.add_argument("--only", nargs="*", help="these bundled tasks only")
    parser.add_argument("--no-bundled", action="store_true", help="only the named tasks")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run without a TPU: estimates only")
    parser.add_argument("--json", help="write the rows as JSON here")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--smoke", action="store_true", help="one small gelu: that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.allow_cpu, args.no_bundled = True, True
    if not local_tpu_chips() and not args.allow_cpu:
        print("on_tpu: this host has no TPU chip; run it on a TPU VM (or --allow-cpu for "
              "the estimates alone)", file=sys.stderr)
        return 2
    when = datetime.date.today().isoformat()
    rows = []
    found = targets(args)
    if args.smoke:
        from tilewright.kernels.tasks.loaders import PRODUCTION_PREFIX

        task = load_task("gelu", {f"{PRODUCTION_PREFIX}rows": "256",
                                  f"{PRODUCTION_PREFIX}cols": "1024"})
        found = [("gelu 256x1024", task, Path(task.kernel_path).read_text())]
    async with WorkerPool(size=1) as pool:
        backend = await pool.backend()
        chip = (backend.device_kind if backend.platform == "tpu"
                else f"no TPU ({backend.platform} host)")
        for name, task, source in found:
            reply = await pool.estimate(task, source, EvalOptions(timeout_s=args.timeout))
            rows.append(row(name, reply, backend.platform == "tpu"))
            print(f"  {name}: {reply.get('status')}", file=sys.stderr, flush=True)
    print_table(rows, chip, when)
    if args.json:
        Path(args.json).write_text(json.dumps({"chip": chip, "date": when, "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(asyncio.run(main()))
