"""Command output at 80 columns: ``tilewright tasks`` stacks one block per
task instead of cutting names into 7-character table columns, and ``auto``'s progress
lines fit the terminal, abbreviated at word ends, never cut mid-word."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import environments

ROOT = Path(__file__).resolve().parent.parent


def _tasks(columns: int) -> str:
    code = "import sys\nfrom tilewright.tui.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.run([sys.executable, "-c", code, "tasks"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=environments.bare(COLUMNS=str(columns), PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_tasks_at_80_columns_stack_whole_words() -> None:
    out = _tasks(80)
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    # Every task's name whole, at the start of its block; shapes never cut.
    for name in ("causal_attention", "gelu", "matmul_bias_gelu", "rmsnorm", "softmax"):
        assert any(line.startswith(f"{name}  (native, ") for line in lines), name
    assert "f32[4,32,4096,128]" in out and "path        kernels/bundled/gelu" in out
    assert "┃" not in out  # no table


def test_tasks_on_a_wide_terminal_keep_the_table() -> None:
    out = _tasks(200)
    assert "┃ name" in out and "causal_attention" in out


def test_auto_progress_lines_fit_the_width_at_word_ends() -> None:
    from tilewright.sessions.cli.headless import abbreviate, step_lines

    summary = ("tune BLOCK_ROWS 256 -> 512, BLOCK_COLS 512 -> 2048 on v3 (largest legal "
               "blocks that fit VMEM, from the diagnosis)")
    for width in (80, 100, 60, 40):
        lines = step_lines(width, 12, 13, summary, "correct", "est. 4.00x",
                           "est. 4.00x (v13)", 123456, 812.3)
        assert all(len(line) <= width for line in lines), (width, lines)
        shown = lines[0].split("v13 ", 1)[1].strip()
        words = shown.split("  ")[0].removesuffix("…").split()
        # every word shown is a whole word of the summary
        assert words and all(w in summary.split() for w in words), (width, shown)
        assert "est. 4.00x" in "\n".join(lines)
    assert abbreviate("one two three", 9) == "one two…"
    assert abbreviate("unbreakable", 4) == "unbreakable…"  # never cut inside a word


def test_sessions_with_no_steps_are_not_listed_as_text(tmp_path: Path, capsys) -> None:
    import json

    from tilewright.sessions.log import SessionLog
    from tilewright.tui.cli import main

    log = SessionLog.create(tmp_path, task={"name": "gelu", "root": str(ROOT), "layout": "native"},
                            backend=None, agent="offline", app_version="test")
    log.close()
    assert main(["sessions", "--session-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert log.path.name not in out and "1 with no steps; --json lists them" in out
    assert main(["sessions", "--session-dir", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [log.path.name] and rows[0]["steps"] == 0
