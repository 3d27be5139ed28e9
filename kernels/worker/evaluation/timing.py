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
from tilewright.kernels.worker.evaluation.compare import Host, compare, to_host
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
        elapsed = channel.call(config.name, judge.pickled(*fresh))
        if check:
            with execution_mode(interpret):
                want = to_host(ref_fn(*fresh[0], *fresh[1]))
            verdict = compare(channel.fetch(want, tree), want, atol, rtol)
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
