"""From a profiled version to its ``diagnosis`` event (``SessionCore.profile`` and
``analyze`` write it for the controller and the search).

Autonomous mode and the search both profile a version and then want one thing written
down: what limits it, with the numbers (``profiling.diagnose`` reads the profile, the
static analysis and the TPU compiler's figures from the version's eval JSON). The next
request to the agent carries that version's diagnosis (``sessions.control.agent_request.build_request``),
checked against the compiler's estimates of the versions measured since
(``profiling.diagnose.check_with_estimates``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tilewright.sessions import events as ev
from tilewright.sessions.log import read_json_blob


def diagnose_version(log_path: Path, result_blob: str | None, profile: dict[str, Any],
                     version: int, run: str, emit: Callable[[ev.Event], Any]) -> None:
    """Emit the ``diagnosis`` of ``version`` profiled by ``run``; nothing when the
    profile has nothing to judge. A failure of the diagnosis itself is emitted as an
    ``error`` event (``where: diagnosis``) instead of raised: a bug there must not stop
    the autonomous loop or the search, which go on without the diagnosis."""
    from tilewright.profiling.diagnose import diagnose

    result = read_json_blob(log_path, result_blob) if result_blob else None
    try:
        found = diagnose(profile, result)
    except Exception as exc:
        emit(ev.Error(type="error", message=f"could not diagnose v{version}: {exc}",
                      where="diagnosis"))
        return
    if found is not None:
        emit(ev.Diagnosis(type="diagnosis", version=version, run=run, **found))
