"""``Judgement``: what one evaluation decided about a version, as every layer above reads it.

The judge's ``EvalResult`` is the whole record (the eval JSON, kept as a blob); a
session's ``run.result`` event carries the part the panes, reports, prompts and
schedulers need, and a ``Judgement`` is that part as one frozen value: the status, the
``Rank``, the integrity flags, the failure's kind and line, the TPU compile verdict and
VMEM. It is written into the event once (``event_fields``) and read back once
(``from_event``); "correct", "crownable", "disqualified" and "failed" are asked of it,
never re-derived from a dict. App-side: no JAX.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tilewright.kernels.judge.rank import DISQUALIFYING_FLAGS, Rank
from tilewright.kernels.judge.result import FAILED_STATUSES, EvalResult


@dataclass(frozen=True)
class Judgement:
    """One evaluation's verdict on one version (see the module docstring)."""

    status: str | None  # one of result.STATUSES; None for a log that recorded none
    rank: Rank | None = None
    flags: tuple[str, ...] = ()  # integrity flags (DISQUALIFYING_FLAGS forbid ranking)
    median_ms: float | None = None  # the timed call's median where one was timed
    error: str | None = None  # ``EvalResult.error_line``: kind, place, first line
    # EvalError.kind ("task": the task itself failed, not the kernel)
    error_kind: str | None = None
    chip: str | None = None  # the TPU generation the candidate was compiled for
    tpu_compile: str | None = None  # ok | error | unavailable (None: no compile ran)
    vmem_bytes: int | None = None  # scoped VMEM the compiler allotted (or refused)
    vmem_limit_bytes: int | None = None  # the limit it was judged against
    production_shape: str | None = None  # the production configuration's shape

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    @property
    def crownable(self) -> bool:
        """Correct and free of the flags that forbid ranking it: only such a version can
        be "best", the tuner's choice or in a search's beam."""
        return self.correct and not (set(self.flags) & DISQUALIFYING_FLAGS)

    @property
    def disqualified(self) -> bool:
        """Correct, but an integrity flag forbids ranking it."""
        return self.correct and not self.crownable

    @property
    def failed(self) -> bool:
        """The kernel needs fixing rather than tuning (it did not run to a correct
        result); a task failure (``error_kind == "task"``) is a failure too, the task's."""
        return self.status in FAILED_STATUSES

    @classmethod
    def of(cls, result: EvalResult) -> Judgement:
        """The judgement of a finished evaluation, as its ``run.result`` records it."""
        tpu = result.tpu or {}
        rank = result.rank
        return cls(status=result.status, rank=rank,
                   flags=tuple((result.integrity or {}).get("flags") or ()),
                   median_ms=(result.timing or {}).get("median_ms"),
                   error=result.error_line(),
                   error_kind=result.error.kind if result.error is not None else None,
                   chip=tpu.get("chip") or rank.chip, tpu_compile=tpu.get("compile"),
                   vmem_bytes=tpu.get("vmem_bytes"),
                   vmem_limit_bytes=tpu.get("vmem_limit_bytes"),
                   production_shape=tpu.get("shape"))

    def event_fields(self) -> dict[str, Any]:
        """The fields of a ``run.result`` event (``from_event`` reads them back)."""
        fields: dict[str, Any] = {
            "status": self.status, "correct": self.correct, "median_ms": self.median_ms,
            "flags": list(self.flags), "error": self.error,
            "rank": self.rank.to_json() if self.rank is not None else None,
            "chip": self.chip, "tpu_compile": self.tpu_compile,
            "vmem_bytes": self.vmem_bytes, "vmem_limit_bytes": self.vmem_limit_bytes,
            "production_shape": self.production_shape}
        if self.error_kind is not None:
            fields["error_kind"] = self.error_kind
        return fields

    @classmethod
    def from_event(cls, e: Mapping[str, Any], backend: Mapping[str, Any] | None = None
                   ) -> Judgement:
        """The judgement a ``run.result`` event recorded. Logs written before ranks (or
        the TPU compile) existed give what they have (``Rank.from_event``); ``backend``
        is the session header's, which says what an old log's timing ratio measured."""
        e = dict(e)
        status = e.get("status")
        if status is None and e.get("correct"):
            status = "correct"
        median = e.get("median_ms")
        return cls(status=status,
                   rank=Rank.from_event(e, dict(backend) if backend else None),
                   flags=tuple(e.get("flags") or ()),
                   median_ms=float(median) if isinstance(median, int | float) else None,
                   error=e.get("error"), error_kind=e.get("error_kind"),
                   chip=e.get("chip"), tpu_compile=e.get("tpu_compile"),
                   vmem_bytes=e.get("vmem_bytes"), vmem_limit_bytes=e.get("vmem_limit_bytes"),
                   production_shape=e.get("production_shape"))
