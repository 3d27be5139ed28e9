"""tokamax's measured TPU times, read from its wheel (never copied into this repository).

Google's kernel library tokamax ships, under ``tokamax/data/autotuning/<chip>/<op>.json``,
what its autotuner measured on real TPUs: per input spec (the JSON key: shapes, dtypes,
group sizes, ...) and per config (tile sizes, buffering), ``evaluation_times_ms``. For an
op with a Pallas implementation and an XLA one (``pallas_mosaic_tpu_ragged_dot`` and
``ragged_dot``), the specs timed for both are a measured speedup of a shipped Pallas
kernel over XLA on that chip: what ``benchmarks/estimates/estimate_fidelity.py --tokamax`` checks
the TPU compiler's estimates against.

``pairs(root)`` reads them: each ``Pair`` carries its provenance (wheel version, files,
spec, the fastest config) so a row can be traced back to the wheel. ``root`` is an
installed tokamax package directory or an extracted wheel (``tokamax/`` inside it);
``find()`` locates the installed one without importing it (tokamax's import needs
flax and qwix).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Our chip names for tokamax's folder names (``jax.devices()[0].device_kind`` slugs).
CHIP_DIRS = {"tpu_v5_lite": "v5e", "tpu_v6_lite": "v6e", "tpu_v5": "v5p", "tpu7x": "v7x"}
# Pallas op file -> the XLA op file it is measured against, and what it computes.
OPS = {
    "pallas_mosaic_tpu_ragged_dot": ("ragged_dot", "grouped matmul"),
    "pallas_mosaic_tpu_flash_attention": ("dot_product_attention", "attention"),
    "pallas_mosaic_tpu_flash_attention_vjp": ("dot_product_attention_vjp",
                                              "attention backward"),
    "pallas_mosaic_tpu_linear_softmax_cross_entropy_loss": (
        "linear_softmax_cross_entropy_loss", "fused loss"),
    "pallas_mosaic_tpu_linear_softmax_cross_entropy_loss_vjp": (
        "linear_softmax_cross_entropy_loss_vjp", "fused loss backward"),
}
# XLA ops tokamax times on a TPU with no Pallas TPU kernel beside them: a program's
# estimate can only be held against its own measured time (its implied clock).
XLA_ONLY = {"normalization": "normalization", "normalization_vjp": "normalization backward"}
_ARRAY = re.compile(r"^([a-z]+\d*)\[([\d,]*)\]$")


@dataclass(frozen=True)
class Timed:
    """One op's fastest measured config for one spec."""

    config: dict[str, Any]
    median_ms: float
    times_ms: tuple[float, ...]


@dataclass(frozen=True)
class Pair:
    """A spec timed for both the Pallas op and its XLA counterpart on one chip."""

    chip: str  # ours (v5e, v7x, ...)
    op: str  # the Pallas op's file stem
    what: str  # grouped matmul, attention, ...
    spec: dict[str, Any]
    pallas: Timed
    xla: Timed
    provenance: dict[str, str] = field(default_factory=dict)

    @property
    def measured_speedup(self) -> float:
        return self.xla.median_ms / self.pallas.median_ms


def find() -> Path | None:
    """The installed tokamax package directory (None: not installed)."""
    spec = importlib.util.find_spec("tokamax")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def version(root: Path) -> str:
    """The wheel's version: from the installed distribution, else the dist-info beside
    an extracted wheel, else unknown."""
    for info in sorted(root.parent.glob("tokamax-*.dist-info")):
        match = re.match(r"tokamax-(.+)\.dist-info", info.name)
        if match:
            return match.group(1)
    try:
        return importlib.metadata.version("tokamax")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def array(text: str) -> tuple[str, tuple[int, ...]] | None:
    """``"bf16[4096,4096]"`` -> ("bf16", (4096, 4096))."""
    match = _ARRAY.match(text) if isinstance(text, str) else None
    if not match:
        return None
    dims = tuple(int(d) for d in match.group(2).split(",") if d)
    return match.group(1), dims


def _timed(entries: dict[str, Any]) -> Timed | None:
    """The fastest config with evaluation times (its median)."""
    best = None
    for config, value in (entries or {}).items():
        times = tuple(float(t) for t in (value or {}).get("evaluation_times_ms") or ())
        if not times:
            continue
        found = Timed(json.loads(config), statistics.median(times), times)
        if best is None or found.median_ms < best.median_ms:
            best = found
    return best


def read(path: Path) -> tuple[dict[str, Timed], str | None]:
    """(spec key -> its fastest timed config, why the file could not be read)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {}, f"{path.name} is not readable JSON ({type(exc).__name__}: {str(exc)[:80]})"
    out = {}
    for key, entries in data.items():
        found = _timed(entries)
        if found is not None:
            out[key] = found
    return out, None


def pairs(root: Path) -> tuple[list[Pair], list[str]]:
    """Every spec timed for a Pallas op and its XLA counterpart, per chip; and what could
    not be read (a file that is not valid JSON, a missing counterpart)."""
    base = root / "data" / "autotuning"
    wheel = f"tokamax {version(root)}"
    found, problems = [], []
    for folder in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else ():
        chip = CHIP_DIRS.get(folder.name)
        if chip is None:
            continue  # a GPU's measurements
        for op, (xla_op, what) in OPS.items():
            pallas_path, xla_path = folder / f"{op}.json", folder / f"{xla_op}.json"
            if not pallas_path.exists():
                continue
            pallas, why = read(pallas_path)
            xla, why_xla = read(xla_path) if xla_path.exists() else ({}, f"no {xla_path.name}")
            for reason in (why, why_xla):
                if reason:
                    problems.append(f"{folder.name}/{reason}")
            for key in sorted(pallas.keys() & xla.keys()):
                found.append(Pair(chip, op, what, json.loads(key), pallas[key], xla[key], {
                    "wheel": wheel, "pallas_file": f"{folder.name}/{pallas_path.name}",
                    "xla_file": f"{folder.name}/{xla_path.name}", "spec": key,
                    "config": json.dumps(pallas[key].config, sort_keys=True)}))
    found.sort(key=lambda p: (p.chip, p.op, _size(p.spec)))  # small programs first
    return found, problems


@dataclass(frozen=True)
class Single:
    """A spec tokamax timed for an XLA op alone (``XLA_ONLY``) on one chip."""

    chip: str
    op: str  # the XLA op's file stem
    what: str
    spec: dict[str, Any]
    xla: Timed
    provenance: dict[str, str] = field(default_factory=dict)


def singles(root: Path) -> tuple[list[Single], list[str]]:
    """Every spec timed for an ``XLA_ONLY`` op, per chip; and the files not readable."""
    base = root / "data" / "autotuning"
    wheel = f"tokamax {version(root)}"
    found, problems = [], []
    for folder in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else ():
        chip = CHIP_DIRS.get(folder.name)
        for op, what in XLA_ONLY.items() if chip is not None else ():
            path = folder / f"{op}.json"
            if not path.exists():
                continue
            timed, why = read(path)
            if why:
                problems.append(f"{folder.name}/{why}")
            found.extend(Single(chip, op, what, json.loads(key), value, {
                "wheel": wheel, "xla_file": f"{folder.name}/{path.name}", "spec": key})
                for key, value in sorted(timed.items()))
    found.sort(key=lambda s: (s.chip, s.op, _size(s.spec)))
    return found, problems


def _size(spec: dict[str, Any]) -> int:
    """The product of the spec's array sizes (orders the cheap estimates first)."""
    total = 1
    for value in spec.values():
        parsed = array(value) if isinstance(value, str) else None
        if parsed:
            for d in parsed[1]:
                total *= d
    return total
