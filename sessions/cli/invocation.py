"""How to run tilewright again, as the running one was run: the commands printed after a
session (resume, export, report) must work as printed, and ``./dev start`` runs
``.venv/bin/tilewright``, which is not on PATH until the venv is activated."""

from __future__ import annotations

import os
import sys


def invocation() -> str:
    """How to run tilewright again as this one was run: ``tilewright`` where that name
    on PATH is this program; else the path it was started by (``./dev start`` runs
    ``.venv/bin/tilewright``, which is not on PATH until the venv is activated)."""
    import shutil
    from pathlib import Path

    started = sys.argv[0] if sys.argv and sys.argv[0] else ""
    found = shutil.which("tilewright")
    try:
        if found and started and Path(found).resolve() == Path(started).resolve():
            return "tilewright"
    except OSError:
        pass
    if started.endswith(".py") or not started:
        return f"{sys.executable} -m tilewright.tui.cli" if not found else "tilewright"
    if Path(started).name == "tilewright" and os.sep in started:
        return started
    return "tilewright" if found else started
