"""Profiling: chip table and roofline, the Timeline model, xprof conversion (real CPU
traces captured in a worker; the device path on CONSTRUCTED TPU fixtures), reports,
and the CLI's clean stderr. Static pallas_call analysis: tests/test_static_analysis.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tilewright.profiling import SCHEMA, chips
from tilewright.profiling.convert import (
    module_times,
    pallas_share,
    timeline_from_trace,
    top_ops,
)
from tilewright.profiling.timeline import Event, Timeline, Track

ROOT = Path(__file__).resolve().parent.parent
PROFILES = Path(__file__).resolve().parent / "fixtures" / "profiles"
KiB, MiB = 1024, 1024 * 1024


# -- chips and roofline -----------------------------------------------------------------

def test_chip_table_is_complete_and_sane() -> None:
    for key in ("v4", "v5e", "v5p", "v6e", "v7x", "h100", "h200", "cpu"):
        chip = chips.get_chip(key)
        assert chip.bf16_flops > 0 and chip.f32_flops > 0 and chip.hbm_bytes_per_s > 0
        assert 0 < chip.scoped_vmem_bytes <= chip.vmem_bytes
    assert [k for k, c in chips.CHIPS.items() if c.megacore] == ["v4", "v5p", "v7x"]
    assert chips.get_chip("TPU v5 lite").name == "v5e"  # JAX's device_kind for v5e
    with pytest.raises(KeyError, match="choose one of"):
        chips.get_chip("v9z")


def test_roofline_bound_by_hand() -> None:
    v5e = chips.get_chip("v5e")
    # 1 GFLOP bf16 and 1 MiB on v5e: compute 1e9 / 197e12 s = 5.076 us; memory
    # 1048576 / 819e9 s = 1.280 us; the bound is the larger: compute-bound 5.076 us.
    roof = chips.bound(1e9, MiB, v5e, "bf16")
    assert roof["bound_by"] == "compute"
    assert roof["bound_ms"] == pytest.approx(1e9 / 197e12 * 1e3)
    assert roof["memory_bound_ms"] == pytest.approx(MiB / 819e9 * 1e3)
    # A run measured at 10.152 us sits at half of the roofline.
    placed = chips.placement(roof, 2 * roof["bound_ms"])
    assert placed["fraction"] == pytest.approx(0.5)
    assert chips.placement(roof, None)["fraction"] is None


# -- the Timeline model -----------------------------------------------------------------

def _toy_timeline() -> Timeline:
    # One host track: outer [0, 100) holds op a [10, 40) which holds op b [20, 30);
    # op c [50, 60) sits outside a; the measured region is [0, 100).
    track = Track("python", "host_thread", "/host:CPU", [
        Event("outer", 0, 100), Event("a.1", 10, 30, {"hlo_op": "a.1"}),
        Event("b.2", 20, 10, {"hlo_op": "b.2"}), Event("c.3", 50, 10, {"hlo_op": "c.3"}),
        Event("a.4", 120, 5, {"hlo_op": "a.4"}),  # after the region: not counted
    ])
    track.sort()
    return Timeline([track], source="host", measured=(0.0, 100.0))


def test_op_summary_self_time_and_share_by_hand() -> None:
    tl = _toy_timeline()
    rows = {r.name: r for r in tl.op_summary(("host_thread",), is_op=lambda e: "hlo_op" in e.args,
                                             group="family")}
    assert rows["a"].total_us == 30 and rows["a"].self_us == 20 and rows["a"].count == 1
    assert rows["b"].self_us == 10 and rows["c"].self_us == 10
    assert rows["a"].share == pytest.approx(0.2)
    assert tl.event_counts() == {"python": 5}
    assert tl.span == (0, 125)
    assert tl.busy_us(("host_thread",), lambda e: "hlo_op" in e.args) == 40  # [10,40) + [50,60)


def test_chrome_trace_export_reads_back() -> None:
    tl = _toy_timeline()
    exported = json.loads(json.dumps(tl.to_chrome_trace()))
    assert {e["ph"] for e in exported["traceEvents"]} >= {"M", "X"}
    back = timeline_from_trace(exported)
    assert back.event_counts() == {"python": 5}
    assert [e.name for e in back.tracks[0].events][:3] == ["outer", "a.1", "b.2"]
    assert "5 events" in tl.summary()


# -- device path on CONSTRUCTED fixtures ------------------------------------------------

def test_constructed_tpu_trace_device_path() -> None:
    trace = json.loads((PROFILES / "constructed_tpu_v5e.trace.json").read_text())
    tl = timeline_from_trace(trace)
    assert tl.source == "device"
    kinds = {t.name: t.kind for t in tl.tracks}
    assert kinds == {"XLA Ops": "device_ops", "XLA Modules": "device_modules",
                     "python": "host_thread"}
    assert tl.event_counts()["XLA Ops"] == 12 and tl.event_counts()["XLA Modules"] == 3
    assert tl.measured is not None and tl.measured[1] - tl.measured[0] == pytest.approx(300)
    assert tl.meta["iterations"] == 3
    # Per iteration: pallas_call.1 40 us + pallas_call.2 10 us of 62 us device op time.
    share = pallas_share(tl)
    assert share["value"] == pytest.approx(50 / 62)
    assert share["kernels"] == pytest.approx({"pallas_call.1": 0.12, "pallas_call.2": 0.03})
    ops = top_ops(tl)
    assert [o["name"] for o in ops] == ["pallas_call.1", "pallas_call.2", "fusion.3", "copy.1"]
    assert ops[0]["total_ms"] == pytest.approx(0.12) and ops[0]["count"] == 3
    assert ops[0]["share"] == pytest.approx(120 / 300)
    assert module_times(tl)["median_ms"] == pytest.approx(0.07)


def test_constructed_gpu_trace_uses_the_stream_line() -> None:
    trace = json.loads((PROFILES / "constructed_gpu_h100.trace.json").read_text())
    tl = timeline_from_trace(trace)
    assert tl.source == "device"
    assert {t.name: t.kind for t in tl.tracks}["Stream #7(Compute)"] == "device_stream"
    share = pallas_share(tl, ["matmul_kernel"])
    assert share["value"] == pytest.approx(40 / 45) and "stream" in share["basis"]
    assert [o["name"] for o in top_ops(tl)] == ["matmul_kernel", "input_transpose_fusion"]


def test_xprof_converts_the_constructed_xplane_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    from tilewright.profiling.convert import trace_events

    trace, log = trace_events(PROFILES / "constructed_tpu_v5e.xplane.pb")
    expected = json.loads((PROFILES / "constructed_tpu_v5e.trace.json").read_text())
    assert trace["traceEvents"] == expected["traceEvents"]
    captured = capfd.readouterr()
    assert captured.err == ""  # xprof's C++ logging went to our temporary file
    assert isinstance(log, list)


# -- real traces captured on the CPU, in a worker ---------------------------------------

@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_profile_op_captures_a_real_cpu_trace(worker_pool, tmp_path: Path) -> None:
    from tilewright.kernels.tasks.loaders import load_task

    task = load_task("rmsnorm")
    # As the session controller sends it: logdir at the payload's top level.
    payload = {"task": task.to_spec(), "source": task.starting_source(),
               "filename": "kernel.py", "logdir": str(tmp_path / "prof"), "options": {"iters": 2}}
    result = await worker_pool.request("profile", payload, 300)
    assert result["status"] == "ok", result.get("error")
    assert result["schema"] == SCHEMA and result["chip"]["name"] == "v5e"
    run_dir = Path(result["run_dir"])
    assert list(run_dir.glob("*.xplane.pb")) and (run_dir / "perfetto_trace.json.gz").exists()
    assert Path(result["logdir"]) == tmp_path / "prof"
    tl = result["timeline"]
    assert tl["source"] == "host" and tl["tracks"] and tl["span_us"][1] > tl["span_us"][0]
    assert any(t["events"] > 0 for t in tl["tracks"])
    ops = result["top_ops"]
    assert ops and {"name", "total_ms", "self_ms", "count"} <= set(ops[0])
    assert all(o["self_ms"] <= o["total_ms"] + 1e-9 for o in ops)
    (kernel,) = result["analysis"]["kernels"]
    assert kernel["grid"] and kernel["vmem_bytes"] > 0 and kernel["bytes_total"] > 0
    assert result["pallas_share"]["value"] is None and result["pallas_share"]["reason"]
    assert result["roofline"]["bound_ms"] > 0 and result["roofline"]["fraction"] is None
    # Our Chrome-trace export of the captured timeline is valid JSON for Perfetto.
    exported = json.loads(Path(tl["chrome_trace"]).read_text())
    assert any(e["ph"] == "X" for e in exported["traceEvents"])
    assert result["wall"]["iters"] == 2
    assert "kernel rmsnorm_kernel: grid (8,)" in result["digest"]
    # The kernel author's report renders it: kernel, VMEM bar, roofline, ops, raw trace.
    from rich.console import Console

    from tilewright.profiling.report import print_report

    console = Console(record=True, width=120)
    print_report({**result, "task": "rmsnorm", "kernel": "kernel.py"}, console)
    text = console.export_text()
    for needle in ("kernel rmsnorm_kernel", "VMEM", "scoped", "roofline on TPU v5e",
                   "top XLA ops", "raw trace", "xprof --logdir"):
        assert needle in text, needle


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_static_only_profile_runs_nothing(worker_pool) -> None:
    from tilewright.kernels.cli.profile import profile
    from tilewright.kernels.judge.options import ProfileOptions
    from tilewright.kernels.tasks.loaders import load_task

    task = load_task("causal_attention")
    result = await profile(task, task.starting_source(), "kernel.py",
                           ProfileOptions(static_only=True, chip="v5p"),
                           judge=worker_pool)
    assert result["status"] == "ok" and result["chip"]["name"] == "v5p"
    assert result["timeline"] is None and result["logdir"] is None and result["top_ops"] == []
    # Nothing runs, so the analysis is made at the production shape (batch 4, 32 heads,
    # seq 4096: what the numbers that rank are for), from the inputs' shapes.
    assert result["shape"]["name"] == "tpu_llama" and result["shape"]["production"] is True
    (k,) = result["analysis"]["kernels"]
    # 128 (batch x heads) x 32 query blocks x 32 key blocks: q/out blocks (128x128 f32)
    # change with the query block (4,096 fetches); k/v blocks change every step.
    steps = 128 * 32 * 32
    assert [o["fetches"] for o in k["operands"]] == [128 * 32, steps, steps, 128 * 32]
    roof = result["roofline"]
    assert roof["note"] == "static analysis only: nothing was run" and roof["fraction"] is None
    # Estimate: the blocking's bound + every grid step x 0.35 us.
    assert roof["step_overhead_ms"] == pytest.approx(steps * 0.35e-3)
    assert roof["estimate_ms"] == pytest.approx(roof["kernel_bound_ms"] + steps * 0.35e-3)
    assert "phases" in result and "capture_s" not in result["phases"]


PIPELINED_GELU = """
import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _outer(x_hbm, o_hbm):
    def inner(x_ref, o_ref):
        o_ref[...] = jax.nn.gelu(x_ref[...])
    spec = pl.BlockSpec((64, 256), lambda i, j: (i, j))
    pltpu.emit_pipeline(inner, grid=(4, 2), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)


def kernel(x):
    return pl.pallas_call(_outer, in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec(memory_space=pl.ANY),
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
"""


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_emit_pipeline_kernel_profiles_on_a_cpu_host(worker_pool) -> None:
    from tilewright.kernels.cli.profile import profile
    from tilewright.kernels.judge.options import ProfileOptions
    from tilewright.kernels.tasks.loaders import load_task

    result = await profile(load_task("gelu"), PIPELINED_GELU, "pipelined.py",
                           ProfileOptions(iters=1), judge=worker_pool)
    assert result["status"] == "ok", result.get("error")
    (k,) = result["analysis"]["kernels"]
    # Its buffers come from emit_pipeline: 2 x (64, 256) f32 per operand = 2 x 128 KiB.
    assert k["vmem_bytes"] == 256 * KiB
    assert {o["bytes_kind"] for o in k["operands"]} == {"estimate"}
    assert result["top_ops"]


@pytest.mark.slow
def test_cli_profile_json_and_quiet_stderr(tmp_path: Path) -> None:
    # Turn XLA/xprof logging fully on (the worker keeps user values): the C++ lines are
    # written, and still none may reach the CLI process's stderr.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "0",
           "GLOG_minloglevel": "0", "ABSL_MIN_LOG_LEVEL": "0"}
    cmd = [sys.executable, "-m", "tilewright.tui.cli", "profile", "--task", "gelu", "--json",
           "--iters", "2", "--logdir", str(tmp_path / "p"), "--trace-out",
           str(tmp_path / "timeline.json")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema"] == SCHEMA and data["task"] == "gelu"
    (k,) = data["analysis"]["kernels"]
    # gelu's kernel: (64, 256) f32 blocks over a (256, 512) array: grid (4, 2); VMEM
    # 2 x 64 KiB in + 2 x 64 KiB out = 256 KiB; 8 fetches each way = 1 MiB of traffic.
    assert k["grid"] == [4, 2] and k["vmem_bytes"] == 256 * KiB and k["bytes_total"] == MiB
    assert {"grid", "operands", "vmem_bytes", "bytes_total", "flops", "intensity",
            "warnings"} <= set(k)
    assert {"tracks", "span_us"} <= set(data["timeline"]) and data["top_ops"]
    exported = json.loads((tmp_path / "timeline.json").read_text())  # --trace-out
    assert sum(e["ph"] == "X" for e in exported["traceEvents"]) == sum(
        t["events"] for t in data["timeline"]["tracks"])
    # xprof logged C++ lines in the worker (we kept them), and none reached our stderr.
    noisy = ("profiler_session.cc", "UnifiedProfileProcessor", "xplane_to_tools_data")
    assert any(any(n in line for n in noisy) for line in data["xprof_log"])
    assert not any(n in proc.stderr for n in noisy), proc.stderr
    assert proc.stderr.strip() == ""


def test_cli_profile_bad_input(tmp_path: Path) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    base = [sys.executable, "-m", "tilewright.tui.cli", "profile", "--task", "gelu"]
    missing = subprocess.run([*base, "--kernel", str(tmp_path / "nope.py")], cwd=ROOT,
                             capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and "cannot read kernel" in missing.stderr
    chip = subprocess.run([*base, "--chip", "v9z"], cwd=ROOT, capture_output=True, text=True,
                          env=env)
    assert chip.returncode == 2 and "invalid choice" in chip.stderr


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_profile_of_a_broken_candidate_says_why(worker_pool) -> None:
    from tilewright.kernels.cli.profile import profile
    from tilewright.kernels.judge.options import ProfileOptions
    from tilewright.kernels.tasks.loaders import load_task

    task = load_task("gelu")
    result = await profile(task, "def kernel(x):\n    return x +\n", "broken.py",
                           ProfileOptions(), judge=worker_pool)
    assert result["status"] == "error" and result["error"]["kind"] == "syntax"
    assert "line 2" in result["error"]["message"] or result["error"]["line"] == 2



@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_a_tampering_candidate_gets_its_candidate_process_recycled(worker_pool) -> None:
    # Profiling runs the candidate in the judge's candidate process, never in the judge:
    # a candidate that patches numpy is refused there and that process replaced; the
    # judge (the worker) stays.
    from tilewright.kernels.cli.profile import profile
    from tilewright.kernels.judge.options import ProfileOptions
    from tilewright.kernels.tasks.loaders import load_task

    task = load_task("gelu")
    await worker_pool.request("hello", {})
    judges = list(worker_pool.pids)
    source = (Path(__file__).parent / "fixtures" / "candidates" / "patches_numpy.py").read_text()
    judge = worker_pool
    result = await profile(task, source, "patch.py", ProfileOptions(static_only=True),
                           judge=judge)
    assert result["status"] == "error" and result["error"]["kind"] == "harness_tampering"
    assert "numpy.abs" in result["error"]["message"]
    clean = await profile(task, task.starting_source(), "kernel.py",
                          ProfileOptions(static_only=True), judge=judge)
    assert clean["status"] == "ok" and clean["analysis"]["kernels"]
    assert worker_pool.pids == judges


def test_report_and_digest_of_a_device_profile() -> None:
    from rich.console import Console

    from tilewright.profiling.digest import digest
    from tilewright.profiling.report import print_report

    trace = json.loads((PROFILES / "constructed_tpu_v5e.trace.json").read_text())
    tl = timeline_from_trace(trace)
    v5e = chips.get_chip("v5e")
    per = module_times(tl)
    roof = chips.placement(chips.bound(2 * 256 * 512 * 384, 832 * KiB, v5e), per["median_ms"])
    profile = {"schema": SCHEMA, "status": "ok", "task": "constructed", "kernel": "k.py",
               "backend": {"platform": "tpu", "mode": "native", "device_kind": "TPU v5 lite"},
               "chip": v5e.to_json(), "analysis": {"kernels": []}, "roofline": roof,
               "timeline": tl.to_json(), "top_ops": top_ops(tl), "pallas_share": pallas_share(tl),
               "per_iteration": per, "logdir": "/tmp/run"}
    console = Console(record=True, width=120)
    print_report(profile, console)
    text = console.export_text()
    assert "run on TPU v5 lite" in text and "top device ops" in text
    assert "Pallas share: 80.6%" in text and "70.00 us median over 3" in text
    # 832 KiB / 819 GB/s = 1.04 us against 70 us measured: 1.5% of the roofline.
    assert "1.5% of roofline" in text
    lines = digest(profile).splitlines()
    assert lines[0] == "analyzed for TPU v5e; ran on tpu (native)"
    assert any(line.startswith("Pallas share: 81%") for line in lines)
