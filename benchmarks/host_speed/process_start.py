"""Starting the judge's children: a fork of the zygote against a fresh Python process.

The judge starts a candidate process per distinct candidate (and a spare for the next
one) and compile processes on cache misses. Each is either a fork of the judge's zygote
(``kernels.worker.zygote``: JAX, Pallas and the harness imported once) or a
fresh ``python -P -m ...`` that imports them itself. This starts ``--reps`` candidate
processes each way, from this process, one at a time, and prints per way the median
wall time from ``start`` to the process's "ready" (imports, confinement and the
warm-up done: a kernel on a TPU, a jitted program off it) and the median CPU time the
process tree spent to get there, then the ratio; and the zygote's own start (its
one-time import), which forks repay after a few children.

    python benchmarks/host_speed/process_start.py [--reps 5] [--smoke]

``--smoke``: one process each way.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time

from tilewright.kernels.confinement import descendants
from tilewright.kernels.pool import forks
from tilewright.kernels.worker.candidate import judge

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every process below it."""
    total = 0
    for entry in (pid, *descendants(pid)):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def start_one(expect_fork: bool) -> tuple[float, float]:
    proc = judge.CandidateProcess()
    started = time.perf_counter()
    proc.start()
    try:
        proc.ensure(time.monotonic() + 300)
        wall = time.perf_counter() - started
        forked = isinstance(proc.proc, forks.Forked)
        if forked != expect_fork:
            raise SystemExit(f"expected {'a fork' if expect_fork else 'a fresh process'}, "
                             f"got the other ({forks.zygote().why})")
        assert proc.pid is not None
        return wall, cpu_s(proc.pid)
    finally:
        proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="one process each way")
    args = parser.parse_args()
    reps = 1 if args.smoke else max(1, args.reps)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="process-start-")
    atexit.register(shutil.rmtree, os.environ["TMPDIR"], ignore_errors=True)

    fresh = [start_one(expect_fork=False) for _ in range(reps)]  # no zygote yet
    began = time.perf_counter()
    judge.start_zygote()
    server = forks.zygote()
    if not server._ready(time.monotonic() + 300):
        raise SystemExit(f"the zygote did not start: {server.why}")
    assert server.proc is not None
    zygote_wall, zygote_cpu = time.perf_counter() - began, cpu_s(server.proc.pid)
    forked = [start_one(expect_fork=True) for _ in range(reps)]
    server.proc.kill()

    def row(name: str, runs: list[tuple[float, float]]) -> tuple[float, float]:
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{name:<15} {wall:8.2f} s wall to ready {cpu:8.2f} s CPU   ({len(runs)} runs)")
        return wall, cpu

    print("candidate process start (imports, confinement, warm-up), median:")
    fresh_wall, fresh_cpu = row("fresh process", fresh)
    fork_wall, fork_cpu = row("zygote fork", forked)
    print(f"{'zygote itself':<15} {zygote_wall:8.2f} s wall to ready {zygote_cpu:8.2f} s CPU   "
          "(once per judge)")
    print(f"fresh/fork: {fresh_wall / max(fork_wall, 1e-9):.1f}x wall, "
          f"{fresh_cpu / max(fork_cpu, 1e-9):.1f}x CPU; the zygote pays for itself after "
          f"{zygote_cpu / max(fresh_cpu - fork_cpu, 1e-9):.1f} children")
    return 0


if __name__ == "__main__":
    sys.exit(main())
