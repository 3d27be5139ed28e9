"""The agent's request: the ``AgentRequest`` built from the folded state, and the role it is
asked to play next (``agents.prompts.context`` words the model's prompt from it).

Roles follow the state: no kernel yet, or an approved plan waiting, -> ``implement``;
the current version failed (compile error, runtime error, incorrect, timeout, crash,
integrity rejection) -> ``fix``; otherwise -> ``tune``. The request carries the base
version's source (the current one: after a regression the controller checks out the best
version first, ``regression_base``), its evaluation, its profile and its own diagnosis
(never another version's), which versions are best and latest and why the base is what
it is, the notes since the last proposal (rejection notes, user messages, proposals
that could not be applied, the approved plan with the one step to carry out now), the
history of every version with its tunables, its numbers (``agents.prompts.evalfacts``), its
grid steps and its diagnosis, and the session's earlier read-only tool answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tilewright.agents.base import AgentRequest, TaskBrief, VersionRow
from tilewright.agents.prompts.evalfacts import rank_of, version_numbers
from tilewright.sessions.log import SessionLog, read_json_blob
from tilewright.sessions.state import SessionState, Version, outranks


def agent_result(log_path: Any, blob: str) -> dict[str, Any] | None:
    """A version's evaluation as an agent may read it: without what the candidate said at
    the held-out configurations (``extra.held_out``: their error, output and reasons, kept
    in the log for the person)."""
    result = read_json_blob(log_path, blob)
    extra = result.get("extra") if isinstance(result, dict) else None
    if isinstance(extra, dict) and "held_out" in extra:
        result = {**result, "extra": {k: v for k, v in extra.items() if k != "held_out"}}
    return result


def next_role(state: SessionState) -> str:
    if state.plan_to_implement is not None or state.current is None:
        return "implement"
    if state.versions[state.current].failed:
        return "fix"
    return "tune"


_TUNABLES: dict[str, dict[str, Any] | None] = {}  # by source blob: sources never change
_TUNABLES_KEPT = 4096
_NUMBERS: dict[str, dict[str, Any]] = {}  # by result blob: an eval JSON never changes
_NUMBERS_KEPT = 4096


def history(versions: Mapping[int, Version], source_of: Callable[[int], str],
            path: Sequence[int] | None = None,
            result_of: Callable[[str], dict[str, Any] | None] | None = None,
            awaiting_result: Callable[[int], bool] | None = None) -> tuple[VersionRow, ...]:
    """Every version so far with its measurements and tunables (so a tuner never
    proposes a measured configuration twice), its parent and origin, and with
    ``result_of`` (a result blob -> its eval JSON) the numbers of its evaluation, its
    grid steps and its own diagnosis. With ``path`` (a graph search: the root to the
    version asked about) those versions come first and every entry says whether it is
    on the path. ``awaiting_result`` (``SessionState.awaiting_result``) marks the versions
    whose evaluation has not ended. Tunables are parsed, and numbers read, once per
    blob."""
    on_path = set(path or ())
    order = [*(path or ()), *(n for n in versions if n not in on_path)]
    out = []
    for number in order:
        v = versions[number]
        numbers = _numbers_of(v.result_blob, result_of) \
            if result_of is not None and v.result_blob else {}
        steps, where = _steps(numbers, v.diagnosis)
        out.append(VersionRow(
            version=number, status=v.status, rank=v.rank or rank_of(numbers), summary=v.summary,
            median_ms=v.median_ms, parent=v.parent, origin=v.origin,
            tunables=_tunables_of(v.source_blob, lambda n=number: source_of(n)),
            numbers=numbers, flags=tuple(f for f in v.flags or () if f),
            diagnosis=v.diagnosis or None, steps=steps, steps_source=where,
            on_path=number in on_path if path is not None else None,
            awaiting_result=awaiting_result is not None and awaiting_result(number)))
    return tuple(out)


def _numbers_of(blob: str, result_of: Callable[[str], dict[str, Any] | None]
                ) -> dict[str, Any]:
    if blob not in _NUMBERS:
        try:
            numbers = version_numbers(result_of(blob))
        except Exception:  # an unreadable blob: no numbers, not a failed request
            return {}
        if len(_NUMBERS) >= _NUMBERS_KEPT:
            _NUMBERS.pop(next(iter(_NUMBERS)))
        _NUMBERS[blob] = numbers
    return dict(_NUMBERS[blob])


def _steps(numbers: dict[str, Any], diagnosis: dict[str, Any] | None
           ) -> tuple[int | None, str | None]:
    """Grid steps of a version: the TPU compile's, at the estimate's shape, else the
    static analysis's, which is at the first check shape."""
    if isinstance(numbers.get("grid_steps"), int):
        return numbers["grid_steps"], "tpu"
    steps = ((diagnosis or {}).get("evidence") or {}).get("steps")
    return (int(steps), "static") if isinstance(steps, int) and steps > 0 else (None, None)


def _tunables_of(blob: str, read: Callable[[], str]) -> dict[str, Any] | None:
    if blob not in _TUNABLES:
        from tilewright.kernels.source import tunables

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
                  tools: Any = None, lessons: tuple[str, ...] = (),
                  why: str | None = None) -> AgentRequest:
    """The request for ``role``; ``version`` (``/explain v3``, or the best version a
    step-mode proposal starts from after a regression: ``why`` says so) puts that
    version in the place of the current one."""
    from tilewright.profiling.diagnose import check_with_estimates

    number = version if version is not None else state.current
    current = state.versions.get(number) if number is not None else None
    source = log.get_blob(current.source_blob).decode() if current else None
    last_eval = agent_result(log.path, current.result_blob) \
        if current is not None and current.result_blob else None
    profile = read_json_blob(log.path, current.profile_blob) \
        if current is not None and current.profile_blob else None
    notes = tuple(state.notes) + plan_notes(state)
    rows = history(state.versions,
                   lambda n: log.get_blob(state.versions[n].source_blob).decode(),
                   result_of=lambda blob: agent_result(log.path, blob), awaiting_result=state.awaiting_result)
    # Every diagnosis is held against the estimates measured since it was made.
    rows = tuple(dataclasses.replace(r, diagnosis=check_with_estimates(r.diagnosis, rows))
                 if r.diagnosis else r for r in rows)
    diagnosis = next((r.diagnosis for r in rows
                      if current is not None and r.version == current.number
                      and r.diagnosis), None)
    return AgentRequest(
        role=role, task=brief, current_source=source,  # type: ignore[arg-type]
        current_version=current.number if current else None, last_eval=last_eval,
        profile_summary=profile, user_message=message, notes=notes, history=rows,
        chip=chip, diagnosis=diagnosis, tools=tools, lessons=lessons,
        best_version=state.best, latest_version=max(state.versions, default=None),
        base_reason=why or base_reason(state, number, explain=version is not None),
        lookups=tuple(state.lookups), backend=state.header.get("backend"),
        rejected=rejected(state, lambda sha: log.get_blob(sha).decode()))


def regression_base(state: SessionState) -> tuple[int, str] | None:
    """Where the next proposal should start when the current version is not it: the best
    version, after the current one came out correct but slower (or not ranked). None
    when the current version is the best, failed (the fixer fixes it), is not yet
    measured, or was chosen (checked out, or edited) by the person. Returns the version
    and the reason, for the ``kernel.checkout`` the controller writes."""
    number, best = state.current, state.best
    if number is None or best is None or best == number or state.chosen_base == number:
        return None
    current, top = state.versions[number], state.versions[best]
    if current.origin == "user-edit" or current.status != "correct":
        return None
    if current.crownable and not outranks(top, current):
        return None
    why = (f"not ranked ({', '.join(current.flags)})" if not current.crownable else
           f"{_rank(current)} is slower than v{best}'s {_rank(top)}")
    return best, f"v{number} {why}: the next proposal starts from the best version, v{best}"


def base_reason(state: SessionState, number: int | None, explain: bool = False) -> str | None:
    """Why the request's version is the one to change, in a sentence."""
    if number is None or number not in state.versions:
        return None
    v, best = state.versions[number], state.best
    if explain:
        return f"you asked about v{number}"
    if state.chosen_base == number:
        return f"v{number} was checked out by the person: the proposal starts from it"
    if v.failed:
        return f"v{number} failed ({v.status}): fix it"
    if v.status is None:
        return f"v{number} is not evaluated yet"
    if state.base_reason and state.current == number:
        return state.base_reason  # the controller went back to it, and said why
    if best == number:
        return f"v{number} is the best version so far"
    if v.origin == "user-edit":
        return f"v{number} is the person's edit: the proposal starts from it"
    return f"v{number} is the latest version"


def _rank(v: Version) -> str:
    """The ranking number in short ("est. 1.26x"; the request says its source and shape
    once, in its ranking rule)."""
    return v.rank.words(short=True) if v.rank and v.rank.ranked else "no ranking number"


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
            from tilewright.kernels.source import tunables

            try:
                tuned = tunables.apply(read(base.source_blob), prop.tuning)
            except Exception:  # a missing blob, a tuning that cannot apply
                tuned = None
            config = _tunables_of(f"tuned:{base.source_blob}:{sorted(prop.tuning.items())}",
                                  lambda t=tuned: t or "") if tuned else None
            if config:
                entry["config"] = config
        if prop.kind == "kernel" and prop.source_blob:
            entry["source_sha256"] = prop.source_blob  # blobs are named by their sha256
        same = _same_as_of(state, prop.id)
        if same is not None:  # the same program as that version: measured, not refused
            entry["same_as"] = same
        out.append(entry)
    return tuple(out)


def _same_as_of(state: SessionState, pid: str) -> int | None:
    for decision in reversed(state.decisions):
        if decision.proposal == pid and decision.decision == "reject":
            return decision.same_as
    return None


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


def own_edit_failed(state: SessionState, log_path: Path, number: int) -> str:
    """What the person is told when their own edit fails its run: "v2 (your edit) does
    not compile: line 15: ... Edit it again, go back to v1 (History: select it, enter),
    or ask the agent to fix it in the chat."."""
    version = state.versions[number]
    error: dict[str, Any] = {}
    if version.result_blob:
        try:
            error = (read_json_blob(log_path, version.result_blob) or {}).get("error") or {}
        except (OSError, ValueError):
            error = {}
    status = {"compile_error": "does not compile", "incorrect": "is not correct",
              "runtime_error": "fails when it runs", "timeout": "timed out",
              "crashed": "crashed", "rejected": "was rejected by the judge"}.get(
        str(version.status), str(version.status))
    where = f"line {error['line']}: " if error.get("line") else ""
    message = " ".join(str(error.get("message") or "").split())[:160]
    back = version.parent if version.parent in state.versions else state.best
    way_back = f", go back to v{back} (History: select it, enter)" if back else ""
    return (f"v{number} (your edit) {status}" + (f": {where}{message}" if message else "")
            + f". Edit it again{way_back}, or ask the agent to fix it in the chat.")
