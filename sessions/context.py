"""What the agent is told: the ``AgentRequest`` built from the folded state, and the role
it is asked to play next.

Roles follow the state: no kernel yet, or an approved plan waiting, -> ``implement``;
the current version failed (compile error, runtime error, incorrect, timeout, crash,
integrity rejection) -> ``fix``; otherwise -> ``tune``. The request carries the current
source and its last evaluation, the profile summary when one was taken, the notes
since the last proposal (rejection notes, user messages, proposals that could not be
applied, the approved plan) and the history of every version with its tunables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agents.base import AgentRequest, TaskBrief
from sessions.log import SessionLog, read_json_blob
from sessions.state import FAILED_STATUSES, SessionState, Version


def next_role(state: SessionState) -> str:
    if state.plan_to_implement is not None or state.current is None:
        return "implement"
    if state.versions[state.current].status in FAILED_STATUSES:
        return "fix"
    return "tune"


_TUNABLES: dict[str, dict[str, Any] | None] = {}  # by source blob: sources never change
_TUNABLES_KEPT = 4096


def history(versions: Mapping[int, Version], source_of: Callable[[int], str],
            path: Sequence[int] | None = None) -> tuple[dict[str, Any], ...]:
    """Every version so far with its measurements and tunables (so a tuner never
    proposes a measured configuration twice). With ``path`` (a graph search: the root
    to the version asked about) those versions come first and every entry says its
    parent and whether it is on the path. Tunables are parsed once per source."""
    on_path = set(path or ())
    order = [*(path or ()), *(n for n in versions if n not in on_path)]
    out = []
    for number in order:
        v = versions[number]
        entry: dict[str, Any] = {"version": number, "status": v.status,
                                 "speedup": v.speedup, "summary": v.summary,
                                 "median_ms": v.median_ms}
        if path is not None:
            entry.update(parent=v.parent, on_path=number in on_path)
        config = _tunables_of(v.source_blob, lambda n=number: source_of(n))
        if config is not None:
            entry["tunables"] = config
        out.append(entry)
    return tuple(out)


def _tunables_of(blob: str, read: Callable[[], str]) -> dict[str, Any] | None:
    if blob not in _TUNABLES:
        from kernels import tunables

        try:
            source = read()
        except Exception:  # unreadable now (a missing blob): not remembered
            return None
        try:
            config: dict[str, Any] | None = tunables.config_of(source)
        except Exception:  # a broken source simply has no tunables
            config = None
        if len(_TUNABLES) >= _TUNABLES_KEPT:
            _TUNABLES.pop(next(iter(_TUNABLES)))
        _TUNABLES[blob] = config
    config = _TUNABLES[blob]
    return None if config is None else dict(config)  # each request its own copy


def build_request(state: SessionState, log: SessionLog, brief: TaskBrief, role: str,
                  message: str | None, chip: str) -> AgentRequest:
    current = state.versions.get(state.current) if state.current is not None else None
    source = log.get_blob(current.source_blob).decode() if current else None
    last_eval = read_json_blob(log.path, current.result_blob) \
        if current is not None and current.result_blob else None
    profile = read_json_blob(log.path, current.profile_blob) \
        if current is not None and current.profile_blob else None
    plan = state.proposals[state.plan_to_implement].plan if state.plan_to_implement else None
    notes = tuple(state.notes) + ((f"approved plan:\n{plan}",) if plan else ())
    return AgentRequest(
        role=role, task=brief, current_source=source,  # type: ignore[arg-type]
        current_version=current.number if current else None, last_eval=last_eval,
        profile_summary=profile, user_message=message, notes=notes,
        history=history(state.versions,
                        lambda n: log.get_blob(state.versions[n].source_blob).decode()),
        chip=chip)
