"""``EvalResult``: the evaluation JSON contract (schema ``tilewright.eval/1``).

Fields other tools rely on are fixed (docs/EVALUATION.md, ``eval_schema.json``); more may
be added, none renamed.
This module is imported by the app process: no JAX here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from profiling.chips import TPU_INTERPRET, backend_is_interpret

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
    def speedup(self) -> float | None:
        """The number that ranks this result (``ranking``): off-TPU the TPU compiler's
        estimated speedup, on a TPU the measured one."""
        return ranking(self.to_json()).value

    @property
    def rank(self) -> Rank:
        return ranking(self.to_json())

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


# -- ranking ---------------------------------------------------------------------------

RANK_SOURCES = ("device_time", "tpu_estimate", "host_simulation", "disqualified", "none")

# Integrity flags that keep a correct kernel from being ranked at all ("best", the
# tuner's choice, search's beam): the work may not be the kernel's, or the number may
# not be real. degenerate_reference is the task's problem, shown but not disqualifying.
DISQUALIFYING_FLAGS = frozenset({
    "compute_outside_kernel", "nondeterministic", "suspicious_speedup", "no_pallas_call",
    "harness_tampering", "background_threads", "jax_config_changed",
    "platform_dependent", "interpret_param",  # always rejected too: never ranked
})


def is_interpret(backend: Backend | dict[str, Any] | None) -> bool:
    """``Backend.is_interpret`` for a backend as recorded (eval JSON, a session header)."""
    if isinstance(backend, Backend):
        return backend.is_interpret
    return backend_is_interpret(backend)


def disqualifying_flags(result: dict[str, Any]) -> list[str]:
    """The result's integrity flags that forbid ranking it, sorted."""
    flags = (result.get("integrity") or {}).get("flags") or []
    return sorted(set(flags) & DISQUALIFYING_FLAGS)


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


@dataclass(frozen=True)
class Rank:
    """The number that ranks an evaluation, where it comes from, and how to say it.

    ``source``: ``device_time`` (measured on a TPU), ``tpu_estimate`` (the TPU
    compiler's static estimate for ``chip`` at the production shape ``shape``, against
    the XLA reference compiled for the same chip and shape), ``host_simulation`` (only
    when no estimate exists: the interpreter's time ratio on this CPU, which predicts
    nothing about a TPU) or ``none``. ``basis`` says what the estimate rests on:
    ``compiler`` (the compiler's cycles), ``memory_floor`` (the memory system's floor
    was higher than the compiler's figure for the kernel or the reference), with
    ``derived`` saying when a figure was scaled from a shorter grid.
    """

    value: float | None
    source: str
    chip: str | None
    label: str  # e.g. "est. 1.80x on v5e at 4096x4096 (TPU compiler)": never a measurement
    estimate: float | None = None  # the estimate, also recorded beside a measurement
    measured: float | None = None  # measured on a TPU
    shape: str | None = None  # the production shape the numbers are for, compact
    basis: str | None = None  # compiler | memory_floor
    derived: bool = False  # a figure was scaled from a shorter grid
    why_none: str | None = None  # no estimate: the reason

    @property
    def is_estimate(self) -> bool:
        return self.source == "tpu_estimate"


def rank_words(source: str | None, value: Any, *, short: bool = False) -> str:
    """A ranking number with what it is, never a host simulation ratio as a speedup:
    "est. 1.34x", "1.34x measured", "host sim. 0.0072 (not a speedup)"; ``short``
    for one-line summaries ("est. 1.341x", "1.341x meas.", "host sim 0.0072")."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    digits = ".3f" if short else ".3g"
    if source == "tpu_estimate":
        return f"est. {value:{digits}}x"
    if source == "device_time":
        return f"{value:{digits}}x {'meas.' if short else 'measured'}"
    if source == "host_simulation":
        return f"host sim {value:.3g}" if short else f"host sim. {value:.3g} (not a speedup)"
    return f"{value:.3f}x" if short else f"{value:.3g}"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value > 0 else None


def estimate_words(tpu: dict[str, Any]) -> str:
    """How an estimate was had, in words for a label: "TPU compiler", "TPU compiler,
    scaled", "TPU compiler, memory-bound floor"."""
    words = ["TPU compiler"]
    methods = {(tpu.get(k) or {}).get("method") for k in ("estimate", "reference_estimate")}
    if "scaled" in methods:
        words.append("scaled")
    if tpu.get("basis") == "memory_floor":
        words.append("memory-bound floor")
    return ", ".join(words)


def ranking(result: dict[str, Any]) -> Rank:
    """The ranking number of an eval result (its JSON): measured speedup on a TPU,
    the TPU compiler's estimated speedup at the production shape elsewhere; never
    interpret-mode time while an estimate exists. Pure data: the app, tuner, search
    and reports all call this."""
    tpu = result.get("tpu") or {}
    timing = result.get("timing") or {}
    backend = result.get("backend") or {}
    chip = tpu.get("chip")
    shape = tpu.get("shape_label") if isinstance(tpu.get("shape_label"), str) else None
    at = f" at {shape}" if shape else ""
    estimate = _num(tpu.get("estimated_speedup"))
    basis = tpu.get("basis") if estimate is not None else None
    derived = any((tpu.get(k) or {}).get("method") == "scaled"
                  for k in ("estimate", "reference_estimate"))
    why = tpu.get("estimate_unavailable") if isinstance(tpu.get("estimate_unavailable"),
                                                        str) else None
    common = {"shape": shape, "basis": basis, "derived": derived}
    if result.get("status") != "correct":
        return Rank(None, "none", chip, str(result.get("status") or "not evaluated"), estimate,
                    **common)
    flags = disqualifying_flags(result)
    if flags:  # correct, but not to be crowned: search, auto and reports skip it
        return Rank(None, "disqualified", chip, "not ranked: " + ", ".join(flags), estimate,
                    **common)
    native = backend.get("platform") == "tpu" and backend.get("mode") == "native"
    measured = _num(timing.get("speedup")) if native else None
    if measured is not None:
        beside = f", est. {estimate:.2f}x" if estimate is not None else ""
        kind = backend.get("device_kind") or "TPU"
        measured_at = timing.get("shape_label") or shape
        where = f" at {measured_at}" if measured_at else ""
        return Rank(measured, "device_time", chip,
                    f"{measured:.2f}x measured on {kind}{where}{beside}", estimate, measured,
                    **common)
    if estimate is not None:
        return Rank(estimate, "tpu_estimate", chip,
                    f"est. {estimate:.2f}x on {chip}{at} ({estimate_words(tpu)})", estimate,
                    **common)
    host = _num(timing.get("speedup"))
    reason = f" (no TPU estimate: {why})" if why else ""
    if host is not None:
        return Rank(host, "host_simulation", chip,
                    f"host sim. ratio {host:.3g} (CPU interpreter, not TPU performance)"
                    + reason, why_none=why, **common)
    return Rank(None, "none", chip, f"no estimate: {why}" if why else "no estimate",
                why_none=why, **common)


def production_note(tpu: dict[str, Any]) -> str:
    """One line on a production verdict as it lands (before the evaluation ends): "at
    4096x4096 on v5e: compiles (VMEM 2.3 of 16.0 MiB), est. 1.75x (TPU compiler,
    scaled)"; "... estimating" while only the verdict is known."""
    where = f"at {tpu.get('shape_label') or tpu.get('shape') or 'the production shape'} " \
            f"on {tpu.get('chip')}"
    compile_ = tpu.get("compile")
    if compile_ == "error":
        message = str(tpu.get("message") or "").splitlines()[0][:160] if tpu.get(
            "message") else tpu.get("kind") or "refused"
        return f"{where}: does not compile ({message})"
    if compile_ != "ok":
        return f"{where}: no verdict ({tpu.get('estimate_unavailable') or 'unavailable'})"
    used, limit = tpu.get("vmem_bytes"), tpu.get("vmem_limit_bytes")
    vmem = (f" (VMEM {used / 2 ** 20:.1f} of {limit / 2 ** 20:.1f} MiB)"
            if isinstance(used, int) and isinstance(limit, int) else "")
    speed = _num(tpu.get("estimated_speedup"))
    if speed is not None:
        return f"{where}: compiles{vmem}, est. {speed:.2f}x ({estimate_words(tpu)})"
    why = tpu.get("estimate_unavailable")
    return f"{where}: compiles{vmem}, " + (f"no estimate ({why})" if why and why != "estimating"
                                          else "estimating ...")

