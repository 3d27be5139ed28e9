"""Adversarial candidates get the status they deserve, and the harness stays standing.

Every candidate in tests/fixtures/candidates/ runs through the real worker pool, in
TPU interpret mode on the CPU, against the bundled gelu task at a small shape.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sizes import load_small

from tilewright.kernels.judge.result import EvalResult
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool

pytestmark = pytest.mark.asyncio(loop_scope="module")

CANDIDATES = Path(__file__).resolve().parent / "fixtures" / "candidates"
# One small configuration, no timing: correctness only, about a second per candidate.
OPTIONS = EvalOptions(trials=3, timeout_s=60.0, timing=False, shapes=["small"])


@pytest.fixture(scope="module")
def gelu():
    return load_small("gelu", rows=64, cols=256)


async def evaluate(pool: WorkerPool, task, name: str, **options) -> EvalResult:
    path = CANDIDATES / name
    opts = EvalOptions(**{**OPTIONS.__dict__, **options})
    return await pool.evaluate(task, path.read_text(), opts, filename=str(path))


async def test_good_candidate_is_correct(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "good_gelu.py")
    assert result.status == "correct", result.error
    assert result.correctness["trials"] == 3
    assert result.lowering["tpu"] == "ok"
    assert result.integrity["flags"] == []


async def test_wrong_values_are_incorrect(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "wrong_values.py")
    assert result.status == "incorrect"
    assert result.correctness["correct"] is False
    assert result.correctness["max_abs_diff"] > result.correctness["atol"]
    assert "outside atol" in result.correctness["reason"]


async def test_nan_output_is_incorrect(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "nan_output.py")
    assert result.status == "incorrect"
    assert "NaN" in result.correctness["reason"]
    assert result.correctness["max_abs_diff"] is None


async def test_output_block_never_written_is_incorrect(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "unwritten_block.py")
    assert result.status == "incorrect"
    # interpret mode fills never-written memory with NaN: the first row block
    assert "NaN" in result.correctness["reason"]
    assert "index (0, 0)" in result.correctness["reason"]


async def test_no_pallas_is_rejected(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "no_pallas.py")
    assert result.status == "rejected"
    assert "no_pallas_call" in result.integrity["flags"]
    assert result.error.kind == "no_pallas_call"


async def test_stateful_cache_is_caught_by_fresh_inputs(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "stateful_cache.py")
    assert result.status == "incorrect"
    # the first trial is right (the cache is filled from it), a later one replays it
    assert "trial 2" in result.correctness["reason"]


async def test_infinite_loop_times_out_and_worker_is_replaced(worker_pool, gelu) -> None:
    await worker_pool.request("hello", {})
    before = list(worker_pool.pids)
    result = await evaluate(worker_pool, gelu, "infinite_loop.py", timeout_s=3.0)
    assert result.status == "timeout"
    assert result.error.kind == "timeout"
    # the judge (the worker) survives; the hung candidate process was killed and replaced
    assert result.extra["candidate_process"]["killed"] == "timeout"
    after = await evaluate(worker_pool, gelu, "good_gelu.py")
    assert after.status == "correct"
    assert worker_pool.pids == before
    assert after.extra["candidate_process"]["pid"] != result.extra["candidate_process"]["pid"]


@pytest.mark.parametrize("name, signal_name", [("os_abort.py", "SIGABRT"),
                                               ("segfault.py", "SIGSEGV")])
async def test_native_crash_is_contained(worker_pool, gelu, name, signal_name) -> None:
    result = await evaluate(worker_pool, gelu, name)
    assert result.status == "crashed"
    assert result.error.kind == "crashed"
    assert signal_name in result.error.message
    assert (await evaluate(worker_pool, gelu, "good_gelu.py")).status == "correct"


async def test_os_exit_is_reported_as_an_exit(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "os_exit.py")
    assert result.status == "crashed"
    assert result.error.kind == "exited"
    assert "code 7" in result.error.message


async def test_sys_exit_is_a_runtime_error_and_worker_survives(worker_pool, gelu) -> None:
    await worker_pool.request("hello", {})  # a worker is up (an earlier test may crash one)
    pids = list(worker_pool.pids)
    result = await evaluate(worker_pool, gelu, "sys_exit.py")
    assert result.status in ("runtime_error", "compile_error")
    assert result.error.kind == "exit"
    assert "sys.exit(3)" in result.error.message
    assert result.error.line == 6
    assert (await evaluate(worker_pool, gelu, "good_gelu.py")).status == "correct"
    assert worker_pool.pids == pids  # SystemExit is an exception: no restart needed


async def test_syntax_error_is_a_compile_error_with_its_line(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "syntax_error.py")
    assert result.status == "compile_error"
    assert result.error.kind == "syntax"
    assert result.error.line == 7


async def test_misaligned_block_fails_tpu_lowering(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "misaligned_block.py")
    assert result.status == "compile_error"
    assert result.error.kind == "lowering"
    assert result.lowering["tpu"] == "error"
    assert "divisible by 8 and 128" in result.lowering["message"]
    assert "(8, 128)" in result.error.hint
    # ... although interpret mode alone accepts it and computes the right values
    lenient = await evaluate(worker_pool, gelu, "misaligned_block.py", lowering=False)
    assert lenient.status == "correct"
    assert lenient.lowering["tpu"] == "skipped"


async def test_out_of_bounds_index_map_is_a_runtime_error(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "oob_index_map.py")
    assert result.status == "runtime_error"
    assert "Out-of-bounds block index" in result.error.message
    assert result.error.line == 20  # the pallas_call that launched the kernel
    assert "index_map" in result.error.hint
    # the interpreter's state was reset: the next kernel runs fine
    assert (await evaluate(worker_pool, gelu, "good_gelu.py")).status == "correct"


async def test_index_map_arity_gets_a_hint_and_a_line(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "index_map_arity.py")
    assert result.status == "compile_error"
    assert result.error.kind == "trace"
    assert "one integer per grid dimension" in result.error.hint
    assert result.error.line is not None


async def test_missing_entry_point(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "missing_entry.py")
    assert result.status == "compile_error"
    assert result.error.kind == "missing_entry"
    assert "gelu_kernel" in result.error.message


async def test_monkeypatching_the_harness_is_rejected(worker_pool, gelu) -> None:
    await worker_pool.request("hello", {})
    before = list(worker_pool.pids)
    result = await evaluate(worker_pool, gelu, "patches_numpy.py")
    assert result.status == "rejected"
    assert "harness_tampering" in result.integrity["flags"]
    assert "numpy.abs" in result.error.message
    # the candidate process is replaced (the judge never ran the candidate's code): the
    # next candidate meets an unpatched numpy
    after = await evaluate(worker_pool, gelu, "good_gelu.py")
    assert after.status == "correct"
    assert worker_pool.pids == before
    assert after.extra["candidate_process"]["pid"] != result.extra["candidate_process"]["pid"]


async def test_api_keys_in_the_app_never_reach_the_candidate(gelu, monkeypatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-a-real-key")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_test")
    async with WorkerPool() as pool:
        result = await evaluate(pool, gelu, "api_key_sniffer.py")
    assert result.status == "correct", result.correctness
    assert os.environ["ANTHROPIC_API_KEY"]  # the app's own environment is untouched


async def test_memory_hog_is_killed(gelu) -> None:
    # A worker idles at about 270 MB resident; the candidate grabs 100 MB at a time.
    async with WorkerPool(memory_limit_mb=800) as pool:
        result = await evaluate(pool, gelu, "memory_hog.py")
        assert result.status == "crashed"
        assert result.error.kind == "memory"
        assert "memory limit" in result.error.message


async def test_global_jax_config_changes_are_undone(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "enables_x64.py")
    assert "jax_config_changed" in result.integrity["flags"]
    assert result.extra["jax_config_changed"] == ["jax_enable_x64"]
    after = await evaluate(worker_pool, gelu, "good_gelu.py")
    assert after.status == "correct" and after.integrity["flags"] == []


async def test_a_forged_reply_on_the_harness_channel_is_refused(worker_pool, gelu) -> None:
    result = await evaluate(worker_pool, gelu, "forged_reply.py", timeout_s=20.0)
    assert result.status == "crashed"
    assert "does not answer this request" in result.error.message
    assert (await evaluate(worker_pool, gelu, "good_gelu.py")).status == "correct"
