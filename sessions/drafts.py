"""A person's unsaved editor text, kept in the session's folder when the app stops.

When the terminal goes away (SIGHUP: the SSH connection dropped) or the app is told to
stop (SIGTERM), or it quits with an edit open, the text in the editor is not a version
yet: it is written to ``draft.json`` beside the log, with what it was an edit of, and
the resumed session offers it back. Opening it in the editor removes the file (the
text is then in the editor; a later stop keeps it again). Nothing here is an event:
a draft was never submitted, so the log does not know it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

DRAFT_FILE = "draft.json"


@dataclass(frozen=True)
class Draft:
    text: str
    version: int | None  # the version it edits (the current one when it was kept)
    proposal: str | None  # the pending proposal it edits, if it was one
    why: str  # disconnect | terminated | quit
    saved_at: float  # time.time()

    def words(self) -> str:
        """"an edit of v3" / "an edit of proposal p4"."""
        if self.proposal:
            return f"an edit of proposal {self.proposal}"
        return f"an edit of v{self.version}" if self.version is not None else "an edit"


def save_draft(session: Path, text: str, *, version: int | None, proposal: str | None,
               why: str) -> Path:
    """Write the draft atomically (a second signal mid-write leaves the old one)."""
    path = Path(session) / DRAFT_FILE
    draft = Draft(text, version, proposal, why, time.time())
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(asdict(draft), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def load_draft(session: Path) -> Draft | None:
    """The kept draft, or None (none kept, or unreadable: a draft is never worth an
    error that stops a session from opening)."""
    try:
        data = json.loads((Path(session) / DRAFT_FILE).read_text(encoding="utf-8"))
        return Draft(text=str(data["text"]), version=data.get("version"),
                     proposal=data.get("proposal"), why=str(data.get("why", "")),
                     saved_at=float(data.get("saved_at", 0.0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def drop_draft(session: Path) -> None:
    try:
        (Path(session) / DRAFT_FILE).unlink()
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class Stop:
    """How the session's last run of the app ended when a signal stopped it: the cause
    (``disconnect``, ``terminated``), the runs it cut short (``r4 (v3, eval)``), and
    whether autonomous mode was on."""

    cause: str
    runs: tuple[tuple[str, int, str], ...]  # (run id, version, kind)
    auto: bool

    def words(self) -> str:
        what = {"disconnect": "the connection dropped",
                "terminated": "the app was told to stop (SIGTERM)"}.get(self.cause,
                                                                        self.cause)
        kinds = {"eval": "evaluation", "profile": "profile", "analysis": "analysis"}
        if self.runs:
            runs = ", ".join(f"run {r} (v{v}, {kinds.get(k, k)})" for r, v, k in self.runs)
            text = f"{what} during {runs}: recorded as interrupted, not as a result"
        else:
            text = f"{what}; no run was cut short"
        if self.auto:
            text += "; autonomous mode was stopped"
        return text


def last_stop(events: list[dict]) -> Stop | None:
    """The signal stop that ended the app's last run on this session, if one did (its
    ``session.end`` reads ``stopped: <cause>``)."""
    ends = [i for i, e in enumerate(events) if e.get("type") == "session.end"]
    if not ends:
        return None
    last = ends[-1]
    reason = str(events[last].get("reason", ""))
    if not reason.startswith("stopped: "):
        return None
    cause = reason.removeprefix("stopped: ")
    resumes = [e for e in events[last + 1:]
               if e.get("type") == "marker" and e.get("label") == "resumed"]
    if len(resumes) > 1:  # reopened since, and that run ended without a word
        return None
    start = ends[-2] + 1 if len(ends) > 1 else 0
    window = events[start:last]
    kinds = {e.get("run"): str(e.get("kind", "eval")) for e in window
             if e.get("type") == "run.start"}
    runs = tuple((str(e["run"]), int(e.get("version") or 0), kinds.get(e["run"], "eval"))
                 for e in window
                 if (e.get("type") == "run.result" and e.get("cause") == cause)
                 or (e.get("type") == "profile.result"
                     and e.get("error") == f"interrupted ({cause})"))
    auto = any(e.get("type") == "auto.stop" and e.get("reason") == cause for e in window)
    return Stop(cause, runs, auto)
