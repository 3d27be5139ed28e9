"""Task loaders: turn a task directory in any supported layout into a ``Task``.

Layouts, detected by marker file (the first that matches wins):
``task.toml`` -> native (``kernels.tasks.loaders.native``), ``kernel_task.yaml`` ->
MaxKernel (``kernels.tasks.loaders.maxkernel``), ``baseline.py`` -> JAXBench
(``kernels.tasks.loaders.jaxbench``). docs/TASK_FORMATS.md describes all three.

This runs in the app process: no JAX here. Sources are checked statically (``ast``);
the worker side (``kernels.worker.runtime``) imports them. Every problem is a
``kernels.tasks.task.TaskError`` naming the file, the line where known, and what is expected.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tilewright.kernels.tasks.loaders import jaxbench, maxkernel, native
from tilewright.kernels.tasks.task import ShapeConfig, Task, TaskError, UnknownOverride

BUNDLED_DIR = Path(__file__).resolve().parents[2] / "bundled"  # kernels/bundled

# Marker file -> (layout, loader), in detection order.
LAYOUTS = (
    ("task.toml", "native", native.load),
    ("kernel_task.yaml", "maxkernel", maxkernel.load),
    ("baseline.py", "jaxbench", jaxbench.load),
)
SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}


def detect_layout(directory: Path) -> str | None:
    """The layout of ``directory``, or None when it holds no marker file."""
    for marker, layout, _ in LAYOUTS:
        if (directory / marker).is_file():
            return layout
    return None


def load_task(path: str | Path, overrides: dict[str, Any] | None = None) -> Task:
    """Load the task at ``path`` (a directory, a file inside it, or a bundled task's name).

    ``overrides`` are ``--set KEY=VALUE`` pairs; string values are parsed as Python
    literals (``128`` -> int, ``"bfloat16"`` stays a string). Raises ``TaskError``.
    """
    directory = _resolve(path)
    check = {k: v for k, v in (overrides or {}).items() if not k.startswith(PRODUCTION_PREFIX)}
    production = {k[len(PRODUCTION_PREFIX):]: v for k, v in (overrides or {}).items()
                  if k.startswith(PRODUCTION_PREFIX)}
    for marker, _, loader in LAYOUTS:
        if (directory / marker).is_file():
            task = loader(directory, check or None)
            return _with_production(task, loader(directory, production)) if production \
                else task
    raise TaskError(directory, "not a task directory",
                    expected="task.toml (native), kernel_task.yaml (MaxKernel) or "
                             "baseline.py (JAXBench)")


# ``--set production.KEY=VALUE`` sets the production shape (the size verdicts and
# rankings are for); a plain ``--set KEY=VALUE`` shrinks the check shapes only.
PRODUCTION_PREFIX = "production."


def _with_production(task: Task, sized: Task) -> Task:
    """``task`` whose production shape is ``sized``'s (the task loaded with the
    ``production.`` overrides as its own)."""
    from dataclasses import replace

    if task.layout == "native":
        name = task.production.name if task.production else sized.shapes[0].name
        chosen = next((s for s in sized.shapes if s.name == name), sized.shapes[0])
        return replace(task, production=chosen, production_meta=None)
    check = sized.shapes[0]
    production = ShapeConfig("production", dict(check.params), "large", atol=check.atol,
                             rtol=check.rtol)
    return replace(task, production=production, production_meta=dict(sized.meta))


def load_with_shared(path: str | Path, shared: dict[str, Any] | None,
                     own: dict[str, Any] | None = None) -> tuple[Task, list[str]]:
    """Load a task with suite-wide overrides: the ``shared`` keys the task has no use
    for are skipped (and returned), ``own`` ones must all apply. The applicable keys are
    applied together, so a size shared by two keys (``in_features`` and
    ``out_features`` both 8192) can be rewritten when both are set; a combination the
    task refuses raises its ``TaskError``. Returns (task, skipped keys)."""
    skipped = []
    chosen: dict[str, Any] = {}
    for key, value in (shared or {}).items():
        try:
            load_task(path, {key: value})
        except UnknownOverride:
            skipped.append(key)
            continue
        except TaskError:
            pass  # a known key that needs a partner (checked together below)
        chosen[key] = value
    chosen.update(own or {})
    return load_task(path, chosen or None), skipped


def find_tasks(directory: str | Path,
               overrides: dict[str, Any] | None = None) -> list[Task | TaskError]:
    """Every task under ``directory`` (recursively, all layouts), broken ones as errors.

    A task directory is not searched further: its subfolders belong to the task.
    ``overrides`` apply to every task that has the key (``load_with_shared``).
    """
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise TaskError(root, "no such directory", expected="a folder holding task directories")
    found: list[Task | TaskError] = []
    for current, dirs, _files in os.walk(root):
        here = Path(current)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        if detect_layout(here) is None:
            continue
        dirs[:] = []
        try:
            found.append(load_with_shared(here, overrides)[0] if overrides
                         else load_task(here))
        except TaskError as exc:
            found.append(exc)
    return found


def bundled_tasks() -> list[Task]:
    """The tasks shipped with tilewright (``kernels/bundled/<name>/``), by name."""
    if not BUNDLED_DIR.is_dir():
        return []
    return [native.load(d) for d in sorted(BUNDLED_DIR.iterdir())
            if (d / "task.toml").is_file()]


def bundled_names() -> list[str]:
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(d.name for d in BUNDLED_DIR.iterdir() if (d / "task.toml").is_file())


def parse_overrides(pairs: Iterable[str] | None) -> dict[str, str]:
    """``["rows=128", "dtype=bfloat16"]`` -> ``{"rows": "128", ...}``; ValueError when malformed."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise ValueError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set rows=128")
        out[key] = value.strip()
    return out


def _resolve(path: str | Path) -> Path:
    candidate = Path(path).expanduser()
    if candidate.is_file():
        return candidate.parent
    if candidate.is_dir():
        return candidate
    name = str(path).rstrip("/")
    if name in bundled_names():
        return BUNDLED_DIR / name
    bundled = ", ".join(bundled_names()) or "none installed"
    raise TaskError(candidate, "no such task directory",
                    expected=f"a task directory, or a bundled task name ({bundled})")
