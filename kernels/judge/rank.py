"""``Rank``: the one number that ranks an evaluation, and the one rule that crowns "best".

Where a rank comes from (measured on a chip, the TPU compiler's estimate, a roofline or
an upper bound, the CPU interpreter's ratio, or nothing: disqualified, failed), its value,
the chip and production shape it is for, how far it can be trusted; one ordering
(``Rank.key``), one wording (``Rank.words``) and one choice of the best (``best_of``) for
every screen, report, prompt, scheduler and search. Built from the eval JSON
(``ranking``) or from a session's event (``Rank.from_event``). App-side: no JAX here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from tilewright.kernels.judge.trust import fidelity_brief, speedup_words

RANK_SOURCES = ("device_time", "tpu_estimate", "roofline", "host_simulation", "disqualified",
                "none")

# Integrity flags that keep a correct kernel from being ranked at all ("best", the
# tuner's choice, search's beam): the work may not be the kernel's, or the number may
# not be real. degenerate_reference is the task's problem, shown but not disqualifying.
DISQUALIFYING_FLAGS = frozenset({
    "compute_outside_kernel", "nondeterministic", "suspicious_speedup", "no_pallas_call",
    "harness_tampering", "background_threads", "jax_config_changed",
    "platform_dependent", "interpret_param",  # always rejected too: never ranked
    # the program that would run is not the one checked (rejected when correct), or its
    # estimate prices less than its own work (the number cannot be believed)
    "production_program_differs", "trace_dependent", "partial_coverage",
    "estimate_below_roofline",
})


_T = TypeVar("_T")

# The key of no rank at all: below every Rank's, the one that ranks nothing included.
UNRANKED = (-1, 0, 0.0, 0.0)


def rank_key(rank: Rank | None) -> tuple[int, int, float, float]:
    """``Rank.key``, or ``UNRANKED`` for no rank."""
    return rank.key() if rank is not None else UNRANKED


# Two compiler figures of one task closer than this are one figure: the TPU compiler's
# estimate prices the MXU work of two tilings alike and not what large blocks cost on the
# chip. Measured on a v5e (benchmarks/data/v5e_gemm_blocks_2026-12-06.jsonl, 4096x8192 @
# 8192x8192 bf16 with an epilogue): a 1024x2048x2048 tiling asking 52 MiB of VMEM, estimated
# 0.02% faster than a 1024x1024x2048 one asking 32 MiB, ran 29% slower (3.74 against 2.89
# ms); on 16384x4096 @ 4096x4096 the same 52 MiB tiling, estimated 0.9% faster than a 22
# MiB one, ran 25% slower; a float32 1024-cubed one (44.5 MiB), 0.25% faster by estimate
# than a 26 MiB one, ran 14% slower. Within this band the tiling asking the least VMEM wins.
ESTIMATE_TIE = 0.01


def _in_band(rank: Rank | None, top: Rank) -> bool:
    """Whether ``rank`` is a compiler figure within ``ESTIMATE_TIE`` of ``top``'s."""
    return rank is not None and rank.compiler and rank.kernel_s is not None \
        and top.kernel_s is not None and rank.kernel_s <= top.kernel_s * (1 + ESTIMATE_TIE)


def contends(rank: Rank | None, top: Rank | None) -> bool:
    """Whether ``rank`` could displace ``top`` as the best (``best_of``): ranked higher,
    or a compiler figure within ``ESTIMATE_TIE`` of it."""
    if top is None:
        return rank is not None
    return rank_key(rank) > top.key() or (top.compiler and _in_band(rank, top))


def best_of(items: Iterable[_T], rank: Callable[[_T], Rank | None]) -> _T | None:
    """The item whose rank is highest (``Rank.key``), the first of equals: the one rule
    that crowns "best" for a session, a search's beam and lineages, the agents' memory
    and plans. Where the highest is the TPU compiler's figure, the items whose figures
    are within ``ESTIMATE_TIE`` of it count as equal and the one asking the least VMEM
    at the production shape (``Rank.vmem_bytes``) wins, the first of equals. None for no
    items."""
    pool = [(item, rank(item)) for item in items]
    best = _highest(pool)
    if best is None:
        return None
    top = best[1]
    if top is None or not top.compiler or top.kernel_s is None or top.vmem_bytes is None:
        return best[0]  # nothing to weigh it by
    chosen, least = best[0], top.vmem_bytes
    for item, found in pool:
        if _in_band(found, top) and found is not None and found.vmem_bytes is not None \
                and found.vmem_bytes < least:
            chosen, least = item, found.vmem_bytes
    return chosen


def ranked_order(items: Iterable[_T], rank: Callable[[_T], Rank | None]) -> list[_T]:
    """The items best first, by ``best_of``'s rule applied again to what is left: the
    first is the one ``best_of`` crowns, so a beam cut from the front always holds it."""
    left = list(items)
    order: list[_T] = []
    while left:
        top = best_of(left, rank)
        index = next(i for i, item in enumerate(left) if item is top)
        order.append(left.pop(index))
    return order


def _highest(pool: list[tuple[_T, Rank | None]]) -> tuple[_T, Rank | None] | None:
    """The (item, rank) whose ``rank_key`` is highest, the first of equals."""
    best: tuple[_T, Rank | None] | None = None
    best_key = UNRANKED
    for item, found in pool:
        key = rank_key(found)
        if best is None or key > best_key:
            best, best_key = (item, found), key
    return best


def tie_note(items: Iterable[_T], rank: Callable[[_T], Rank | None],
             name: Callable[[_T], str]) -> str | None:
    """Why ``best_of``'s choice is not the item ranked highest, when the tie rule made it:
    "v7's estimate is 0.62% faster: within 1% the tiling asking less VMEM wins (22 MiB
    against 41 MiB)"; None when the highest is the choice."""
    pool = list(items)
    chosen = best_of(pool, rank)
    highest = _highest([(item, rank(item)) for item in pool])
    if chosen is None or highest is None or chosen is highest[0]:
        return None
    top = highest[0]
    mine, theirs = rank(chosen), highest[1]
    if mine is None or theirs is None or not mine.kernel_s or not theirs.kernel_s \
            or mine.vmem_bytes is None or theirs.vmem_bytes is None:
        return None
    faster = mine.kernel_s / theirs.kernel_s - 1
    return (f"{name(top)}'s estimate is {faster:.2%} faster: within {ESTIMATE_TIE:.0%} the "
            f"tiling asking less VMEM wins ({mine.vmem_bytes / 2**20:.0f} MiB against "
            f"{theirs.vmem_bytes / 2**20:.0f} MiB; the estimate does not see what large "
            "blocks cost)")


_WHY_SHORT = (
    ("memory limit", "estimator memory cap"), ("aborted", "estimator aborted"),
    ("did not finish", "estimator timed out"), ("deadline", "estimator timed out"),
    ("busy", "estimator busy"), ("halves its output", "reference unscalable"),
    ("too costly", "reference too costly"), ("does not compile", "reference won't compile"),
    ("callback", "host callback"), ("without an estimate", "no estimator for chip"),
    ("libtpu", "libtpu refused"), ("0 cycles", "priced at 0 cycles"),
)


def why_short(why: str | None) -> str | None:
    """A missing figure's reason in a few words (None without one)."""
    if not why:
        return None
    lowered = why.lower()
    for words, short in _WHY_SHORT:
        if words in lowered:
            return short
    return "see why"


@dataclass(frozen=True)
class Rank:
    """The number that ranks an evaluation: where it comes from, its value, the chip and
    production shape it is for, how far it can be trusted; one ordering (``key``) and
    one wording (``words``) for every screen, report, prompt and scheduler.

    ``source`` (best first):

    - ``device_time``: measured on a TPU; ``value`` is the measured speedup over the XLA
      reference timed the same way (the estimate is kept beside it).
    - ``tpu_estimate``: the TPU compiler's static estimate for ``chip`` at the production
      ``shape``, against the XLA reference estimated for the same chip and shape;
      ``value`` is the estimated speedup (each side the larger of the compiler's figure
      and its memory floor: ``basis`` says which decided).
    - ``roofline``: the kernel's own estimate against the reference's roofline (its FLOPs
      at the chip's peak, its compulsory bytes at the HBM bandwidth), where the
      estimator cannot price the reference; ``value`` is roofline time / kernel time, a
      lower bound of the speedup (XLA is never faster than its roofline).
    - ``bound``: the compiler's estimate was not believed (``tpu.unpriced``: a kernel
      whose loop length is read at run time priced at 0 cycles); ``value`` is the
      reference's time over the least time the kernel can take (its own work at the
      chip's peak, its memory floor), an upper bound of the speedup, ranked below every
      compiler figure and above host simulation.
    - ``host_simulation``: only where no compiler figure exists: the CPU interpreter's
      time ratio, which predicts nothing about a TPU (``value`` is that ratio).
    - ``disqualified`` (correct, but an integrity flag forbids ranking it) and ``none``.

    Both compiler sources order by the kernel's own time at the production shape
    (``kernel_s``: the larger of its estimate and its memory floor; ties broken by its
    cycles), which is what differs between candidates of one task: a reference estimate
    that arrives later changes the words, never the order.
    """

    source: str
    value: float | None = None
    chip: str | None = None
    shape: str | None = None  # the production shape, compact ("4096x4096")
    kernel_s: float | None = None  # the kernel's time that orders compiler ranks
    kernel_cycles: int | None = None  # the compiler's cycles for it
    reference_s: float | None = None  # the reference's: estimate, or roofline (roofline)
    clock_hz: float | None = None  # the chip's clock the cycles are counted at
    basis: str | None = None  # compiler | memory_floor | roofline (tpu_estimate)
    derived: bool = False  # a figure was scaled from a shorter grid or a smaller size
    estimate: float | None = None  # the estimated speedup, also beside a measurement
    measured: float | None = None  # measured on a TPU
    fidelity: dict[str, Any] | None = None  # {class, chip, median_ratio, within_2x, rows}
    # The speedup the compiler's cycles alone say (kernel vs reference), beside an
    # estimate the memory floor decided: both figures are shown.
    compiler_value: float | None = None
    why_none: str | None = None  # why there is no better number (no estimate: the reason)
    status: str | None = None  # the evaluation's status
    flags: tuple[str, ...] = ()  # the disqualifying flags
    device: str | None = None  # the TPU the measurement ran on
    # The scoped VMEM the compiler allotted the kernel at the production shape: decides
    # between compiler figures within ESTIMATE_TIE of each other (``best_of``).
    vmem_bytes: int | None = None
    # A log written before this type existed says only how its number read.
    legacy_label: str | None = None

    # -- order ------------------------------------------------------------------------
    def key(self) -> tuple[int, int, float, float]:
        """The one ordering (larger is better): device time, then the compiler's figures
        (by the kernel's time at the production shape, then its cycles), then host
        simulation, then nothing. Ranks of one task and chip compare."""
        if self.source == "device_time" and self.value is not None:
            return (4, 1, self.value, 0.0)
        if self.source in ("tpu_estimate", "roofline"):
            if self.kernel_s is not None:
                return (3, 1, -self.kernel_s, -float(self.kernel_cycles or 0))
            if self.kernel_cycles is not None:
                return (3, 1, -self.kernel_cycles / (self.clock_hz or 1e9),
                        -float(self.kernel_cycles))
            if self.value is not None:  # a log older than kernel times
                return (3, 0, self.value, 0.0)
        if self.source == "bound" and self.kernel_s is not None:
            return (2, 1, -self.kernel_s, 0.0)
        if self.source == "host_simulation" and self.value is not None:
            return (1, 1, self.value, 0.0)
        return (0, 0, 0.0, 0.0)

    @property
    def ranked(self) -> bool:
        """Whether this is a ranking number at all (a correct, undisqualified result)."""
        return self.key()[0] > 0

    @property
    def compiler(self) -> bool:
        """A figure of the TPU compiler's (estimate or roofline): what ranks off-TPU."""
        return self.source in ("tpu_estimate", "roofline")

    @property
    def is_estimate(self) -> bool:
        """The TPU compiler's estimate against XLA's estimate (``tpu_estimate``)."""
        return self.source == "tpu_estimate"

    @property
    def on_chip(self) -> bool:
        """Measured on a TPU (``device_time``)."""
        return self.source == "device_time"

    @property
    def is_roofline(self) -> bool:
        """The kernel's estimate against the reference's roofline: a lower bound."""
        return self.source == "roofline"

    @property
    def is_bound(self) -> bool:
        """The reference over the kernel's least time: an upper bound (``bound``)."""
        return self.source == "bound"

    @property
    def simulated(self) -> bool:
        """The CPU interpreter's time ratio, which predicts nothing about a TPU."""
        return self.source == "host_simulation"

    @property
    def disqualified(self) -> bool:
        """Correct, but an integrity flag forbids ranking it (``flags`` say which)."""
        return self.source == "disqualified"

    @property
    def said(self) -> bool:
        """There is something to say: a ranking number, or why a correct kernel has none
        (disqualified); not for a failed or unevaluated version (``none``)."""
        return self.source != "none"

    @property
    def decided(self) -> bool:
        """Ranked, or disqualified: a verdict on a correct kernel."""
        return self.ranked or self.disqualified

    def better_than(self, other: Rank | None) -> bool:
        return other is None or self.key() > other.key()

    # -- words ------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return self.words()

    def words(self, short: bool = False, chip: bool = True) -> str:
        """The number with what it is, never a host simulation ratio as a speedup:
        "est. 1.29x on v5e at 4096x4096 (TPU compiler, memory floor)", "≥0.87x vs XLA's
        roofline ...", "1.34x measured on TPU v5 lite ...", "host sim. ratio 0.0278 ...";
        ``short`` for one-line summaries and tables ("est. 1.29x", "≥0.87x roofline",
        "1.34x meas.", "host sim 0.0278", "-"); ``chip=False`` leaves the chip out where
        the screen names it already."""
        v = self.value
        on = f" on {self.chip}" if chip and self.chip else ""
        if self.source == "device_time" and v is not None:
            if short:
                return f"{times(v)} meas."
            where = f" at {self.shape}" if self.shape else ""
            beside = f", est. {times(self.estimate)}" if self.estimate is not None else ""
            device = f" on {self.device or 'TPU'}" if chip else ""
            return f"{times(v)} measured{device}{where}{beside}"
        if self.source == "tpu_estimate" and v is not None:
            if short:
                return f"est. {times(v)}"
            if self.legacy_label:  # a log older than ranks: its own words
                return self.legacy_label if on or not self.chip else \
                    self.legacy_label.replace(f" on {self.chip}", "")
            return f"est. {times(v)}{on}{self._at()} ({self.how()})"
        if self.source == "roofline" and v is not None:
            if short:
                return f"≥{times(v)} roofline"
            kernel = f"kernel {_ms(self.kernel_s)} by the TPU compiler" if self.kernel_s \
                else "the kernel's compiler cycles"
            ref = f" {_ms(self.reference_s)}" if self.reference_s else ""
            why = f"; no XLA estimate: {self.why_none}" if self.why_none else ""
            return (f"≥{times(v)} vs XLA's roofline{on}{self._at()} ({kernel} "
                    f"against the reference's roofline{ref}{why})")
        if self.source == "bound" and v is not None:
            if short:
                return f"≤{v:.2f}x bound"
            kernel = f"the kernel's least time {_ms(self.kernel_s)}" if self.kernel_s \
                else "the kernel's least time"
            ref = f" against XLA's {_ms(self.reference_s)}" if self.reference_s else ""
            why = f"; the estimate is not believed: {self.why_none}" if self.why_none else ""
            return f"≤{v:.2f}x bound{on}{self._at()} ({kernel}{ref}{why})"
        if self.source == "host_simulation" and v is not None:
            if short:  # the reason there is no compiler figure stands beside it
                why = self.why_short()
                return f"host sim {v:.3g}" + (f" ({why})" if why else "")
            reason = f" (no TPU estimate: {self.why_none})" if self.why_none else ""
            return f"host sim. ratio {v:.3g} (CPU interpreter, not TPU performance){reason}"
        if self.source == "disqualified":
            return "disq." if short else "not ranked: " + ", ".join(self.flags)
        if short:
            why = self.why_short() if self.status in (None, "correct") else None
            return f"no est. ({why})" if why else "-"
        if self.status and self.status != "correct":
            return self.status
        return f"no estimate: {self.why_none}" if self.why_none else "no estimate"

    def why_short(self) -> str | None:
        """Why there is no compiler figure, in a few words for a table cell or a status
        line (the whole reason is ``why_none``, in ``words()``)."""
        return why_short(self.why_none)

    def _at(self) -> str:
        return f" at {self.shape}" if self.shape else ""

    def how(self) -> str:
        """How an estimate was had: "TPU compiler", "TPU compiler, scaled", "TPU
        compiler, memory floor; cycles alone 1.72x" (the floor decided, and what the
        compiler's cycles alone say beside it)."""
        words = ["TPU compiler"]
        if self.derived:
            words.append("scaled")
        if self.floored:
            alone = f"; cycles alone {times(self.compiler_value)}" \
                if self.compiler_value is not None else ""
            what = "XLA at its roofline" if self.basis == "roofline" else "memory floor"
            from tilewright.profiling.chips import CHIPS, SLOWEST_CLOCK_HZ

            chip = CHIPS.get(str(self.chip))
            if chip is not None and not chip.clock_hz:  # v7x: the floor counted in cycles
                what += f" in cycles at {SLOWEST_CLOCK_HZ / 1e9:g} GHz"
            words.append(f"{what}{alone}")
        return ", ".join(words)

    @property
    def floored(self) -> bool:
        """A floor decided the estimate, not the compiler's cycles: a memory floor (either
        side's bytes at the HBM bandwidth), or the XLA reference's roofline (its FLOPs at
        the chip's peak, where the compiler priced it below that)."""
        return self.basis in ("memory_floor", "roofline")

    def floor_words(self) -> str | None:
        """When the memory floor decided an estimate, both figures in a sentence: "the
        memory floor decided it (est. 4.00x); the compiler's cycles alone say 1.72x";
        None otherwise."""
        if self.source != "tpu_estimate" or not self.floored or self.value is None:
            return None
        alone = f"; the compiler's cycles alone say {times(self.compiler_value)}" \
            if self.compiler_value is not None else ""
        if self.basis == "roofline":
            return (f"the XLA reference's roofline decided it (est. {times(self.value)}: "
                    f"the compiler priced XLA below its FLOPs at the chip's peak){alone}")
        return f"the memory floor decided it (est. {times(self.value)}){alone}"

    def time_words(self) -> str | None:
        """The kernel's figure in cycles and time side by side: "1,196,542 cycles =
        0.798 ms at 1.5 GHz"; None without cycles."""
        if self.kernel_cycles is None:
            return None
        if not self.clock_hz:
            return f"{self.kernel_cycles:,} cycles"
        return (f"{self.kernel_cycles:,} cycles = "
                f"{_ms(self.kernel_cycles / self.clock_hz)} at {self.clock_hz / 1e9:g} GHz")

    def trust_words(self) -> str | None:
        """How far a compiler figure can be trusted, as measured for its chip and class:
        "compute-bound v5e: median 0.96 of measured, 10 programs"; None for other
        sources or without a record."""
        f = self.fidelity
        if not self.compiler or not f:
            return None
        klass = str(f.get("class") or "this class").replace("_", "-")
        rows = f.get("rows") or 0
        speedups = speedup_words(f.get("speedups"))
        if not rows or f.get("median_ratio") is None:
            said = f"{klass} on {f.get('chip') or self.chip}: no public measurement"
            return f"{said}; {speedups}" if speedups else said
        within = f.get("within_2x")
        share = f", {within:.0%} within 2x" if isinstance(within, int | float) else ""
        measured_on = f.get("chip") or self.chip
        # figures measured on another chip stand in for this one: said so
        borrowed = (f" (borrowed for {self.chip}: no measurements on {self.chip} for this "
                    "class)" if self.chip and measured_on and measured_on != self.chip else "")
        said = (f"{klass} {measured_on}: median {f['median_ratio']:.2f} of "
                f"measured, {rows} programs{share}{borrowed}")
        return f"{said}; {speedups}" if speedups else said

    # -- JSON --------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if v not in (None, (), False)}
        if self.flags:
            data["flags"] = list(self.flags)
        data["source"] = self.source
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Rank | None:
        if not isinstance(data, dict) or not isinstance(data.get("source"), str):
            return None
        known = {f for f in cls.__dataclass_fields__}
        given = {k: v for k, v in data.items() if k in known}
        if "flags" in given:
            given["flags"] = tuple(given["flags"] or ())
        return cls(**given)

    @classmethod
    def from_event(cls, e: dict[str, Any], backend: dict[str, Any] | None = None
                   ) -> Rank | None:
        """The rank a session's ``run.result`` event recorded (``Judgement.event_fields``).
        A log written before ranks were recorded gives its source, number and label; one
        written before the TPU compile existed only its timing ratio, measured on the
        session's ``backend`` (its header's): device time on a TPU, host simulation
        elsewhere."""
        found = cls.from_json(e.get("rank"))
        if found is not None:
            return found
        source = e.get("rank_source")
        if not source:
            if e.get("status") != "correct":
                source = "none"
            elif (backend or {}).get("platform") == "tpu" \
                    and (backend or {}).get("mode") == "native":
                source = "device_time"
            else:
                source = "host_simulation"
        return cls.legacy(source, e.get("speedup"), e.get("rank_label"), e.get("chip"),
                          e.get("rank_shape"))

    @classmethod
    def legacy(cls, source: str | None, value: Any, label: str | None = None,
               chip: str | None = None, shape: str | None = None) -> Rank | None:
        """A rank from a log written before ``Rank`` was recorded: its source, the number
        it ranked by, and how it read."""
        if not source:
            return None
        return cls(source, _num(value), chip, shape, legacy_label=label)


def times(x: float | None) -> str:
    """The one way a speedup is written: "4.00x" (two decimals); "-" for none."""
    if not isinstance(x, int | float) or isinstance(x, bool):
        return "-"
    return f"{x:.2f}x"


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.3g} us"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and value > 0 else None


def ranking(result: dict[str, Any]) -> Rank:
    """The ranking number of an eval result (its JSON): measured speedup on a TPU; the
    TPU compiler's figures at the production shape elsewhere (estimate, else the
    kernel's estimate against the reference's roofline); host simulation only where the
    compiler gave nothing. Pure data: the app, tuner, search and reports all call this."""
    tpu = result.get("tpu") or {}
    timing = result.get("timing") or {}
    backend = result.get("backend") or {}
    chip = tpu.get("chip")
    shape = tpu.get("shape_label") if isinstance(tpu.get("shape_label"), str) else None
    status = str(result.get("status") or "not evaluated")
    estimate = _num(tpu.get("estimated_speedup"))
    kernel = tpu.get("estimate") or {}
    cycles = int(kernel["cycles"]) if isinstance(kernel.get("cycles"), int | float) \
        and not isinstance(kernel.get("cycles"), bool) else None
    kernel_s = _num(tpu.get("kernel_time_s"))
    clock = None
    if cycles and _num(kernel.get("seconds")):
        clock = cycles / float(kernel["seconds"])
    why = tpu.get("estimate_unavailable") if isinstance(tpu.get("estimate_unavailable"),
                                                        str) else None
    common = {"chip": chip, "shape": shape, "status": status, "kernel_cycles": cycles,
              "kernel_s": kernel_s, "clock_hz": round(clock) if clock else None,
              "fidelity": fidelity_brief(tpu.get("fidelity")),
              "vmem_bytes": tpu["vmem_bytes"] if type(tpu.get("vmem_bytes")) is int
              and tpu["vmem_bytes"] > 0 else None,
              "derived": any((tpu.get(k) or {}).get("method") == "scaled"
                             for k in ("estimate", "reference_estimate"))}
    if status != "correct":
        return Rank("none", None, estimate=estimate, **common)
    flags = disqualifying_flags(result)
    if flags:  # correct, but not to be crowned: search, auto and reports skip it
        return Rank("disqualified", None, estimate=estimate, flags=tuple(flags), **common)
    native = backend.get("platform") == "tpu" and backend.get("mode") == "native"
    measured = _num(timing.get("speedup")) if native else None
    if measured is not None:
        return Rank("device_time", measured, estimate=estimate, measured=measured,
                    device=backend.get("device_kind") or "TPU",
                    **{**common, "shape": timing.get("shape_label") or shape})
    bound = tpu.get("bound") if isinstance(tpu.get("bound"), dict) else {}
    doubt = next((tpu[k] for k in ("implausible", "unpriced") if isinstance(tpu.get(k), str)),
                 None)
    if doubt and _num(bound.get("speedup")):
        return Rank("bound", _num(bound.get("speedup")),
                    reference_s=_num(bound.get("reference_s")), why_none=doubt,
                    **{**common, "kernel_s": _num(bound.get("kernel_s"))})
    if estimate is not None:
        ref = _num((tpu.get("reference_estimate") or {}).get("seconds"))
        return Rank("tpu_estimate", estimate, estimate=estimate, reference_s=ref,
                    basis=tpu.get("basis"), compiler_value=_num(tpu.get("compiler_speedup")),
                    **common)
    roofline = _num(tpu.get("roofline_ratio"))
    if roofline is not None:
        ref = _num((tpu.get("reference_roofline") or {}).get("seconds"))
        return Rank("roofline", roofline, reference_s=ref, why_none=why, **common)
    host = _num(timing.get("host_ratio"))
    if host is None and not native:  # an eval JSON written before host_ratio existed
        host = _num(timing.get("speedup"))
    if host is not None:
        return Rank("host_simulation", host, why_none=why, **common)
    return Rank("none", None, why_none=why, **common)


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
    rank = ranking({"status": "correct", "tpu": tpu})
    if rank.compiler:
        return f"{where}: compiles{vmem}, {rank.words(short=True)} ({rank.how()})"
    why = tpu.get("estimate_unavailable")
    if why and why != "estimating":
        return f"{where}: compiles{vmem}, no estimate ({why})"
    cycles = (tpu.get("estimate") or {}).get("cycles")
    if isinstance(cycles, int):
        return f"{where}: compiles{vmem}, kernel {cycles:,} cycles; estimating the reference ..."
    return f"{where}: compiles{vmem}, estimating ..."


def disqualifying_flags(result: dict[str, Any]) -> list[str]:
    """The result's integrity flags that forbid ranking it, sorted."""
    flags = (result.get("integrity") or {}).get("flags") or []
    return sorted(set(flags) & DISQUALIFYING_FLAGS)
