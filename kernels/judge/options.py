"""How thoroughly a kernel is judged: ``EvalOptions`` and ``ProfileOptions``.

The one home of every evaluation and profile default. The app builds them (the CLIs,
a session's config, a search), the judge protocol carries them typed
(``kernels.pool.Judge``), they cross to the worker as plain JSON (``to_json``),
and the harness reads them back with ``from_json`` (``kernels.worker.evaluation.evaluate``):
no side repeats a default. Pure data: the app and the worker both import this module,
and it imports nothing of either.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

MIN_TRIALS = 3  # one trial cannot tell a stale cache from a kernel: fewer count as this
# EvalOptions fields the app sets for one request and a config file never does (they are
# not ``[eval]`` keys): which program a source is, asked before an evaluation is spent
REQUEST_ONLY = frozenset({"identity_only"})

_Options = TypeVar("_Options", "EvalOptions", "ProfileOptions")


@dataclass
class EvalOptions:
    """How thoroughly to evaluate. ``trials`` below 3 count as 3 (the harness's floor);
    ``shapes`` restricts to named configurations; ``time_budget_s`` bounds the timing
    of candidate + reference together when ``iters`` is None."""

    trials: int = MIN_TRIALS
    iters: int | None = None  # None: adaptive, bounded by time_budget_s
    timeout_s: float = 120.0
    time_budget_s: float = 3.0
    lowering: bool = True
    timing: bool = True
    shapes: list[str] | None = None
    # The TPU generation every candidate is compiled for by the real TPU compiler (and
    # whose static estimate ranks kernels off-TPU); None: the TPU host's own, else
    # profiling.chips.DEFAULT_TPU.
    chip: str | None = None
    # Memory limit of each TPU compile process (kernels.worker.tpu.compile_pool); None: 4 GiB.
    compile_memory_mb: int | None = None
    # Who runs the candidate's programs: None chooses by host (on a TPU host the judge
    # runs them as exported programs, since only it may open the chip; on a CPU host the
    # candidate process interprets them); "exported" takes the TPU host's route on any
    # host (on the CPU: kernels in the plain interpreter), to test it without a TPU.
    route: str | None = None
    # On a TPU host the chip's compiler gives the production verdict and nothing is
    # estimated (the estimator's compiles cost 60-70 s an evaluation on the v5e); True
    # estimates there too, beside the measurement (``calibrate``, ``eval --estimate``).
    # Off a TPU the estimate is what ranks: always made.
    estimate_on_tpu: bool = False
    # ``estimate`` only: the candidate traced at the production shape and nothing more;
    # the reply's ``program`` is that trace's fingerprint (the same for two sources that
    # are the same program there: a block size the kernel clamps back, a comment). Seconds
    # where an evaluation takes minutes: what the search's rules ask before spending one.
    identity_only: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> EvalOptions:
        return _from_json(cls, data)


@dataclass
class ProfileOptions:
    """How to profile: the chip the static analysis and the roofline are for (None: the
    device's own, else ``DEFAULT_TPU``), the shape configuration (None: the first small
    one), the traced iterations (None: 3 in interpret mode, 20 native), the Python
    tracer, only the static analysis (nothing runs), and the request's deadline.
    ``stderr``: also return what the worker printed meanwhile, under ``stderr`` (the
    ``tilewright profile`` command shows it; a session's record of a profile does not
    keep it)."""

    chip: str | None = None
    shape: str | None = None
    iters: int | None = None
    python_tracer: bool = False
    static_only: bool = False
    timeout_s: float = 300.0
    stderr: bool = False
    # As EvalOptions.route: None chooses by host (the judge runs the exported program
    # under the profiler on a TPU host); "exported" takes that route on any host.
    route: str | None = None

    def to_json(self) -> dict[str, Any]:
        """What the worker's ``profile`` op reads (``stderr`` is the app's business)."""
        data = asdict(self)
        data.pop("stderr")
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ProfileOptions:
        return _from_json(cls, data)


def _from_json(cls: type[_Options], data: dict[str, Any] | None) -> _Options:
    """``cls`` from JSON another process wrote: unknown keys are left out (the worker's
    payload carries its own, e.g. ``memory_limit_mb``), and a missing, null or empty
    value (0, "", []) takes the field's default, as a value the sender did not choose."""
    data = data or {}
    given = {}
    for spec in fields(cls):
        value = data.get(spec.name)
        if value is None or (not value and not isinstance(value, bool)):
            continue
        given[spec.name] = value
    return cls(**given)


def configured_chip(config: Any) -> str | None:
    """The chip a loaded config names (``agents.config.Config``, read by its fields: this
    layer does not import the config's): ``[eval] chip`` (what the judge compiles for),
    else ``[backend] chip``; None: the host's own. The one rule a session
    (``sessions.opening.choose_chip``) and the kernel commands (``kernels.cli``) follow."""
    if config is None:
        return None
    table = getattr(config, "eval", None) or {}
    named = table.get("chip") if hasattr(table, "get") else None
    return named or getattr(getattr(config, "backend", None), "chip", None)
