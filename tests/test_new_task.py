"""``tilewright new``: from a function in the user's own module, and from a JAXBench task,
to a native task that ``tilewright tasks`` validates and ``eval`` runs (real
subprocesses and workers; small check shapes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tilewright.kernels.tasks import new as nt

ROOT = Path(__file__).resolve().parent.parent
USER = ROOT / "tests" / "fixtures" / "user_code"
TASKS = ROOT / "tests" / "fixtures" / "tasks"
LN_SHAPES = ["--shape", "x=f32[4096,1024]", "--shape", "res=f32[4096,1024]",
             "--shape", "gamma=f32[1024]", "--shape", "beta=f32[1024]"]


def tw(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TILEWRIGHT_CONFIG="/nonexistent/config.toml")
    return subprocess.run([sys.executable, "-m", "tilewright.tui.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# -- shapes and check sizes (no worker) ------------------------------------------------------

def test_equal_sizes_are_one_dimension_and_names_keep_them_apart() -> None:
    shapes = nt.parse_shapes(["x=f32[4096,1024]", "w=f32[1024]"])
    assert shapes.dims == {"x_0": 4096, "x_1": 1024}
    assert [s.dims for s in shapes.inputs] == [["x_0", "x_1"], ["x_1"]]
    named = nt.parse_shapes(["a=bf16[m=4096,k=4096]", "b=bf16[k,n=512]", "ids=i32[m]:0..n"])
    assert named.dims == {"m": 4096, "k": 4096, "n": 512}
    assert named.inputs[2].high == "n" and named.inputs[0].dtype == "bfloat16"
    with pytest.raises(nt.NewTaskError, match="could be any of m, k"):
        nt.parse_shapes(["a=f32[m=64,k=64]", "b=f32[64]"])
    with pytest.raises(nt.NewTaskError, match="unknown dtype"):
        nt.parse_shapes(["x=float7[8]"])
    with pytest.raises(nt.NewTaskError, match="never given a value"):
        nt.parse_shapes(["x=f32[rows]"])


def test_check_sizes_shrink_the_largest_input_and_keep_alignment() -> None:
    square = nt.parse_shapes(["x=f32[4096,8192]", "w=f32[8192,8192]"])
    check = nt.derive_check(square)
    assert all(v % 128 == 0 for v in check.values())
    assert max(check["x_0"] * check["x_1"], check["x_1"] ** 2) <= nt.CHECK_ELEMENTS
    # w's rows are its columns (one size): no long-row check shape fits the budget
    assert [c for c, _, _ in nt.plan_task("t", square).configs()] == [
        "production", "check", "held_out"]
    shapes = nt.parse_shapes(["x=f32[4096,8192]", "w=f32[8192]"])
    plan = nt.plan_task("t", shapes)
    names = [c for c, _, _ in plan.configs()]
    assert names == ["production", "check", "check_long", "held_out"]
    long = plan.configs()[2][1]
    assert long["x_1"] == 2048 and long["x_0"] * long["x_1"] <= nt.CHECK_ELEMENTS
    production = plan.configs()[0]
    assert production[1] == {"x_0": 4096, "x_1": 8192}
    assert production[2] == {"production": True, "size": "large"}
    small = nt.plan_task("t", nt.parse_shapes(["x=f32[64,256]"]))
    assert small.configs()[0] == ("production", {"x_0": 64, "x_1": 256}, {"production": True})


def test_usage_errors_say_what_to_do(tmp_path: Path) -> None:
    proc = tw("new", "--from", f"{USER / 'model.py'}:fused_ln", "--shape", "x=f32[8,128]",
              "-o", str(tmp_path / "t"), "--no-check")
    assert proc.returncode == 2
    assert "needs res, gamma, beta" in proc.stderr and "--shape res=f32[...]" in proc.stderr
    proc = tw("new", "--from", f"{USER / 'model.py'}:nope", "--no-check")
    assert proc.returncode == 2 and "defines no top-level function 'nope'" in proc.stderr
    assert "fused_ln" in proc.stderr  # the functions it does define


# -- end to end --------------------------------------------------------------------------------

def test_new_from_a_function_then_tasks_validates_and_eval_runs(tmp_path: Path) -> None:
    user = tmp_path / "user"
    shutil.copytree(USER, user)
    proc = tw("new", f"{user / 'model.py'}:fused_ln", *LN_SHAPES, "--arg", "eps=1e-6",
              "--kernel", f"{user / 'ln_kernel.py'}:fused_ln_pallas", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    task = tmp_path / "fused_ln"
    assert "checked: a worker built the inputs and traced the reference" in proc.stdout
    assert "reference -> f32[4096,1024]" in proc.stdout
    config = tomllib.loads((task / "task.toml").read_text())
    assert config["shapes"]["production"] == {"x_0": 4096, "x_1": 1024, "production": True,
                                              "size": "large"}
    assert config["shapes"]["check"]["x_0"] * config["shapes"]["check"]["x_1"] <= nt.CHECK_ELEMENTS
    copied = (task / "model.py").read_text()
    assert "def fused_ln" in copied and "_center" in copied and "torch" not in copied
    assert "eps=1e-06" in (task / "reference.py").read_text()

    listed = tw("tasks", str(task), "--no-bundled", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["tasks"]
    assert [r["name"] for r in rows] == ["fused_ln"] and not rows[0]["error"]

    result = tw("eval", "--task", str(task), "--json", "--no-timing")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["status"] == "correct"
    ran = {s["name"] for s in data["extra"]["shapes"]}
    assert "check" in ran and "production" not in ran  # large: not run in interpret mode


def test_new_from_example_inputs(tmp_path: Path) -> None:
    proc = tw("new", "ln", "--from", f"{USER / 'model.py'}:fused_ln", "--example",
              f"{USER / 'model.py'}:example_inputs", "-o", str(tmp_path / "ln"), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["inputs"] == ["x f32[x_0,x_1]", "res f32[x_0,x_1]", "gamma f32[x_1]",
                                 "beta f32[x_1]"]
    production = summary["configs"][0]
    assert production["sizes"] == {"x_0": 2048, "x_1": 1024} and summary["check"]["ok"]


def test_new_from_a_jaxbench_task_converts_to_native(tmp_path: Path) -> None:
    bench = tmp_path / "bench" / "scaled_tanh"
    shutil.copytree(TASKS / "jaxbench_scaled_tanh", bench)
    kernel = tmp_path / "tanh_kernel.py"
    kernel.write_text((USER / "scale_kernel.py").read_text().replace(
        "jnp.tanh(x_ref[...]) * 2.0 + b_ref[...]", "jnp.tanh(x_ref[...]) * b_ref[...]")
        .replace("b.reshape(1, n)", "b"))
    proc = tw("new", "tanh", "--from", str(bench), "--kernel", f"{kernel}:scale_add",
              cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    task = tmp_path / "tanh"
    config = tomllib.loads((task / "task.toml").read_text())
    assert config["shapes"]["production"]["size"] == "large"
    assert config["shapes"]["check"] == {"variant": "check", "index": 0}
    assert "CONFIG['rows'] = " in (task / "bench_check.py").read_text()
    result = tw("eval", "--task", str(task), "--json", "--no-timing")
    assert result.returncode == 0, result.stderr + result.stdout
    assert json.loads(result.stdout)["status"] == "correct"


def test_a_users_block_tuple_kernel_is_tuned_by_the_offline_agent(tmp_path: Path) -> None:
    """`BLOCK = (128, 512)` in the user's own kernel: the offline agent declares the two
    sizes as TUNABLES, then tunes them; autonomous mode does not end `agent_failed`."""
    made = tw("new", "sa", "--from", f"{USER / 'model.py'}:scale_add",
              "--shape", "x=f32[1024,2048]", "--shape", "b=f32[2048]",
              "--kernel", f"{USER / 'scale_kernel.py'}:scale_add", "-o", str(tmp_path / "sa"),
              "--no-check")
    assert made.returncode == 0, made.stderr
    env_dir = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, "-m", "tilewright.tui.cli", "auto", "--task", str(tmp_path / "sa"), "--agent",
         "offline", "--budget", "3", "--time-budget", "0.2", "--json"], cwd=ROOT,
        env=dict(os.environ, JAX_PLATFORMS="cpu", TILEWRIGHT_DATA_DIR=str(env_dir),
                 TILEWRIGHT_CONFIG="/nonexistent/config.toml"),
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["stop_reason"] != "agent_failed", proc.stderr
    versions = summary["versions"]
    assert versions[1]["summary"] == "declare the kernel's block sizes as TUNABLES"
    assert versions[1]["status"] == "correct"
    tuned = [v for v in versions if v["origin"] == "tuning"]
    # A tuning whose blocks overflow VMEM at the production shape (1024x2048) is a
    # compile error there, never ranked; the others are correct.
    assert tuned and any(v["status"] == "correct" for v in tuned), versions
    assert all(v["status"] in ("correct", "compile_error") for v in tuned), versions
    assert versions[summary["best_version"] - 1]["status"] == "correct"
    assert any("BLOCK_ROWS" in v["summary"] or "BLOCK_COLS" in v["summary"] for v in tuned)


def test_every_axis_of_an_input_gets_a_size_name_of_its_own() -> None:
    split = nt.parse_shapes(["x=bf16[4096,4096]", "res=bf16[4096,4096]", "g=bf16[4096]"],
                            split=True)
    assert [s.dims for s in split.inputs] == [["x_0", "x_1"], ["x_0", "x_1"], ["x_1"]]
    assert split.dims == {"x_0": 4096, "x_1": 4096}
    check = nt.derive_check(split)
    assert check["x_0"] != check["x_1"]  # non-square: a row/column mix-up shows
    shared = nt.parse_shapes(["x=bf16[4096,4096]", "g=bf16[4096]"])
    assert [s.dims for s in shared.inputs] == [["x_0", "x_0"], ["x_0"]]


def test_new_splits_square_sizes_unless_the_reference_needs_them_equal(tmp_path) -> None:
    (tmp_path / "m.py").write_text(
        "def ln(x, res, g):\n    h = x + res\n    return (h - h.mean(-1, keepdims=True)) * g\n\n"
        "def mm(x, y):\n    return x @ y\n")
    ln = tw("new", "ln", "--from", "m.py:ln", "--shape", "x=bf16[1024,1024]", "--shape",
            "res=bf16[1024,1024]", "--shape", "g=bf16[1024]", "--json", cwd=tmp_path)
    assert ln.returncode == 0, ln.stdout + ln.stderr
    summary = json.loads(ln.stdout)
    assert summary["inputs"][0] == "x bf16[x_0,x_1]" and summary["check"]["ok"]
    mm = tw("new", "mm", "--from", "m.py:mm", "--shape", "x=bf16[1024,1024]", "--shape",
            "y=bf16[1024,1024]", "--json", cwd=tmp_path)
    assert mm.returncode == 0, mm.stdout + mm.stderr
    summary = json.loads(mm.stdout)
    assert summary["inputs"] == ["x bf16[x_0,x_0]", "y bf16[x_0,x_0]"] and summary["check"]["ok"]
    assert any("share one name" in note for note in summary["notes"])
