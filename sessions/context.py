"""What the agent is told: the ``AgentRequest`` built from the folded state, and the role
it is asked to play next.

Roles follow the state: no kernel yet, or an approved plan waiting, -> ``implement``;
the current version failed (compile error, runtime error, incorrect, timeout, crash,
integrity rejection) -> ``fix``; otherwise -> ``tune``. The request carries the current
source and its last evaluation, the profile summary and the latest diagnosis when one
was made, the notes since the last proposal (rejection notes, user messages, proposals
that could not be applied, the approved plan with the one step to carry out now) and
the history of every version with its tunables.
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
        if v.rank_label:  # what ``speedup`` is: "est. 1.34x on v5e (TPU compiler)"
            entry.update(rank_label=v.rank_label, rank_source=v.rank_source)
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
                  message: str | None, chip: str, *, version: int | None = None,
                  tools: Any = None, lessons: tuple[str, ...] = ()) -> AgentRequest:
    """The request for ``role``; ``version`` (``/explain v3``) puts that version in the
    place of the current one."""
    number = version if version is not None else state.current
    current = state.versions.get(number) if number is not None else None
    source = log.get_blob(current.source_blob).decode() if current else None
    last_eval = read_json_blob(log.path, current.result_blob) \
        if current is not None and current.result_blob else None
    profile = read_json_blob(log.path, current.profile_blob) \
        if current is not None and current.profile_blob else None
    notes = tuple(state.notes) + plan_notes(state)
    return AgentRequest(
        role=role, task=brief, current_source=source,  # type: ignore[arg-type]
        current_version=current.number if current else None, last_eval=last_eval,
        profile_summary=profile, user_message=message, notes=notes,
        history=history(state.versions,
                        lambda n: log.get_blob(state.versions[n].source_blob).decode()),
        chip=chip, diagnosis=latest_diagnosis(state, number), tools=tools, lessons=lessons,
        rejected=rejected(state, lambda sha: log.get_blob(sha).decode()))


def rejected(state: SessionState, read: Callable[[str], str]) -> tuple[dict[str, Any], ...]:
    """Every rejected proposal of the session, with what it would have changed: the
    tunables a tuning would have set on its base version, the hash of a kernel's
    source. The notes of ``state.notes`` last one request; these last the session, so
    a rejected change is never proposed again."""
    out = []
    for prop in state.proposals.values():
        if prop.decision != "reject":
            continue
        entry: dict[str, Any] = {"proposal": prop.id, "kind": prop.kind,
                                 "summary": prop.summary, "by": prop.decided_by,
                                 "note": _note_of(state, prop.id), "tuning": prop.tuning}
        base = state.versions.get(prop.base_version) if prop.base_version is not None \
            else None
        if prop.kind == "tuning" and prop.tuning and base is not None:
            from sessions.state import tuned_source

            try:
                tuned = tuned_source(read(base.source_blob), prop.tuning)
            except Exception:  # a missing blob: the summary still says what it was
                tuned = None
            config = _tunables_of(f"tuned:{base.source_blob}:{sorted(prop.tuning.items())}",
                                  lambda t=tuned: t or "") if tuned else None
            if config:
                entry["config"] = config
        if prop.kind == "kernel" and prop.source_blob:
            entry["source_sha256"] = prop.source_blob  # blobs are named by their sha256
        out.append(entry)
    return tuple(out)


def _note_of(state: SessionState, pid: str) -> str | None:
    for decision in reversed(state.decisions):
        if decision.proposal == pid and decision.decision == "reject":
            return decision.note
    return None


def plan_notes(state: SessionState) -> tuple[str, ...]:
    """The approved plan and the one step to carry out now (one approved step at a time)."""
    if not state.plan_to_implement:
        return ()
    plan = state.proposals[state.plan_to_implement].plan or ""
    steps = state.plan_steps or [plan]
    k = min(state.plan_step, len(steps) - 1)
    done = "".join(f"\n  done: {i + 1}. {steps[i]}" for i in range(k))
    return (f"approved plan:\n{plan}",
            f"carry out step {k + 1} of {len(steps)} of the approved plan now, and only that "
            f"step: {steps[k]}{done}")


def latest_diagnosis(state: SessionState, number: int | None) -> dict[str, Any] | None:
    """The diagnosis of this version, else the latest one of the session (the best
    version's profile still says what limits its descendants)."""
    version = state.versions.get(number) if number is not None else None
    if version is not None and version.diagnosis:
        return version.diagnosis
    return state.diagnoses[-1] if state.diagnoses else None
