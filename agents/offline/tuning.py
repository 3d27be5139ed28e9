"""The offline agent's tuning, one change at a time: the tuner's next step as a
proposal (``tuner_step``), blocks grown past the declared choices
(``grow_past_choices``), what the request's history measured (``observations``,
``was_measured``), what was refused (``is_rejected``), and what the agent remembers across
sessions (``lessons_for``, ``remember_convergence``). ``agents.offline`` decides when to tune."""

from __future__ import annotations

from typing import Any

from tilewright.agents import memory
from tilewright.agents.base import AgentRequest, Failure, Proposal
from tilewright.agents.memory import Lesson
from tilewright.agents.offline import tuner
from tilewright.agents.offline.constraints import allowed, constraints_from_notes
from tilewright.agents.prompts.evalfacts import version_numbers
from tilewright.kernels.judge.rank import times
from tilewright.kernels.source import tunables


def step_meta(step: tuner.Step) -> dict[str, Any]:
    """A tuner step's proposal meta: its configuration, and the version it applies to
    (``base``) when that is not the current one, so the change is made to the source its
    title and diff describe."""
    meta: dict[str, Any] = {"via": "tuner", "config": step.config}
    if step.base is not None:
        meta["base"] = step.base
    return meta


def grow_past_choices(request: AgentRequest, source: str) -> Proposal | None:
    """A fresh diagnosis of the best version asks for larger blocks, and every larger
    declared choice is measured: widen the declared choices (twice and four times the
    largest, aligned, while they still tile the task's dims) and move there."""
    diagnosis = request.diagnosis or {}
    if diagnosis.get("kind") not in ("per_step_overhead", "memory_bound"):
        return None
    declared = tunables.read(source)
    obs = observations(request, source, set(declared))
    best = obs.best()
    if best is None or (diagnosis.get("version") is not None
                        and obs.version.get(best[0]) not in (None, diagnosis.get("version"))):
        return None
    dims = tuner.tiled_dims(list(declared), request.task.shapes)
    aligns = tunables.alignment(source)
    constraints = _constraints(request, list(declared), tunables.config_of(source))
    base = dict(best[0])
    cover = covered(request, set(declared))
    wider: dict[str, list[Any]] = {}
    target: dict[str, Any] = {}
    switches = tunables.switches(source)
    for name, (_current, choices) in declared.items():
        numeric = [c for c in choices if isinstance(c, int) and not isinstance(c, bool)]
        if name in switches or not numeric or base.get(name) != max(numeric) or (
                name in cover and cover[name] <= base[name]):
            continue  # (a block that covers its grid axes has nothing left to save)
        top = max(numeric)
        limit = max(dims.get(name, ()) or (top * 4,))
        extra = [v for v in (top * 2, top * 4) if v <= limit
                 and tunables.is_legal(name, v, aligns.get(name, 1), dims.get(name, ()))
                 and allowed(v, constraints.get(name, []))]
        if extra:
            wider[name] = [*choices, *extra]
            target[name] = extra[0]
    if not wider:
        return None
    config = {**base, **target}
    if tuner.config_key(config) in obs.score:
        return None
    new_source = tunables.apply(tunables.widen(source, wider), config)
    proposal = Proposal(
        "kernel", "widen " + ", ".join(f"{k} to {v}" for k, v in target.items())
        + " (past the declared choices, from the diagnosis)",
        rationale=(f"The profile of v{diagnosis.get('version')} says {diagnosis.get('summary')} "
                   "Every larger declared block has been measured already, so this adds "
                   "larger aligned choices to TUNABLES ("
                   + "; ".join(f"{k}: {v}" for k, v in wider.items())
                   + ") and moves to the first of them; the tuner keeps whichever is best."),
        source=new_source, meta={"via": "tuner", "rule": "widen_choices"})
    return None if is_rejected(request, proposal) else proposal


def covered(request: AgentRequest, names: set[str]) -> dict[str, int]:
    """``tuner.covering`` over the versions measured so far (their tunables and their
    pallas_calls' grids at the production shape), the current one included; and the
    current value of each tunable ``tuner.held`` by a child of the current version whose
    evaluation has not ended (``VersionRow.awaiting_result``). (18k's search: the offline agent
    widened 128 rows to 256 while the search's 64-row child was being measured.)"""
    rows = [(h.tunables, h.numbers.get("grids")) for h in request.history
            if h.tunables is not None]
    current = None
    if request.current_source is not None:
        try:
            current = tunables.config_of(request.current_source)
        except tunables.TunablesError:
            current = None
    if current is not None and request.last_eval:
        rows.append((current, version_numbers(request.last_eval).get("grids")))
    found = tuner.covering(rows, names)
    if current is not None:
        children = [h.tunables for h in request.history if h.awaiting_result and h.tunables
                    and h.parent == request.current_version]
        for name in tuner.held(current, children) & names:
            found[name] = min(found.get(name, current[name]), current[name])
    return found


def tuner_step(request: AgentRequest, lessons: list[Lesson] | None = None
                ) -> tuner.Step | Failure | None:
    source = request.current_source or ""
    declared = tunables.read(source)
    if not declared:
        return Failure("offline agent: the kernel declares no TUNABLES and none of its block "
                       "sizes could be found, so there is nothing to tune. Declare block "
                       "sizes as module constants plus `TUNABLES = {\"NAME\": [choices]}` "
                       "(see docs/INTERFACES.md, Tunables).")
    obs = observations(request, source, set(declared))
    # Blocks are chosen for the production shape (the size that is ranked) and must be
    # legal at the check shapes too (where correctness is checked).
    production = (request.task.production,) if request.task.production else ()
    dims = tuner.tiled_dims(list(declared), (*request.task.shapes, *production))
    constraints = _constraints(request, list(declared), tunables.config_of(source))
    # What fits VMEM at the production shape, scaled from the compiler's own figure there.
    vmem = tuner.vmem_model(request.history, request.last_eval, request.current_source,
                            tuner.tiled_dims(list(declared), production), request.chip) \
        if production else None
    cover = covered(request, set(declared))
    return (_seed(source, obs, lessons or [], dims)
            or tuner.diagnosed_step(source, obs, dims, request.diagnosis, constraints, vmem,
                                    cover)
            or tuner.next_step(source, obs, dims, constraints, vmem, cover))


def observations(request: AgentRequest, source: str, names: set[str]) -> tuner.Observations:
    """What was measured, plus every configuration the person rejected (as infinitely
    slow: the search never proposes it again)."""
    obs = tuner.observations_from(request.history, source, request.last_eval, names,
                                  request.current_version)
    rows = {row.version: row for row in request.history}
    for entry in request.rejected:
        config = entry.get("config")
        if isinstance(config, dict) and set(config) == names:
            same = rows.get(entry.get("same_as"))  # type: ignore[arg-type]
            if same is not None and same.tunables is not None \
                    and set(same.tunables) == names:
                # that version's program: its measurement is this one's
                obs.alias(config, same.tunables)
            else:
                obs.add(config, "rejected", None, None)
    return obs


def tried_text(request: AgentRequest, source: str) -> str:
    """What happened to the configurations around the best, as it happened: measured,
    failed, rejected by the person (never "measured" for one that never ran)."""
    names = set(tunables.read(source))
    rejected = {tuner.config_key(e["config"]) for e in request.rejected
                if isinstance(e.get("config"), dict) and set(e["config"]) == names
                and e.get("same_as") is None}
    measured = tuner.observations_from(request.history, source, request.last_eval, names,
                                       request.current_version)
    ran = {k for k, v in measured.score.items() if v != tuner.FAILED}
    failed = {k for k, v in measured.score.items() if v == tuner.FAILED} - rejected
    same = {tuner.config_key(e["config"]) for e in request.rejected
            if isinstance(e.get("config"), dict) and set(e["config"]) == names
            and e.get("same_as") is not None} - ran
    parts = [f"{len(ran)} measured"]
    if same:
        parts.append(f"{len(same)} the same program as one measured (not run)")
    if failed:
        parts.append(f"{len(failed)} failed")
    if rejected:
        parts.append(f"{len(rejected)} rejected by you (not run)")
    return ("no neighbour of the best configuration is left to try (" + ", ".join(parts)
            + ")")


def _constraints(request: AgentRequest, names: list[str], current: dict[str, Any]
                 ) -> dict[str, list[tuple[str, int]]]:
    """Bounds the person's rejection notes put on the tunables (for the whole session)."""
    notes = [str(e.get("note")) for e in request.rejected if e.get("note") and e.get("by") != "auto"]
    notes += [n for n in request.notes if n.startswith("rejected ")]
    return constraints_from_notes(notes, names, current)


def is_rejected(request: AgentRequest, proposal: Proposal) -> bool:
    """Whether the person (or the auto-approver) already said no to this very change."""
    import hashlib

    sha = hashlib.sha256(proposal.source.encode()).hexdigest() if proposal.source else None
    for entry in request.rejected:
        if sha is not None and entry.get("source_sha256") == sha:
            return True
        if proposal.kind == "tuning" and proposal.tuning and entry.get("kind") == "tuning" \
                and entry.get("tuning") == proposal.tuning \
                and entry.get("summary") == proposal.summary:
            return True
    return False


def _seed(source: str, obs: tuner.Observations, lessons: list[Lesson],
          dims: dict[str, tuple[int, ...]]) -> tuner.Step | None:
    """A configuration an earlier session found best, tried once before searching."""
    space = tuner.search_space(source, dims)
    current = tunables.config_of(source)
    for lesson in lessons:
        config = lesson.config or {}
        if set(config) != set(space) or any(config[k] not in space[k] for k in config):
            continue
        config = {k: config[k] for k in space}
        changes = {k: v for k, v in config.items() if current.get(k) != v}
        if not changes or tuner.config_key(config) in obs.score:
            continue
        full = " ".join(f"{k}={v}" for k, v in config.items())
        return tuner.Step(changes, config, f"tune to a remembered configuration ({full})",
                          f"A lesson from an earlier session [{lesson.scope()}] says: "
                          f"{lesson.text}. Trying that configuration before searching; if it is "
                          "not the best here, the search continues from whichever is.")
    return None


def lessons_for(request: AgentRequest) -> list[Lesson]:
    try:
        return memory.matching(family=request.task.family, chip=request.chip,
                               task=request.task.name)
    except OSError:
        return []


def remember_convergence(request: AgentRequest) -> Lesson | None:
    source = request.current_source or ""
    obs = tuner.observations_from(request.history, source, request.last_eval,
                                  set(tunables.read(source)), request.current_version)
    best = obs.best()
    if best is None or len(obs.score) < 2:
        return None
    order = list(tunables.read(source))
    config = {k: dict(best[0])[k] for k in order if k in dict(best[0])}
    said = obs.said(best[0])
    try:
        known = memory.matching(family=request.task.family, chip=request.chip)
    except OSError:
        known = []
    if any(old.config == config for old in known):
        return None  # already remembered for this family and chip
    text = (f"{request.task.name}: tuning converged at "
            f"{' '.join(f'{k}={v}' for k, v in config.items())}"
            f"{f' ({said})' if said else ''} after {len(obs.score)} configurations on "
            f"{request.chip}")
    # Scoped to the family and chip (not the task): the same block sizes are the first
    # guess for the family's other tasks, as lessons are meant to be.
    lesson = Lesson(text, request.task.family, request.chip, None, "helped",
                    source="agent", config=config)
    try:
        return memory.remember(lesson)
    except OSError:
        return None


def best_text(request: AgentRequest) -> str:
    source = request.current_source or ""
    names = set(tunables.read(source))
    obs = tuner.observations_from(request.history, source, request.last_eval, names,
                                  request.current_version)
    best = obs.best()
    if best is None:
        return ""
    config = " ".join(f"{k}={v}" for k, v in best[0])
    version = obs.version.get(best[0])
    said = obs.said(best[0])
    return (f" at {config}{f' (v{version}' if version else ' ('}"
            f"{f', {said}' if said else ''}) after {len(obs.score)} measured configurations"
            + floor_note(obs))


def floor_note(obs: tuner.Observations) -> str:
    """When the memory floor hides a difference: "; 3 configurations tie at est. 4.00x
    on the memory floor, so the compiler's cycles ordered them (v1: 184,352 cycles, ...)";
    "" when no two ranked configurations tie there."""
    best = obs.best()
    if best is None:
        return ""
    top = obs.rank.get(best[0])
    if top is None or not top.floored or top.value is None:
        return ""
    tied = [(k, r) for k, r in obs.rank.items() if r is not None and r.floored
            and r.value is not None and times(r.value) == times(top.value)]
    if len(tied) < 2:
        return ""
    tied.sort(key=lambda kr: obs.score[kr[0]], reverse=True)
    listed = ", ".join(
        (f"v{obs.version[k]}" if obs.version.get(k) else " ".join(f"{n}={v}" for n, v in k))
        + (f": {r.kernel_cycles:,} cycles" if r.kernel_cycles else "") for k, r in tied[:4])
    return (f"; {len(tied)} configurations tie at est. {times(top.value)} on the memory floor "
            f"(the estimate cannot tell them apart), so the compiler's cycles ordered them "
            f"({listed})")


def was_measured(request: AgentRequest, changes: dict[str, Any]) -> bool:
    source = request.current_source or ""
    try:
        target = tunables.config_of(tunables.apply(source, changes))
    except tunables.TunablesError:
        return False
    return any(h.tunables == target for h in request.history)
