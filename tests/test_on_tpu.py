"""On a real TPU host: the judge holds the chip, and the workbench works there.

Skipped unless this host has a TPU chip and ``TILEWRIGHT_TPU_TESTS=1`` asks for them
(the rest of the suite pins its workers to the CPU, ``JAX_PLATFORMS=cpu``, and these
start workers that open the chip). Run on a TPU VM:

    TILEWRIGHT_TPU_TESTS=1 python -m pytest -q tests/test_on_tpu.py

The same logic is tested without a TPU in ``tests/test_chip_route.py``.
"""

from __future__ import annotations

import json
import os

import pytest
from sizes import load_small

from tilewright.kernels.judge.options import EvalOptions, ProfileOptions
from tilewright.kernels.pool import local_tpu_chips
from tilewright.kernels.pool.workers import WorkerPool, WorkerStartError

pytestmark = pytest.mark.skipif(
    not local_tpu_chips() or os.environ.get("TILEWRIGHT_TPU_TESTS") != "1",
    reason="needs a TPU host and TILEWRIGHT_TPU_TESTS=1")
ON_CHIP = {"JAX_PLATFORMS": ""}  # the worker picks the TPU, as on a user's TPU VM


@pytest.mark.asyncio(loop_scope="module")
async def test_eval_on_the_chip_ranks_by_device_time() -> None:
    gelu = load_small("gelu", rows=1024, cols=1024)
    async with WorkerPool(size=1, env_overrides=ON_CHIP) as pool:
        result = await pool.evaluate(gelu, gelu.kernel_path.read_text(),
                                     EvalOptions(timeout_s=600.0))
        data = result.to_json()
        assert result.status == "correct", json.dumps(data.get("error"))[:3000]
        assert data["backend"]["platform"] == "tpu"
        assert data["extra"]["candidate_process"]["route"] == "exported"
        assert data["timing"]["method"] == "device_trace", data["timing"]
        assert data["timing"]["speedup"] is not None
        assert data["timing"]["per_call_wall"]["kernel_median_ms"] > 0

        estimate = await pool.estimate(gelu, gelu.kernel_path.read_text(),
                                       EvalOptions(timeout_s=600.0))
        assert estimate["status"] == "ok", estimate.get("error")
        assert estimate["tpu"]["measured"]["median_ms"] > 0, estimate["tpu"]["measured"]

        profile = await pool.profile(gelu, gelu.kernel_path.read_text(), None,
                                     ProfileOptions(iters=5))
        assert profile["status"] == "ok", profile.get("error")
        assert profile["route"] == "exported"
        assert profile["timeline"]["source"] == "device"


@pytest.mark.asyncio(loop_scope="module")
async def test_a_second_judge_is_told_the_chip_is_busy() -> None:
    async with WorkerPool(size=1, env_overrides=ON_CHIP) as holder:
        await holder.backend()
        second = WorkerPool(size=1, env_overrides=ON_CHIP)
        with pytest.raises(WorkerStartError, match="ChipBusyError: the TPU chip is busy"):
            async with second:
                await second.backend()


@pytest.mark.slow
def test_the_workbench_in_a_terminal_judges_on_the_chip(tmp_path) -> None:
    """The real ``tilewright`` command in a pseudo-terminal on the TPU host: the starting
    kernel runs on the chip, ranked by device time, and the app quits cleanly."""
    from test_tui_e2e import Terminal, _env, _events, _has

    sessions = tmp_path / "sessions"
    env = _env(tmp_path)
    env.pop("JAX_PLATFORMS")  # the worker picks the TPU, as on a user's TPU VM
    term = Terminal(["--task", "gelu", "--set", "rows=1024", "--set", "cols=1024",
                     "--session-dir", str(sessions)], env)
    term.wait("the starting kernel", _has(sessions, type="kernel.version", version=1), 300)
    term.drain(1.0)
    term.send("r")
    term.wait("v1 on the chip", lambda: any(
        e["type"] == "run.result" and e.get("version") == 1 for e in _events(sessions)), 600)
    term.drain(1.0)
    term.send("q")
    assert term.finish() == 0
    result = next(e for e in _events(sessions) if e["type"] == "run.result")
    assert result["status"] == "correct", result.get("error")
    assert result["rank"]["source"] == "device_time", result["rank"]
    assert b"TPU" in term.output  # the screen names the chip's backend
