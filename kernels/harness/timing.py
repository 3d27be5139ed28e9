"""Wall-clock timing of a jitted callable, bounded by a time budget.

Method ``wall_clock``: ``time.perf_counter()`` around each call plus
``jax.block_until_ready`` on its output, after warm-up calls (compilation happens in
the warm-up). The iteration count adapts to the budget (one call in TPU interpret mode
on a CPU can take a second), unless a fixed count is asked for. The candidate and the
XLA reference are timed the same way, in the same process, on the same inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from profiling.chips import TPU_INTERPRET

MIN_ITERS = 3
MAX_ITERS = 1000


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
    """The contract's ``timing`` object from two ``measure`` results."""
    speedup = baseline["median_ms"] / kernel["median_ms"] if kernel["median_ms"] else None
    interpret = mode == TPU_INTERPRET
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
        "flops": flops,
        "gflops_per_s": (flops / (kernel["median_ms"] * 1e6)
                         if flops and kernel["median_ms"] else None),
    }
