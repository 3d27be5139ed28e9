"""Copies of task directories inside a worker's scratch dir (app side, no JAX).

A confined worker cannot read the user's files: its Landlock domain is fixed when it
starts, before any task is known, and names no task directory. So the app hands each
request's task over as a copy under ``<worker scratch>/tasks/<key>/`` and rewrites the
task spec's paths to it; the worker (the judge) and its candidate process read only
that copy (the candidate process may read ``tasks/`` but not write it). Replies get
the original paths back (``restore``), so errors still name the user's files.

What is copied is what a task needs and nothing that could carry the user's secrets:
regular files only (symlinks are not followed: a link to ``~/.ssh`` stays behind),
no dotfiles or dot-directories (``.env``, ``.git``), no ``__pycache__``, no tilewright
session directories (one holding ``events.jsonl``), within
``MAX_FILES`` files, ``MAX_FILE_BYTES`` per file and ``MAX_TOTAL_BYTES`` in all. A
copy is refreshed only when a file's size or modification time changed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path
from typing import Any

MAX_FILES = 2000
MAX_FILE_BYTES = 32 << 20
MAX_TOTAL_BYTES = 128 << 20
MAX_DEPTH = 6
TASKS_DIRNAME = "tasks"  # under a worker's scratch dir
PATH_KEYS = ("root", "reference_path", "kernel_path", "input_gen_path")
_SKIP_DIRS = {"__pycache__", "node_modules"}


class TaskCopyError(ValueError):
    """The task directory cannot be handed to a worker (too large, unreadable)."""


def _manifest(root: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of every file that is copied, sorted."""
    found: list[tuple[str, int, int]] = []
    total = 0
    base_depth = len(root.parts)
    for current, dirs, files in os.walk(root, followlinks=False):
        here = Path(current)
        # Sessions kept inside a task (``--session-dir ./sessions``) are not the task's:
        # other runs' records, growing with every event.
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS
                         and len(here.parts) - base_depth < MAX_DEPTH
                         and not (here / d / "events.jsonl").exists())
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = here / name
            try:
                info = path.lstat()
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
                continue  # links, devices, sockets; files too big to be a task's own
            total += info.st_size
            found.append((str(path.relative_to(root)), info.st_size, info.st_mtime_ns))
            if len(found) > MAX_FILES or total > MAX_TOTAL_BYTES:
                raise TaskCopyError(
                    f"the task directory {root} holds more than {MAX_FILES} files or "
                    f"{MAX_TOTAL_BYTES >> 20} MiB: a worker gets a copy of it, and this is "
                    "too much to copy for every evaluation. Keep a task's directory to its "
                    "own files (task.toml, reference.py, helpers), or point --task at the "
                    "task's own directory.")
    return found


class TaskCopies:
    """The copies made for one worker, under ``parent`` (``<scratch>/tasks``)."""

    def __init__(self, parent: str | Path) -> None:
        self.parent = Path(parent)
        self._made: dict[str, list[tuple[str, int, int]]] = {}

    def localize(self, spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """``spec`` with its paths in a fresh-enough copy, and {copy path: original}."""
        root = spec.get("root")
        if not isinstance(root, str) or not root:
            return spec, {}
        source = Path(root)
        if not source.is_dir():
            return spec, {}  # the worker reports the missing task as it always did
        key = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]
        dest = self.parent / key
        try:
            manifest = _manifest(source)
        except OSError as exc:
            raise TaskCopyError(f"cannot read the task directory {root}: {exc}") from exc
        if self._made.get(key) != manifest or not dest.is_dir():
            self._copy(source, dest, manifest)
            self._made[key] = manifest
        localized = dict(spec)
        mapping = {str(dest): str(source)}
        for name in PATH_KEYS:
            value = spec.get(name)
            if not isinstance(value, str) or not value:
                continue
            path = Path(value)
            try:
                relative = path.relative_to(source)
            except ValueError:
                # A file outside the task (a loader may point there): copied on its own.
                outside = self.parent / key / "_outside" / name
                self._copy_file(path, outside / path.name)
                localized[name] = str(outside / path.name)
                mapping[str(outside / path.name)] = value
                continue
            localized[name] = str(dest / relative)
        return localized, mapping

    def _copy(self, source: Path, dest: Path, manifest: list[tuple[str, int, int]]) -> None:
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True, exist_ok=True)
        for relative, _size, _mtime in manifest:
            self._copy_file(source / relative, dest / relative)

    @staticmethod
    def _copy_file(src: Path, dst: Path) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            # follow_symlinks=False: a file swapped for a link since the scan is copied
            # as the link, which the worker cannot follow out of its copy's rules anyway.
            shutil.copy2(src, dst, follow_symlinks=False)
        except OSError as exc:
            raise TaskCopyError(f"cannot copy the task file {src}: {exc}") from exc


def restore(value: Any, mapping: dict[str, str]) -> Any:
    """``value`` (a reply) with every copy path replaced by the original path."""
    if not mapping:
        return value
    if isinstance(value, str):
        for copy, original in sorted(mapping.items(), key=lambda item: -len(item[0])):
            if copy in value:
                value = value.replace(copy, original)
        return value
    if isinstance(value, dict):
        return {k: restore(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [restore(v, mapping) for v in value]
    return value
