"""Which task a session is about: what the header records, and how it is found again.

The header stores the task's name, directory, layout and the ``--set`` overrides it
was loaded with, so resume and ``replay --verify`` rebuild the same shapes. When the
directory has moved (a session copied to another machine), a bundled task of the
same name is used instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tilewright.kernels.tasks.task import Task, TaskError


def task_header(task: Task, overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The header's ``task``: where it is (absolute, so resume and replay work from any
    working directory), the ``--set`` overrides, and the effective shapes they gave
    (visible configurations' parameters, and the hard-coded sizes rewritten in a
    JAXBench baseline), so a reader of the log knows what ran; and the production
    shape, the size every verdict and ranking of the session is for."""
    header: dict[str, Any] = {
        "name": task.name, "root": str(Path(task.root).resolve()), "layout": task.layout,
        "overrides": dict(overrides or {}),
        "shapes": [{"name": s.name, "size": s.size, "params": s.params}
                   for s in task.visible_shapes()],
    }
    if task.meta.get("literal_rewrites"):
        header["literal_rewrites"] = task.meta["literal_rewrites"]
    if task.production is not None:
        # The size verdicts, estimates and rankings are for (``--set`` never changes it).
        production: dict[str, Any] = {"name": task.production.name,
                                      "size": task.production.size,
                                      "params": task.production.params,
                                      "is_check_shape": task.production_is_check_shape()}
        if task.production_meta and "config" in task.production_meta:
            production["config"] = task.production_meta["config"]  # JAXBench, as written
        header["production"] = production
    return header


def task_for_header(header: dict[str, Any]) -> Task:
    """Load the task a session header names; a ``TaskError`` says why it cannot be."""
    from tilewright.kernels.tasks.loaders import load_task

    info = header.get("task") or {}
    overrides = info.get("overrides") or None
    root = info.get("root")
    if root and Path(root).is_dir():
        return load_task(root, overrides)
    name = info.get("name")
    if not name:
        raise TaskError(str(root), "the session header names no task")
    try:
        return load_task(name, overrides)
    except TaskError as exc:
        raise TaskError(str(root or name), f"the session's task is not available here "
                        f"({exc}); pass the task directory") from None

