"""Hostile probes against the judge/candidate split (docs/SECURITY.md, "The judge").

Each candidate below is an attack that worked while the candidate shared the harness's
process. Each runs through the real worker pool (the judge) and its real candidate
process, in TPU interpret mode on the CPU, against the bundled gelu task at a small
shape; each test asserts the attack fails and the result is still a sensible one.
"""

from __future__ import annotations

import pytest
from sizes import load_small

from tilewright.kernels.judge.result import EvalResult
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool

pytestmark = pytest.mark.asyncio(loop_scope="module")

OPTIONS = EvalOptions(trials=3, timeout_s=60.0, timing=False, shapes=["small"])

GELU = '''
import math
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

def _gelu(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

def _zero(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 0

def gelu(x):
    return pl.pallas_call(_gelu, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

def zeros(x):
    return pl.pallas_call(_zero, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
'''


@pytest.fixture(scope="module")
def task():
    return load_small("gelu", rows=64, cols=256)


async def evaluate(pool: WorkerPool, task, body: str, **options) -> EvalResult:
    opts = EvalOptions(**{**OPTIONS.__dict__, **options})
    return await pool.evaluate(task, GELU + body, opts, filename="kernel.py")


async def test_patching_compare_does_not_reach_the_judge(worker_pool, task) -> None:
    # Every comparison "passes" in the process this runs in: not the judge's.
    result = await evaluate(worker_pool, task, '''
import tilewright.kernels.worker.evaluation.compare as _c
_c.compare.__code__ = (lambda out, ref, atol, rtol: _c.Comparison(True, 0.0, 0.0)).__code__

def kernel(x):
    return zeros(x)
''')
    # The swapped code is caught where it ran (the candidate process's snapshot covers
    # code objects); the judge's own compare never changed: zeros stay wrong.
    assert result.status == "rejected", (result.status, result.error)
    assert "tilewright.kernels.worker.evaluation.compare.compare" in result.error.message
    after = await evaluate(worker_pool, task, "kernel = zeros\n")
    assert after.status == "incorrect"
    assert "outside atol" in after.correctness["reason"]


async def test_references_found_through_gc_are_not_the_judges(worker_pool, task) -> None:
    # Overwrite every float32 array of the output's shape, then return zeros.
    result = await evaluate(worker_pool, task, '''
import gc
import numpy as np

def kernel(x):
    hit = 0
    for obj in gc.get_objects():
        if isinstance(obj, np.ndarray) and obj.shape == tuple(x.shape) and obj.flags.writeable:
            obj[...] = 0
            hit += 1
    print("overwrote", hit, "arrays")
    return zeros(x)
''')
    assert result.status == "incorrect"
    assert result.correctness["max_abs_diff"] > result.correctness["atol"]


async def test_a_forged_reply_with_the_nonce_is_impossible(worker_pool, task) -> None:
    # Look for the app's nonce in every frame, then write a reply claiming success on
    # every socket this process holds (its channel to the judge is the only one).
    before = list(worker_pool.pids)
    result = await evaluate(worker_pool, task, '''
import json, os, socket, stat, struct, sys

def kernel(x):
    nonces = []
    frame = sys._getframe()
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, dict) and "nonce" in value:
                nonces.append(value["nonce"])
        frame = frame.f_back
    print("NONCE-FOUND" if nonces else "no nonce here")
    body = json.dumps({"id": 1, "nonce": nonces[0] if nonces else None, "ok": True,
                       "result": {"schema": "tilewright.eval/1", "status": "correct"}}).encode()
    for fd in range(3, 64):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.write(fd, struct.pack(">I", len(body)) + body)
        except OSError:
            pass
    return x
''')
    assert result.status == "crashed"
    assert "does not answer this request" in result.error.message
    assert "NONCE-FOUND" not in result.stderr and "no nonce here" in result.stderr
    assert worker_pool.pids == before  # the judge stands; the candidate process was replaced
    assert result.extra["candidate_process"]["killed"] == "protocol"
    assert (await evaluate(worker_pool, task, "kernel = gelu\n")).status == "correct"


async def test_stack_sniffing_cannot_split_inspection_from_execution(worker_pool, task) -> None:
    # Pallas when the stack looks like inspection, a plain (wrong) jnp rewrite otherwise.
    # The names it looks for are the harness's own (its ops, its checks) and JAX's.
    result = await evaluate(worker_pool, task, '''
import inspect

def kernel(x):
    names = {f.function for f in inspect.stack()}
    print("ENTRY-RAN")
    if names & {"trace", "prepare", "_check_config", "contains_pallas_call"}:
        return gelu(x)
    return x * 0.5
''', timing=True, iters=3)
    # traced once per shape (the check shape, the production shape), every time the same
    # way: no harness frame is on the stack, so the sniffer takes the plain rewrite at
    # both, and what was inspected (no pallas_call) is what would run: refused
    assert result.stderr.count("ENTRY-RAN") == 2
    assert result.status == "rejected", (result.correctness, result.error)
    assert result.error.kind == "no_pallas_call"


async def test_a_callback_that_changes_while_timed_is_caught(worker_pool, task) -> None:
    # Right for the checked trials (3 + the determinism rerun), zeros afterwards.
    result = await evaluate(worker_pool, task, '''
import itertools
import numpy as np

_calls = itertools.count()

def _maybe_zero(a):
    return a if next(_calls) < 4 else np.zeros_like(a)

def kernel(x):
    out = gelu(x)
    return jax.pure_callback(_maybe_zero, jax.ShapeDtypeStruct(x.shape, x.dtype), out)
''', timing=True, iters=3)
    assert result.status == "incorrect"
    assert "timed call" in result.correctness["reason"]
    assert result.correctness["correct"] is False


async def test_a_thread_hogging_the_interpreter_cannot_slow_the_baseline(worker_pool,
                                                                        task) -> None:
    # A busy thread started at import: in one process it held the interpreter lock while
    # the XLA reference was timed (a 0.005x kernel read 3x). The baseline is timed in the
    # judge now, with the candidate process stopped.
    result = await evaluate(worker_pool, task, '''
import threading

def _hog():
    n = 0
    while True:
        n += 1

threading.Thread(target=_hog, daemon=True).start()
kernel = gelu
''', timing=True, iters=3)
    assert result.status == "correct"
    assert "background_threads" in result.integrity["flags"]
    assert result.timing["candidate_paused"] is True
    # interpret mode simulates the kernel on the CPU: hundreds of times slower than XLA
    assert result.timing["host_ratio"] < 1.0 and result.timing["speedup"] is None
    assert result.extra["candidate_process"]["restarted"] is True


async def test_a_flood_on_the_channel_kills_only_the_candidate(worker_pool, task) -> None:
    before = list(worker_pool.pids)
    result = await evaluate(worker_pool, task, '''
import os, struct

def kernel(x):
    args = open("/proc/self/cmdline").read().split("\\0")
    fd = int(args[args.index("--fd") + 1])
    os.write(fd, struct.pack(">I", 1 << 31) + b"x" * 4096)
    return gelu(x)
''')
    assert result.status == "crashed"
    assert result.error.kind == "crashed"
    assert "exceeds the limit" in result.error.message
    assert worker_pool.pids == before
    assert (await evaluate(worker_pool, task, "kernel = gelu\n")).status == "correct"


async def test_compute_outside_the_kernel_is_found_in_the_tpu_lowering(worker_pool,
                                                                       task) -> None:
    # XLA computes the answer, the kernel only copies it.
    result = await evaluate(worker_pool, task, '''
def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]

def kernel(x):
    y = 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(y)
''')
    assert result.status == "correct"
    assert "compute_outside_kernel" in result.integrity["flags"]
    assert any("TPU lowering" in item for item in result.integrity["outside_compute"])
    assert result.extra["candidate_process"]["lowering_checked"] is True


async def test_a_kernel_in_the_older_pallas_style_loads_and_is_judged(worker_pool, task) -> None:
    """Names later JAX releases dropped (pltpu.TPUCompilerParams, TPUMemorySpace, ANY)
    are the harness's aliases of the current ones: such a kernel is judged, on either
    stack, and the aliases are not the candidate's tampering."""
    from pathlib import Path

    from tilewright.kernels.worker import pallas_compat

    source = (Path(__file__).parent / "fixtures" / "candidates" /
              "older_pallas_names.py").read_text()
    result = await worker_pool.evaluate(task, source, EvalOptions(**OPTIONS.__dict__),
                                        filename="kernel.py")
    assert result.status == "correct", (result.error, result.lowering)
    assert result.lowering["tpu"] == "ok"
    # the names this JAX lacks, or none: what the fixture above relies on is an alias
    assert set(pallas_compat.aliases()) <= {"TPUCompilerParams", "TPUMemorySpace", "ANY"}
