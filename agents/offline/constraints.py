"""What the person said no to, as bounds on the tunables.

A rejection's note ("keep BLOCK_ROWS at 512 or above", "BLOCK_COLS <= 256", "don't
touch BLOCK_M") becomes (op, value) bounds per tunable; the tuner searches only the
values those bounds allow (``constrain``), and the offline agent checks a proposal
against them (``allowed``). The notes' wishes (larger, smaller) are ``words``'s.
"""

from __future__ import annotations

import re
from typing import Any

_AT_LEAST = r"(?:>=|≥|at least|no less than|not below|not under|or (?:above|more|higher|larger|bigger|greater))"
_AT_MOST = r"(?:<=|≤|at most|no more than|not above|not over|or (?:below|less|lower|smaller))"
_NUMBER = r"(\d+)"


def constraints_from_notes(notes: list[str], names: list[str],
                           current: dict[str, Any]) -> dict[str, list[tuple[str, int]]]:
    """What rejection notes say about the tunables, as (op, value) bounds per name:
    "keep BLOCK_ROWS at 512 or above" -> [(">=", 512)], "BLOCK_COLS <= 256" ->
    [("<=", 256)], "keep BLOCK_K at 128" -> [("==", 128)], "don't touch BLOCK_M" ->
    [("==", its current value)]. Names match case-insensitively, with or without the
    ``BLOCK_`` prefix; what the notes do not say about a name leaves it free."""
    out: dict[str, list[tuple[str, int]]] = {}
    for note in notes:
        text = " ".join(str(note or "").split())
        for name in names:
            stems = {name, name.removeprefix("BLOCK_").removeprefix("TILE_")}
            alts = "|".join(re.escape(s) for s in sorted(stems, key=len, reverse=True))
            for match in re.finditer(rf"(?<![A-Za-z0-9_])({alts})(?![A-Za-z0-9_])", text,
                                     re.IGNORECASE):
                before = text[max(0, match.start() - 24):match.start()].lower()
                after = text[match.end():match.end() + 48]
                bound = _bound(after)
                if bound is None and re.search(r"(don'?t|do not|never|leave)\s+(change|touch|"
                                               r"tune|move)?\s*$", before) \
                        and isinstance(current.get(name), int):
                    bound = ("==", int(current[name]))
                if bound is not None:
                    out.setdefault(name, []).append(bound)
    return out


def _bound(after: str) -> tuple[str, int] | None:
    a = after.lower()
    for pattern, op in ((rf"^\s*(?:at|=|==|to)?\s*{_NUMBER}\s*{_AT_LEAST}", ">="),
                        (rf"^\s*(?:at|=|==|to)?\s*{_NUMBER}\s*{_AT_MOST}", "<="),
                        (rf"^\s*{_AT_LEAST}\s*{_NUMBER}", ">="),
                        (rf"^\s*{_AT_MOST}\s*{_NUMBER}", "<="),
                        (rf"^\s*>\s*{_NUMBER}", ">"), (rf"^\s*<\s*{_NUMBER}", "<"),
                        (rf"^\s*(?:at|=|==|fixed at|stays? at)\s*{_NUMBER}(?!\d)", "==")):
        m = re.search(pattern, a)
        if m:
            return op, int(m.group(1))
    return None


def allowed(value: Any, bounds: list[tuple[str, int]]) -> bool:
    if not isinstance(value, int) or isinstance(value, bool):
        return True
    checks = {">=": value.__ge__, "<=": value.__le__, ">": value.__gt__, "<": value.__lt__,
              "==": value.__eq__}
    return all(checks[op](bound) for op, bound in bounds)


def constrain(space: dict[str, list[Any]], constraints: dict[str, list[tuple[str, int]]]
              ) -> dict[str, list[Any]]:
    """The search space without the values a note rules out (a name whose every value
    is ruled out keeps its values: the note cannot be met by tuning alone)."""
    out = {}
    for name, values in space.items():
        kept = [v for v in values if allowed(v, constraints.get(name, []))]
        out[name] = kept or values
    return out
