"""The sessions CLI as a user runs it: real ``tilewright`` subprocesses, the offline
agent, real workers on the bundled gelu task (one trial, short timing).

Covers ``auto`` (progress lines, --json summary, Ctrl-C), ``sessions``, ``report``
(Markdown and HTML), ``replay --headless`` and ``--verify`` (including a tampered
session that must fail), and a kill -9 of ``tilewright auto`` in the middle of a run
followed by ``--resume``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import until_now

from tilewright.kernels.confinement import descendants
from tilewright.sessions.log import load
from tilewright.sessions.state import fold

ROOT = Path(__file__).resolve().parent.parent
# One trial, short timing, every shape shrunk to 64x256 (recorded in the header).
FAST = ["--trials", "1", "--time-budget", "0.2", "--set", "rows=64", "--set", "cols=256"]


def _env() -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TILEWRIGHT_CONFIG="/nonexistent/config.toml")
    env.pop("ANTHROPIC_API_KEY", None)
    # pytest-xdist's workers set COLUMNS=80; these runs write to pipes, read line by line
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    return env


def tw(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tilewright.tui.cli", *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tilewright.tui.cli", *args], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def events(session: Path) -> list[dict]:
    """The session's events so far; none while its log is being created (the file can
    exist a moment before its header is written)."""
    path = session / "events.jsonl"
    if not path.exists() or not path.stat().st_size:
        return []
    return load(session).events


def wait_for(predicate, timeout: float = 240.0) -> None:
    until_now(predicate, "the session's events", timeout)


def only_session(base: Path) -> Path:
    dirs = [p for p in base.iterdir() if (p / "events.jsonl").exists()] if base.exists() else []
    return dirs[0] if len(dirs) == 1 else Path("/nonexistent")


def worker_pids(parent: int) -> list[int]:
    """Worker processes below ``parent``: forks of its zygote (named ``tw-worker``) or
    started as ``python -m tilewright.kernels.worker.main``."""
    found = []
    for pid in descendants(parent):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if comm == "tw-worker" or b"tilewright.kernels.worker.main" in cmd:
            found.append(pid)
    return found


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One headless autonomous run (budget 2) shared by the read-only tests."""
    base = tmp_path_factory.mktemp("sessions")
    proc = tw("auto", "--task", "gelu", "--agent", "offline", "--budget", "2",
              "--session-dir", str(base), "--json", "--timeout", "333", *FAST)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    session = Path(summary["session"])
    assert summary["schema"] == "tilewright.auto/1" and session.parent == base
    assert summary["iterations"] == 2 and summary["stop_reason"] == "budget:iterations"
    assert summary["best_status"] == "correct" and summary["best_rank"]["value"] > 0
    # what the best is, in the rank's words: the TPU compiler's figure, never host time
    assert summary["best_rank"]["source"] in ("tpu_estimate", "roofline")
    assert summary["best_words"].startswith(("est. ", "≥"))
    assert summary["best_version"] in (1, 2, 3)
    # one progress line per evaluation (baseline + 2), on stderr with --json
    steps = [line for line in proc.stderr.splitlines() if line.startswith("[")]
    assert len(steps) == 3 and "v3" in steps[-1] and "correct" in steps[-1]
    return session


def test_auto_writes_a_complete_session(finished: Path) -> None:
    loaded = load(finished)
    assert loaded.header["task"]["name"] == "gelu" and loaded.header["task"]["overrides"] == {"rows": "64", "cols": "256"}
    assert loaded.header["backend"]["mode"] == "tpu-interpret"
    assert loaded.header["eval_options"]["timeout_s"] == 333  # auto --timeout
    state = fold(loaded.header, loaded.events)
    assert state.ended == "completed"
    assert [d.by for d in state.decisions] == ["auto", "auto"]
    kinds = [e["type"] for e in loaded.events]
    # Autonomous mode ends on the best version (a checkout when the last one tried is not).
    ending = ["auto.stop", "mode.change", "session.end"] if state.current == state.best \
        and kinds[-2] != "kernel.checkout" else \
        ["auto.stop", "mode.change", "kernel.checkout", "session.end"]
    assert kinds[-len(ending):] == ending
    assert state.current == state.best


def test_sessions_lists_it(finished: Path) -> None:
    proc = tw("sessions", "--session-dir", str(finished.parent))
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith(finished.name))
    assert "gelu" in line and "completed" in line and "x v" in line
    as_json = json.loads(tw("sessions", "--session-dir", str(finished.parent),
                            "--json").stdout)
    # two approved proposals and three evaluations (the starting kernel and both versions)
    assert as_json[0]["id"] == finished.name and as_json[0]["steps"] == 5
    assert as_json[0]["evaluations"] == 3 and as_json[0]["versions"] == 3


def test_report_markdown_and_html(finished: Path, tmp_path: Path) -> None:
    md = tmp_path / "r.md"
    assert tw("report", str(finished), "-o", str(md)).returncode == 0
    text = md.read_text()
    assert "## Decisions" in text and "| approve | auto |" in text
    assert "## Best rank per evaluation" in text and "| 3 | v3 |" in text
    assert "## Final kernel" in text and "TPU interpret mode" in text
    html = tmp_path / "r.html"
    assert tw("report", finished.name, "--session-dir", str(finished.parent),
              "-o", str(html)).returncode == 0
    page = html.read_text()
    # a dot per evaluation (each titled with its rank), besides the legend's
    assert "<svg" in page and page.count("</title></circle>") == 3 and "<path d=\"M" in page
    bad = tw("report", str(finished), "-o", str(tmp_path / "r.pdf"))
    assert bad.returncode == 2 and "unknown format" in bad.stderr


def test_replay_headless_prints_the_fold(finished: Path) -> None:
    proc = tw("replay", finished.name, "--session-dir", str(finished.parent), "--headless")
    assert proc.returncode == 0, proc.stderr
    assert "kernel.version" in proc.stdout and "3 versions, 3 evaluations" in proc.stdout
    missing = tw("replay", "no-such-session", "--session-dir", str(finished.parent),
                 "--headless")
    assert missing.returncode == 2 and "no session 'no-such-session'" in missing.stderr


def test_replay_verify_reproduces_and_catches_a_tampered_session(finished: Path,
                                                                 tmp_path: Path) -> None:
    proc = tw("replay", str(finished), "--headless", "--verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verify: 3/3 versions agree" in proc.stdout

    tampered = tmp_path / finished.name
    shutil.copytree(finished, tampered)
    path = tampered / "events.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if '"type":"run.result"' in line and '"version":1,' in line:
            lines[i] = line.replace('"status":"correct","correct":true',
                                    '"status":"incorrect","correct":false')
    path.write_text("".join(lines))
    proc = tw("replay", str(tampered), "--headless", "--verify", "--json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c["ok"] for c in report["checks"]] == [False, True, True], proc.stdout[-3000:]
    assert report["checks"][0]["recorded_status"] == "incorrect"


def test_auto_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    proc = tw("auto", "--task", str(tmp_path), "--session-dir", str(tmp_path))
    assert proc.returncode == 2 and "not a task directory" in proc.stderr
    proc = tw("auto", "--session-dir", str(tmp_path))
    assert proc.returncode == 2 and "--task" in proc.stderr
    proc = tw("auto", "--task", "gelu", "--set", "rows", "--session-dir", str(tmp_path))
    assert proc.returncode == 2 and "KEY=VALUE" in proc.stderr
    proc = tw("auto", "--task", "gelu", "--agent", "anthropic", "--session-dir", str(tmp_path))
    assert proc.returncode == 2 and "ANTHROPIC_API_KEY" in proc.stderr
    assert "--agent offline" in proc.stderr and not list(tmp_path.iterdir())


def test_auto_refuses_a_broken_task_before_spending_anything(tmp_path: Path) -> None:
    """A task whose reference raises would fail every candidate alike: ``auto`` says so
    and where to fix it (exit 2) before a session, a worker or an agent call is spent."""
    task = tmp_path / "broken"
    shutil.copytree(Path(__file__).parent / "fixtures" / "tasks" / "native_axpy", task)
    reference = task / "reference.py"
    reference.write_text(reference.read_text().replace(
        "    return 2.0 * x + y", "    raise ValueError('this reference is broken')"))
    proc = tw("auto", "--task", str(task), "--agent", "offline", "--budget", "5",
              "--session-dir", str(tmp_path / "sessions"), "--json", "--trials", "1",
              "--time-budget", "0.2")
    assert proc.returncode == 2, proc.stderr
    assert "this reference is broken" in proc.stderr
    assert f"{reference}:" in proc.stderr and "not a kernel" in proc.stderr
    assert not any((tmp_path / "sessions").glob("*/events.jsonl"))


def test_ctrl_c_stops_cleanly_with_the_session_saved(tmp_path: Path) -> None:
    proc = start("auto", "--task", "gelu", "--agent", "offline", "--budget", "50",
                 "--session-dir", str(tmp_path), *FAST)
    try:
        wait_for(lambda: any(e["type"] == "run.result"
                             for e in events(only_session(tmp_path))))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in out and "session:" in out
    state = fold(*(lambda s: (s.header, s.events))(load(only_session(tmp_path))))
    assert state.ended == "interrupted" and state.active_run is None
    assert state.auto_stops[-1]["reason"] == "user" and state.mode == "step"


def test_kill_9_mid_run_then_resume(tmp_path: Path) -> None:
    proc = start("auto", "--task", "gelu", "--agent", "offline", "--budget", "50",
                 "--session-dir", str(tmp_path), *FAST)
    try:
        # Kill while the second version is being evaluated.
        wait_for(lambda: any(e["type"] == "run.start" and e["version"] == 2
                             for e in events(only_session(tmp_path))))
        workers = worker_pids(proc.pid)
        assert workers
        started = descendants(proc.pid)  # the workers, the zygotes and their children
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    # Workers (and every process the app started) do not outlive the app.
    def ours(pid: int) -> bool:
        try:
            return b"tilewright" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    wait_for(lambda: not any(ours(pid) for pid in started), timeout=30)
    session = only_session(tmp_path)
    loaded = load(session)
    assert not loaded.warnings or loaded.torn_tail
    before = fold(loaded.header, loaded.events)
    assert before.ended is None and before.active_run is not None
    assert before.active_run.version == 2

    resumed = tw("auto", "--resume", session.name, "--session-dir", str(tmp_path),
                 "--budget", "1", "--json")
    assert resumed.returncode == 0, resumed.stderr
    after_loaded = load(session)
    assert not after_loaded.warnings
    after = fold(after_loaded.header, after_loaded.events)
    new = after_loaded.events[len(loaded.events):]
    assert new[0]["type"] == "marker" and new[0]["label"] == "resumed"
    assert new[1]["type"] == "run.result" and new[1]["interrupted"] and new[1]["version"] == 2
    # The interrupted version is measured again, then one more iteration (budget 1).
    assert after.versions[2].status == "correct"
    assert max(after.versions) == 3 and after.ended == "completed"
    assert [e["seq"] for e in after_loaded.events] == \
        list(range(1, len(after_loaded.events) + 1))


def test_printed_commands_run_as_printed(tmp_path, monkeypatch) -> None:
    """``./dev start`` runs .venv/bin/tilewright, which is not on PATH: the commands
    printed after a session name the program as it was started; export is offered only
    when a correct version exists."""
    import sys

    from tilewright.sessions.cli.invocation import invocation
    from tilewright.tui.app import quit_lines

    exe = tmp_path / ".venv" / "bin" / "tilewright"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(exe)])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert invocation() == str(exe)
    said = quit_lines(tmp_path / "s1", "fused ln", has_best=False)
    assert f"resume: {exe} --resume s1" in said
    assert "no correct version yet" in said and "export s1 best" not in said
    monkeypatch.setenv("PATH", str(exe.parent))
    assert invocation() == "tilewright"  # on PATH (an activated venv): its plain name
    assert "export: tilewright export s1 best -o fused_ln_kernel.py --test" in quit_lines(
        tmp_path / "s1", "fused ln")
