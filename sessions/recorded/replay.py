"""Headless replay: fold a recorded session and print it; ``--verify`` re-runs it.

Printing goes through the same fold as live work. Verification re-evaluates every
version that has a finished evaluation, with the evaluation options recorded in the
header, and checks that the status and the correctness verdict reproduce and that
the number that ranked the version agrees:

- The TPU compiler's figures (off-TPU, whenever the log has one): the re-run's kernel
  time at the production shape (in an eval JSON written before kernel times, its
  estimated speedup) is within 2% of the recorded one. The compiler's static estimate
  is deterministic for the same kernel, shapes and chip, so any real change shows.
- Otherwise, TPU interpret mode (or any CPU timing): the new host ratio (candidate vs.
  reference, both timed in the same worker a moment apart, which cancels most of the
  machine's load; never a speedup) is within a factor of 3 of the recorded one. Raw
  interpret-mode medians on a shared 2-core CPU were measured to swing 4-6x between
  runs of the same kernel, so they are printed but not judged; a tighter band would
  flag the machine, not the kernel.
- Native timing (a real TPU/GPU): the new median lies inside the recorded p10-p90
  spread widened by half on each side (``[p10 / 1.5, p90 * 1.5]``).

A version whose timing falls outside the band is measured once more (a busy machine
or a cold worker makes single outliers; measured here: 5-7x on a shared 2-core host)
and the closer measurement counts. A version whose status or correctness differs, or
whose timing is still outside the band, makes the verification fail (exit 1); so does
a re-judged ``Rank`` that disagrees with the logged one (``rank_agrees``: the same kind
of number, a compiler figure by the kernel's time within 2%, any other within a factor
of 3).

Before anything is re-run, ``audit`` checks that the log is what tilewright wrote:
every blob's name is the sha256 of its content and no referenced blob is missing;
every number in a ``run.result`` event (status, correctness, median, the rank's
source, value and kernel time; an old log's speedup) equals the eval JSON it points
to; ``seq`` runs 1, 2, ... without gaps or repeats; no line was skipped as binary or
foreign; and the approval chain holds (every kernel version but the task's own has an
approving ``user.decision`` about its proposal, written before it, and every run is
of such a version). Re-measurement is compared with the
event's numbers too, so an edited rank fails one way or the other.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from tilewright.kernels.judge.judgement import Judgement
from tilewright.kernels.judge.rank import Rank, ranking
from tilewright.kernels.judge.result import is_interpret
from tilewright.kernels.source.printable import PrintableStream
from tilewright.sessions import events as ev
from tilewright.sessions.log import LoadedSession, SessionError, read_blob
from tilewright.sessions.state import SessionState, approving

INTERPRET_FACTOR = 3.0
NATIVE_WIDEN = 1.5
ATTEMPTS = 2  # a timing outlier is measured once more


def describe(event: ev.Event) -> str:
    """One line for an event in a printed timeline."""
    kind = event["type"]
    words = detail(event) or "(unknown event type, kept)"
    return f"{event.get('seq', '-'):>5} {float(event.get('t', 0)):>9.2f}s  {kind:<15} {words}"


def detail(event: ev.Event) -> str | None:
    """What an event says, in the words of a timeline line (None for a kind with no
    words of its own: the search's); the replay screen's transport line shows them too."""
    line = _DESCRIBE.get(event["type"])
    return line(event) if line is not None else None


def _user_message(e: ev.UserMessage) -> str:
    return f"you: {e.get('text', '')}"


def _agent_message(e: ev.AgentMessage) -> str:
    u = e.get("usage") or {}
    return (f"agent ({e.get('role')}): {(e.get('text') or '').strip()[:70]!r} "
            f"[{u.get('input_tokens', 0)}+{u.get('output_tokens', 0)} tok]"
            + (" (cancelled)" if e.get("cancelled") else ""))


def _proposal(e: ev.AgentProposal) -> str:
    extra = f" {e.get('tuning')}" if e.get("tuning") else ""
    return f"proposal {e.get('proposal')} [{e.get('kind')}] {e.get('summary')}{extra}"


def _decision(e: ev.UserDecision) -> str:
    note = f" — {e['note']}" if e.get("note") else ""
    return f"{e.get('decision')} {e.get('proposal') or '(edit)'} by {e.get('by')}{note}"


def _version(e: ev.KernelVersion) -> str:
    return f"v{e.get('version')} from v{e.get('parent')} ({e.get('origin')}): {e.get('summary')}"


def _checkout(e: ev.KernelCheckout) -> str:
    return f"back to v{e.get('version')} (by {e.get('by')})"


def _run_start(e: ev.RunStart) -> str:
    return f"{e.get('run')} {e.get('kind')} v{e.get('version')} (by {e.get('by')})"


def _run_result(e: ev.RunResult) -> str:
    rank = Judgement.from_event(e).rank  # an estimate says so; host sim is no speedup
    speed = f" · {rank.words()}" if rank is not None and rank.ranked else ""
    return f"{e.get('run')} v{e.get('version')} {e.get('status')}{speed}"


def _mode(e: ev.ModeChange) -> str:
    return f"mode {e.get('mode')} (by {e.get('by')})"


def _reason(e: ev.AutoStop | ev.SessionEnd) -> str:
    return f"{e.get('reason')}"


def _error(e: ev.Error) -> str:
    return f"{e.get('where')}: {e.get('message')}"


def _agent_finished(e: ev.AgentFinished) -> str:
    return str(e.get("message"))


def _marker(e: ev.Marker) -> str:
    return str(e.get("label"))


def _profile_result(e: ev.ProfileResult) -> str:
    return f"{e.get('run')} v{e.get('version')}" + (f" error: {e['error']}"
                                                     if e.get("error") else "")


def _diagnosis(e: ev.Diagnosis) -> str:
    return f"v{e.get('version')} {e.get('kind')}: {str(e.get('summary'))[:70]!r}"


# The kinds a timeline line describes, each function filed under the event it reads
# (``ev.by_kind``). Others print as unknown.
_DESCRIBE: dict[str, Callable[[Any], str]] = ev.by_kind(
    _user_message, _agent_message, _proposal, _decision, _version, _checkout, _run_start,
    _run_result, _mode, _reason, _error, _agent_finished, _marker, _profile_result, _diagnosis)


def print_session(loaded: LoadedSession, state: SessionState, out: TextIO) -> None:
    out = PrintableStream(out)  # type: ignore[assignment]  # a log's text, no controls
    h = loaded.header
    task = h.get("task") or {}
    backend = h.get("backend") or {}
    print(f"session {h.get('id')} · task {task.get('name')} ({task.get('layout')}) · "
          f"{backend.get('label') or backend.get('platform') or 'backend unknown'} · "
          f"agent {h.get('agent')} · created {h.get('created')}", file=out)
    for event in loaded.events:
        print(describe(event), file=out)
    print(file=out)
    print_state(state, out)


def print_state(state: SessionState, out: TextIO) -> None:
    out = PrintableStream(out)  # type: ignore[assignment]
    print(f"{len(state.versions)} versions, {state.spent.runs} evaluations, "
          f"{len(state.decisions)} decisions, {state.spent.tokens} tokens, "
          f"{state.spent.cost_text()}; mode {state.mode}; "
          f"ended: {state.ended or 'no (resumable)'}", file=out)
    for v in state.versions.values():
        mark = "*" if v.number == state.best else " "
        speed = v.rank.words(short=True) if v.rank is not None else "-"
        print(f" {mark} v{v.number:<3} {v.origin:<9} {v.status or 'not run':<13} {speed:>16}  "
              f"{v.summary}", file=out)
    if state.best is not None:
        rank = state.best_rank
        print(f"best: v{state.best} ({rank.words() if rank is not None else '-'})", file=out)
    if state.pending:
        print(f"pending proposal: {state.pending}", file=out)


@dataclass
class Check:
    version: int
    recorded_status: str | None
    status: str
    recorded_correct: bool
    correct: bool
    recorded_ms: float | None
    median_ms: float | None
    band: tuple[str, float, float] | None  # what was compared, and its range
    timing_ok: bool

    @property
    def ok(self) -> bool:
        return (self.status == self.recorded_status and self.correct == self.recorded_correct
                and self.timing_ok)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok}


ESTIMATE_TOLERANCE = 0.02  # the compiler's static estimate is deterministic: 2% slack


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        and value > 0 else None


def _estimate(recorded: dict[str, Any] | None) -> float | None:
    return _positive(((recorded or {}).get("tpu") or {}).get("estimated_speedup"))


def _kernel_time(recorded: dict[str, Any] | None) -> float | None:
    return _positive(((recorded or {}).get("tpu") or {}).get("kernel_time_s"))


def _host_ratio(timing: dict[str, Any]) -> float | None:
    """Interpret mode's time ratio: ``host_ratio``, or ``speedup`` in an eval JSON written
    before ``host_ratio`` existed (it is never a speedup)."""
    found = _positive(timing.get("host_ratio"))
    return found if found is not None else _positive(timing.get("speedup"))


def rank_band(rank: Rank | None) -> tuple[str, float, float] | None:
    """The band the re-judged ``Rank`` must fall in around the log's: a compiler figure
    by the kernel's time at the production shape (``kernel_s``, what orders it; the
    value where a log has no kernel times) within the estimate's 2%, any other rank by
    its value within a factor of ``INTERPRET_FACTOR`` either way. None for a rank that
    ranks nothing."""
    if rank is None or not rank.ranked:
        return None
    if rank.compiler and rank.kernel_s:
        return ("kernel_s", rank.kernel_s * (1 - ESTIMATE_TOLERANCE),
                rank.kernel_s * (1 + ESTIMATE_TOLERANCE))
    if rank.value is None:
        return None
    if rank.compiler:
        return ("value", rank.value * (1 - ESTIMATE_TOLERANCE),
                rank.value * (1 + ESTIMATE_TOLERANCE))
    return ("value", rank.value / INTERPRET_FACTOR, rank.value * INTERPRET_FACTOR)


def rank_agrees(logged: Rank | None, new: Rank) -> bool:
    """The re-judged rank says what the log's said: the same kind of number (a compiler
    figure either way: the reference's estimate may arrive between the two) inside
    ``rank_band``."""
    band = rank_band(logged)
    if band is None or logged is None:
        return True
    same_kind = new.compiler if logged.compiler else new.source == logged.source
    if not same_kind:
        return False
    value = new.kernel_s if band[0] == "kernel_s" else new.value
    return value is not None and band[1] <= value <= band[2]


def band_value(result: Any, name: str) -> float | None:
    """The re-run's value for a band: ``estimated_speedup`` and ``kernel_time_s`` from its
    ``tpu`` section, ``host_ratio`` the interpreter's ratio, any other name from its
    ``timing``."""
    data = result.to_json() if hasattr(result, "to_json") else result
    if name == "estimated_speedup":
        return _estimate(data)
    if name == "kernel_time_s":
        return _kernel_time(data)
    timing = data.get("timing") or {}
    if name == "host_ratio":
        return _host_ratio(timing)
    return timing.get(name)


def timing_band(recorded: dict[str, Any] | None) -> tuple[str, float, float] | None:
    """What is compared and the range the re-measured value may fall in: the TPU
    compiler's figure (deterministic, 2%) when the log has one and no TPU ran it: the
    kernel's time at the production shape (``kernel_time_s``), or in an eval JSON
    written before it the estimated speedup; else the host ratio in interpret mode
    (``("host_ratio", lo, hi)``), ``("median_ms", lo, hi)`` natively."""
    timing = (recorded or {}).get("timing") or {}
    backend = (recorded or {}).get("backend") or {}
    if backend.get("platform") != "tpu":
        kernel = _kernel_time(recorded)
        if kernel is not None:
            return ("kernel_time_s", kernel * (1 - ESTIMATE_TOLERANCE),
                    kernel * (1 + ESTIMATE_TOLERANCE))
        estimate = _estimate(recorded)
        if estimate is not None:
            return ("estimated_speedup", estimate * (1 - ESTIMATE_TOLERANCE),
                    estimate * (1 + ESTIMATE_TOLERANCE))
    if is_interpret(backend) or backend.get("platform") == "cpu":
        ratio = _host_ratio(timing)
        if ratio is None:
            return None
        return ("host_ratio", ratio / INTERPRET_FACTOR, ratio * INTERPRET_FACTOR)
    median = timing.get("median_ms")
    if median is None:
        return None
    p10 = timing.get("p10_ms") or median
    p90 = timing.get("p90_ms") or median
    return ("median_ms", p10 / NATIVE_WIDEN, p90 * NATIVE_WIDEN)


def _blob(loaded: LoadedSession, sha: str, problems: list[str], what: str) -> bytes | None:
    """A blob's bytes after checking its name against its content; None (with the
    problem noted) when it is missing or altered."""
    try:
        data = read_blob(loaded.path, sha)
    except SessionError as exc:
        problems.append(f"{what}: {exc}")
        return None
    if hashlib.sha256(data).hexdigest() != sha:
        problems.append(f"{what}: blob {sha[:12]}… was altered (its content no longer "
                        "hashes to its name)")
        return None
    return data


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return a == b


def audit(loaded: LoadedSession, state: SessionState) -> list[str]:
    """Everything in the log that tilewright would not have written; empty when sound."""
    problems = [w for w in loaded.warnings if "torn last line" not in w]
    seqs = [e.get("seq") for e in loaded.events]
    expected = list(range(1, len(seqs) + 1))
    if seqs != expected:
        dupes = sorted({s for s in seqs if seqs.count(s) > 1})
        problems.append("event sequence numbers are not 1, 2, ...: "
                        + (f"repeated {dupes[:5]}" if dupes else "gaps or reordering")
                        + " (two writers, or lines added or removed)")
    decisions: dict[Any, ev.UserDecision] = {}
    versions: dict[Any, ev.KernelVersion] = {}
    starts: dict[Any, ev.RunStart] = {}
    for e in loaded.events:
        if e["type"] == "user.decision":
            decisions[e.get("seq")] = e
    initial = 0
    for e in loaded.events:
        if e["type"] == "kernel.version":
            n = e.get("version")
            versions[n] = e
            source_blob = e.get("source_blob")
            if source_blob:
                _blob(loaded, source_blob, problems, f"v{n} source")
            if e.get("origin") == "initial":
                initial += 1
                if initial > 1:
                    problems.append(f"v{n}: a second 'initial' version (only the task's own "
                                    "kernel runs without a decision)")
                continue
            d = decisions.get(e.get("decision"))
            if d is None or d.get("seq", 0) > e.get("seq", 0):
                problems.append(f"v{n}: no user.decision approved it (its decision "
                                f"{e.get('decision')!r} is missing or comes later)")
            elif not approving(d.get("decision")) \
                    or d.get("proposal") != e.get("proposal"):
                problems.append(f"v{n}: its user.decision (seq {d.get('seq')}) is "
                                f"{d.get('decision')!r} for {d.get('proposal')!r}, not an "
                                f"approval of {e.get('proposal')!r}")
        elif e["type"] == "run.start":
            starts[e.get("run")] = e
            if e.get("version") not in versions:
                problems.append(f"{e.get('run')}: runs v{e.get('version')}, which no earlier "
                                "kernel.version created")
        elif e["type"] == "run.result":
            run = e.get("run")
            if run not in starts:
                problems.append(f"{run}: a result without a run.start")
            elif starts[run].get("version") != e.get("version"):
                problems.append(f"{run}: result for v{e.get('version')} but it started "
                                f"v{starts[run].get('version')}")
            result_blob = e.get("result_blob")
            if result_blob:
                data = _blob(loaded, result_blob, problems, f"{run} result")
                if data is not None:
                    _compare_result(run, e, data, problems)
    for v in state.versions.values():
        if not state.authorized(v.number) and v.status is not None:
            problems.append(f"v{v.number} was evaluated without an approving decision")
    return list(dict.fromkeys(problems))


def _compare_result(run: Any, event: ev.RunResult, data: bytes,
                    problems: list[str]) -> None:
    try:
        recorded = json.loads(data)
    except ValueError:
        problems.append(f"{run}: its eval JSON blob is not JSON")
        return
    timing = recorded.get("timing") or {}
    rank = ranking(recorded)
    derived = {"status": recorded.get("status"), "correct": recorded.get("status") == "correct",
               "median_ms": timing.get("median_ms"),
               # a log written before ranks were recorded: the number that ranked
               "speedup": rank.value}
    logged: dict[str, Any] = dict(event)  # compared field by field, by name
    for key, value in derived.items():
        if key in logged and not _same(logged[key], value):
            problems.append(f"{run}: the log says {key}={logged[key]!r} but its eval JSON "
                            f"says {value!r} (edited)")
    said = logged.get("rank")
    if isinstance(said, dict):  # the rank: what orders it and what it says
        made = rank.to_json()
        for key in RANK_CHECKED:
            if not _same(said.get(key), made.get(key)):
                problems.append(f"{run}: the log says rank.{key}={said.get(key)!r} but its "
                                f"eval JSON says {made.get(key)!r} (edited)")
    elif "rank" in logged and logged["rank"] is not None:
        problems.append(f"{run}: the log's rank is not a rank: {logged['rank']!r} (edited)")


# The recorded rank's fields the audit checks against its eval JSON.
RANK_CHECKED = ("source", "value", "kernel_s", "kernel_cycles", "estimate", "measured",
                "chip", "shape")


async def verify(loaded: LoadedSession, state: SessionState, evaluate: Any,
                 out: TextIO) -> list[Check]:
    """Re-evaluate each measured version with ``evaluate(source) -> EvalResult``."""
    checks: list[Check] = []
    for v in state.versions.values():
        if v.status is None or not v.result_blob:
            continue
        problems: list[str] = []
        result_data = _blob(loaded, v.result_blob, problems, f"v{v.number} result")
        source_data = _blob(loaded, v.source_blob, problems, f"v{v.number} source") \
            if v.source_blob else None
        if result_data is None or source_data is None:
            for problem in problems or [f"v{v.number}: no source recorded"]:
                print(f"v{v.number:<3} cannot be re-run: {problem}  MISMATCH", file=out,
                      flush=True)
            checks.append(Check(version=v.number, recorded_status=v.status, status="missing",
                                recorded_correct=v.correct, correct=False,
                                recorded_ms=v.median_ms, median_ms=None, band=None,
                                timing_ok=False))
            continue
        recorded = json.loads(result_data)
        source = source_data.decode(errors="replace")
        band = timing_band(recorded)
        for attempt in range(ATTEMPTS):
            result = await evaluate(source)
            median = (result.timing or {}).get("median_ms")
            value = band_value(result, band[0]) if band else None
            timing_ok = band is None or (value is not None and band[1] <= value <= band[2])
            # The rank the log shows (and the fold ranks by) must agree as well.
            if timing_ok:
                timing_ok = rank_agrees(v.rank, result.rank)
            if timing_ok or result.status != v.status or attempt == ATTEMPTS - 1:
                break
            print(f"v{v.number:<3} {band[0] if band else 'timing'} {_figure(band, value)} "
                  "outside the band; "
                  "measuring again", file=out, flush=True)
        check = Check(version=v.number, recorded_status=v.status, status=result.status,
                      recorded_correct=v.correct, correct=result.correct,
                      recorded_ms=v.median_ms, median_ms=median, band=band,
                      timing_ok=bool(timing_ok))
        checks.append(check)
        rec = f"{check.recorded_ms:.3f}" if check.recorded_ms is not None else "-"
        new = f"{median:.3f}" if median is not None else "-"
        judged = (f"{band[0]} {_figure(band, value)} in "
                  f"[{_figure(band, band[1])}, {_figure(band, band[2])}]") if band else "no timing"
        print(f"v{v.number:<3} {v.status:<13} -> {result.status:<13} median {rec} -> {new} ms; "
              f"{judged}  {'ok' if check.ok else 'MISMATCH'}", file=out, flush=True)
    return checks


def _figure(band: Any, value: float | None) -> str:
    """A band's figure as every other screen writes it: a speedup by the one formatter
    ("4.00x"), a time to four figures; "-" for none."""
    from tilewright.kernels.judge.rank import times

    if value is None:
        return "-"
    return times(value) if band and "speedup" in str(band[0]) else f"{value:.4g}"
