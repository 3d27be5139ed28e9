"""How numbers read on screen, the same in every pane."""

from __future__ import annotations

from typing import Any

from tilewright.kernels.judge.result import STATUS_LOOKS
from tilewright.sessions.state import Rank  # kernels.judge.result's, as the sessions API carries it

# A version's status as one mark, the same in every pane (the history table, the search
# tree) and in ``tilewright eval`` (kernels.judge.result's one table); tui.look turns
# each into ASCII on terminals that need it.
STATUS_MARKS = {status: mark for status, (mark, _style) in STATUS_LOOKS.items()}


# The TPU compiler's verdict at the production shape (``tpu.compile``), the same in every
# pane: (mark, word, sentence, style). "refused" is the kernel's fault; "unavailable"
# means this host could not ask the compiler (the reason is in Problems).
COMPILE_VERDICTS = {"ok": ("✓", "ok", "accepted", "green"),
                    "error": ("✗ refused", "refused", "refused", "bold red"),
                    "unavailable": ("? n/a", "unavailable", "not compiled", "yellow")}


def compile_verdict(verdict: str | None) -> tuple[str, str, str, str]:
    """``COMPILE_VERDICTS``' row for a verdict (one it does not know reads as itself)."""
    found = COMPILE_VERDICTS.get(str(verdict))
    return found or (str(verdict), str(verdict), f"not compiled ({verdict})", "yellow")


def status_mark(status: str | None) -> str:
    """The mark for a version's status ("?" for one this table does not know)."""
    return STATUS_MARKS.get(status, "?")


def format_mib(value: Any) -> str:
    return f"{value / 2**20:.1f}" if isinstance(value, int | float) else "?"


def format_vmem(used: Any, limit: Any) -> str:
    """"VMEM 2.0/16.0 MiB": what the TPU compiler allocated of the chip's scoped limit."""
    if not isinstance(used, int | float):
        return ""
    if not isinstance(limit, int | float):
        return f"VMEM {format_mib(used)} MiB"
    return f"VMEM {format_mib(used)}/{format_mib(limit)} MiB"



def rank_at_length(rank: Rank | None) -> str:
    """A ranking number in full (``Rank.words``), and beside a compiler figure how far
    such figures can be trusted (``Rank.trust_words``): "est. 1.29x on v5e at 4096x4096
    (TPU compiler) · compute-bound v5e: median 0.96 of measured, 10 programs"."""
    if rank is None:
        return "-"
    trust = rank.trust_words()
    return rank.words() + (f" · {trust}" if trust else "")
