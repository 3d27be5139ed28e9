"""The precision XLA will multiply at, read from a program's StableHLO.

A TPU's matrix unit multiplies bf16 (and int8, and fp8 on chips that have it). A float32
dot runs as bf16 passes: one at XLA's DEFAULT precision (the inputs rounded to bf16,
products accumulated in f32), three at HIGH, six at HIGHEST. So an f32 matmul at default
precision runs at the bf16 peak, not a third of it: on a v5e, XLA's f32 4096x8192 @
8192x8192 measured 150 TFLOP/s of the 197 bf16 peak. A roofline that prices it at
bf16/3 puts the reference's physical limit 3x too high, and a kernel appears to beat it.

``dot_work(text)`` lists each ``stablehlo.dot_general`` with its FLOPs (2 x the result's
elements x the contracted size), its operands' element type and its precision, and
``mxu_seconds`` prices them on a chip: passes x FLOPs at the rate of the operand type.
Pure Python: no JAX.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

# MXU passes of one float32 dot at each precision XLA knows (the larger of the two
# operands' precisions counts). bf16 and narrower always take one.
F32_PASSES = {"DEFAULT": 1, "HIGH": 3, "HIGHEST": 6}
_DOT = re.compile(
    r"stablehlo\.dot_general\s+[^,]+,\s*[^,]+,(?P<attrs>.*?):\s*"
    r"\(tensor<(?P<lhs>[^>]*)>,\s*tensor<(?P<rhs>[^>]*)>\)\s*->\s*tensor<(?P<out>[^>]*)>")
_CONTRACT = re.compile(r"contracting_dims\s*=\s*\[([\d,\s]*)\]\s*x\s*\[([\d,\s]*)\]")
_PRECISION = re.compile(r"precision\s*=\s*\[([A-Z_,\s]*)\]")


@dataclass(frozen=True)
class Dot:
    flops: float
    dtype: str  # the operands' element type as StableHLO writes it: f32, bf16, i8, ...
    precision: str  # DEFAULT | HIGH | HIGHEST

    @property
    def passes(self) -> int:
        if self.dtype in ("f32", "f64"):
            return F32_PASSES.get(self.precision, 1)
        return 1


def _tensor(text: str) -> tuple[list[int], str]:
    """``4096x8192xf32`` -> ([4096, 8192], "f32"); dynamic sizes count as 1."""
    parts = text.split("x")
    dims = [int(p) if p.isdigit() else 1 for p in parts[:-1]]
    return dims, parts[-1]


def dot_work(text: str) -> list[Dot]:
    """The dots of a StableHLO module's text, with their work, operand type and
    precision (DEFAULT where none is written)."""
    found = []
    for line in text.splitlines():
        if "stablehlo.dot_general" not in line:
            continue
        match = _DOT.search(line)
        if match is None:
            continue
        lhs, lhs_type = _tensor(match["lhs"])
        _rhs, rhs_type = _tensor(match["rhs"])
        out, _ = _tensor(match["out"])
        contract = _CONTRACT.search(match["attrs"])
        dims = [int(d) for d in contract.group(1).split(",") if d.strip()] if contract else []
        contracted = math.prod(lhs[d] for d in dims if d < len(lhs)) if dims else 1
        precision = _PRECISION.search(match["attrs"])
        said = [p.strip() for p in precision.group(1).split(",")] if precision else []
        level = max(said, key=lambda p: F32_PASSES.get(p, 1)) if said else "DEFAULT"
        wider = lhs_type if _width(lhs_type) >= _width(rhs_type) else rhs_type
        found.append(Dot(2.0 * math.prod(out) * contracted, wider, level))
    return found


def _width(dtype: str) -> int:
    digits = re.sub(r"\D", "", dtype)
    return int(digits) if digits else 32


def mxu_rate(chip: Any, dtype: str) -> float:
    """FLOP/s of one pass on ``chip``'s matrix unit for operands of ``dtype``: int8 and
    fp8 at the chip's rate for them where it has one, everything else at bf16's."""
    if dtype in ("i8", "ui8", "si8") and getattr(chip, "int8_flops", None):
        return float(chip.int8_flops)
    if dtype.startswith("f8") and getattr(chip, "fp8_flops", None):
        return float(chip.fp8_flops)
    return float(chip.bf16_flops)


def mxu_seconds(dots: list[Dot], chip: Any) -> float:
    """The time the chip's matrix unit needs for ``dots`` at their precision."""
    return sum(d.flops * d.passes / mxu_rate(chip, d.dtype) for d in dots)


def describe(dots: list[Dot]) -> str | None:
    """How the dots were priced, in words (None without dots)."""
    if not dots:
        return None
    kinds = sorted({f"{d.dtype} at {d.precision} ({d.passes} pass{'es' if d.passes > 1 else ''})"
                    for d in dots})
    return ("dots priced at the precision XLA uses: " + ", ".join(kinds)
            + "; DEFAULT f32 runs as one bf16 pass")
