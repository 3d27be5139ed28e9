"""``EvalResult``: the evaluation JSON contract (schema ``tilewright.eval/1``).

Fields other tools rely on are fixed by DESIGN.md; more may be added, none renamed.
This module is imported by the app process: no JAX here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SCHEMA = "tilewright.eval/1"

Status = Literal[
    "correct", "incorrect", "compile_error", "runtime_error", "timeout", "crashed", "rejected"
]
STATUSES: tuple[str, ...] = (
    "correct", "incorrect", "compile_error", "runtime_error", "timeout", "crashed", "rejected",
)


@dataclass
class Backend:
    platform: str  # cpu | tpu | gpu
    mode: str  # native | tpu-interpret
    device_kind: str
    jax_version: str

    def label(self) -> str:
        """Human label used everywhere the backend is shown, e.g. 'CPU (TPU interpret)'."""
        if self.mode == "tpu-interpret":
            return f"{self.platform.upper()} (TPU interpret)"
        return f"{self.platform.upper()} {self.device_kind}".strip()


@dataclass
class EvalError:
    kind: str  # syntax | import | missing_entry | lowering | runtime | timeout | crashed | ...
    message: str
    line: int | None = None  # candidate line, when it is the candidate's fault
    traceback: str | None = None
    hint: str | None = None  # friendlier explanation of a common Pallas mistake


@dataclass
class EvalResult:
    status: str
    backend: Backend | None
    lowering: dict[str, Any] = field(default_factory=lambda: {"tpu": "skipped", "message": None})
    correctness: dict[str, Any] | None = None
    integrity: dict[str, Any] = field(default_factory=lambda: {"flags": []})
    timing: dict[str, Any] | None = None
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
    def speedup(self) -> float | None:
        return (self.timing or {}).get("speedup")

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
