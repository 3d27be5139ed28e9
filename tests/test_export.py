"""``tilewright export``: a version of a session as a module for the user's code, with the
template's plumbing taken out (each simplification judged correct again) and a pytest
file that checks it against the reference; ``report -o x.py`` points at it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tilewright import agents
from tilewright.agents.offline import templates
from tilewright.kernels.tasks.loaders import load_task
from tilewright.sessions.recorded.export import PLUMBING, rename, simplify

ROOT = Path(__file__).resolve().parent.parent
USER = ROOT / "tests" / "fixtures" / "user_code"


def tw(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None,
       timeout: float = 600) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, JAX_PLATFORMS="cpu", TILEWRIGHT_CONFIG="/nonexistent/config.toml",
                **(env or {}))
    full.pop("ANTHROPIC_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "tilewright.tui.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)


def test_the_templates_plumbing_comes_out_and_the_rest_stays() -> None:
    brief = agents.brief(load_task("softmax"))
    source, _ = templates.write_template(brief, "rowwise")
    out = simplify(source, PLUMBING)
    assert out is not None
    for name in PLUMBING:
        assert name not in out
    assert "static" not in out.replace("static_argnums", "")
    assert "@jax.jit\ndef _row_blocks(*arrays):" in out and "jax.eval_shape(_reference_math" in out
    compile(out, "exported.py", "exec")
    kept = simplify(source, ("_widen",))
    assert kept is not None and "_merge" in kept and "_widen" not in kept
    user_kernel = (USER / "ln_kernel.py").read_text()
    assert simplify(user_kernel, PLUMBING) is None  # a user's own kernel is left alone


def test_rename_touches_names_not_attributes_or_keywords() -> None:
    text = "def f(x):\n    return g(f=1) + m.f + f(x)\n"
    assert rename(text, "f", "_f") == "def _f(x):\n    return g(f=1) + m.f + _f(x)\n"


def test_export_best_and_a_version_then_eval_and_the_test_file_pass(tmp_path: Path) -> None:
    data = {"TILEWRIGHT_DATA_DIR": str(tmp_path / "data")}
    made = tw("new", "ln", "--from", f"{USER / 'model.py'}:fused_ln",
              "--shape", "x=f32[256,512]", "--shape", "res=f32[256,512]",
              "--shape", "gamma=f32[512]", "--shape", "beta=f32[512]",
              "-o", str(tmp_path / "ln"), "--no-check", env=data)
    assert made.returncode == 0, made.stderr
    task = tmp_path / "ln"
    auto = tw("auto", "--task", str(task), "--agent", "offline", "--budget", "2",
              "--time-budget", "0.2", "--json", env=data)
    assert auto.returncode == 0, auto.stderr
    summary = json.loads(auto.stdout)
    session = summary["session_id"]
    assert summary["best_words"].startswith(("est. ", "≥")) and summary["current_version"] == \
        summary["best_version"]  # autonomous mode lands on the best version

    out = tmp_path / "out"
    exported = tw("export", session, "best", "-o", str(out / "ln_kernel.py"), "--test",
                  env=data)
    assert exported.returncode == 0, exported.stderr
    assert "judged correct again" in exported.stdout
    module = (out / "ln_kernel.py").read_text()
    assert f"tilewright session {session}" in module
    assert "# Number: est. " in module or "# Number: ≥" in module
    # the compiler's cycles and the time they make, side by side
    assert re.search(r"^# Kernel: [\d,]+ cycles = [\d.]+ (ms|us) at ", module, re.M), module[:900]
    assert "_split_static" not in module and "_merge" not in module
    assert "from model import" not in module  # the user's math is inlined: no cycle
    assert module.rstrip().endswith("fused_ln = kernel")

    judged = tw("eval", "--task", str(task), "--kernel", str(out / "ln_kernel.py"), "--json",
                "--no-timing", env=data)
    assert judged.returncode == 0, judged.stderr
    assert json.loads(judged.stdout)["status"] == "correct"
    # The test imports the user's module by name, as it would in their project.
    tested = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(out / "test_ln_kernel.py")], cwd=out,
                            env=dict(os.environ, JAX_PLATFORMS="cpu",
                                     PYTHONPATH=f"{out}{os.pathsep}{USER}"),
                            capture_output=True, text=True, timeout=600)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert " passed" in tested.stdout

    first = tw("export", session, "--version", "1", "-o", str(out / "ln_v1.py"),
               "--no-verify", env=data)
    assert first.returncode == 0, first.stderr
    assert f"v1 of tilewright session {session}" in (out / "ln_v1.py").read_text()
    again = tw("export", session, "v1", "-o", str(out / "ln_v1.py"), "--no-verify", env=data)
    assert again.returncode == 2 and "--force" in again.stderr

    report = tw("report", session, "-o", str(out / "best.py"), env=data)
    assert report.returncode == 2 and "tilewright export" in report.stderr
    html = tw("report", session, "-o", str(out / "report.html"), env=data)
    assert html.returncode == 0, html.stderr
    page = (out / "report.html").read_text()
    assert "<th>gain vs parent</th>" in page and "|---|" not in page  # a table, not Markdown


def test_the_export_header_says_which_floor_ranks_and_its_arithmetic_adds_up(tmp_path) -> None:
    """A kernel and a reference both at their memory floor (a memory-bound program):
    the header names the reference's floor beside its estimate, and the division."""
    from tilewright.kernels.judge.rank import Rank
    from tilewright.sessions.log import SessionLog, load
    from tilewright.sessions.recorded.export import header
    from tilewright.sessions.state import fold

    rank = Rank("tpu_estimate", 1.0, "v5e", "4096x4096", kernel_s=0.0615e-3,
                kernel_cycles=57_900, clock_hz=1.5e9, reference_s=0.0386e-3,
                basis="memory_floor", status="correct")
    log = SessionLog.create(tmp_path, task={"name": "toy", "root": "/nowhere",
                                            "layout": "native"},
                            backend={"platform": "cpu", "mode": "tpu-interpret",
                                     "label": "CPU (TPU interpret)"},
                            agent="offline", app_version="test")
    log.append("kernel.version", version=1, parent=None, origin="initial", proposal=None,
               source_blob=log.put_blob("def kernel(x):\n    return x\n"), summary="v1",
               decision=None)
    log.append("run.start", run="r1", version=1, kind="eval", by="user")
    log.append("run.result", run="r1", version=1, status="correct", correct=True,
               rank=rank.to_json(), chip="v5e", median_ms=1.0, result_blob=None,
               cancelled=False)
    log.close()
    loaded = load(log.path)
    text = header(loaded, fold(loaded.header, loaded.events), 1, None, None)
    line = next(ln for ln in text.splitlines() if ln.startswith("# Kernel:"))
    assert "the XLA reference's estimate 0.0386 ms (its memory floor, 0.0615 ms, ranks it)" \
        in line
    assert "0.0615 ms / 0.0615 ms = 1.00x" in line
