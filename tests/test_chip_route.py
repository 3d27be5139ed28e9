"""The route of a host with a chip, tested where its logic runs without one.

On a TPU host libtpu admits one process per chip: the judge holds it, its children run
JAX on the CPU, and the candidate's programs reach the chip exported (``jax.export``),
checked, compiled and run by the judge. Here: that route end to end on the CPU
(``route = "exported"``: the kernels in the plain interpreter), the checks the judge
makes on an exported program before it runs anything, the rule that no child of the
judge opens an accelerator, the busy-chip error, and reading device time from a
profile's device plane.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sizes import load_small
from waiting import until_now

from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.worker import chip
from tilewright.kernels.worker.errors import Stopped
from tilewright.kernels.worker.evaluation.compare import Host
from tilewright.kernels.worker.evaluation.exported import ExportedPrograms, custom_calls
from tilewright.profiling import convert, device_time

ON_MODULE_LOOP = pytest.mark.asyncio(loop_scope="module")
EXPORTED = EvalOptions(trials=3, iters=5, timeout_s=120.0, route="exported", shapes=["small"])


@pytest.fixture(scope="module")
def gelu():
    return load_small("gelu", rows=64, cols=256)


@ON_MODULE_LOOP
async def test_the_judge_runs_the_exported_program_and_times_it(worker_pool, gelu) -> None:
    result = await worker_pool.evaluate(gelu, gelu.kernel_path.read_text(), EXPORTED,
                                        filename=str(gelu.kernel_path))
    data = result.to_json()
    assert result.status == "correct", result.error
    assert data["extra"]["candidate_process"]["route"] == "exported"
    assert data["extra"]["candidate_process"]["lowering_checked"] is True
    timing = data["timing"]
    assert timing["route"] == "exported"
    # No accelerator here: no device plane, so the pipelined mean, said so.
    assert timing["method"] == "pipelined"
    assert "no device plane" in timing["why_not_device_trace"]
    assert timing["checked_calls"] == timing["input_sets"] >= 1
    assert timing["per_call_wall"]["kernel_median_ms"] > 0
    assert timing["p10_ms"] <= timing["median_ms"] <= timing["p90_ms"]


@ON_MODULE_LOOP
async def test_a_wrong_kernel_is_wrong_on_the_exported_route(worker_pool, gelu) -> None:
    source = gelu.kernel_path.read_text() + textwrap.dedent("""

        _right = kernel

        def kernel(x):
            return _right(x) * 1.01 + 0.01
    """)
    result = await worker_pool.evaluate(gelu, source, EXPORTED, filename="kernel.py")
    assert result.status == "incorrect"
    assert "trial 1" in result.correctness["reason"]


@ON_MODULE_LOOP
async def test_outputs_compared_on_the_device_judge_as_the_host_does(gelu) -> None:
    """The judge compares large outputs on its device (on a TPU host: the chip; here the
    CPU backend, forced by TILEWRIGHT_COMPARE_ON_DEVICE): the right kernel is correct and
    timed, a wrong one is wrong with the host's words; the judge's own modules are left
    as they were (a rebound global there was once taken for the task tampering)."""
    wrong = gelu.kernel_path.read_text() + textwrap.dedent("""

        _right = kernel

        def kernel(x):
            return _right(x) * 1.01 + 0.01
    """)
    async with WorkerPool(size=1, env_overrides={"TILEWRIGHT_COMPARE_ON_DEVICE": "1"}) as pool:
        right = await pool.evaluate(gelu, gelu.kernel_path.read_text(), EXPORTED,
                                    filename=str(gelu.kernel_path))
        bad = await pool.evaluate(gelu, wrong, EXPORTED, filename="kernel.py")
    assert right.status == "correct", (right.error, right.correctness)
    assert right.timing["checked_calls"] >= 1
    assert 0 < right.correctness["max_abs_diff"] < 1e-4
    assert bad.status == "incorrect" and "trial 1" in bad.correctness["reason"]
    assert "outside atol" in bad.correctness["reason"]


PLATFORM_PROBE = textwrap.dedent("""
    import os
    import jax

    raise RuntimeError(
        f"env={os.environ.get('JAX_PLATFORMS')!r} config={jax.config.jax_platforms!r} "
        f"device={jax.devices()[0].platform}")
""")


@ON_MODULE_LOOP
async def test_no_child_of_the_judge_opens_an_accelerator(gelu) -> None:
    # The worker is started as on a TPU VM: JAX_PLATFORMS unset (empty), JAX picks the
    # platform itself. Its candidate process is pinned to the CPU all the same.
    async with WorkerPool(size=1, env_overrides={"JAX_PLATFORMS": ""}) as pool:
        result = await pool.evaluate(gelu, PLATFORM_PROBE, EXPORTED, filename="kernel.py")
    assert result.status == "runtime_error"
    assert "env='cpu' config='cpu' device=cpu" in result.error.message


def _exported(fn, *avals, platforms=("cpu",), **kwargs) -> bytes:
    return bytes(jax.export.export(jax.jit(fn), platforms=platforms, **kwargs)(*avals)
                 .serialize())


X = jax.ShapeDtypeStruct((8, 128), jnp.float32)


def _inputs() -> tuple:
    return (jnp.ones((8, 128), jnp.float32),)


def test_the_runner_runs_a_program_it_checked() -> None:
    runner = ExportedPrograms("cpu")
    program = runner.adopt("small", _exported(lambda x: x * 2.0, X), _inputs(), None, 0)
    assert "stablehlo" in program.text or "func.func" in program.text
    expected = Host([np.full((8, 128), 2.0, np.float32)], "PyTreeDef(*)", np.float32)
    out = runner.run("small", _inputs(), expected, None)
    np.testing.assert_array_equal(out.leaves[0], expected.leaves[0])


def test_one_program_exported_twice_is_compiled_once() -> None:
    """The production shape is also a check shape: its program, exported for both, is
    compiled on the chip once (a compile at 8192x8192 is seconds there)."""
    runner = ExportedPrograms("cpu")
    blob = _exported(lambda x: x * 2.0, X)
    first = runner.adopt("tpu_8k", blob, _inputs(), None, 0)
    again = runner.adopt("production", blob, _inputs(), None, 0)
    assert again.compiled is first.compiled and len(runner.compiled) == 1
    other = runner.adopt("small", _exported(lambda x: x * 3.0, X), _inputs(), None, 0)
    assert other.compiled is not first.compiled and len(runner.compiled) == 2


def test_the_exported_route_sends_the_candidate_shapes_not_values() -> None:
    """On the exported route the candidate process only traces and exports: its inputs
    go as shapes and dtypes (at 8192x8192 the values took about 5 s to pickle and send)."""
    import pickle

    from tilewright.kernels.worker.candidate import judge

    dyn, static = (jnp.ones((64, 256), jnp.float32), np.zeros((8,), np.int32)), (3,)
    sent, kept = pickle.loads(judge.pickled(dyn, static, shapes_only=True))
    assert all(isinstance(a, jax.ShapeDtypeStruct) for a in sent) and kept == (3,)
    assert [(a.shape, a.dtype) for a in sent] == [((64, 256), jnp.float32), ((8,), np.int32)]
    assert len(judge.pickled(dyn, static, shapes_only=True)) < 2048
    values, _ = pickle.loads(judge.pickled(dyn, static))  # the candidate runs them itself
    assert isinstance(values[0], np.ndarray) and values[0].shape == (64, 256)


def test_the_runner_refuses_a_custom_call_outside_the_stable_list() -> None:
    # What a hostile candidate process can send: a program calling a target of its choice.
    def planted(x):
        return jax.ffi.ffi_call("tw_planted", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    blob = _exported(planted, X, disabled_checks=[
        jax.export.DisabledSafetyCheck.custom_call("tw_planted")])
    assert custom_calls(jax.export.deserialize(bytearray(blob)).mlir_module()) == {"tw_planted"}
    with pytest.raises(Stopped) as stop:
        ExportedPrograms("cpu").adopt("small", blob, _inputs(), None, 0)
    assert stop.value.status == "rejected" and "tw_planted" in stop.value.error.message


def test_the_runner_refuses_other_inputs_platforms_and_big_outputs() -> None:
    runner = ExportedPrograms("cpu")
    other = (jnp.ones((16, 128), jnp.float32),)
    with pytest.raises(Stopped, match="takes"):
        runner.adopt("small", _exported(lambda x: x, X), other, None, 0)
    with pytest.raises(Stopped, match="is for"):
        runner.adopt("small", _exported(lambda x: x, X, platforms=("tpu",)), _inputs(),
                     None, 0)
    with pytest.raises(Stopped, match="outputs take"):
        runner.adopt("small", _exported(lambda x: jnp.tile(x, (64, 1)), X), _inputs(),
                     None, 8 * 128 * 4 * 2)
    with pytest.raises(Stopped, match="does not deserialize"):
        runner.adopt("small", b"not a program", _inputs(), None, 0)


def test_pin_to_cpu_resets_a_process_that_imported_jax_for_any_platform() -> None:
    code = textwrap.dedent("""
        import os
        import jax
        from tilewright.kernels.worker import chip
        before = jax.config.jax_platforms
        chip.pin_to_cpu()
        print(before, jax.config.jax_platforms, os.environ["JAX_PLATFORMS"],
              jax.devices()[0].platform)
    """)
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["None", "cpu", "cpu", "cpu"]


LIBTPU_BUSY = ("Unable to initialize backend 'tpu': ABORTED: Internal error when accessing "
               "libtpu multi-process lockfile. Run \"$ sudo lsof -w /dev/vfio/1\" to figure "
               "out which process is using the TPU.")


def test_the_busy_chip_error_names_the_process_holding_it(tmp_path) -> None:
    device = tmp_path / "vfio" / "1"
    device.parent.mkdir()
    device.write_text("")
    holder = subprocess.Popen(
        # the payload: a process that holds the device open (killed below, never waited out)
        [sys.executable, "-c", f"f = open({str(device)!r}); import time; time.sleep(60)"])
    try:
        until_now(lambda: chip.holders(paths=(str(device.parent) + "/",)),
                  "the holder to open the device", timeout=30)
        found = chip.holders(paths=(str(device.parent) + "/",))
        assert [h.pid for h in found] == [holder.pid]
        assert str(device) == found[0].what and "time.sleep" in found[0].command
    finally:
        holder.kill()
        holder.wait()
    assert chip.is_busy_message(LIBTPU_BUSY)
    assert not chip.is_busy_message("Unable to initialize backend 'tpu': NOT_FOUND: no TPU")
    error = chip.busy_error(LIBTPU_BUSY)
    assert "chip is busy" in str(error) and "JAX_PLATFORMS=cpu" in str(error)
    assert "lockfile" in str(error)


def _trace(process: str, line: str, names: list[tuple[str, float]]) -> dict:
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": process}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": line}}]
    start = 0.0
    for name, dur in names:
        events.append({"ph": "X", "pid": 1, "tid": 2, "name": name, "ts": start, "dur": dur})
        start += dur + 1.0
    return {"traceEvents": events}


def test_device_time_reads_the_module_line_of_a_device_plane() -> None:
    trace = _trace("/device:TPU:0", "XLA Modules",
                   [("jit_tw_candidate(42)", 204.5), ("jit_tw_reference(7)", 296.0),
                    ("jit_tw_candidate(42)", 205.0), ("jit_other(1)", 5.0)])
    timeline = convert.timeline_from_trace(trace)
    kernel = device_time.program_times(timeline, "tw_candidate")
    assert kernel is not None and kernel.durations_us == (204.5, 205.0)
    assert kernel.device == "/device:TPU:0"
    assert device_time.program_times(timeline, "tw_reference").durations_us == (296.0,)
    # A host's threads are not a device plane: no device time there.
    host = convert.timeline_from_trace(_trace("/host:CPU", "python",
                                              [("jit_tw_candidate(42)", 10.0)]))
    assert device_time.program_times(host, "tw_candidate") is None


@ON_MODULE_LOOP
async def test_profile_runs_the_exported_program_in_the_judge(worker_pool, gelu) -> None:
    from tilewright.kernels.judge.options import ProfileOptions

    found = await worker_pool.profile(gelu, gelu.kernel_path.read_text(), None,
                                      ProfileOptions(route="exported", iters=3))
    assert found["status"] == "ok", found.get("error")
    assert found["route"] == "exported"
    assert found["wall"]["iters"] == 3 and found["timeline"] is not None
    # The judge ran the exported program (kernels in the plain interpreter: pure HLO),
    # not the candidate process's TPU interpreter, whose host callbacks would show.
    assert found["top_ops"] and not any("callback" in op["name"] for op in found["top_ops"])
    assert found["analysis"]["kernels"], "the candidate process's static analysis is kept"


def test_a_candidate_process_that_did_not_start_is_not_the_kernels_fault() -> None:
    from tilewright.kernels.judge.process_failure import FAILURE_HINTS
    from tilewright.kernels.worker.candidate import judge

    tail = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
            f"RuntimeError: {LIBTPU_BUSY}\n").encode()
    said = judge._last_error(tail)
    assert said is not None and said.startswith("RuntimeError: Unable to initialize")
    assert chip.is_busy_message(said)
    assert "Not the kernel" in FAILURE_HINTS["start"]


@pytest.mark.parametrize("name", ["gelu", "matmul_bias_gelu", "causal_attention"])
def test_the_exported_program_reads_as_its_lowering_for_the_integrity_checks(name) -> None:
    """On a TPU host the judge's integrity checks read the program it runs (the one the
    candidate exported for the chip), not the lowering text: both must read alike for an
    honest kernel (its Pallas kernel found, no compute outside it)."""
    import importlib.util

    from jax.extend.core import jaxpr_as_fun

    from tilewright.kernels.tasks.loaders import load_task
    from tilewright.kernels.worker.candidate import production as prod
    from tilewright.kernels.worker.evaluation import integrity
    from tilewright.kernels.worker.tpu import tpu_compile

    task = load_task(name)
    modules = []
    for path in (task.kernel_path, task.reference_path):
        spec = importlib.util.spec_from_file_location(f"tw_{name}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules.append(module)
    kernel, ref = modules
    config = next(c for c in task.shapes if c.size == "small")
    inputs = ref.make_inputs(jax.random.PRNGKey(0), **config.params)
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in inputs]
    with tpu_compile.abstract_device("v5e"):
        closed = jax.jit(kernel.kernel).trace(*avals).jaxpr
        lowered = jax.jit(jaxpr_as_fun(closed)).trace(*avals).lower(
            lowering_platforms=("tpu",)).as_text()
    text = jax.export.deserialize(bytearray(prod.export(closed, avals, "v5e"))).mlir_module()
    outside = integrity.outside_compute(closed, "kernel.py")
    size = max(int(a.size) for a in inputs)
    read = [integrity.check_lowering(t, True, outside, size) for t in (lowered, text)]
    assert [(r.has_pallas, r.contradicted, tuple(r.outside)) for r in read] == \
        [(True, False, ())] * 2


def test_device_time_reads_an_xspace_directly_and_a_host_plane_is_none() -> None:
    from tilewright.kernels.worker.evaluation import timing

    planes = [("/host:CPU", "python", [("jit_tw_candidate(1)", 10.0)]),
              ("/device:TPU:0", "XLA Ops", [("fusion.1", 3.0)]),
              ("/device:TPU:0", "XLA Modules", [("jit_tw_candidate(42)", 204.5),
                                                ("jit_tw_reference(7)", 296.0)])]
    found = device_time.program_times_in_planes(planes, "tw_candidate")
    assert found is not None and found.durations_us == (204.5,)
    assert device_time.program_times_in_planes(planes[:2], "tw_candidate") is None
    # a real trace of this CPU host, read by jax's own reader: host planes, no device one
    import tempfile

    logdir = tempfile.mkdtemp()
    fn = jax.jit(lambda x: x * 2.0)
    x = jnp.ones((64, 128))
    fn(x).block_until_ready()
    traced, why = timing._traced_calls(fn, [(x,)], fn, [(x,)], 3, logdir)
    assert traced is None and "no device plane" in why


def test_a_quiet_fallback_to_the_cpu_on_a_tpu_host_is_named(monkeypatch) -> None:
    """With JAX_PLATFORMS unset, JAX records the TPU's failure and opens the CPU: on a
    host with a chip attached the judge says why instead of judging in the interpreter;
    on a host without one (a laptop with libtpu installed) it is no failure."""
    from jax._src import xla_bridge

    monkeypatch.setitem(xla_bridge._backend_errors, "tpu", LIBTPU_BUSY)
    from tilewright.kernels import confinement

    monkeypatch.setattr(confinement, "chip_attached", lambda: True)
    assert chip.quiet_failure() == LIBTPU_BUSY
    monkeypatch.setattr(confinement, "chip_attached", lambda: False)
    assert chip.quiet_failure() is None


def test_a_baseline_submitted_as_its_kernel_is_split_by_call_order() -> None:
    """The v5e's device plane named all 2n executions of a JAXBench baseline run as its
    own kernel after the candidate's jit (one program, compiled once): the first n are
    the kernel's calls, the last n the reference's."""
    plane = [("/device:TPU:0", "XLA Modules",
              [(f"jit_tw_candidate({i})", float(t)) for i, t in enumerate([9, 1, 2, 3, 4, 5, 6])])]
    kernel = device_time.program_times_in_planes(plane, "tw_candidate")
    ref = device_time.program_times_in_planes(plane, "tw_reference")
    assert ref is None
    k, r = device_time.one_program_twice(kernel, ref, 3)
    assert (k.durations_us, r.durations_us) == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))
    assert device_time.one_program_twice(kernel, None, 4) == (kernel, None)  # too few
    said = device_time.what_planes_hold(plane)
    assert "XLA Modules" in said and "jit_tw_candidate" in said
    assert "no accelerator" in device_time.what_planes_hold(
        [("/host:CPU", "python", [("x", 1.0)])])


@pytest.mark.parametrize("platforms, chip_node", [("tpu", False), ("cpu", True)])
def test_every_process_on_a_tpu_host_leaves_rlimit_nproc_alone(platforms: str,
                                                                chip_node: bool) -> None:
    """On a TPU host libtpu's runtimes start threads no count foresees, and RLIMIT_NPROC
    counts every task of the user: the limit is left as it is by the worker that opens
    the chip (JAX_PLATFORMS=tpu) and by a candidate process pinned to the CPU on a host
    with a chip's device node (on the v5e a candidate could not start a thread in its
    trace under a lowered limit, the judge's threads counted)."""
    code = ("import os, resource, json\n"
            "from tilewright.kernels import confinement\n"
            + ("confinement.chip_attached = lambda: True\n" if chip_node else "")
            + "before = resource.getrlimit(resource.RLIMIT_NPROC)\n"
            "report = confinement._rlimits(12345)\n"
            "print(json.dumps([before == resource.getrlimit(resource.RLIMIT_NPROC), "
            "report.get('nproc_reason', ''), confinement.tpu_host()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "JAX_PLATFORMS": platforms})
    unchanged, reason, tpu = json.loads(out.stdout.strip().splitlines()[-1])
    assert tpu == (platforms == "tpu")
    assert unchanged and reason.startswith("TPU host")


def test_calls_in_flight_are_bounded_by_their_outputs() -> None:
    """Calls issued back to back keep their outputs alive until the wait: a program with
    a 1 GiB output gets two in flight (the v5e ran out of HBM with twenty 256 MiB ones),
    a small one all of them; ``issue`` makes every call."""
    from tilewright.kernels.worker.evaluation import timing

    big = jax.ShapeDtypeStruct((16384, 16384), jnp.float32)  # 1 GiB, never allocated
    assert timing.in_flight(lambda x: x, (big,)) == 2
    small = jnp.ones((8, 128))
    assert timing.in_flight(lambda x: x, (small,)) > 1000
    calls = []
    timing.issue(lambda x: calls.append(1) or x, [(small,)], 7, 3)
    assert len(calls) == 7


def test_a_cpu_worker_reports_no_chip_memory_to_leave_room_for() -> None:
    """The memory watch adds the chip's memory the worker maps (gVisor counts it as
    resident); a CPU host has none to add."""
    from tilewright.kernels.worker.main import _device_memory_mb

    assert _device_memory_mb() == 0


def test_the_production_verdict_on_the_chip_is_its_own_compile(gelu) -> None:
    """On a TPU host the chip's compiler gives the production verdict (no estimator
    compiles: 60-70 s of every evaluation on the v5e); its executable is kept, so timing
    at production compiles nothing more; a refusal is the kernel's compile error with
    the compiler's VMEM figures."""
    from concurrent.futures import Future

    from tilewright.kernels.worker.tpu.production_run import ProductionRun
    from tilewright.kernels.worker.tpu.verdict import production_verdict

    runner = ExportedPrograms("cpu")
    blob = _exported(lambda x: x * 2.0, X)
    run = ProductionRun(gelu, "v5e", None, time.monotonic() + 60, on_chip=runner)
    run.inputs, run.verdict, run.started = [((8, 128), "float32")], Future(), time.perf_counter()
    out = run._chip_compile(blob)
    assert out["verdict"]["compile"] == "ok" and out["verdict"]["by"] == "chip"
    assert "not estimated on a TPU host" in out["unavailable"]
    assert len(runner.compiled) == 1
    program = runner.adopt("tpu_8k", blob, _inputs(), None, 0)
    assert program.compiled is next(iter(runner.compiled.values()))

    class Refusing:
        def compile_only(self, blob, inputs):
            raise RuntimeError("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Ran out of "
                               "memory in memory space vmem. Scoped allocation with size "
                               "18.01M and limit 16.00M exceeded scoped vmem limit by 2.01M")

    run = ProductionRun(gelu, "v5e", None, time.monotonic() + 60, on_chip=Refusing())
    run.inputs, run.verdict, run.started = [((8, 128), "float32")], Future(), time.perf_counter()
    done: Future = Future()
    done.set_result(run._chip_compile(blob))
    run.job = done
    with pytest.raises(Stopped) as stopped:
        production_verdict(run, [], "v5e", None, apply=True)
    section = stopped.value.tpu
    assert stopped.value.status == "compile_error"
    assert section["compile"] == "error" and section["kind"] == "vmem"
    assert section["verdict_by"] == "chip" and section["vmem_bytes"] == int(18.01 * 2**20)


def test_the_chip_verdict_compiles_only_a_program_that_passes_the_judges_checks(gelu) -> None:
    """The production verdict's compile (a thread of the judge, before the timing's
    adopt) checks the program first, as adopt does: one exported for another platform or
    for other inputs is not compiled, and the verdict says why."""
    from concurrent.futures import Future

    from tilewright.kernels.worker.tpu.production_run import ProductionRun

    runner = ExportedPrograms("cpu")
    for blob, inputs in ((_exported(lambda x: x * 2.0, X, platforms=("tpu",)),
                          [((8, 128), "float32")]),
                         (_exported(lambda x: x * 2.0, X), [((4, 128), "float32")])):
        with pytest.raises(Stopped) as stopped:
            runner.compile_only(blob, inputs)
        assert stopped.value.status == "rejected" and not runner.compiled
        run = ProductionRun(gelu, "v5e", None, time.monotonic() + 60, on_chip=runner)
        run.inputs, run.verdict, run.started = inputs, Future(), time.perf_counter()
        verdict = run._chip_compile(blob)["verdict"]
        assert verdict["compile"] == "unavailable"
        assert "not compiled: the exported program" in verdict["message"]
