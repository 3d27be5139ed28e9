"""A session's log on disk: a new one with its header (``create_log``, the only place
headers are written) or a recorded one reopened for appending (``reopen_log``), for the
controller's sessions and the searches alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tilewright.kernels.judge.result import Backend
from tilewright.kernels.tasks.task import Task
from tilewright.sessions.errors import OpenError
from tilewright.sessions.log import LoadedSession, SessionError, SessionLog, resolve
from tilewright.sessions.tasks import task_header

if TYPE_CHECKING:
    from tilewright.kernels.judge.options import EvalOptions

__all__ = ["app_version", "backend_json", "create_log", "options_from", "recorded_options",
           "reopen_log"]


def app_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tilewright")
    except PackageNotFoundError:
        return "0+unknown"


def backend_json(backend: Backend | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The header's ``backend``: the worker's platform, mode, device and its label."""
    if backend is None:
        return None
    if isinstance(backend, Backend):
        return {**asdict(backend), "label": backend.label()}
    data = dict(backend)
    if "label" not in data and data.get("platform") and data.get("mode"):
        data["label"] = Backend(str(data["platform"]), str(data["mode"]),
                                str(data.get("device_kind") or ""), "").label()
    return data


def create_log(sessions_dir: str | Path, *, task: Task | Mapping[str, Any],
               backend: Backend | Mapping[str, Any] | None, agent: str,
               eval_options: EvalOptions | Mapping[str, Any] | None = None,
               parent: Mapping[str, Any] | None = None,
               extra: Mapping[str, Any] | None = None) -> SessionLog:
    """A new session directory and its header (the only place headers are written)."""
    header_task = task_header(task, task.meta.get("overrides")) if isinstance(task, Task) \
        else dict(task)
    options = None if eval_options is None else \
        dict(eval_options) if isinstance(eval_options, Mapping) else asdict(eval_options)
    path = Path(sessions_dir)
    path.mkdir(parents=True, exist_ok=True)
    return SessionLog.create(path, task=header_task, backend=backend_json(backend),
                             agent=agent, app_version=app_version(),
                             parent=dict(parent) if parent else None,
                             extra={**({"eval_options": options} if options else {}),
                                    **(extra or {})})


def reopen_log(ref: str | Path, sessions_dir: str | Path | None = None
               ) -> tuple[SessionLog, LoadedSession]:
    """Reopen a recorded session for appending (locked: one writer at a time)."""
    try:
        return SessionLog.open(resolve(str(ref), sessions_dir))
    except SessionError as exc:
        raise OpenError(str(exc), "`tilewright sessions` lists the sessions") from None


def options_from(fields: Mapping[str, Any]) -> EvalOptions:
    """``EvalOptions`` from ``fields``; an option this version does not know (a session
    recorded by another) is an ``OpenError``."""
    from tilewright.kernels.judge.options import EvalOptions

    try:
        return EvalOptions(**fields)
    except TypeError as exc:
        raise OpenError(f"evaluation options {sorted(fields)}: {exc}",
                        "start a new session with --task") from None


def recorded_options(header: Mapping[str, Any]) -> EvalOptions | None:
    """The evaluation options a session's header records (None: it records none)."""
    recorded = header.get("eval_options")
    return options_from(recorded) if recorded else None
