"""``EvalResult``: the evaluation JSON contract (schema ``tilewright.eval/1``).

Fields other tools rely on are fixed (docs/EVALUATION.md, ``eval_schema.json``); more may
be added, none renamed.
This module is imported by the app process: no JAX here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tilewright.profiling.chips import TPU_INTERPRET, backend_is_interpret

if TYPE_CHECKING:
    from tilewright.kernels.judge.rank import Rank

__all__ = ["TPU_INTERPRET"]  # re-exported: the app side reads the mode from here

SCHEMA = "tilewright.eval/1"
# The production-only verdict and estimate (``tilewright estimate``, the judge's estimate).
ESTIMATE_SCHEMA = "tilewright.estimate/1"

Status = Literal[
    "correct", "incorrect", "compile_error", "runtime_error", "timeout", "crashed", "rejected"
]
STATUSES: tuple[str, ...] = (
    "correct", "incorrect", "compile_error", "runtime_error", "timeout", "crashed", "rejected",
)
# The statuses of a kernel that needs fixing rather than tuning: every one but correct.
FAILED_STATUSES = frozenset(STATUSES) - {"correct"}
# Each status as one mark and one rich style, the same wherever a status is shown (the
# TUI's panes, ``tilewright eval``'s summary); None: not run yet.
STATUS_LOOKS: dict[str | None, tuple[str, str]] = {
    "correct": ("✓", "bold green"), "incorrect": ("✗", "bold red"),
    "compile_error": ("✗", "bold yellow"), "runtime_error": ("✗", "bold yellow"),
    "timeout": ("⏱", "bold yellow"), "crashed": ("☠", "bold yellow"),
    "rejected": ("⊘", "bold magenta"), None: ("·", "dim")}



@dataclass
class Backend:
    platform: str  # cpu | tpu | gpu
    mode: str  # native | tpu-interpret
    device_kind: str
    jax_version: str

    @property
    def is_interpret(self) -> bool:
        """Kernels run in TPU interpret mode: timings are host simulation, not TPU time."""
        return self.mode == TPU_INTERPRET

    def label(self) -> str:
        """Human label used everywhere the backend is shown, e.g. 'CPU (TPU interpret)'."""
        if self.is_interpret:
            return f"{self.platform.upper()} (TPU interpret)"
        return f"{self.platform.upper()} {self.device_kind}".strip()


@dataclass
class EvalError:
    kind: str  # syntax | import | missing_entry | lowering | runtime | timeout | crashed | ...
    message: str
    line: int | None = None  # candidate line, when it is the candidate's fault
    traceback: str | None = None
    hint: str | None = None  # friendlier explanation of a common Pallas mistake
    # The file ``line`` belongs to when it is not the candidate's: a task error (kind
    # "task": a broken input builder or reference) names the task's own file.
    file: str | None = None


@dataclass
class EvalResult:
    status: str
    backend: Backend | None
    lowering: dict[str, Any] = field(default_factory=lambda: {"tpu": "skipped", "message": None})
    correctness: dict[str, Any] | None = None
    integrity: dict[str, Any] = field(default_factory=lambda: {"flags": []})
    timing: dict[str, Any] | None = None
    # The real TPU compiler's verdict for the session's chip and its static estimate:
    # {chip, compile: ok|error|unavailable, message, vmem_bytes, estimate, reference_estimate,
    # estimated_speedup, ...}; None when no TPU compile ran (lowering turned off).
    tpu: dict[str, Any] | None = None
    error: EvalError | None = None
    duration_s: float = 0.0
    stderr: str = ""  # captured worker stderr for this request (XLA logs, prints)
    extra: dict[str, Any] = field(default_factory=dict)  # per-shape details etc.
    # What confined the candidate's worker and why a stronger layer was not used
    # (``kernels.confinement``); None where no worker ran.
    confinement: dict[str, Any] | None = None
    schema: str = SCHEMA

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    @property
    def rank(self) -> Rank:
        """The number that ranks this result (``kernels.judge.rank.ranking``)."""
        from tilewright.kernels.judge.rank import ranking

        return ranking(self.to_json())

    # -- what the judge's own layers add after the evaluation ---------------------------
    # The worker (a harness changed under it), the pool (a kill to blame on the task) and
    # the evaluation (processes the candidate left) amend a result only through these.

    def flag(self, *flags: str) -> None:
        """Add integrity flags (each once; the list kept sorted)."""
        self.integrity["flags"] = sorted({*(self.integrity.get("flags") or ()), *flags})

    def note_leftovers(self, count: int | None) -> None:
        """``count`` processes the candidate left behind (killed with its request; the
        candidate process's and the judge's own counts add up): recorded in
        ``extra.leftover_processes`` and flagged ``spawned_processes``."""
        if not count:
            return
        self.extra["leftover_processes"] = int(self.extra.get("leftover_processes") or 0) \
            + int(count)
        self.flag("spawned_processes")

    def blame_task(self, error: EvalError | None) -> None:
        """The task's reference alone does not fit the limits the kernel was killed by:
        ``error`` blames the task instead (None: the kernel's own error stands)."""
        if error is not None:
            self.error = error

    def withhold(self, why: str) -> None:
        """No verdict: the judge's harness changed while task code (the reference, the
        input builder) ran in it, so the task is blamed and nothing is believed."""
        self.status = "runtime_error"
        self.error = EvalError(
            kind="task", message=f"the task's code changed the harness in the judge ({why}): "
            "no verdict is given, and the worker is replaced",
            hint="Task files (reference.py, input builders) run in the judge: they must not "
                 "import or patch tilewright's harness.")
        self.timing = None
        if isinstance(self.correctness, dict):
            self.correctness["correct"] = False

    def error_line(self) -> str | None:
        """One line saying why the evaluation failed (kind, place, message), for the log,
        reports and tables; None when it did not fail."""
        error = self.error
        if error is None:
            return (self.correctness or {}).get("reason") if not self.correct else None
        where = f" line {error.line}" if error.line else ""
        first = (error.message or error.kind).strip().splitlines()[0] if error.message \
            else error.kind
        return f"{error.kind}{where}: {first[:300]}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        # schema first, for readers
        return {"schema": data.pop("schema"), **data}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalResult:
        data = dict(data)
        backend = data.get("backend")
        error = data.get("error")
        data["backend"] = Backend(**backend) if backend else None
        data["error"] = EvalError(**error) if error else None
        known = set(cls.__dataclass_fields__)
        extra = {k: v for k, v in data.items() if k not in known}
        data = {k: v for k, v in data.items() if k in known}
        if extra:
            data.setdefault("extra", {}).update(extra)
        return cls(**data)


# -- words the contract and the ranks share ------------------------------------------

def is_interpret(backend: Backend | dict[str, Any] | None) -> bool:
    """``Backend.is_interpret`` for a backend as recorded (eval JSON, a session header)."""
    if isinstance(backend, Backend):
        return backend.is_interpret
    return backend_is_interpret(backend)


_SHORT_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "i32",
                 "int8": "i8", "bool": "bool", "int64": "i64", "float64": "f64",
                 "int16": "i16", "uint8": "u8", "uint32": "u32"}


def array_text(shape: Any, dtype: Any) -> str:
    """``f32[4096,8192]``: an array as the eval JSON's ``tpu.input_shapes`` lists it."""
    name = str(dtype)
    return f"{_SHORT_DTYPES.get(name, name)}[{','.join(str(int(d)) for d in shape)}]"


def shape_label(shapes: list[tuple[Any, Any]], limit: int = 40) -> str:
    """``4096x8192, 8192x8192, 8192``: the inputs' dimensions, compact enough for a
    status bar (cut with an ellipsis past ``limit`` characters); scalars left out."""
    parts = ["x".join(str(int(d)) for d in shape) for shape, _ in shapes if len(shape)]
    text = ", ".join(parts) or "scalars"
    return text if len(text) <= limit else text[:limit - 1].rstrip(", ") + "…"


# A missing estimate's reason, condensed for a table cell: (words to find, the cell's).
