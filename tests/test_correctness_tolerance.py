"""Correctness that a loose tolerance cannot fool (JAXBench and MaxKernel use
atol = rtol = 1e-2): on a row softmax whose outputs are about 0.004, a kernel that
returns zeros, one that normalizes over 128-column tiles of 256-column rows, and one
that lets XLA compute the answer and only copies it through a pallas_call. The first
two are incorrect every time; the third is correct but flagged and never ranked."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from tilewright.kernels.judge.rank import ranking
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.tasks.loaders import load_task

ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
QUICK = EvalOptions(trials=3, timeout_s=60.0, timing=False)

REFERENCE = """
    import jax, jax.numpy as jnp
    def make_inputs(key, rows=16, cols=256):
        return (jax.random.normal(key, (rows, cols), jnp.float32),)
    def reference(x):
        return jax.nn.softmax(x, axis=-1)
"""

HEADER = """
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
"""

ZEROS = HEADER + """
    def _zeros(x_ref, o_ref):
        o_ref[...] = jnp.zeros_like(x_ref)

    def kernel(x):
        return pl.pallas_call(_zeros, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
"""

# Softmax over each 128-column tile on its own: every value is about twice too large.
TILED = HEADER + """
    def _softmax(x_ref, o_ref):
        x = x_ref[...]
        e = jnp.exp(x - x.max(axis=-1, keepdims=True))
        o_ref[...] = e / e.sum(axis=-1, keepdims=True)

    def kernel(x):
        rows, cols = x.shape
        spec = pl.BlockSpec((rows, 128), lambda j: (0, j))
        return pl.pallas_call(_softmax, grid=(cols // 128,), in_specs=[spec], out_specs=spec,
                              out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
"""

XLA_THEN_COPY = HEADER + """
    def _copy(y_ref, o_ref):
        o_ref[...] = y_ref[...]

    def kernel(x):
        y = jax.nn.softmax(x, axis=-1)
        return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(y.shape, y.dtype))(y)
"""

HONEST = HEADER + """
    def _softmax(x_ref, o_ref):
        x = x_ref[...]
        e = jnp.exp(x - x.max(axis=-1, keepdims=True))
        o_ref[...] = e / e.sum(axis=-1, keepdims=True)

    def kernel(x):
        return pl.pallas_call(_softmax, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
"""


@pytest.fixture(scope="module")
def loose(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("loose") / "softmax"
    root.mkdir()
    (root / "task.toml").write_text('name = "loose_softmax"\natol = 1e-2\nrtol = 1e-2\n'
                                    "[shapes.small]\nrows = 16\ncols = 256\n")
    (root / "reference.py").write_text(textwrap.dedent(REFERENCE))
    return load_task(root)


async def evaluate(pool: WorkerPool, task, source: str, tmp: Path):
    path = tmp / "candidate.py"
    path.write_text(textwrap.dedent(source))
    return await pool.evaluate(task, path.read_text(), QUICK, filename=str(path))


@ON_MODULE_LOOP
async def test_zeros_are_incorrect_every_time(worker_pool, loose, tmp_path) -> None:
    for _ in range(3):
        result = await evaluate(worker_pool, loose, ZEROS, tmp_path)
        assert result.status == "incorrect", result.correctness
        assert result.correctness["max_rel_diff"] == pytest.approx(1.0)


@ON_MODULE_LOOP
async def test_softmax_over_the_wrong_tiles_is_incorrect(worker_pool, loose, tmp_path) -> None:
    result = await evaluate(worker_pool, loose, TILED, tmp_path)
    assert result.status == "incorrect", result.correctness
    assert result.correctness["max_rel_diff"] > 0.5  # about 2x off: never reported as 0.0


@ON_MODULE_LOOP
async def test_xla_compute_then_copy_is_flagged_and_never_ranked(worker_pool, loose,
                                                                  tmp_path) -> None:
    result = await evaluate(worker_pool, loose, XLA_THEN_COPY, tmp_path)
    assert result.status == "correct"
    assert "compute_outside_kernel" in result.integrity["flags"]
    assert any("line" in item for item in result.integrity["outside_compute"])
    rank = ranking(result.to_json())
    assert rank.value is None and rank.source == "disqualified"
    honest = await evaluate(worker_pool, loose, HONEST, tmp_path)
    assert honest.status == "correct" and not honest.integrity["flags"]
    # The tolerance as enforced is recorded: atol=1e-2 capped at 5% of max|ref| (a row
    # softmax of 256 normal values peaks near 0.05, so the cap is a few 1e-3, not 1e-2;
    # the inputs are fresh each run, and one value above 4.7 sigma in the first trial's
    # 4096, about one run in 200, makes the cap the atol itself).
    enforced = honest.correctness["atol_effective"]
    assert 0 < enforced <= 0.01
    (shape,) = honest.extra["shapes"]
    assert shape["atol_effective"] == enforced


def test_the_enforced_absolute_tolerance_is_the_capped_one() -> None:
    import numpy as np

    from tilewright.kernels.worker.evaluation.compare import Host, compare, effective_atol

    ref = Host([np.array([0.004, 0.002, -0.001], np.float32),
                np.array([3.0, -5.0], np.float32)], "t", "float32")
    # 5% of 0.004 for the first array, the task's 1e-2 for the second (5% of 5 is more).
    assert effective_atol(ref, 1e-2) == pytest.approx(0.0002)
    # What the comparison enforces: an error of 0.0003 on the small array is outside it,
    # though far inside the stated atol.
    out = Host([ref.leaves[0] + np.float32(0.0003), ref.leaves[1]], "t", "float32")
    assert not compare(out, ref, 1e-2, 0.0).close
    assert effective_atol(Host([np.zeros(3, np.float32)], "t", "float32"), 1e-2) == 1e-2


def test_a_flagged_version_is_never_best() -> None:
    """The fold that every view, report and stop rule reads: a correct version with a
    disqualifying flag is not crowned, however fast it looks."""
    from tilewright.sessions.state import fold

    def version(n: int, seq: int) -> dict:
        return {"type": "kernel.version", "seq": seq, "t": 0.0, "version": n,
                "origin": "initial" if n == 1 else "user-edit", "source_blob": f"b{n}"}

    def result(n: int, seq: int, speedup: float, flags: list[str]) -> dict:
        return {"type": "run.result", "seq": seq, "t": 0.0, "run": f"r{n}", "version": n,
                "status": "correct", "correct": True, "speedup": speedup, "flags": flags,
                "cancelled": False}

    events = [version(1, 1), result(1, 2, 1.2, []),
              version(2, 3), result(2, 4, 9.0, ["compute_outside_kernel"]),
              version(3, 5), result(3, 6, 1.5, ["degenerate_reference"])]
    state = fold({"schema": "tilewright.session/1"}, events)
    assert state.best == 3 and state.best_rank.value == 1.5
    assert state.best_history[1].judgement.flags == ("compute_outside_kernel",)
    assert state.best_history[1].best == 1


# A user's own bf16 fused residual + layer norm (`tilewright new` writes atol = rtol = 0.02
# for bf16): the reference as written keeps its statistics in bf16, and with activations
# around 8 its mean and variance lose digits (bf16 spacing there is 0.06).
BF16_REFERENCE = """
    import jax, jax.numpy as jnp
    def make_inputs(key, rows=64, cols=1024):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        x = 8.0 + jax.random.normal(k1, (rows, cols), jnp.bfloat16)  # an offset: bf16 sums lose
        res = jax.random.normal(k2, (rows, cols), jnp.bfloat16)
        gamma = 1.0 + 0.1 * jax.random.normal(k3, (cols,), jnp.bfloat16)
        beta = 0.1 * jax.random.normal(k4, (cols,), jnp.bfloat16)
        return x, res, gamma, beta
    def reference(x, res, gamma, beta):
        h = x + res
        mean = h.mean(-1, keepdims=True)
        var = ((h - mean) ** 2).mean(-1, keepdims=True)
        return (h - mean) * jax.lax.rsqrt(var + 1e-6) * gamma + beta
"""

F32_STATISTICS = HEADER + """
    def _ln(x_ref, r_ref, g_ref, b_ref, o_ref):
        h = x_ref[...].astype(jnp.float32) + r_ref[...].astype(jnp.float32)
        mean = h.mean(-1, keepdims=True)
        var = ((h - mean) ** 2).mean(-1, keepdims=True)
        y = (h - mean) * jax.lax.rsqrt(var + 1e-6) * g_ref[...].astype(jnp.float32)
        o_ref[...] = (y + BETA * b_ref[...].astype(jnp.float32)).astype(o_ref.dtype)

    BETA = 1.0

    def kernel(x, res, gamma, beta):
        rows, cols = x.shape
        return pl.pallas_call(_ln, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(
            x, res, gamma.reshape(1, cols), beta.reshape(1, cols))
"""


@pytest.fixture(scope="module")
def bf16_layer_norm(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("bf16") / "fused_ln"
    root.mkdir()
    (root / "task.toml").write_text('name = "fused_ln"\natol = 0.02\nrtol = 0.02\n'
                                    "[shapes.small]\nrows = 64\ncols = 1024\n")
    (root / "reference.py").write_text(textwrap.dedent(BF16_REFERENCE))
    return load_task(root)


@ON_MODULE_LOOP
async def test_a_bf16_kernel_more_accurate_than_its_reference_is_correct(
        worker_pool, bf16_layer_norm, tmp_path) -> None:
    result = await evaluate(worker_pool, bf16_layer_norm, F32_STATISTICS, tmp_path)
    assert result.status == "correct", result.correctness
    assert "f32 from the same inputs" in result.correctness["judged_against"]
    # one that forgets a term (beta) is far from both references
    forgot = F32_STATISTICS.replace("BETA = 1.0", "BETA = 0.0")
    wrong = await evaluate(worker_pool, bf16_layer_norm, forgot, tmp_path)
    assert wrong.status == "incorrect", wrong.correctness


def test_the_written_references_own_error_is_allowed_against_the_precise_one() -> None:
    import numpy as np

    from tilewright.kernels.worker.evaluation.compare import (
        AS_WRITTEN,
        PRECISE,
        Host,
        judge_output,
    )

    precise = Host([np.linspace(-2, 2, 101, dtype=np.float32)], "t", "float32")
    written = Host([precise.leaves[0] + np.float32(0.06)], "t", "bfloat16")  # its own error
    better = Host([precise.leaves[0] + np.float32(0.001)], "t", "bfloat16")
    verdict, basis = judge_output(better, written, precise, 0.02, 0.02)
    assert verdict.close and basis == PRECISE
    off = Host([precise.leaves[0] - np.float32(0.1)], "t", "bfloat16")  # a missing term
    verdict, basis = judge_output(off, written, precise, 0.02, 0.02)
    assert not verdict.close and basis == AS_WRITTEN
    # without a precise reference (an f32 task): judged as written only
    assert judge_output(better, written, None, 0.02, 0.02)[1] == AS_WRITTEN


@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
def test_a_kernel_rounding_at_other_elements_than_the_reference_is_correct(
        device: bool, monkeypatch) -> None:
    """Two bf16 programs of the same norm, rounding an intermediate at different points,
    have the same error level against the f32 answer at different elements (22k's conv
    kernel against XLA's program on the v5e). Judged with the written reference's error
    only where it made it, such a kernel fails; with the tolerance widened by the written
    reference's worst error (in units of the tolerance) it passes, and a shift of 5% of
    the output's spread, a 3% scale, a block left at zero or an error twice the written
    one's rms still fail. The same on the device's comparison (a judge holding a TPU),
    here on the CPU backend."""
    import ml_dtypes

    from tilewright.kernels.worker.evaluation import compare as module

    if device:
        monkeypatch.setattr(module, "DEVICE_COMPARE", True)
        monkeypatch.setattr(module, "DEVICE_COMPARE_MIN", 1)

    from tilewright.kernels.worker.evaluation.compare import (
        PRECISE,
        Host,
        compare,
        judge_output,
    )

    def bf16(a: np.ndarray) -> np.ndarray:
        return np.asarray(a, ml_dtypes.bfloat16).astype(np.float32)

    def norm(y: np.ndarray) -> np.ndarray:
        return (y - y.mean(axis=1, keepdims=True)) / y.std(axis=1, keepdims=True)

    rng = np.random.default_rng(0)
    y1 = rng.uniform(0.5, 1.0, (64, 4096)).astype(np.float32)  # a conv's output, say
    y2 = (rng.standard_normal((64, 1)) * 0.02).astype(np.float32)  # its bias
    precise = Host([norm(y1 + y2)], "t", "float32")
    written = Host([bf16(norm(bf16(y1 + y2)))], "t", "bfloat16")
    kernel = bf16(norm(bf16(bf16(y1) + y2)))  # the bias added after rounding
    error = np.abs(written.leaves[0] - precise.leaves[0])
    # the premise: the same level of error, at other elements
    assert abs(np.sqrt(np.mean((kernel - precise.leaves[0]) ** 2))
               - np.sqrt(np.mean(error ** 2))) < 0.1 * np.sqrt(np.mean(error ** 2))
    assert not compare(Host([kernel], "t", "bfloat16"), written, 0.01, 0.01).close
    assert not compare(Host([kernel], "t", "bfloat16"), precise, 0.01, 0.01, [error]).close
    verdict, basis = judge_output(Host([kernel], "t", "bfloat16"), written, precise, 0.01, 0.01)
    assert verdict.close and basis == PRECISE, verdict.reason
    spread = float(precise.leaves[0].std())
    zeroed = kernel.copy()
    zeroed[:, :8] = 0.0
    own = float(np.sqrt(np.mean(error ** 2)))
    noisy = kernel + (rng.standard_normal(kernel.shape) * 2.2 * own).astype(np.float32)
    for wrong in (kernel + np.float32(0.05 * spread), kernel * np.float32(0.97), zeroed,
                  noisy):
        verdict, _ = judge_output(Host([wrong], "t", "bfloat16"), written, precise, 0.01, 0.01)
        assert not verdict.close
        assert module.precise_on_device(wrong, written.leaves[0], precise.leaves[0], 0.01,
                                        0.01) is None
    # on the device the clear pass is decided there, without the host's passes
    decided = module.precise_on_device(kernel, written.leaves[0], precise.leaves[0], 0.01, 0.01)
    assert (decided is not None) == device


def test_mean_squares_are_float64_sums_that_do_not_overflow() -> None:
    """The spread rule's mean squares come from float32 values without a float64 copy:
    scaled first, so values above 1.8e19 (whose float32 square is inf) still count."""
    import numpy as np

    from tilewright.kernels.worker.evaluation.compare import _mean_square

    x = np.array([3e20, -4e20, 0.0, 1e20], np.float32)
    want = float(np.mean(x.astype(np.float64) ** 2))
    with np.errstate(over="ignore"):
        assert np.isinf(np.mean(np.square(x)))  # what a plain float32 square gives
    assert abs(_mean_square(x) - want) <= 1e-6 * want
    assert _mean_square(np.zeros(3, np.float32)) == 0.0
    assert _mean_square(np.zeros(0, np.float32)) == 0.0


@pytest.fixture
def on_the_device(monkeypatch):
    """The comparison a judge holding a TPU makes on the chip, here on the CPU backend."""
    from tilewright.kernels.worker.evaluation import compare as module

    monkeypatch.setattr(module, "DEVICE_COMPARE", True)
    monkeypatch.setattr(module, "DEVICE_COMPARE_MIN", 1)
    return module


def _cases(rng: np.random.Generator) -> list[tuple[str, np.ndarray, np.ndarray, float, float]]:
    ref = rng.standard_normal((64, 256)).astype(np.float32)
    tiny = (ref * 1e-3).astype(np.float32)
    out = []
    out.append(("exact", ref.copy(), ref, 1e-5, 1e-5))
    out.append(("close", ref + rng.standard_normal(ref.shape).astype(np.float32) * 1e-6, ref,
                1e-5, 1e-5))
    out.append(("one element off", _poke(ref, (3, 7), 0.5), ref, 1e-5, 1e-5))
    out.append(("at the bound", ref + np.float32(9.99e-6), ref, 1e-5, 0.0))
    out.append(("nan", _poke(ref, (0, 0), np.nan), ref, 1e-5, 1e-5))
    out.append(("constant", np.zeros_like(ref), ref, 10.0, 0.0))
    out.append(("off as a whole", ref + np.float32(0.02) * np.sign(ref), ref, 0.05, 0.0))
    out.append(("capped atol", tiny + np.float32(2e-5), tiny, 1e-2, 0.0))
    out.append(("inf in the reference", _poke(ref, (1, 1), np.inf), _poke(ref, (1, 1), np.inf),
                1e-5, 1e-5))
    return out


def _poke(a: np.ndarray, where: tuple[int, int], value: float) -> np.ndarray:
    b = a.copy()
    b[where] = value
    return b


def test_the_device_comparison_passes_only_what_the_host_passes(on_the_device) -> None:
    """Every case judged twice, on the host and with the device deciding the clear
    passes: the same verdict and reason, the same largest differences (the device's
    division may differ in the last place)."""
    from tilewright.kernels.worker.evaluation.compare import Host, compare

    rng = np.random.default_rng(7)
    for name, out, ref, atol, rtol in _cases(rng):
        host_out, host_ref = Host([out], "*", np.float32), Host([ref], "*", np.float32)
        on_the_device.DEVICE_COMPARE = False
        want = compare(host_out, host_ref, atol, rtol)
        on_the_device.DEVICE_COMPARE = True
        got = compare(host_out, host_ref, atol, rtol)
        assert (got.close, got.reason) == (want.close, want.reason), name
        if want.max_abs_diff is not None:
            assert got.max_abs_diff == want.max_abs_diff, name
            assert got.max_rel_diff == pytest.approx(want.max_rel_diff, rel=1e-5), name
    # and the device did decide: a clear pass is not sent back to the host
    ref = rng.standard_normal((64, 256)).astype(np.float32)
    assert on_the_device.on_device(ref + np.float32(1e-7), ref, 1e-5, 1e-5, None) is not None
    assert on_the_device.on_device(_poke(ref, (0, 0), 1.0), ref, 1e-5, 1e-5, None) is None


def test_a_device_that_cannot_compare_leaves_it_to_the_host(on_the_device, monkeypatch) -> None:
    """Two more copies of a large output may not fit the chip's HBM beside the inputs:
    the comparison then happens on the host, with the same verdict."""
    from tilewright.kernels.worker.evaluation.compare import Host, compare

    def full(*_args):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 268435456 bytes")

    monkeypatch.setattr(on_the_device, "_leaf_stats", lambda: full)
    ref = np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32)
    assert on_the_device.on_device(ref, ref, 1e-5, 1e-5, None) is None
    found = compare(Host([ref + np.float32(1e-7)], "*", np.float32), Host([ref], "*", np.float32),
                    1e-5, 1e-5)
    assert found.close and found.max_abs_diff is not None
