"""What the offline agent takes from the person's words: a rejection note, a chat
message, the text of ``/plan``.

No model reads them, so only what rules can read is taken, and the agent says what it
took: block sizes ("256 rows", "BLOCK_ROWS=256", "try 256" when the kernel has one
tunable), directions ("larger", "smaller blocks", "fewer rows") and named techniques
("fuse the reciprocal", "bf16", "an accumulator"). Bounds ("at least 512") are
``constraints.constraints_from_notes``'s; this reads wishes, not limits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_UP = r"larger|bigger|more|increase|grow|wider|taller|up"
_DOWN = r"smaller|less|fewer|decrease|shrink|narrower|down|lower"

# Techniques a person may name, with the words that name them (first match wins).
TECHNIQUES: tuple[tuple[str, str], ...] = (
    ("fusion", r"\bfus(?:e|ed|es|ing|ion)\b"),
    ("reciprocal", r"\breciprocal\b|\brsqrt\b|\b1\s*/\s*x\b"),
    ("accumulator", r"\baccumulat(?:or|e|ion)\b"),
    ("lower precision", r"\bbf16\b|\bbfloat16\b|\bhalf precision\b|\bfp16\b"),
    ("online softmax", r"\bonline softmax\b|\bflash\b"),
    ("double buffering", r"\bdouble[- ]buffer\w*|\bpipelin\w*"),
    ("unrolling", r"\bunroll\w*"),
    ("transpose", r"\btranspos\w*"),
    ("scratch memory", r"\bscratch\b"),
    ("parallel grid", r"\bmegacore\b|\bparallel\b"),
)


@dataclass
class Wishes:
    sizes: dict[str, int] = field(default_factory=dict)  # tunable -> the value asked for
    directions: dict[str, str] = field(default_factory=dict)  # tunable -> "up" | "down"
    techniques: list[str] = field(default_factory=list)
    quoted: str = ""  # the words they were read from

    def __bool__(self) -> bool:
        return bool(self.sizes or self.directions or self.techniques)

    def took(self) -> str:
        """What was taken, in words: "BLOCK_ROWS = 256; larger BLOCK_COLS; fusion"."""
        parts = [f"{k} = {v}" for k, v in self.sizes.items()]
        parts += [f"{'larger' if d == 'up' else 'smaller'} {k}"
                  for k, d in self.directions.items() if k not in self.sizes]
        parts += self.techniques
        return "; ".join(parts)


def _stems(name: str) -> list[str]:
    stem = name.upper().removeprefix("BLOCK_").removeprefix("TILE_").lower()
    out = [name.lower(), stem, stem.rstrip("s"), stem + "s"]
    if stem in ("cols", "col"):
        out += ["columns", "column"]
    if stem in ("q", "kv"):
        out += ["seq", "sequence"]
    return sorted({s for s in out if s}, key=len, reverse=True)


def read(texts: list[str], names: list[str]) -> Wishes:
    """The wishes in ``texts`` (newest last: a later one overrides an earlier one) about
    the tunables ``names``."""
    wishes = Wishes()
    for text in texts:
        words = " ".join(str(text or "").split())
        if not words:
            continue
        low = words.lower()
        found = False
        for name in names:
            alts = "|".join(re.escape(s) for s in _stems(name))
            # "256 rows", "BLOCK_ROWS=256", "BLOCK_ROWS to 256", "rows of 256"
            patterns = (rf"(?<![\w.])(\d+)\s*(?:-|\s)?(?:{alts})(?![\w])",
                        rf"(?<![\w])(?:{alts})\s*(?:=|:|to|of|at|->|→)?\s*(\d+)(?![\w.])")
            for pattern in patterns:
                m = re.search(pattern, low)
                if m and not _is_bound(low, m.start(), m.end()):
                    wishes.sizes[name] = int(m.group(1))
                    found = True
                    break
            m = re.search(rf"\b({_UP}|{_DOWN})\s+(?:\w+\s+){{0,2}}?(?:{alts})(?![\w])", low)
            if m and name not in wishes.sizes:
                wishes.directions[name] = "up" if re.fullmatch(_UP, m.group(1)) else "down"
                found = True
        if not found:
            bare = re.search(r"(?<![\w.<>=])(\d{2,5})(?![\w.])", low)
            if bare and len(names) == 1 and not _is_bound(low, bare.start(), bare.end()):
                wishes.sizes[names[0]] = int(bare.group(1))
                found = True
            generic = re.search(rf"\b({_UP}|{_DOWN})\b(?:\s+\w+)?\s+(?:blocks?|tiles?|sizes?)",
                                low)
            if generic and not found:
                way = "up" if re.fullmatch(_UP, generic.group(1)) else "down"
                wishes.directions.update({n: way for n in names})
                found = True
        for technique, pattern in TECHNIQUES:
            if re.search(pattern, low) and technique not in wishes.techniques:
                wishes.techniques.append(technique)
                found = True
        if found:
            wishes.quoted = words
    return wishes


def _is_bound(text: str, at: int, end: int | None = None) -> bool:
    """Whether the number at ``at`` is a bound ("at least 512", "<= 256", "512 or
    above"): a limit the tuner keeps, not a size to go to."""
    before = text[max(0, at - 16):at]
    after = text[end:end + 24] if end is not None else ""
    return bool(re.search(r"(least|most|>=|<=|<|>|≥|≤|no more than|no less than|under|"
                          r"over|above|below)\s*$", before)
                or re.match(r"\s*(or (above|more|higher|larger|bigger|greater|below|less|"
                            r"lower|smaller)|and (above|up|below|down))", after))


def person_texts(notes: tuple[str, ...] | list[str], message: str | None) -> list[str]:
    """The person's words a request carries for this turn: the notes of rejections
    ("rejected p5: try 256 rows instead") and the message (``/plan`` text, a chat line)."""
    out = [str(n).split(": ", 1)[1] for n in notes
           if str(n).startswith("rejected ") and ": " in str(n)]
    if message:
        out.append(str(message))
    return out


def legal_size(name: str, value: int, choices: list[Any], dims: tuple[int, ...],
               align: int) -> str | None:
    """Why ``value`` cannot be ``name``'s block size here; None when it can."""
    from tilewright.kernels.source import tunables

    if value in choices:
        return None
    if not tunables.is_legal(name, value, align, dims):
        tiled = f" (it tiles {', '.join(str(d) for d in dims)})" if dims else ""
        return f"{name} = {value} is not a legal block size{tiled}"
    return None
