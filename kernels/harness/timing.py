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
