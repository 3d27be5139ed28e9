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

import contextlib
from typing import Any

from agents.base import AgentRequest, TaskBrief
from sessions.log import SessionLog, read_json_blob
from sessions.state import FAILED_STATUSES, SessionState


def next_role(state: SessionState) -> str:
    if state.plan_to_implement is not None or state.current is None:
        return "implement"
    if state.versions[state.current].status in FAILED_STATUSES:
        return "fix"
    return "tune"


def history(state: SessionState, log: SessionLog) -> tuple[dict[str, Any], ...]:
    from kernels import tunables

    out = []
    for v in state.versions.values():
        entry: dict[str, Any] = {"version": v.number, "status": v.status,
                                 "speedup": v.speedup, "summary": v.summary,
                                 "median_ms": v.median_ms}
        with contextlib.suppress(Exception):  # a broken source simply has no tunables
            entry["tunables"] = tunables.config_of(log.get_blob(v.source_blob).decode())
        out.append(entry)
    return tuple(out)


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
        history=history(state, log), chip=chip)
