"""The XLA reference at the production shape, worked out once per task, chip and libtpu.

Every candidate of a task is ranked against the same program: the task's XLA reference
compiled for the chip at the production shape. Its figures are therefore computed once,
off the candidates' critical path, and kept:

- **the record** (``ReferenceRecord``): the reference's compile verdict, XLA's cost
  analysis (FLOPs), the bytes it must move (every input read and every output written
  once: the compulsory traffic), its roofline for the chip, and the TPU compiler's
  estimate, or why there is none. Kept on disk by the exported program's hash, the chip
  and the libtpu version (``compile_pool.DiskCache``): a later evaluation, session or
  worker of the same task reads it instead of compiling anything.
- **the estimate**: whole when XLA's cost analysis puts the program within the
  estimator's budget; else at two smaller sizes and extrapolated by the cost per unit at
  the larger one. The size to scale is one whose halving halves the output: a task's
  batch-like size parameter (``--set``'s names), else axes of the reference's inputs
  (the rows of a matmul, the queries of an attention; ``shrink.batch_axes``), so a task
  brought in with ``tilewright new`` from a plain function scales too. Where the cycles
  do not grow with that size (doubling it, less than 1.8x the cycles), the next such
  size is tried and the one whose cost grows in proportion wins. The programs and their
  sizes: ``reference_programs``.
- **where the estimator cannot price it**, the record still carries the roofline
  (FLOPs at the chip's peak, compulsory bytes at its HBM bandwidth): candidates are then
  ranked by their own compiler cycles against it (``kernels.judge.rank.Rank``, source
  ``roofline``), never by host simulation.

``ReferenceBook`` is the judge's one entry point: ``request(spec, chip)`` in the main
thread (tracing the task's code there, before the trials) returns a ``Ticket`` whose
record is computed by a background thread in a compile process of its own, so a
candidate's own verdict and estimate never queue behind the reference's. Workers of one
host share the work through the disk cache and a lock file per record.

Worker-side (the judge); imports JAX to export the reference.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tilewright.kernels.worker.tpu import compile_pool, estimates, tpu_compile
from tilewright.kernels.worker.tpu.reference_programs import (
    ReferencePlan,
    Scaling,
    budget_ratio,
    export_spec,
    reference_plan,
    roofline,
    scaling_key,
    scaling_options,
)

RECORD_VERSION = 7  # part of a record's key: a new way of computing it is a new record
# A scaled estimate's pair whose cycles grow less than this share of its sizes' growth
# (doubling the size, less than 1.8x the cycles) is not in proportion: the plan's
# alternate size is tried (``reference_estimate``).
LINEAR_MIN = 0.9
# The most the background may spend on one reference (each compile is also bounded by
# compile_pool.COMPILE_TIMEOUT_S).
REFERENCE_TIMEOUT_S = 900.0


# -- estimating it -----------------------------------------------------------------------

def scale_reference(c1: int, c2: int, n1: float, n2: float, full: float
                    ) -> tuple[int, int, float]:
    """An XLA program's cycles at ``full`` of a batch-like size from its cycles at
    ``n1 < n2``: ``c2 * full / n2``, the cost per unit at the larger size. Not the line
    through both: XLA tiles a big batch and re-reads what a small one reads once (a
    4096-row f32 matmul against a line through 256 and 512 rows: 45% low; by the cost
    per row at 512: 4% high, measured). Returns (cycles, the line's figure, how far
    apart the two are, relative)."""
    value = round(c2 * full / max(n2, 1))
    linear, _ = estimates.scale(c1, c2, n1, n2, full)
    return value, linear, abs(value - linear) / max(value, 1)


# A pair whose FLOPs (XLA's count) grow more than this much faster than its sizes is
# scaled by its cost per FLOP: its work grows faster than the size.
WORK_APART = 0.05


def work_units(n1: int, n2: int, full: int, flops: tuple[float, float, float]
               ) -> tuple[float, float, float, str]:
    """What a scaled pair's cost is counted per: the size (``unit``), or XLA's FLOP count
    of each program (``FLOP``) where the FLOPs grow faster than the size. An attention
    scaled along its sequence does four times the work at twice the size: by its cost
    per unit, causal_attention's XLA reference (4x32x4096x128 f32, scaled from 256 and
    512) was 5.2 ms against 39.2 ms on a v5e; per FLOP, 41.6 ms. FLOPs that grow slower
    than the size do not count: the size halves the output, so its bytes grow with it.
    ``flops``: at ``n1``, ``n2`` and ``full`` (0 where XLA gave no count)."""
    f1, f2, ff = flops
    if min(f1, f2, ff) > 0 and (f2 / f1) / (n2 / n1) > 1.0 + WORK_APART:
        return f1, f2, ff, "FLOP"
    return n1, n2, full, "unit"


def _reference_why(answer: dict[str, Any], at: str = "") -> str:
    if answer.get("why") == "crashed" and answer.get("fatal"):
        return (f"the TPU compiler (estimator) aborted on the XLA reference{at}: "
                f"{tpu_compile.short(answer['fatal'], 400)}")
    if answer.get("what"):
        return f"the TPU compiler (estimator) {answer['what']} on the XLA reference{at}"
    return f"XLA reference{at}: {estimates.why_no_records(answer)}"


def reference_estimate(plan: ReferencePlan, deadline: float, memory_mb: int,
                       kind: str = "estimate"
                       ) -> tuple[dict[str, Any] | None, dict[str, Any], str | None]:
    """(estimate, verdict answer, why not): the XLA reference at the production shape,
    whole or extrapolated from the plan's two smaller sizes. ``kind`` names the compile
    process the estimates run in (``reference``: its own, beside the candidates')."""
    comp = compile_pool.compilers()
    chip = plan.chip
    want, reason = estimates.estimates_possible(chip)
    whole: dict[str, Any] = {}
    if want and not plan.scaled and not plan.why_not_scaled:
        # Estimated whole: the estimator's compile says whether it compiles too, so the
        # verdict compiler compiles it only when that one does not (nobody waits for
        # this verdict alone: the record is worked out in the background).
        whole = comp.compile(plan.full.blob, chip, "estimate", deadline, memory_mb,
                             process=kind, fingerprint=plan.full.fingerprint)
        if whole.get("compile") == "ok" and whole.get("records") is not None:
            verdict = {k: v for k, v in whole.items() if k != "records"}
            if _total(whole["records"]) <= 0:
                return None, verdict, ("the TPU compiler (estimator) priced the XLA reference "
                                       "at 0 cycles (ops it cannot price)")
            return _labelled(estimates.estimate_of(whole["records"], chip), plan), verdict, None
    verdict = comp.compile(plan.full.blob, chip, "verdict", deadline, memory_mb,
                           fingerprint=plan.full.fingerprint)
    if verdict.get("compile") != "ok":
        return None, verdict, ("the XLA reference does not compile for "
                               f"{chip} at the production shape: "
                               f"{tpu_compile.short(verdict.get('message') or '', 300)}")
    if not want:
        return None, verdict, reason
    if not plan.scaled:
        if plan.why_not_scaled:
            return None, verdict, plan.why_not_scaled
        return None, verdict, _reference_why(whole)
    found, why = _scaled(plan, deadline, memory_mb, kind)
    chosen = plan
    if found is None and plan.alternate is not None:  # the estimator refused that size
        found, _ = _scaled(plan.alternate, deadline, memory_mb, kind)
        if found is not None:
            found["detail"] += f"; not by {plan.param} ({why})"
            chosen = plan.alternate
    if found is None:
        return None, verdict, why
    if found["linearity"] < LINEAR_MIN and chosen is plan and plan.alternate is not None:
        # Its cost does not grow with this size (9p's SwiGLU along emb_dim: the
        # (tokens, mlp_dim) activations are as large at 16 as at 8192, and the cost per
        # unit at 32 priced it at 2.2x its v5e time): the next size, if it scales better.
        other, _ = _scaled(plan.alternate, deadline, memory_mb, kind)
        if other is not None and other["linearity"] > found["linearity"]:
            other["detail"] += f"; not by {plan.param} ({found['growth']})"
            found, chosen = other, plan.alternate
    if chosen.scaling is not None:
        found["scaling"] = chosen.scaling.to_json()
    if found["linearity"] < LINEAR_MIN:  # said wherever the figure is shown
        found["detail"] += (f"; out of proportion ({chosen.param}: {found['growth']}): the "
                            "smaller sizes are not in the full program's regime, likely "
                            "priced above what the whole program would be")
    return _labelled(found, chosen), verdict, None


def _scaled(plan: ReferencePlan, deadline: float, memory_mb: int, kind: str
            ) -> tuple[dict[str, Any] | None, str | None]:
    """(estimate, why not): the plan's reference at production from a pair of its
    smaller sizes, the preferred pair first, then the one above, then the one below.
    The estimate's ``linearity``: its cycles' growth from the smaller size to the
    larger over the sizes' (1.0: in proportion)."""
    comp = compile_pool.compilers()
    chip = plan.chip
    starts = [plan.start, plan.start + 1, plan.start - 1]
    pairs = [(plan.scaled[i], plan.scaled[i + 1]) for i in starts
             if 0 <= i < len(plan.scaled) - 1]
    why = None
    records: list[list[dict[str, Any]]] = []
    pair = pairs[0]
    name = plan.param
    for pair in pairs:
        records = []
        for n, program in pair:
            answer = comp.compile(program.blob, chip, "estimate", deadline, memory_mb,
                                  process=kind, fingerprint=program.fingerprint)
            if answer.get("compile") != "ok" or answer.get("records") is None:
                why = why or _reference_why(answer, f" with {name} at {n}")
                break
            if _total(answer["records"]) <= 0:  # nothing priced: no figure to scale
                why = why or (f"the TPU compiler (estimator) priced the XLA reference at 0 "
                              f"cycles with {name} at {n} (ops it cannot price)")
                break
            records.append(answer["records"])
        if len(records) == 2 or time.monotonic() > deadline:
            break
    if len(records) != 2:
        return None, why
    (n1, p1), (n2, p2) = pair
    totals = [_total(recs) for recs in records]
    full = int(plan.value or n2)
    u1, u2, uf, unit = work_units(n1, n2, full, tuple(  # type: ignore[arg-type]
        float(c.get("flops") or 0.0) for c in (p1.cost, p2.cost, plan.cost)))
    value, linear, spread = scale_reference(totals[0], totals[1], u1, u2, uf)
    grows = (f" (XLA counts {uf / u2:,.1f} times its FLOPs at {full}, for {full / n2:g} "
             "times the size)" if unit == "FLOP" else "")
    found = estimates.estimate_of(
        records[1], chip, "scaled",
        f"XLA reference estimated with {name} at {n1} and {n2} ({totals[0]:,} and "
        f"{totals[1]:,} cycles) and scaled to {full} by its cost per {unit} at {n2}{grows} "
        f"(a line through both gives {linear:,}: {spread:.0%} apart)")
    found["spread"] = spread
    found["linearity"] = (totals[1] / max(totals[0], 1)) / (u2 / u1)
    found["growth"] = _growth(totals[1] / max(totals[0], 1), u2 / u1, n2 / n1, unit)
    found["cycles"] = value
    found["seconds"] = tpu_compile.estimate(value, chip)["seconds"]
    found["ops"] = [{"name": f"XLA reference ({len(records[1])} ops, extrapolated)",
                     "kind": "xla", "cycles": value}]
    return found, None


def _growth(cycles: float, work: float, size: float, unit: str) -> str:
    """How a pair's cycles grew against its size (and its FLOPs, when counted per FLOP)."""
    said = f"{size:g} times the size multiplied the cycles by {cycles:.2f}"
    return said + (f" and XLA's FLOPs by {work:.2f}" if unit == "FLOP" else "")


def _total(records: list[dict[str, Any]]) -> int:
    """A program's cycles: every op's, times the identical ops its record stands for."""
    return sum(int(r["cycles"]) * int(r.get("count") or 1) for r in records)


def _labelled(found: dict[str, Any], plan: ReferencePlan) -> dict[str, Any]:
    """The estimate, saying so when an equivalent program was priced in its place."""
    note = plan.full.note
    if not note:
        return found
    detail = found.get("detail")
    return {**found, "equivalent": note, "detail": f"{detail}; {note}" if detail else note}


# -- the record, kept --------------------------------------------------------------------

def record_key(fingerprint: str, chip: str, libtpu: str, scaling: str = "whole") -> str:
    """The disk key of a reference record: everything that decides it (the program
    without source locations, which fixes its production shapes; the chip; libtpu; how
    it may be scaled, ``scaling_key``; the way records are made)."""
    return hashlib.sha256("|".join(["reference", str(RECORD_VERSION), chip, libtpu,
                                    fingerprint, scaling]).encode()).hexdigest()


def make_record(plan: ReferencePlan, found: dict[str, Any] | None,
                verdict: dict[str, Any], why: str | None, took: float) -> dict[str, Any]:
    """What every candidate of the task is ranked against (JSON)."""
    cost = dict(plan.cost)
    compiled = verdict.get("cost") or {}
    if compiled.get("flops"):  # the compiled program's count, when it gives one
        cost["flops"] = float(compiled["flops"])
    return {"version": RECORD_VERSION, "chip": plan.chip, "estimate": found, "why": why,
            "compile": verdict.get("compile"),
            "message": tpu_compile.short(verdict.get("message") or "", 300) or None,
            "cost": verdict.get("cost"), "opcodes": verdict.get("opcodes"),
            "convolutions": cost.get("convolutions"),  # as written (``export_program``)
            "flops": cost.get("flops"), "io_bytes": cost.get("io_bytes"),
            "roofline": roofline(cost, plan.chip),
            # the size that priced it (the plan's alternate, when the first was not in
            # proportion: ``reference_estimate``)
            "scaling": (found or {}).get("scaling") or (
                plan.scaling.to_json() if plan.scaling else None),
            "equivalent": plan.full.note,
            "computed_s": round(took, 2)}


def _keep(record: dict[str, Any], answer_why: str | None) -> bool:
    """A record worth keeping on disk: an estimate, or a failure that would happen again
    (not a deadline, a busy host or a memory limit another run may not hit)."""
    if record.get("estimate") is not None:
        return True
    why = answer_why or ""
    # No way to scale it is no lasting answer either: a better way (another layout's
    # parameter, an axis found by a later version) must not meet this record.
    return not any(word in why for word in ("did not finish", "busy", "memory limit",
                                            "deadline", "slot", "no size of it",
                                            "smaller size"))


def reference_memory_mb(memory_mb: int) -> int:
    """The reference's compile process may use more than a candidate's (it runs once per
    task and chip, and a big XLA program's estimate needed 5-16 GB here): what the host
    gives a compile that needs more (``compile_pool.raised_memory_mb``: a third of its
    memory, at most 12 GiB), never less than ``memory_mb``."""
    return max(memory_mb, compile_pool.raised_memory_mb())


@contextlib.contextmanager
def _host_lock(root: Any, key: str, deadline: float) -> Iterator[None]:
    """One worker of this host computes a given record; the others wait for it (a file
    lock: a killed holder releases it). No cache directory: no coordination."""
    if root is None:
        yield
        return
    import filelock

    path = root / "references" / f"{key[:32]}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(path)
        lock.acquire(timeout=max(0.0, deadline - time.monotonic()), poll_interval=0.2)
    except filelock.Timeout:  # go ahead: a stuck holder must not stop this one
        yield
        return
    except OSError:  # cannot coordinate: go ahead alone
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.release()


# -- the book: one record per task and chip, computed in the background -------------------

class Ticket:
    """A reference record being had: ``wait(timeout)`` for it. ``cost`` is known at
    once (XLA's FLOPs and the compulsory bytes of the full program, from its export):
    the production deadline, the memory floor and the roofline need no estimate."""

    def __init__(self, cost: dict[str, float] | None = None) -> None:
        self.future: Future[dict[str, Any]] = Future()
        self.started = time.monotonic()
        self.cost = dict(cost or {})

    def done(self) -> bool:
        return self.future.done()

    def wait(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.future.result(timeout=max(timeout, 0.0))
        except TimeoutError:
            return None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @classmethod
    def of(cls, record: dict[str, Any], cost: dict[str, float] | None = None) -> Ticket:
        ticket = cls(cost)
        ticket.future.set_result(record)
        return ticket


class ReferenceBook:
    """This judge's reference records, by (task spec, chip)."""

    SIZE = 32

    def __init__(self) -> None:
        self.tickets: dict[str, Ticket] = {}
        self.lock = threading.Lock()
        self._thread: ThreadPoolExecutor | None = None

    def start(self) -> None:
        """The background thread, started before the harness snapshots live threads."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tw-reference")
            self._thread.submit(lambda: None).result()

    def request(self, spec: dict[str, Any], chip: str, memory_mb: int) -> Ticket:
        """The reference record of ``spec`` (at its one, production, configuration) for
        ``chip``: from memory, from disk, or computed in the background. The export runs
        here (the task's code, in the calling thread)."""
        key = json.dumps([spec, chip], sort_keys=True, default=str)
        with self.lock:
            ticket = self.tickets.get(key)
        if ticket is not None and (not ticket.done() or (ticket.wait(0) or {}).get("final")):
            return ticket  # being computed, or done for good (not a deadline's failure)
        comp = compile_pool.compilers()
        try:
            full = export_spec(spec, chip)
        except Exception as exc:  # the task's reference at its own size
            ticket = Ticket.of({"estimate": None, "compile": None, "chip": chip,
                                "why": "the XLA reference could not be exported at the "
                                       f"production shape: {type(exc).__name__}: "
                                       f"{str(exc)[:300]}", "roofline": None, "final": True})
            return self._keep(key, ticket)
        options: list[tuple[Scaling, Any]] | None = None
        options_error: Exception | None = None
        if budget_ratio(full.cost) > 1.0:  # to be scaled: how is part of what decides it
            try:
                options = scaling_options(spec, chip)
            except Exception as exc:
                options, options_error = [], exc
        disk_key = record_key(full.fingerprint, chip, comp.libtpu, scaling_key(options))
        cached = comp.cache.get(disk_key)
        if cached is not None:
            return self._keep(key, Ticket.of({**cached, "cached": True, "final": True},
                                             full.cost))
        try:
            if options_error is not None:
                raise options_error
            plan = reference_plan(spec, chip, full, options)
        except Exception as exc:
            plan = ReferencePlan(full, chip)
            plan.why_not_scaled = (f"the XLA reference could not be exported at a smaller "
                                   f"size: {type(exc).__name__}: {str(exc)[:300]}")
        ticket = Ticket(full.cost)
        self._keep(key, ticket)
        self.start()
        assert self._thread is not None
        self._thread.submit(self._compute, plan, disk_key, ticket, memory_mb)
        return ticket

    def _keep(self, key: str, ticket: Ticket) -> Ticket:
        with self.lock:
            if len(self.tickets) >= self.SIZE:
                self.tickets.pop(next(iter(self.tickets)))
            self.tickets[key] = ticket
        return ticket

    @staticmethod
    def _compute(plan: ReferencePlan, disk_key: str, ticket: Ticket, memory_mb: int) -> None:
        comp = compile_pool.compilers()
        started = time.monotonic()
        deadline = started + REFERENCE_TIMEOUT_S
        try:
            with _host_lock(comp.cache.root, disk_key, deadline):
                cached = comp.cache.get(disk_key)
                if cached is not None:
                    ticket.future.set_result({**cached, "cached": True, "final": True})
                    return
                found, verdict, why = reference_estimate(plan, deadline,
                                                         reference_memory_mb(memory_mb),
                                                         kind="reference")
                record = make_record(plan, found, verdict, why, time.monotonic() - started)
                final = _keep(record, why)
                if final:
                    comp.cache.put(disk_key, record)
            ticket.future.set_result({**record, "cached": False, "final": final})
        except BaseException as exc:  # a harness bug: the candidates go on without it
            ticket.future.set_result({
                "estimate": None, "chip": plan.chip, "compile": None,
                "why": f"the XLA reference's estimate failed: {type(exc).__name__}: {exc}"[:400],
                "roofline": roofline(plan.cost, plan.chip),
                "flops": plan.cost.get("flops"), "io_bytes": plan.cost.get("io_bytes")})


BOOK = ReferenceBook()
