"""Timing: the candidate's timed calls and the XLA reference, by the judge's clock.

Method ``wall_clock``. The candidate runs in its own process (``kernels.worker.candidate.channel``):
``time_candidate`` stages fresh inputs before every call and times the round trip of
``call`` with ``time.perf_counter()`` (the judge's clock, never the candidate's word),
after one warm-up call; the outputs of a random sample of the timed calls (all of them
off-TPU), drawn here and never told, are checked against references computed here, so
a kernel that is right only when checked is wrong. Then the candidate's process tree is
stopped (SIGSTOP) and the reference is timed in the judge (``measure``:
``time.perf_counter()`` around each call plus ``jax.block_until_ready``). The iteration
count adapts to a budget (one call in TPU interpret mode on a CPU can take a second),
unless a fixed count is asked for; off-TPU the interpreter's time is a host simulation
time: a few calls, no more. ``record`` writes the contract's ``timing`` object.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilewright.kernels.worker.candidate import judge
from tilewright.kernels.worker.candidate.channel import CandidateChannel
from tilewright.kernels.worker.errors import short_message, task_failure
from tilewright.kernels.worker.evaluation.compare import (
    Host,
    judge_output,
    precise_reference,
    to_host,
)
from tilewright.kernels.worker.execution import execution_mode, reset_interpret_state
from tilewright.profiling.chips import TPU_INTERPRET

MIN_ITERS = 3
MAX_ITERS = 1000
HOST_SIM_ITERS = 3  # interpret-mode timing: host simulation time, not TPU performance
TIMED_SAMPLE = 8  # timed calls whose outputs are checked on hardware (all, off-TPU)


@dataclass
class TimedCalls:
    """The candidate's side of the timing: its calls' summary (``summarize``), or the
    first timed call whose output was wrong (``failure``), how many were checked, and
    the seconds the timed calls took (the warm-up aside)."""

    kernel: dict[str, Any] | None
    failure: str | None
    checked: int
    loop_s: float = 0.0


def time_candidate(channel: CandidateChannel, runtime: Any, config: Any, expected: Host,
                   tree: str | None, tolerance: tuple[float, float], ref_fn: Any, *,
                   interpret: bool, iters: int | None, budget_s: float) -> TimedCalls:
    """Time the candidate's compiled program at ``config`` from the judge: every call on
    fresh inputs (``runtime.make_inputs`` with a new key), the outputs of the sampled
    calls compared with ``ref_fn``'s at ``tolerance`` (``expected`` bounds their size,
    ``tree`` is their structure)."""
    import jax

    atol, rtol = tolerance
    # Off-TPU the interpreter's time is a host simulation time: a few calls, no more.
    iters = iters or (HOST_SIM_ITERS if interpret else None)
    rng = random.SystemRandom()
    checked, failure = 0, None

    def one_call(check: bool) -> float:
        nonlocal checked, failure
        fresh = runtime.make_inputs(config, jax.random.PRNGKey(rng.getrandbits(32)))
        elapsed = channel.call(config.name, *fresh)
        if check:
            with execution_mode(interpret):
                want = to_host(ref_fn(*fresh[0], *fresh[1]))
            precise = precise_reference(ref_fn, fresh[0], fresh[1], want, interpret)
            verdict, _ = judge_output(channel.fetch(want, tree), want, precise, atol, rtol)
            checked += 1
            if not verdict.close:
                failure = verdict.reason
        return elapsed

    warm = one_call(check=True)
    if iters is None:
        target = min(max(int(budget_s / max(warm, 1e-6)), MIN_ITERS), MAX_ITERS)
    else:
        target = max(int(iters), 1)
    # Which calls are checked is drawn here and never told: all of them off-TPU.
    sampled = set(range(target)) if interpret or target <= TIMED_SAMPLE else \
        set(rng.sample(range(target), TIMED_SAMPLE))
    samples: list[float] = []
    started = time.perf_counter()
    deadline = started + budget_s
    for i in range(target):
        samples.append(one_call(check=i in sampled))
        if failure is not None:
            return TimedCalls(None, failure, checked)
        if iters is None and len(samples) >= MIN_ITERS and time.perf_counter() > deadline:
            break
    return TimedCalls(summarize(samples, warmup=1, extra_s=warm), None, checked,
                      time.perf_counter() - started)


def time_reference(ref_fn: Any, args: tuple[Any, ...], *, interpret: bool, iters: int | None,
                   budget_s: float) -> dict[str, Any]:
    """``measure`` the XLA reference in the judge while the candidate's process tree is
    stopped (it cannot compete for the CPU); a reference that fails is the task's."""
    iters = iters or (HOST_SIM_ITERS if interpret else None)
    try:
        with judge.process().paused(), execution_mode(interpret):
            return measure(ref_fn, args, budget_s, iters)
    except Exception as exc:
        if interpret:
            reset_interpret_state()
        raise task_failure(exc, f"timing the reference failed: {short_message(exc)}") \
            from exc


def _run(fn: Callable[..., Any], args: tuple[Any, ...]) -> float:
    import jax

    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def measure(fn: Callable[..., Any], args: tuple[Any, ...], budget_s: float,
            iters: int | None = None, warmup: int = 1) -> dict[str, Any]:
    """Time ``fn(*args)``: ``warmup`` calls, then ``iters`` calls or as many as fit in
    ``budget_s`` (at least MIN_ITERS). Returns iters, warmup, median/p10/p90/min ms."""
    warm = [_run(fn, args) for _ in range(max(warmup, 1))]
    estimate = max(warm[-1], 1e-6)
    if iters is None:
        target = int(budget_s / estimate)
        target = min(max(target, MIN_ITERS), MAX_ITERS)
    else:
        target = max(int(iters), 1)
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    for _ in range(target):
        samples.append(_run(fn, args))
        if iters is None and len(samples) >= MIN_ITERS and time.perf_counter() > deadline:
            break
    ms = np.asarray(samples) * 1e3
    return {
        "iters": len(samples),
        "warmup": max(warmup, 1),
        "median_ms": float(np.median(ms)),
        "p10_ms": float(np.percentile(ms, 10)),
        "p90_ms": float(np.percentile(ms, 90)),
        "min_ms": float(ms.min()),
        "total_s": float(sum(samples) + sum(warm)),
    }


def summarize(samples: list[float], warmup: int = 1, extra_s: float = 0.0) -> dict[str, Any]:
    """``measure``'s summary for call times (seconds) measured elsewhere (the judge's
    round trips to the candidate process)."""
    ms = np.asarray(samples) * 1e3
    return {
        "iters": len(samples), "warmup": warmup,
        "median_ms": float(np.median(ms)), "p10_ms": float(np.percentile(ms, 10)),
        "p90_ms": float(np.percentile(ms, 90)), "min_ms": float(ms.min()),
        "total_s": float(sum(samples) + extra_s),
    }


def record(kernel: dict[str, Any], baseline: dict[str, Any], mode: str, shape: str,
           flops: float | None) -> dict[str, Any]:
    """The contract's ``timing`` object from two ``measure`` results. ``speedup`` is a
    measured speedup or null: in TPU interpret mode the same ratio is ``host_ratio``
    (the CPU simulating both, which says nothing about a TPU)."""
    ratio = baseline["median_ms"] / kernel["median_ms"] if kernel["median_ms"] else None
    interpret = mode == TPU_INTERPRET
    speedup = None if interpret else ratio
    return {
        "method": "wall_clock",
        "mode": mode,
        "note": ("TPU interpret mode on the CPU: simulated, not TPU performance"
                 if interpret else "native execution"),
        "shape": shape,
        "warmup": kernel["warmup"], "iters": kernel["iters"],
        "median_ms": kernel["median_ms"], "p10_ms": kernel["p10_ms"],
        "p90_ms": kernel["p90_ms"], "min_ms": kernel["min_ms"],
        "baseline_median_ms": baseline["median_ms"], "baseline_p10_ms": baseline["p10_ms"],
        "baseline_p90_ms": baseline["p90_ms"], "baseline_iters": baseline["iters"],
        "speedup": speedup,
        "host_ratio": ratio if interpret else None,
        "flops": flops,
        "gflops_per_s": (flops / (kernel["median_ms"] * 1e6)
                         if flops and kernel["median_ms"] else None),
    }


# -- the exported route: the judge's own device, device time from the profiler ----------

INPUT_SET_BYTES = 2 << 30  # fresh input sets kept on the device at once for timed calls
INPUT_SETS = 4
PIPELINED_BATCHES = 5  # where no trace can be had: the spread of batch means
DEVICE_MIN_CALLS = 10
DEVICE_MAX_CALLS = 200
CANDIDATE_NAME = "tw_candidate"  # the jitted names the device plane is searched for
REFERENCE_NAME = "tw_reference"


@dataclass
class DeviceTiming:
    """Candidate and reference timed on the judge's own device (the exported route):
    their summaries (``summarize``'s fields) by ``method``: ``device_trace`` (durations
    of each execution on the chip, from the profiler's device plane) or ``pipelined``
    (N calls issued back to back, one wait, the mean: where no device plane can be had),
    per-call wall times beside them (dispatch included, labelled), the first timed
    output that was wrong (``failure``), and why the device plane was not used."""

    kernel: dict[str, Any] | None
    baseline: dict[str, Any] | None
    method: str
    failure: str | None = None
    per_call: dict[str, float] | None = None
    pipelined: dict[str, float] | None = None
    device: str | None = None
    why_not_trace: str | None = None
    checked: int = 0
    input_sets: int = 0


def _named(fn: Callable[..., Any], name: str) -> Any:
    """``fn`` jitted under ``name``: XLA names the program ``jit_<name>``."""
    import jax

    def call(*args: Any) -> Any:
        return fn(*args)

    call.__name__ = call.__qualname__ = name
    return jax.jit(call)


def time_on_device(program: Any, ref_fn: Any, runtime: Any, config: Any, tree: str | None,
                   tolerance: tuple[float, float], static: tuple, *, iters: int | None,
                   budget_s: float, logdir: str) -> DeviceTiming:
    """Time the candidate's compiled exported ``program`` and the XLA reference the same
    way on this process's device: a few fresh input sets on the device, every set's
    output checked against the reference, then N calls of each issued back to back
    under the profiler, cycling through the sets; device time per call from the trace's
    device plane, else the pipelined mean (labelled). Per-call wall time (one call, one
    wait) is measured beside, for the record."""
    import jax

    rng = random.SystemRandom()
    atol, rtol = tolerance
    first = runtime.make_inputs(config, jax.random.PRNGKey(rng.getrandbits(32)))
    set_bytes = max(sum(int(getattr(a, "nbytes", 0)) for a in first[0]), 1)
    count = max(1, min(INPUT_SETS, INPUT_SET_BYTES // set_bytes))
    sets = [first] + [runtime.make_inputs(config, jax.random.PRNGKey(rng.getrandbits(32)))
                      for _ in range(count - 1)]
    flat_sets = [jax.device_put(jax.tree.leaves(dyn)) for dyn, _ in sets]
    dyn_sets = [jax.device_put(tuple(dyn)) for dyn, _ in sets]
    candidate = _named(program, CANDIDATE_NAME)
    reference = _named(lambda *dyn: ref_fn(*dyn, *static), REFERENCE_NAME)
    # Every set's output checked (the compiled program is fixed: no Python of the
    # candidate's runs at call time, so a set checked once is checked for every call).
    checked = 0
    for flat, dyn in zip(flat_sets, dyn_sets, strict=True):
        got = jax.block_until_ready(candidate(*flat))
        want = to_host(jax.block_until_ready(reference(*dyn)))
        host = Host([np.asarray(x).astype(np.float32) for x in jax.tree.leaves(got)],
                    tree or want.tree, want.dtype)
        precise = precise_reference(lambda *d: ref_fn(*d, *static), tuple(dyn), (), want,
                                    False)
        verdict, _ = judge_output(host, want, precise, atol, rtol)
        checked += 1
        if not verdict.close:
            return DeviceTiming(None, None, "none", failure=verdict.reason, checked=checked,
                                input_sets=count)

    def per_call(fn: Any, args: list[Any], n: int) -> list[float]:
        out = []
        for i in range(n):
            started = time.perf_counter()
            jax.block_until_ready(fn(*args[i % len(args)]))
            out.append(time.perf_counter() - started)
        return out

    def pipelined(fn: Any, args: list[Any], n: int) -> list[float]:
        """Per-call means of PIPELINED_BATCHES batches of calls issued back to back."""
        means = []
        size = max(n // PIPELINED_BATCHES, 1)
        window = in_flight(fn, args[0])
        for _ in range(PIPELINED_BATCHES):
            started = time.perf_counter()
            issue(fn, args, size, window)
            means.append((time.perf_counter() - started) / size)
        return means

    flat_args = [tuple(f) for f in flat_sets]
    dyn_args = [tuple(d) for d in dyn_sets]
    single = per_call(candidate, flat_args, 3) + per_call(reference, dyn_args, 3)
    if iters is None:
        n = int(budget_s / max(max(single), 1e-6) / 3)
        n = min(max(n, DEVICE_MIN_CALLS), DEVICE_MAX_CALLS)
    else:
        n = max(int(iters), 1)
    walls = {"kernel": per_call(candidate, flat_args, min(n, 20)),
             "reference": per_call(reference, dyn_args, min(n, 20))}
    piped_kernel = pipelined(candidate, flat_args, n)
    piped_reference = pipelined(reference, dyn_args, n)
    piped = {"kernel_ms": float(np.median(piped_kernel) * 1e3),
             "baseline_ms": float(np.median(piped_reference) * 1e3),
             "batches": PIPELINED_BATCHES, "calls_per_batch": max(n // PIPELINED_BATCHES, 1)}
    traced, why = _traced_calls(candidate, flat_args, reference, dyn_args, n, logdir)
    per_call_ms = {"kernel_median_ms": float(np.median(walls["kernel"]) * 1e3),
                   "baseline_median_ms": float(np.median(walls["reference"]) * 1e3)}
    if traced is not None:
        kernel_us, reference_us, device = traced
        return DeviceTiming(
            summarize([d / 1e6 for d in kernel_us], warmup=count),
            summarize([d / 1e6 for d in reference_us], warmup=count), "device_trace",
            per_call=per_call_ms, pipelined=piped, device=device, checked=checked,
            input_sets=count)
    # No device plane: the pipelined mean of n calls stands for each call's time.
    kernel = summarize(piped_kernel, warmup=count)
    baseline = summarize(piped_reference, warmup=count)
    return DeviceTiming(kernel, baseline, "pipelined", per_call=per_call_ms, pipelined=piped,
                        why_not_trace=why, checked=checked, input_sets=count)


IN_FLIGHT_BYTES = 2 << 30  # outputs of calls issued back to back, alive at once


def in_flight(fn: Any, args: tuple) -> int:
    """How many calls of ``fn`` may be in flight at once: their outputs all stay alive
    until the wait, so a program with a 256 MiB output issued 20 times ran a 16 GiB chip
    out of memory (JAXBench's 5p_Flex_Attention on the v5e). At least 2."""
    import jax

    out = jax.eval_shape(fn, *args)
    size = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(out))
    return max(2, IN_FLIGHT_BYTES // max(size, 1))


def issue(fn: Any, args: list[Any], n: int, window: int) -> None:
    """``n`` calls issued back to back, waiting every ``window`` calls (their outputs
    dropped), cycling through ``args``."""
    import jax

    for start in range(0, n, window):
        jax.block_until_ready([fn(*args[i % len(args)])
                               for i in range(start, min(n, start + window))])


def _traced_calls(candidate: Any, flat_args: list[Any], reference: Any, dyn_args: list[Any],
                  n: int, logdir: str) -> tuple[tuple[list[float], list[float], str] | None,
                                                str | None]:
    """N calls of each under the profiler, issued back to back; their device durations
    (microseconds) from the trace's device plane, or (None, why not)."""
    import glob
    import os

    import jax

    from tilewright.profiling import convert, device_time

    os.makedirs(logdir, exist_ok=True)
    try:
        jax.profiler.start_trace(logdir)
    except Exception as exc:  # another trace running, no profiler plugin
        return None, f"the profiler did not start: {short_message(exc)[:200]}"
    try:
        issue(candidate, flat_args, n, in_flight(candidate, flat_args[0]))
        issue(reference, dyn_args, n, in_flight(reference, dyn_args[0]))
    finally:
        jax.profiler.stop_trace()
    planes = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
    if not planes:
        return None, "the profiler wrote no trace"
    kernel = ref = None
    read: list[Any] = []
    try:  # the XSpace read directly (jax's own reader: no xprof needed)
        read = _planes(planes[-1])
        kernel = device_time.program_times_in_planes(read, CANDIDATE_NAME)
        ref = device_time.program_times_in_planes(read, REFERENCE_NAME)
        kernel, ref = device_time.one_program_twice(kernel, ref, n)
    except Exception:  # an older reader: xprof's conversion below
        kernel = ref = None
    if kernel is None or ref is None:
        try:
            trace, _log = convert.trace_events(planes[-1])
            timeline = convert.timeline_from_trace(trace)
        except Exception as exc:
            return None, f"the trace could not be read: {short_message(exc)[:200]}"
        kernel = device_time.program_times(timeline, CANDIDATE_NAME)
        ref = device_time.program_times(timeline, REFERENCE_NAME)
        kernel, ref = device_time.one_program_twice(kernel, ref, n)
    if kernel is None or ref is None:
        return None, ("the trace has no device plane with these programs "
                      f"({device_time.what_planes_hold(read) if read else 'unread'})")
    # The executions of these n calls: the last n (the warm-up ran before the trace).
    if kernel.count < n or ref.count < n:
        return None, (f"the device plane holds {kernel.count} and {ref.count} executions "
                      f"of {n} calls each")
    return (list(kernel.durations_us[-n:]), list(ref.durations_us[-n:]), kernel.device), None


def _planes(path: str) -> list[Any]:
    """An xplane file's planes as ``profiling.device_time.Plane`` tuples (durations in
    microseconds), read with ``jax.profiler.ProfileData``."""
    import jax

    data = jax.profiler.ProfileData.from_file(path)
    return [(plane.name, line.name, [(event.name, event.duration_ns / 1e3)
                                     for event in line.events])
            for plane in data.planes for line in plane.lines]
