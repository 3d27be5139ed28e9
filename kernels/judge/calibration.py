"""The user's calibration pairs: the TPU compiler's estimate beside measured device time.

``tilewright calibrate`` (``kernels.cli.calibrate``) evaluates kernels on a TPU host and
records, per program (the kernel and its XLA reference), the estimate and the time
measured, for that chip, in ``<user data dir>/calibration.jsonl``. The worker pool
makes that file readable to the judge (``kernels.pool.workers``), whose ``tpu.fidelity``
reports the user's own figures beside the public ones (``kernels.worker.tpu.fidelity``).
App side: no JAX here.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

FILENAME = "calibration.jsonl"


def calibration_path() -> Path:
    """``<user data dir>/calibration.jsonl`` (``$TILEWRIGHT_DATA_DIR`` when set, as for
    sessions and lessons)."""
    import os

    env = os.environ.get("TILEWRIGHT_DATA_DIR")
    if env:
        return Path(env).expanduser() / FILENAME
    from platformdirs import user_data_dir

    return Path(user_data_dir("tilewright")) / FILENAME


def pairs(task_name: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    """The (estimate, measurement) pairs one evaluation on a TPU gives: the kernel's
    and the XLA reference's, when both were estimated and timed."""
    tpu = result.get("tpu") or {}
    timing = result.get("timing") or {}
    backend = result.get("backend") or {}
    if result.get("status") != "correct" or backend.get("platform") != "tpu" \
            or backend.get("mode") != "native":
        return []
    fidelity = tpu.get("fidelity") or {}
    when = datetime.date.today().isoformat()
    found = []
    for program, estimate, measured_ms in (
            ("kernel", tpu.get("estimate"), timing.get("median_ms")),
            ("reference", tpu.get("reference_estimate"), timing.get("baseline_median_ms"))):
        seconds = (estimate or {}).get("seconds")
        if not seconds or not measured_ms:
            continue
        measured = float(measured_ms) / 1e3
        found.append({"chip": tpu.get("chip"), "task": task_name, "program": program,
                      "class": fidelity.get("class"), "shape": tpu.get("shape_label"),
                      "estimate_s": seconds, "measured_s": measured,
                      "ratio": seconds / measured, "method": timing.get("method"),
                      "device_kind": backend.get("device_kind"), "date": when})
    return found


def record(rows: list[dict[str, Any]], path: Path | None = None) -> Path:
    path = path or calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path
