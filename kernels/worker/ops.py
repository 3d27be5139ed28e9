"""The operations a worker answers: ``OPS`` maps a name to ``handler(payload) -> dict``.

Built in: ``hello`` (backend and process facts). Every other op lives in the module that
does the work and registers its handler on import with ``@op("name")``; the worker
imports the modules listed in ``PLUGIN_MODULES``: ``eval`` and ``estimate``
(``kernels.worker.evaluation.evaluate``), ``reference_estimate`` (``kernels.worker.tpu.verdict``),
``profile`` (``kernels.worker.requests.profile_op``), ``inputs`` and ``lookup_api``. This module
imports none of them (they import it: ``op``, ``progress``). Handlers import their heavy
dependencies lazily and return plain JSON-able dicts; an exception they raise becomes
an error reply.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

Handler = Callable[[dict[str, Any]], dict[str, Any]]
OPS: dict[str, Handler] = {}

# Worker-side modules that register more ops; a missing one is skipped.
PLUGIN_MODULES = (
    "tilewright.kernels.worker.evaluation.evaluate",
    "tilewright.kernels.worker.tpu.verdict",
    "tilewright.kernels.worker.requests.profile_op",
    "tilewright.kernels.worker.requests.inputs_op",
    "tilewright.kernels.worker.requests.lookup_op",
    "tilewright.kernels.worker.requests.task_check_op",
)


# Progress of the request being served (``progress``): set by the worker's serve loop
# for the duration of one request, a sender of frames that carry its id and nonce.
_PROGRESS: Callable[[dict[str, Any]], None] | None = None


def set_progress(sender: Callable[[dict[str, Any]], None] | None) -> None:
    global _PROGRESS
    _PROGRESS = sender


def progress(data: dict[str, Any]) -> None:
    """Tell the app something about the request being served before its reply (the
    production verdict and estimate while the trials still run). From any thread; a
    request without a listener, or a broken channel, drops it."""
    sender = _PROGRESS
    if sender is not None:
        try:
            sender(data)
        except OSError:
            pass


def op(name: str) -> Callable[[Handler], Handler]:
    """Register ``handler`` under ``name`` (a later registration replaces an earlier one)."""

    def register(handler: Handler) -> Handler:
        OPS[name] = handler
        return handler

    return register


@op("hello")
def hello(payload: dict[str, Any]) -> dict[str, Any]:
    from tilewright.kernels import confinement
    from tilewright.kernels.worker.backend import backend_info

    # The pid as the app sees it (getpid() is 2 inside the worker's PID namespace, and
    # the namespace's own /proc numbers it that way too).
    return {"backend": backend_info(), "pid": confinement.host_pid(), "ops": sorted(OPS)}


def load_plugins() -> list[str]:
    """Import the plugin modules; returns the ones that were found."""
    found = []
    for name in PLUGIN_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        found.append(name)
    return found
