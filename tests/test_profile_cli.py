"""``tilewright profile`` keeps the trace: in the directory given, else under the user
data dir, says where, and every path in its JSON exists after the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMALL = ("--set", "rows=64", "--set", "cols=256", "--iters", "1")


def _paths(value, found=None):
    found = [] if found is None else found
    if isinstance(value, dict):
        for v in value.values():
            _paths(v, found)
    elif isinstance(value, list):
        for v in value:
            _paths(v, found)
    elif isinstance(value, str) and os.path.isabs(value) and os.sep in value[1:]:
        found.append(value)
    return found


def test_profile_paths_exist_after_the_command(tmp_path: Path) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TILEWRIGHT_DATA_DIR=str(tmp_path / "data"),
               TILEWRIGHT_CONFIG="/nonexistent/config.toml")
    def profile(*extra: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "profile", "--task", "gelu",
                               *SMALL, *extra], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return proc

    data = json.loads(profile("--json").stdout)  # no --logdir: under the user data dir
    logdir = Path(data["logdir"])
    assert (tmp_path / "data" / "profiles") in logdir.parents
    paths = [p for p in _paths(data) if p.startswith(str(tmp_path))]
    assert {data["logdir"], data["perfetto"], data["timeline"]["chrome_trace"]} <= set(paths)
    missing = [p for p in paths if not Path(p).exists()]
    assert not missing, missing
    assert list(logdir.rglob("*.xplane.pb")), "the raw trace for xprof/TensorBoard"

    chosen = tmp_path / "my traces"
    report = profile("--logdir", str(chosen)).stdout
    assert f"trace kept in {chosen}" in report and f"xprof --logdir {chosen}" in report
    assert list(chosen.rglob("*.xplane.pb"))
