"""Continue a recorded session live from any event: a new session branch.

The branch is a new session directory whose header names its parent
(``{"session": id, "seq": n}``) and whose log starts with copies of the parent's first
``n`` events (new ``seq``/``t``, same fields), so folding it gives exactly the parent's
state at that point. Blobs the copied events reference are copied too. Written through
``sessions.log`` only (the header by ``sessions.core.log_open.create_log``, as every session's
is); the parent is never touched.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tilewright.sessions.log import load, read_blob
from tilewright.sessions.opening import create_log
from tilewright.sessions.state import fold

_SHA = re.compile(r"[0-9a-f]{64}")


def _blob_refs(event: dict[str, Any]) -> set[str]:
    return {v for k, v in event.items()
            if k.endswith("_blob") and isinstance(v, str) and _SHA.fullmatch(v)}


def branch_session(parent: Path, seq: int, sessions_dir: Path | None = None) -> Path:
    """Create the branch and return its directory (beside the parent by default)."""
    loaded = load(parent)
    header = loaded.header
    events = [e for e in loaded.events if isinstance(e.get("seq"), int) and e["seq"] <= seq]
    # A branch continues work: a recorded end or an auto run in flight is not carried on.
    events = [e for e in events if e.get("type") != "session.end"]
    target_dir = sessions_dir or loaded.path.parent
    # The parent's evaluation options go with it: the branch is judged as the parent was.
    log = create_log(
        target_dir, task=header.get("task") or {}, backend=header.get("backend"),
        agent=str(header.get("agent", "")), eval_options=header.get("eval_options"),
        parent={"session": header.get("id", loaded.path.name), "seq": seq})
    try:
        for event in events:
            for sha in _blob_refs(event):
                log.put_blob(read_blob(loaded.path, sha))
            fields = {k: v for k, v in event.items() if k not in ("seq", "t", "type")}
            log.append(event["type"], **fields)
        log.append("marker", label=f"branched from {header.get('id')} at seq {seq}")
        if fold(header, events).mode == "auto":  # a person picks up the branch: step mode
            log.append("auto.stop", reason="user")
            log.append("mode.change", mode="step", by="user")
    finally:
        log.close()
    return log.path
