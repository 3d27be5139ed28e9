"""Command output at 80 columns (issue 35): ``tilewright tasks`` stacks one block per
task instead of cutting names into 7-character table columns, and ``auto``'s progress
lines fit the terminal, abbreviated at word ends, never cut mid-word."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tasks(columns: int) -> str:
    code = "import sys\nfrom tui.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.run([sys.executable, "-c", code, "tasks"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": str(columns),
                               "HOME": str(ROOT), "PYTHONPATH": str(ROOT)})
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
