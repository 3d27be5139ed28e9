"""Profile capture around a candidate's timed iterations (worker-side: imports jax lazily).

``capture(fn, args, logdir)`` warms the function up outside the trace (compilation
stays out of the profile), then runs ``iters`` timed calls inside
``jax.profiler.trace(logdir, create_perfetto_trace=True)``: the whole loop under a
``tilewright.measured`` annotation and each call under a step annotation
(``tilewright.iter N``), each call blocked until ready. The raw logdir is kept: open it
with ``xprof --logdir DIR`` or TensorBoard's profile plugin; ``perfetto_trace.json.gz``
opens in ui.perfetto.dev.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tilewright.profiling.convert import ITERATION, MEASURED, captured_stderr


def capture(fn: Callable[..., Any], args: tuple[Any, ...], logdir: str | Path, *,
            iters: int = 3, warmup: int = 1, python_tracer: bool = False) -> dict[str, Any]:
    """Run and trace ``fn(*args)``; returns the run directory, files and per-call wall times."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import jax

    logdir = Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    warm_s = []
    for _ in range(max(warmup, 0)):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        warm_s.append(time.perf_counter() - t0)

    options = jax.profiler.ProfileOptions()
    # The Python tracer records every Python call (100k+ events for one interpret-mode
    # kernel); kernel authors want XLA ops, so it is off unless asked for.
    options.python_tracer_level = 1 if python_tracer else 0
    wall_s: list[float] = []
    t_start = time.perf_counter()
    trace = jax.profiler.trace(str(logdir), create_perfetto_trace=True, profiler_options=options)
    with captured_stderr() as log, trace, jax.profiler.TraceAnnotation(MEASURED):
        for i in range(iters):
            with jax.profiler.StepTraceAnnotation(ITERATION, step_num=i):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*args))
                wall_s.append(time.perf_counter() - t0)
    total_s = time.perf_counter() - t_start
    runs = sorted((logdir / "plugins" / "profile").glob("*"), key=lambda p: p.stat().st_mtime)
    run_dir = runs[-1] if runs else logdir
    return {
        "logdir": str(logdir),
        "run_dir": str(run_dir),
        "xplane": [str(p) for p in sorted(run_dir.glob("*.xplane.pb"))],
        "perfetto": str(run_dir / "perfetto_trace.json.gz")
        if (run_dir / "perfetto_trace.json.gz").exists() else None,
        "iters": iters,
        "warmup_ms": [s * 1e3 for s in warm_s],
        "iter_ms": [s * 1e3 for s in wall_s],
        "capture_s": total_s,
        "log": log[-50:],
    }
