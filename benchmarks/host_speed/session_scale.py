"""Session scale: load and fold a synthetic 10,000-event session.

Writes a session the way the controller does (``SessionLog.append``, one fsynced line
per event, content-addressed blobs) with a realistic mix per iteration: agent message
(with usage), proposal, decision, kernel version, run start, run result; plus user
messages, mode changes and markers. Then measures, in a fresh process state:

- time to ``sessions.log.load`` the session and ``sessions.state.fold`` it (best of 5),
- peak memory of load + fold (tracemalloc, Python allocations),
- and, for context, the append rate with fsync.

Targets (issue #3): load + fold under 1 s and under 100 MB. Run:
``python benchmarks/host_speed/session_scale.py [--events N] [--dir DIR] [--smoke]`` (``--smoke``:
200 events, that it runs).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import tempfile
import time
import tracemalloc
from pathlib import Path

from tilewright.kernels.judge.rank import ranking
from tilewright.sessions.log import SessionLog, load
from tilewright.sessions.state import fold

KERNEL = '''"""A tiled elementwise kernel (synthetic benchmark source, version {n})."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_ROWS = {rows}
BLOCK_COLS = {cols}
TUNABLES = {{"BLOCK_ROWS": [8, 16, 32, 64, 128, 256, 512], "BLOCK_COLS": [128, 256, 512]}}


def body(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = 0.5 * x * (1.0 + jnp.tanh(0.79788456 * (x + 0.044715 * x * x * x)))
''' + "# padding to a realistic size\n" * 60


def write_session(base: Path, n_events: int, seed: int = 0) -> tuple[Path, float]:
    rng = random.Random(seed)
    log = SessionLog.create(base, task={"name": "bench", "root": "/bench", "layout": "native"},
                            backend={"platform": "cpu", "mode": "tpu-interpret"},
                            agent="synthetic", app_version="bench")
    started = time.perf_counter()
    log.append("kernel.version", version=1, parent=None, origin="initial", proposal=None,
               source_blob=log.put_blob(KERNEL.format(n=1, rows=64, cols=128)),
               summary="start", decision=None)
    log.append("mode.change", mode="auto", by="user")
    version, proposal, run = 1, 0, 0
    while log._next_seq <= n_events:
        proposal += 1
        pid = f"p{proposal}"
        log.append("agent.message", text="Trying a larger tile. " * 8, role="tune",
                   proposal=pid, usage={"input_tokens": 4000, "output_tokens": 600,
                                        "cache_read_tokens": 3000, "cache_write_tokens": 0,
                                        "cost_usd": 0.012})
        source = KERNEL.format(n=version + 1, rows=rng.choice([8, 64, 256]),
                               cols=rng.choice([128, 512]))
        blob = log.put_blob(source)
        log.append("agent.proposal", proposal=pid, kind="kernel", summary=f"try {proposal}",
                   rationale="bigger tiles amortise per-step overhead", base_version=version,
                   source_blob=blob, plan=None, tuning=None, role="tune")
        decision = log.append("user.decision", proposal=pid, decision="approve", by="auto",
                              note=None, source_blob=None)
        version += 1
        log.append("kernel.version", version=version, parent=version - 1, origin="agent",
                   proposal=pid, source_blob=blob, summary=f"try {proposal}",
                   decision=decision["seq"])
        run += 1
        log.append("run.start", run=f"r{run}", version=version, kind="eval", by="auto")
        correct = rng.random() > 0.2
        # ranked as off a TPU: the TPU compiler's estimate at the production shape
        estimate = rng.uniform(0.5, 3.0)
        cycles = round(1_500_000 / estimate)
        result = {"schema": "tilewright.eval/1", "status": "correct" if correct else
                  "incorrect",
                  "timing": {"median_ms": 1.0, "speedup": None, "host_ratio": 0.02},
                  "tpu": {"chip": "v5e", "compile": "ok", "shape_label": "4096x4096",
                          "estimate": {"cycles": cycles, "seconds": cycles / 1.5e9},
                          "reference_estimate": {"cycles": 1_500_000, "seconds": 1e-3},
                          "kernel_time_s": cycles / 1.5e9, "estimated_speedup": estimate,
                          "basis": "compiler"},
                  "n": run}
        log.append("run.result", run=f"r{run}", version=version,
                   status=result["status"], correct=correct,
                   rank=ranking(result).to_json(), chip="v5e",
                   median_ms=1.0, result_blob=log.put_blob(json.dumps(result)),
                   cancelled=False)
        if proposal % 10 == 0:
            log.append("user.message", text="keep going")
        if proposal % 50 == 0:
            log.append("marker", label=f"checkpoint {proposal}")
    elapsed = time.perf_counter() - started
    count = log._next_seq - 1
    log.close()
    return log.path, count / elapsed


def measure(path: Path) -> dict[str, float]:
    times = []
    for _ in range(5):
        gc.collect()
        t0 = time.perf_counter()
        loaded = load(path)
        state = fold(loaded.header, loaded.events)
        times.append(time.perf_counter() - t0)
    gc.collect()
    tracemalloc.start()
    loaded = load(path)
    state = fold(loaded.header, loaded.events)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    size = (path / "events.jsonl").stat().st_size
    digest = hashlib.sha256(json.dumps(state.snapshot(), sort_keys=True,
                                       default=str).encode()).hexdigest()[:12]
    return {"events": len(loaded.events), "file_mb": size / 2**20, "versions": len(state.versions),
            "best": state.best or 0, "best_time_s": min(times), "median_time_s":
            sorted(times)[len(times) // 2], "peak_mb": peak / 2**20, "state": digest}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--smoke", action="store_true", help="that it runs: tiny sizes, one repetition (tests/test_benchmarks.py)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.events = 200
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.dir or tmp)
        path, rate = write_session(base, args.events)
        m = measure(path)
    print(f"session: {m['events']} events, {m['versions']} versions, "
          f"events.jsonl {m['file_mb']:.2f} MB (best v{m['best']}, state {m['state']})")
    print(f"append with fsync: {rate:,.0f} events/s")
    print(f"load + fold: best {m['best_time_s'] * 1000:.0f} ms, median "
          f"{m['median_time_s'] * 1000:.0f} ms of 5  (target < 1000 ms: "
          f"{m['median_time_s'] / 1.0:.2f} of the target)")
    print(f"peak memory (tracemalloc) of load + fold: {m['peak_mb']:.1f} MB  "
          f"(target < 100 MB: {m['peak_mb'] / 100:.2f} of the target)")


if __name__ == "__main__":
    main()
