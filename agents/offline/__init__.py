"""The offline agent: proposes without a model and without a key.

It writes a first kernel from a template for the task's family (``templates``), repairs
common failures with rules (``fixes``), and tunes the kernel's declared TUNABLES one
change at a time (``tuner``), remembering what it measured through the request's
history. It streams its rationale as text like any agent and ends with one
``ProposalReady`` or a ``Failure`` that says what it cannot do and what to do instead.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from agents import memory
from agents.base import (
    AgentEvent,
    AgentRequest,
    Answer,
    Failure,
    Finished,
    Notice,
    Proposal,
    ProposalReady,
    TextDelta,
)
from agents.memory import Lesson
from agents.offline import fixes, templates, tuner
from kernels import tunables

CONVERGED = "tuning converged"


class OfflineAgent:
    name = "offline"
    label = "offline agent"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = config or {}
        # Lessons: read to seed the tuner, written when tuning converges (agents.memory).
        # Opt-in ([agent] remember_lessons = true): an agent built without configuration
        # (tests, scripts) must not read or write the user's lessons file behind their back.
        from agents.config import coerce

        self.remember = coerce(config).agent.remember_lessons

    async def propose(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        if request.user_message and request.role != "analyze":
            yield Notice("The offline agent does not read chat messages; it follows its rules "
                         "(template, fixes, tuning). Set ANTHROPIC_API_KEY to talk to Claude.")
        lessons = _lessons(request) if self.remember else []
        outcome = decide(request, lessons)
        if isinstance(outcome, Answer):
            for piece in re.split(r"(?<=\n)", outcome.text):
                if piece:
                    yield TextDelta(piece)
            yield outcome
            return
        if isinstance(outcome, Failure | Finished):
            if self.remember and isinstance(outcome, Finished):
                stored = _remember_convergence(request)
                if stored is not None:
                    yield Notice(f"remembered for later sessions: {stored.text}")
            yield outcome
            return
        text = outcome.rationale or outcome.plan or outcome.summary
        for piece in re.split(r"(?<=[.:;])\s+", text):
            if piece:
                yield TextDelta(piece + " ")
        yield ProposalReady(outcome, text=text)


def decide(request: AgentRequest, lessons: list[Lesson] | None = None
           ) -> Proposal | Answer | Failure | Finished:
    """The offline agent's whole policy, as a pure function of the request (and lessons)."""
    try:
        return _decide(request, lessons or [])
    except (templates.TemplateError, tunables.TunablesError, SyntaxError) as exc:
        return Failure(f"offline agent: {exc}")


def _decide(request: AgentRequest, lessons: list[Lesson]
            ) -> Proposal | Answer | Failure | Finished:
    if request.role == "analyze":
        return Answer(explain(request))
    if request.role == "plan":
        return _plan(request)
    if request.current_source is None:
        return _template(request)
    failed = bool(request.last_eval) and request.last_eval.get("status") != "correct"
    if failed and request.task.family is None and not _has_correct(request):
        # A guessed family whose template failed: try the next family's template.
        retry = _template(request)
        if isinstance(retry, Proposal):
            return retry
    if request.role == "fix" or failed:
        return _fix(request)
    return _tune(request, lessons)


def _template(request: AgentRequest) -> Proposal | Failure:
    """A first kernel from the family's template. For a task that names no family the
    family is inferred from the reference, and each failed guess moves to the next."""
    tried = {str(h.get("summary", "")).split(" template", 1)[0]
             for h in request.history if " template from the reference" in
             str(h.get("summary", ""))}
    families = templates.infer_families(request.task)
    unfit: list[str] = []
    too_big = _whole_array_too_big(request)
    for family in families:
        if family in tried:
            continue
        if family == templates.FALLBACK and too_big:
            unfit.append(f"{family}: {too_big}")
            continue
        try:
            source, why = templates.write_template(request.task, family)
        except templates.TemplateError as exc:  # this family does not fit: try the next
            unfit.append(f"{family}: {exc}")
            continue
        if request.task.family is None:
            article = "an" if family[:1] in "aeiou" else "a"
            earlier = f" (earlier guesses failed: {', '.join(sorted(tried))})" if tried else ""
            why = (f"The task declares no family; its reference reads like {article} "
                   f"{family} computation{earlier}. " + why)
        return Proposal("kernel", f"{family} template from the reference",
                        rationale=why, source=source, meta={"via": "template"})
    why_not = f"; templates that do not fit: {'; '.join(unfit)}" if unfit else ""
    return Failure("offline agent: every template family failed for this task "
                   f"({', '.join(families)}){why_not}; write a first kernel.py, or use "
                   "Claude (set ANTHROPIC_API_KEY)")


def _whole_array_too_big(request: AgentRequest) -> str | None:
    """Why the whole-array fallback cannot work at the production shape (its inputs alone
    exceed the chip's scoped VMEM there, as the last evaluation measured them); None
    when it may fit or nothing is known yet."""
    tpu = (request.last_eval or {}).get("tpu") or {}
    limit = tpu.get("vmem_limit_bytes")
    shapes = tpu.get("input_shapes") or []
    if not limit or not shapes:
        return None
    sizes = {"f32": 4, "bf16": 2, "f16": 2, "i32": 4, "i8": 1, "u8": 1, "f64": 8, "i64": 8,
             "bool": 1, "i16": 2}
    total = 0
    for text in shapes:
        kind, _, dims = str(text).partition("[")
        count = 1
        for d in dims.rstrip("]").split(","):
            count *= int(d) if d.strip().isdigit() else 1
        total += count * sizes.get(kind, 4)
    if total <= limit:
        return None
    return (f"its inputs alone ({total / 2**20:.0f} MiB at the production shape "
            f"{tpu.get('shape_label') or ''}) exceed the {limit / 2**20:.0f} MiB of scoped VMEM "
            f"a kernel gets on {tpu.get('chip')}")


def _fix(request: AgentRequest) -> Proposal | Failure:
    source = request.current_source or ""
    result = request.last_eval or {}
    fix = fixes.suggest_fix(source, result)
    if fix is not None and fix.tuning is not None and _measured(request, fix.tuning):
        fix = None  # that configuration was measured already: search on instead of repeating it
    if fix is not None:
        if fix.tuning is not None:
            return Proposal("tuning", fix.summary, rationale=fix.rationale, tuning=fix.tuning,
                            meta={"via": "rule", "rule": fix.rule})
        return Proposal("kernel", fix.summary, rationale=fix.rationale, source=fix.source,
                        meta={"via": "rule", "rule": fix.rule})
    # No rule matched: when a correct configuration exists, keep searching from it.
    step = _tuner_step(request)
    error = (result.get("error") or {})
    what = f"{result.get('status', 'failed')}: {error.get('message') or (result.get('correctness') or {}).get('reason') or 'see the evaluation'}"
    if isinstance(step, tuner.Step) and _has_correct(request):
        return Proposal("tuning", step.summary,
                        rationale=f"The current version failed ({_clip(what)}), and no repair "
                                  f"rule yields a configuration not yet measured; the failed one "
                                  f"is now excluded. {step.rationale}",
                        tuning=step.changes, meta={"via": "tuner", "config": step.config})
    return Failure(f"offline agent: no rule-based fix for this failure ({_clip(what)}). Revert to "
                   "an earlier version, edit the kernel yourself, or use Claude (set "
                   "ANTHROPIC_API_KEY).")


def _tune(request: AgentRequest, lessons: list[Lesson]) -> Proposal | Failure | Finished:
    source = request.current_source or ""
    if not tunables.read(source):
        inferred = tunables.infer(source)
        if inferred is not None:  # a user's own kernel: make its block sizes tunable first
            new_source, choices = inferred
            names = ", ".join(f"{k} (now {tunables.config_of(new_source)[k]})" for k in choices)
            return Proposal(
                "kernel", "declare the kernel's block sizes as TUNABLES",
                rationale=("The kernel declares no TUNABLES, but its BlockSpecs fix block "
                           f"sizes: {names}. This names them as module constants with "
                           "aligned neighbouring choices (TUNABLES, TUNABLE_ALIGN) and "
                           "changes nothing else, so the tuner can size them next."),
                source=new_source, meta={"via": "tuner", "rule": "infer_tunables"})
    step = _tuner_step(request, lessons)
    if isinstance(step, Failure):
        return step
    if step is None:
        return Finished(f"offline agent: {CONVERGED}{_best_text(request)}: every neighbour "
                        "of the best configuration has been measured. Try a structural change "
                        "(edit, or Claude) to go further.")
    return Proposal("tuning", step.summary, rationale=step.rationale, tuning=step.changes,
                    meta={"via": "tuner", "config": step.config})


def _tuner_step(request: AgentRequest, lessons: list[Lesson] | None = None
                ) -> tuner.Step | Failure | None:
    source = request.current_source or ""
    declared = tunables.read(source)
    if not declared:
        return Failure("offline agent: the kernel declares no TUNABLES, so there is nothing to "
                       "tune. Declare block sizes as module constants plus "
                       "`TUNABLES = {\"NAME\": [choices]}` (see kernels/tunables.py).")
    obs = tuner.observations_from(request.history, source, request.last_eval, set(declared),
                                  request.current_version)
    # Blocks are chosen for the production shape (the size that is ranked) and must be
    # legal at the check shapes too (where correctness is checked).
    production = (request.task.production,) if request.task.production else ()
    dims = tuner.tiled_dims(list(declared), (*request.task.shapes, *production))
    return (_seed(source, obs, lessons or [], dims)
            or tuner.diagnosed_step(source, obs, dims, request.diagnosis)
            or tuner.next_step(source, obs, dims))


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
        if not changes or tuner.config_key(config) in obs.cost:
            continue
        full = " ".join(f"{k}={v}" for k, v in config.items())
        return tuner.Step(changes, config, f"tune to a remembered configuration ({full})",
                          f"A lesson from an earlier session [{lesson.scope()}] says: "
                          f"{lesson.text}. Trying that configuration before searching; if it is "
                          "not the best here, the search continues from whichever is.")
    return None


def _lessons(request: AgentRequest) -> list[Lesson]:
    try:
        return memory.matching(family=request.task.family, chip=request.chip,
                               task=request.task.name)
    except OSError:
        return []


def _remember_convergence(request: AgentRequest) -> Lesson | None:
    source = request.current_source or ""
    obs = tuner.observations_from(request.history, source, request.last_eval,
                                  set(tunables.read(source)), request.current_version)
    best = obs.best()
    if best is None or len(obs.cost) < 2:
        return None
    order = list(tunables.read(source))
    config = {k: dict(best[0])[k] for k in order if k in dict(best[0])}
    speed = obs.speedup.get(best[0])
    try:
        known = memory.matching(family=request.task.family, chip=request.chip)
    except OSError:
        known = []
    if any(old.config == config for old in known):
        return None  # already remembered for this family and chip
    text = (f"{request.task.name}: tuning converged at "
            f"{' '.join(f'{k}={v}' for k, v in config.items())}"
            f"{f' ({speed:.3g}x)' if speed else ''} after {len(obs.cost)} configurations on "
            f"{request.chip}")
    # Scoped to the family and chip (not the task): the same block sizes are the first
    # guess for the family's other tasks, as lessons are meant to be.
    lesson = Lesson(text, request.task.family, request.chip, None, "helped",
                    source="agent", config=config)
    try:
        return memory.remember(lesson)
    except OSError:
        return None


def _best_text(request: AgentRequest) -> str:
    source = request.current_source or ""
    names = set(tunables.read(source))
    obs = tuner.observations_from(request.history, source, request.last_eval, names,
                                  request.current_version)
    best = obs.best()
    if best is None:
        return ""
    config = " ".join(f"{k}={v}" for k, v in best[0])
    version = obs.version.get(best[0])
    speed = obs.speedup.get(best[0])
    return (f" at {config}{f' (v{version}' if version else ' ('}"
            f"{f', {speed:.3g}x' if speed else ''}) after {len(obs.cost)} measured configurations")


def _measured(request: AgentRequest, changes: dict[str, Any]) -> bool:
    source = request.current_source or ""
    try:
        target = tunables.config_of(tunables.apply(source, changes))
    except tunables.TunablesError:
        return False
    return any(h.get("tunables") == target for h in request.history)


def _has_correct(request: AgentRequest) -> bool:
    return any(h.get("status") == "correct" for h in request.history)


def _plan(request: AgentRequest) -> Proposal:
    steps = []
    if request.current_source is None:
        steps.append(f"1. Write a first kernel from the {request.task.family or 'matching'} "
                     "template: the reference's math on VMEM blocks, block sizes as TUNABLES.")
    elif request.last_eval and request.last_eval.get("status") != "correct":
        steps.append("1. Repair the failing version with a rule (alignment, VMEM, "
                     "accumulator init), else continue from the best correct version.")
    steps.append(f"{len(steps) + 1}. Tune the declared TUNABLES one change at a time: jump to the "
                 "largest legal block per tunable, bisect back on a slowdown, then try smaller.")
    steps.append(f"{len(steps) + 1}. Stop when every neighbour of the best configuration is "
                 "measured; a structural change needs a human or Claude.")
    best = [h for h in request.history if h.get("status") == "correct" and h.get("speedup")]
    if best:
        top = max(best, key=lambda h: h["speedup"])
        steps.append(f"Best so far: v{top.get('version')} at {top['speedup']:.3g}x.")
    plan = "\n".join(steps)
    return Proposal("plan", "offline plan: template, rule-based fixes, tuning", plan=plan,
                    rationale=plan, meta={"via": "offline"})


def explain(request: AgentRequest) -> str:
    """The analyst's answer without a model: the version's evaluation, its diagnosis with
    the numbers, and what the rules would try next."""
    label = f"v{request.current_version}" if request.current_version else "the kernel"
    result = request.last_eval or {}
    lines = [f"**{label}**: {result.get('status', 'not evaluated yet')}"]
    error = result.get("error") or {}
    if error:
        where = f" at line {error['line']}" if error.get("line") else ""
        lines.append(f"- error ({error.get('kind')}){where}: {_clip(error.get('message', ''))}")
        fix = fixes.suggest_fix(request.current_source or "", result)
        lines.append(f"- rule-based fix: {fix.summary}" if fix else
                     "- no repair rule matches this error")
    timing = result.get("timing") or {}
    if timing.get("speedup"):
        lines.append(f"- speedup {timing['speedup']:.3g}x ({timing.get('method')}, median "
                     f"{timing.get('median_ms', 0):.4g} ms)")
    diagnosis = request.diagnosis
    if diagnosis:
        lines.append(f"- diagnosis (profile of v{diagnosis.get('version')}): "
                     f"{diagnosis.get('summary')}")
        for finding in diagnosis.get("findings") or []:
            lines.append(f"  - {finding.get('kind')}: {finding.get('reason')}")
    elif not error:
        lines.append("- no profile yet: profile it (ctrl+t) for a diagnosis")
    return "\n".join(lines)


def _clip(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "…"
