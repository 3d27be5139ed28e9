"""The installed project is one package, ``tilewright``: the wheel holds it and nothing
else at the top level, installs into a fresh environment with its console script, and
works beside other distributions' ``kernels`` and ``agents`` packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy: setuptools writes build/ and *.egg-info beside the sources
    tree = tmp_path_factory.mktemp("tree") / "tilewright"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "__pycache__", ".*cache*"))
    # setuptools and wheel come with the test extra: no index needed to build
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out), str(tree)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (found,) = out.glob("tilewright-*.whl")
    return found


def test_the_wheel_holds_one_package_and_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"tilewright", next(t for t in tops if t.endswith(".dist-info"))}
    dist = next(t for t in tops if t.endswith(".dist-info"))
    top_level = zipfile.ZipFile(wheel).read(f"{dist}/top_level.txt").decode().split()
    assert top_level == ["tilewright"]
    rooms = {n.split("/")[1] for n in names if n.count("/") >= 2}
    assert rooms == {"tui", "sessions", "agents", "kernels", "profiling"}
    # every file of the rooms is in the wheel (a new folder left out of pyproject.toml's
    # packages, or a data file its package-data does not name, would be missing)
    for room in rooms:
        for path in (ROOT / room).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                rel = path.relative_to(ROOT).as_posix()
                assert f"tilewright/{rel}" in names, rel
    # nothing of the repository's own beside the package
    assert not [n for n in names if n.startswith("tilewright/") and n.count("/") == 1
                and n != "tilewright/__init__.py"]


def test_a_fresh_environment_gets_tilewright_and_its_script_only(wheel: Path,
                                                                tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    before = set(os.listdir(site)) | set(os.listdir(venv / "bin"))
    # this interpreter's pip installs into the fresh environment (no index: --no-deps)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install",
                           "--no-deps", "-q", str(wheel)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    added = (set(os.listdir(site)) | set(os.listdir(venv / "bin"))) - before
    assert {a for a in added if not a.endswith(".dist-info")} == {"tilewright"}
    assert (venv / "bin" / "tilewright").exists()
    script = (venv / "bin" / "tilewright").read_text()
    assert "from tilewright.tui.cli import main" in script


def test_tilewright_works_beside_other_kernels_and_agents_packages(wheel: Path,
                                                                  tmp_path: Path) -> None:
    """The unpacked wheel first on the path, next to packages named ``kernels`` and
    ``agents`` that refuse to be imported (as another distribution's would be foreign):
    tilewright's commands never touch them, and its code comes from the wheel."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    for other in ("kernels", "agents", "tui", "sessions", "profiling"):
        (site / other).mkdir()
        (site / other / "__init__.py").write_text(
            f"raise ImportError('this is another distribution\\'s {other}')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(PYTHONPATH=str(site), TILEWRIGHT_DATA_DIR=str(tmp_path / "data"),
               JAX_PLATFORMS="cpu")
    where = subprocess.run(
        [sys.executable, "-P", "-c", "import tilewright.kernels.judge.result as r, "
         "tilewright.tui.cli as c; print(r.__file__); print(c.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(site)) for line in where.stdout.split())
    for args in (["chips"], ["sessions"], ["--help"]):
        done = subprocess.run([sys.executable, "-P", "-m", "tilewright.tui.cli", *args],
                              capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=120)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        assert "another distribution" not in done.stdout + done.stderr
        if args == ["chips"]:  # read from the wheel's data
            assert "v5e" in done.stdout
