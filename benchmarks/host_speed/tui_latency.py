"""TUI responsiveness: keypress-to-screen-update latency under load, and first paint.

1. Latency. The real ``TilewrightApp`` (headless, 140x40) with the real controller on
   the bundled gelu task, while (a) an agent streams a reply at about 150 tokens/s
   through the controller (live deltas, Markdown flushes) and (b) a second real
   ``WorkerPool`` evaluates softmax back to back (a JAX worker competing for the same
   CPUs). F6 is pressed 100 times at 40-120 ms intervals; latency is the time from the
   key event entering the app to the first composed frame that shows the new focused
   pane: the keyboard focus inside it and its border lit (``App._display`` is wrapped to
   timestamp frames; headless, so the terminal write itself is not included). "app CPU":
   the app process's CPU time over wall time in a phase (its threads included; the
   worker processes not).
2. First paint. The real ``tilewright`` command in a pseudo-terminal (pexpect): time
   from spawn to the first output that contains the Source pane's title. Five runs.

Targets (issue 6): p95 latency under 50 ms; first paint under 1 s.
Run: ``JAX_PLATFORMS=cpu python benchmarks/host_speed/tui_latency.py [--smoke]``. ``--smoke``: three
presses per phase, a short stream, no evaluation load (the controller's worker pool is
never started: nothing is evaluated), one first paint: that it runs.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from tilewright.agents.base import (
    AgentEvent,
    AgentRequest,
    Proposal,
    ProposalReady,
    TextDelta,
    Usage,
    UsageReport,
)

TOKENS_PER_S = 150
PRESSES = 100


class StreamingAgent:
    """Streams a long Markdown reply at a steady token rate, then proposes nothing new."""

    name = "bench"
    label = "streaming benchmark agent"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.tokens = 0

    async def propose(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        words = ("the", "block", "**VMEM**", "tile", "`BLOCK_ROWS`", "grid", "step", "fuse")
        end = time.perf_counter() + self.seconds
        line = 0
        while time.perf_counter() < end:
            for i in range(TOKENS_PER_S // 10):
                text = " " + words[(line + i) % len(words)]
                if i == 0 and line % 8 == 0:
                    text = "\n\n- " + text
                self.tokens += 1
                yield TextDelta(text)
            line += 1
            await asyncio.sleep(0.1)
        yield UsageReport(Usage(input_tokens=1000, output_tokens=self.tokens))
        source = request.current_source or ""
        yield ProposalReady(Proposal(kind="kernel", summary="same kernel", source=source))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def latency(smoke: bool = False) -> dict[str, float]:
    from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
    from tilewright.kernels.tasks.loaders import load_task
    from tilewright.sessions.evaluator import PoolEvaluator
    from tilewright.tui.app import TilewrightApp
    from tilewright.tui.launch import ChipChoice, start_session
    from tilewright.tui.widgets.panes import PaneGrid

    chip = ChipChoice("v5e", "TPU v5e", 16 * 2**20)
    gelu, softmax = load_task("gelu"), load_task("softmax")
    agent = StreamingAgent(seconds=3.0 if smoke else 60.0)
    presses_per_phase, measured = (3, 3) if smoke else (30, PRESSES)
    tmp = Path(tempfile.mkdtemp(prefix="tw-bench-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    # A smoke run starts no worker: the controller's pool is never asked to evaluate.
    async with contextlib.AsyncExitStack() as pools:
        pool, load_pool = WorkerPool(), WorkerPool()
        if not smoke:
            for started in (pool, load_pool):
                await pools.enter_async_context(started)
        evaluator = PoolEvaluator(pool, EvalOptions(trials=1, time_budget_s=0.05))

        async def opener():
            link = await start_session(gelu, agent, evaluator, {}, sessions_dir=tmp,
                                       backend=None, chip=chip)
            return link, chip

        app = TilewrightApp({}, opener)
        frames: list[tuple[float, str | None]] = []
        async with app.run_test(size=(140, 40)):
            await app.workers.wait_for_complete()
            grid = app.workbench.query_one(PaneGrid)
            original = app._display

            def display(screen, renderable):  # timestamp every composed frame
                shown = grid.focused_pane()
                frames.append((time.perf_counter(), shown if grid.lit_pane == shown else None))
                return original(screen, renderable)

            app._display = display  # type: ignore[method-assign]
            evals = 0

            async def evaluate_forever() -> None:
                nonlocal evals
                options = EvalOptions(trials=1, time_budget_s=0.5)
                while True:
                    await load_pool.evaluate(softmax, softmax.starting_source() or "", options)
                    evals += 1

            async def presses(count: int) -> list[float]:
                samples: list[float] = []
                for _ in range(count):
                    target = grid.cycle_target(1)
                    t0 = time.perf_counter()
                    await app._press_keys(["f6"])
                    while True:
                        done = [t for t, pane in frames if t >= t0 and pane == target]
                        if done:
                            samples.append((done[0] - t0) * 1000)
                            break
                        if time.perf_counter() - t0 > 5:
                            samples.append(5000.0)
                            break
                        await asyncio.sleep(0.001)
                    await asyncio.sleep(random.uniform(0.04, 0.12))
                return samples

            idle = await presses(presses_per_phase)  # the same app, nothing streaming or running
            app.link.send_message("explain the tiling while you think")
            await asyncio.sleep(0.3 if smoke else 1.0)
            cpu0, wall0, tokens0 = time.process_time(), time.perf_counter(), agent.tokens
            stream_only = await presses(presses_per_phase)  # streaming, no evaluation load
            stream_s = time.perf_counter() - wall0
            stream_cpu = (time.process_time() - cpu0) / stream_s
            stream_rate = (agent.tokens - tokens0) / stream_s
            load = asyncio.create_task(asyncio.sleep(0) if smoke else evaluate_forever())
            await asyncio.sleep(0.1 if smoke else 2.0)  # the evaluation is under way too
            start_tokens = agent.tokens
            t_start, cpu0 = time.perf_counter(), time.process_time()
            samples = await presses(measured)
            elapsed = time.perf_counter() - t_start
            cpu = (time.process_time() - cpu0) / elapsed
            rate = (agent.tokens - start_tokens) / elapsed
            busy = pool.state
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load  # its evaluation is cancelled before the pools close
            await app.link.cancel()
            await app.action_quit()
    return {"p50_ms": statistics.median(samples), "p95_ms": percentile(samples, 95),
            "max_ms": max(samples), "presses": len(samples), "tokens_per_s": rate,
            "evals_during": evals, "controller_pool": busy, "cpu": cpu, "stream_cpu": stream_cpu,
            "stream_rate": stream_rate, "stream_max_ms": max(stream_only),
            "idle_p50_ms": statistics.median(idle), "idle_p95_ms": percentile(idle, 95),
            "stream_p50_ms": statistics.median(stream_only),
            "stream_p95_ms": percentile(stream_only, 95), "phase_presses": len(idle)}


def first_paint(runs: int = 5) -> list[float]:
    import pexpect

    exe = str(Path(sys.executable).parent / "tilewright")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
    env.update(JAX_PLATFORMS="cpu", TERM="xterm-256color")
    times = []
    for _ in range(runs):
        tmp = tempfile.mkdtemp(prefix="tw-paint-")
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        t0 = time.perf_counter()
        child = pexpect.spawn(exe, ["--agent", "offline", "--session-dir", tmp], env=env,
                              dimensions=(40, 140), timeout=30)
        child.expect("Source")
        times.append(time.perf_counter() - t0)
        child.send("\x11")  # ctrl+q
        child.expect(pexpect.EOF, timeout=60)
        child.close()
    return times


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="that it runs: tiny sizes, one repetition (tests/test_benchmarks.py)")
    smoke = parser.parse_args(argv).smoke
    result = asyncio.run(latency(smoke))
    print(f"keypress -> frame latency while streaming {result['tokens_per_s']:.0f} tok/s "
          f"and evaluating ({result['evals_during']} softmax evals in the background), "
          f"{result['presses']} presses:")
    print(f"  p50 {result['p50_ms']:.1f} ms   p95 {result['p95_ms']:.1f} ms   "
          f"max {result['max_ms']:.1f} ms   (target p95 < 50 ms: "
          f"{result['p95_ms'] / 50:.2f}x of target)   app CPU {result['cpu']:.0%}")
    print(f"  same app with nothing streaming or running, {result['phase_presses']} presses: p50 "
          f"{result['idle_p50_ms']:.1f} ms   p95 {result['idle_p95_ms']:.1f} ms")
    print(f"  streaming only ({result['stream_rate']:.0f} tok/s, no evaluation), "
          f"{result['phase_presses']} presses: p50 {result['stream_p50_ms']:.1f} ms   "
          f"p95 {result['stream_p95_ms']:.1f} ms   max {result['stream_max_ms']:.1f} ms   "
          f"app CPU {result['stream_cpu']:.0%}")
    print(f"  host load average (1/5/15 min) at the end: "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    paints = first_paint(1 if smoke else 5)
    print(f"first paint of `tilewright` in a pty, {len(paints)} runs: median "
          f"{statistics.median(paints):.2f} s, max {max(paints):.2f} s "
          f"(target < 1 s: {statistics.median(paints):.2f}x of target)")


if __name__ == "__main__":
    main()
