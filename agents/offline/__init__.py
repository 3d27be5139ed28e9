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

from tilewright.agents import base as events  # what ``propose`` streams
from tilewright.agents import memory
from tilewright.agents.base import AgentRequest, Answer, Failure, Finished, Proposal
from tilewright.agents.memory import Lesson
from tilewright.agents.offline import fixes, templates, tuner, words
from tilewright.kernels.judge.result import Rank, ranking, times
from tilewright.kernels.source import tunables

CONVERGED = "tuning converged"


class OfflineAgent:
    name = "offline"
    label = "offline agent"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = config or {}
        # Lessons: read to seed the tuner, written when tuning converges (agents.memory).
        # Opt-in ([agent] remember_lessons = true): an agent built without configuration
        # (tests, scripts) must not read or write the user's lessons file behind their back.
        from tilewright.agents.config import coerce

        self.remember = coerce(config).agent.remember_lessons

    async def propose(self, request: AgentRequest) -> AsyncIterator[events.AgentEvent]:
        if request.user_message and request.role not in ("analyze", "plan"):
            heard = _heard(request)
            yield events.Notice(
                f"The offline agent took from your words: {heard.took()}." if heard else
                "The offline agent took nothing from your words: it reads block sizes "
                "(\"256 rows\", \"BLOCK_ROWS=256\"), \"larger\"/\"smaller\" and named "
                "techniques, and follows its rules (template, fixes, tuning). Set "
                "ANTHROPIC_API_KEY to talk to Claude.")
        lessons = _lessons(request) if self.remember else []
        outcome = decide(request, lessons)
        if isinstance(outcome, Answer):
            for piece in re.split(r"(?<=\n)", outcome.text):
                if piece:
                    yield events.TextDelta(piece)
            yield outcome
            return
        if isinstance(outcome, Failure | Finished):
            if self.remember and isinstance(outcome, Finished):
                stored = _remember_convergence(request)
                if stored is not None:
                    yield events.Notice(f"remembered for later sessions: {stored.text}")
            yield outcome
            return
        text = outcome.rationale or outcome.plan or outcome.summary
        for piece in re.split(r"(?<=[.:;])\s+", text):
            if piece:
                yield events.TextDelta(piece + " ")
        yield events.ProposalReady(outcome, text=text)


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
    asked = _as_asked(request)
    if isinstance(asked, Proposal):
        return asked
    made = _fix(request) if request.role == "fix" or failed else _tune(request, lessons)
    if asked and isinstance(made, Proposal):  # what was heard, and why it was not done
        return Proposal(made.kind, made.summary, rationale=f"{asked} {made.rationale}",
                        source=made.source, plan=made.plan, tuning=made.tuning,
                        meta=made.meta)
    return made


def _heard(request: AgentRequest) -> words.Wishes:
    source = request.current_source or ""
    try:
        names = list(tunables.read(source)) if source else []
    except (tunables.TunablesError, SyntaxError):
        names = []
    return words.read(words.person_texts(request.notes, request.user_message), names)


def _as_asked(request: AgentRequest) -> Proposal | str | None:
    """The person's words made into the next proposal: the block sizes they named, or
    one legal notch in the direction they said, from the version the request is about.
    A string when something was heard that cannot be done (said in the next proposal's
    rationale); None when nothing was heard."""
    wishes = _heard(request)
    if not wishes:
        return None
    quoted = f"You said “{words_clip(wishes.quoted)}”"
    source = request.current_source or ""
    declared = tunables.read(source)
    cannot: list[str] = []
    if wishes.techniques:
        cannot.append("the offline agent has no rule for " + ", ".join(wishes.techniques)
                      + " (a change of the kernel's structure): edit the kernel yourself or use "
                      "Claude for that")
    if not declared or not (wishes.sizes or wishes.directions):
        return f"{quoted}; took: {wishes.took()}; " + "; ".join(cannot) + "." if cannot \
            else None
    production = (request.task.production,) if request.task.production else ()
    dims = tuner.tiled_dims(list(declared), (*request.task.shapes, *production))
    aligns = tunables.alignment(source)
    current = tunables.config_of(source)
    space = tuner.search_space(source, dims)
    config = dict(current)
    widened: dict[str, list[Any]] = {}
    for name, value in wishes.sizes.items():
        choices = declared[name][1]
        why = words.legal_size(name, value, choices, dims.get(name, ()), aligns.get(name, 1))
        if why is not None:
            cannot.append(why)
            continue
        if value not in choices:
            widened[name] = sorted({*choices, value}, key=lambda v: (not isinstance(v, int), v))
        config[name] = value
    for name, way in wishes.directions.items():
        values = [v for v in space.get(name, []) if isinstance(v, int)]
        if name in wishes.sizes or current.get(name) not in values:
            continue
        i = values.index(current[name])
        j = i + 1 if way == "up" else i - 1
        if 0 <= j < len(values):
            config[name] = values[j]
        else:
            cannot.append(f"no {'larger' if way == 'up' else 'smaller'} legal {name} than "
                          f"{current[name]}")
    obs = _observations(request, source, set(declared))
    known = obs.score.get(tuner.config_key(config))
    took = f"{quoted}; took: {wishes.took()}"
    if config == current:
        return f"{took}; " + ("; ".join(cannot) if cannot else
                              f"that is the kernel as it is (v{request.current_version})") + "."
    if known is not None:
        version = obs.version.get(tuner.config_key(config))
        said = obs.said(tuner.config_key(config))
        what = "failed" if known == tuner.FAILED else (said or "measured")
        return (f"{took}; " + " ".join(f"{k}={v}" for k, v in config.items())
                + f" was tried already ({f'v{version}, ' if version else ''}{what}), so the "
                "search goes on from what is known.")
    too_big = _known_not_to_fit(request, config)
    if too_big is not None:
        return f"{took}; it would not fit VMEM ({too_big}), so the search goes on."
    moves = ", ".join(f"{k} {current.get(k)} -> {v}" for k, v in config.items()
                      if current.get(k) != v)
    label = f"v{request.current_version}" if request.current_version else "the kernel"
    rationale = (f"{took}. This sets {moves} on {label}"
                 + (", adding the value to TUNABLES" if widened else "")
                 + ("; " + "; ".join(cannot) if cannot else "") + ".")
    summary = f"tune {moves} (as you asked)"
    if widened:
        new_source = tunables.apply(tunables.widen(source, widened), config)
        return Proposal("kernel", summary, rationale=rationale, source=new_source,
                        meta={"via": "words", "config": config})
    changes = {k: v for k, v in config.items() if current.get(k) != v}
    return Proposal("tuning", summary, rationale=rationale, tuning=changes,
                    meta={"via": "words", "config": config})


def words_clip(text: str, limit: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "…"


def _known_not_to_fit(request: AgentRequest, config: dict[str, Any]) -> str | None:
    """A configuration measured not to fit VMEM that ``config`` is at least as large as in
    every block (so it cannot fit either): its version in words; None when none is."""
    for entry in request.history:
        measured = entry.get("tunables")
        if not isinstance(measured, dict) or set(measured) != set(config):
            continue
        numbers = entry.get("numbers") or {}
        text = " ".join(str(x) for x in (numbers.get("tpu_message"), entry.get("summary")) if x)
        failed = entry.get("status") != "correct" or numbers.get("compile") == "error"
        if not failed or not fixes._VMEM_MSG.search(text):
            continue
        if all(not isinstance(v, int) or not isinstance(measured[k], int) or v >= measured[k]
               for k, v in config.items()):
            return f"v{entry.get('version')} with " + " ".join(
                f"{k}={v}" for k, v in measured.items()) + " did not"
    return None


_TEMPLATE = " template from the reference"
_VARIANT = ", larger blocks"


def _templates_tried(request: AgentRequest) -> dict[str, list[tuple[str, str | None]]]:
    """Family -> [(summary, status)] of the template versions proposed so far: evaluated
    ones (the history, with their status), rejected ones, and siblings a search proposed
    beside this request ("already tried: v2: matmul template ... (not run)")."""
    found: dict[str, list[tuple[str, str | None]]] = {}
    entries = [(str(h.get("summary", "")), h.get("status")) for h in request.history]
    entries += [(str(h.get("summary", "")), "rejected") for h in request.rejected]
    for note in request.notes:
        said = re.match(r"already tried: v\d+: (.*) \((\w[\w ]*?)[,)]", str(note))
        if said:
            entries.append((said.group(1), None if said.group(2) == "not run"
                            else said.group(2)))
    for summary, status in entries:
        if _TEMPLATE in summary:
            found.setdefault(summary.split(" template", 1)[0], []).append((summary, status))
    return found


def _template(request: AgentRequest) -> Proposal | Failure:
    """A first kernel from the family's template. For a task that names no family the
    family is inferred from the reference, and each failed guess moves to the next. A
    family whose template was proposed and has not failed (correct, or not yet run: a
    search's sibling) gets one variant with every block a notch larger before the next
    family is tried: the likeliest family is worth two starting points, a less likely
    one rarely is."""
    proposed = _templates_tried(request)
    tried = set(proposed)
    families = templates.infer_families(request.task)
    unfit: list[str] = []
    too_big = _whole_array_too_big(request)
    for family in families:
        if family in tried:
            entries = proposed[family]
            failed = all(status not in (None, "correct") for _s, status in entries)
            if not failed and not any(_VARIANT in summary for summary, _s in entries):
                variant = _larger_variant(request, family)
                if variant is not None:
                    return variant
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
            failed_before = sorted(f for f, entries in proposed.items()
                                   if all(status not in (None, "correct")
                                          for _s, status in entries))
            earlier = (f" (earlier guesses failed: {', '.join(failed_before)})"
                       if failed_before else "")
            why = (f"The task declares no family; its reference reads like {article} "
                   f"{family} computation{earlier}. " + why)
        return Proposal("kernel", f"{family}{_TEMPLATE}",
                        rationale=why, source=source, meta={"via": "template"})
    why_not = f"; templates that do not fit: {'; '.join(unfit)}" if unfit else ""
    return Failure("offline agent: every template family failed for this task "
                   f"({', '.join(families)}){why_not}; write a first kernel.py, or use "
                   "Claude (set ANTHROPIC_API_KEY)")


def _larger_variant(request: AgentRequest, family: str) -> Proposal | None:
    """The family's template with every tunable one legal notch larger than the
    template's own choice (at the production shape's dims); None when none can grow."""
    try:
        source, why = templates.write_template(request.task, family)
    except templates.TemplateError:
        return None
    declared = tunables.read(source)
    production = (request.task.production,) if request.task.production else ()
    dims = tuner.tiled_dims(list(declared), (*request.task.shapes, *production))
    space = tuner.search_space(source, dims)
    current = tunables.config_of(source)
    config = {}
    for name, value in current.items():
        larger = [v for v in space.get(name, []) if isinstance(v, int) and isinstance(value, int)
                  and v > value]
        if larger:
            config[name] = min(larger)
    if not config:
        return None
    moves = ", ".join(f"{k} {current[k]} -> {v}" for k, v in config.items())
    return Proposal("kernel", f"{family}{_TEMPLATE}{_VARIANT}",
                    rationale=(f"The {family} template is already a starting point of this "
                               f"search; a second one starts from larger blocks ({moves}): "
                               "fewer grid steps and less HBM re-reading, if it fits VMEM. "
                               + why),
                    source=tunables.apply(source, config), meta={"via": "template"})


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
    if fix is not None and fix.tuning is not None and fix.rule == "vmem":
        fix = _fitting_vmem_fix(request, source, fix)
    if fix is not None:
        if fix.tuning is not None:
            proposal = Proposal("tuning", fix.summary, rationale=fix.rationale,
                                tuning=fix.tuning, meta={"via": "rule", "rule": fix.rule})
        else:
            proposal = Proposal("kernel", fix.summary, rationale=fix.rationale,
                                source=fix.source, meta={"via": "rule", "rule": fix.rule})
        if not _is_rejected(request, proposal):
            return proposal
    # No rule matched: when a correct configuration exists, keep searching from it.
    step = _tuner_step(request)
    error = (result.get("error") or {})
    what = f"{result.get('status', 'failed')}: {error.get('message') or (result.get('correctness') or {}).get('reason') or 'see the evaluation'}"
    if isinstance(step, tuner.Step) and _has_correct(request):
        return Proposal("tuning", step.summary,
                        rationale=f"The current version failed ({_clip(what)}), and no repair "
                                  f"rule yields a configuration not yet measured; the failed one "
                                  f"is now excluded. {step.rationale}",
                        tuning=step.changes, meta=_step_meta(step))
    if not tunables.read(source) and not _has_correct(request):
        template = _template(request)  # a user's kernel that fails and cannot be tuned
        if isinstance(template, Proposal):
            return Proposal(template.kind, template.summary,
                            rationale=(f"The current kernel failed ({_clip(what)}) and no "
                                       "repair rule matches; instead of stopping, here is the "
                                       "offline agent's own kernel for the task. "
                                       + template.rationale),
                            source=template.source, meta=template.meta)
    return Failure(f"offline agent: no rule-based fix for this failure ({_clip(what)}). Revert to "
                   "an earlier version, edit the kernel yourself, or use Claude (set "
                   "ANTHROPIC_API_KEY).")


def _fitting_vmem_fix(request: AgentRequest, source: str, fix: fixes.Fix) -> fixes.Fix | None:
    """A VMEM fix that does not repeat a size already known not to fit: when the one-notch
    shrink is at least as large as a configuration that ran out of VMEM, shrink further
    (the largest block first) to the first configuration neither measured nor known too
    large; None when there is none."""
    current = tunables.config_of(source)
    target = {**current, **(fix.tuning or {})}
    if _known_not_to_fit(request, target) is None:
        return fix
    declared = tunables.read(source)
    aligns = tunables.alignment(source)
    for name, (value, choices) in sorted(declared.items(), key=lambda kv: -(
            kv[1][0] if isinstance(kv[1][0], int) else 0)):
        if not isinstance(value, int):
            continue
        for smaller in sorted((c for c in choices if isinstance(c, int) and c < value
                               and tunables.is_legal(name, c, aligns[name])), reverse=True):
            config = {**current, name: smaller}
            if _known_not_to_fit(request, config) is None and not _measured(
                    request, {name: smaller}):
                known = _known_not_to_fit(request, target)
                return fixes.Fix("vmem", f"shrink {name} {value} -> {smaller} to fit VMEM",
                                 f"{fix.rationale} A one-notch shrink would not fit either "
                                 f"({known}), so {name} goes to {smaller}.",
                                 tuning={name: smaller})
    return None


def _tune(request: AgentRequest, lessons: list[Lesson]) -> Proposal | Failure | Finished:
    source = request.current_source or ""
    if not tunables.read(source):
        made = _make_tunable(request, source)
        if made is not None:
            return made
    step = _tuner_step(request, lessons)
    if isinstance(step, Failure):
        return step
    if step is None:
        grown = _grow_past_choices(request, source)
        if grown is not None:
            return grown
        return Finished(f"offline agent: {CONVERGED}{_best_text(request)}: "
                        f"{_tried_text(request, source)}. Try a structural change (edit, or "
                        "Claude) to go further.")
    hidden = floor_note(_observations(request, source, set(tunables.read(source))))
    rationale = step.rationale + (f" Note:{hidden[1:]}." if hidden else "")
    return Proposal("tuning", step.summary, rationale=rationale, tuning=step.changes,
                    meta=_step_meta(step))


def _step_meta(step: tuner.Step) -> dict[str, Any]:
    """A tuner step's proposal meta: its configuration, and the version it applies to
    (``base``) when that is not the current one, so the change is made to the source its
    title and diff describe."""
    meta: dict[str, Any] = {"via": "tuner", "config": step.config}
    if step.base is not None:
        meta["base"] = step.base
    return meta


def _make_tunable(request: AgentRequest, source: str) -> Proposal | Failure | None:
    """A kernel without TUNABLES (a user's own): declare the block sizes it fixes as
    TUNABLES; where none can be found, propose the offline agent's own template for
    the task instead of giving up. None when that was proposed and rejected already."""
    inferred = tunables.infer(source)
    if inferred is not None:  # a user's own kernel: make its block sizes tunable first
        new_source, choices = inferred
        names = ", ".join(f"{k} (now {tunables.config_of(new_source)[k]})" for k in choices)
        proposal = Proposal(
            "kernel", "declare the kernel's block sizes as TUNABLES",
            rationale=("The kernel declares no TUNABLES, but it fixes block sizes: "
                       f"{names}. This names them as module constants with aligned "
                       "neighbouring choices (TUNABLES, TUNABLE_ALIGN) and changes nothing "
                       "else, so the tuner can size them next."),
            source=new_source, meta={"via": "tuner", "rule": "infer_tunables"})
        if not _is_rejected(request, proposal):
            return proposal
    template = _template(request)
    if isinstance(template, Proposal):
        found = "its block sizes were declined" if inferred is not None else \
            ("no block sizes could be found in it (no BlockSpec shape literals, block-size "
             "constants, tuples, dicts or parameter defaults)")
        return Proposal(template.kind, template.summary,
                        rationale=(f"The current kernel declares no TUNABLES and {found}, so "
                                   "there is nothing of it to tune. Instead, here is the "
                                   "offline agent's own kernel for the task, which declares "
                                   "its blocks as TUNABLES; the tuner sizes it next, and the "
                                   "best version stays whichever measures best. "
                                   + template.rationale),
                        source=template.source, meta=template.meta)
    return template


def _grow_past_choices(request: AgentRequest, source: str) -> Proposal | None:
    """A fresh diagnosis of the best version asks for larger blocks, and every larger
    declared choice is measured: widen the declared choices (twice and four times the
    largest, aligned, while they still tile the task's dims) and move there."""
    diagnosis = request.diagnosis or {}
    if diagnosis.get("kind") not in ("per_step_overhead", "memory_bound"):
        return None
    declared = tunables.read(source)
    obs = _observations(request, source, set(declared))
    best = obs.best()
    if best is None or (diagnosis.get("version") is not None
                        and obs.version.get(best[0]) not in (None, diagnosis.get("version"))):
        return None
    dims = tuner.tiled_dims(list(declared), request.task.shapes)
    aligns = tunables.alignment(source)
    constraints = _constraints(request, list(declared), tunables.config_of(source))
    base = dict(best[0])
    wider: dict[str, list[Any]] = {}
    target: dict[str, Any] = {}
    for name, (_current, choices) in declared.items():
        numeric = [c for c in choices if isinstance(c, int) and not isinstance(c, bool)]
        if not numeric or base.get(name) != max(numeric):
            continue
        top = max(numeric)
        limit = max(dims.get(name, ()) or (top * 4,))
        extra = [v for v in (top * 2, top * 4) if v <= limit
                 and tunables.is_legal(name, v, aligns.get(name, 1), dims.get(name, ()))
                 and tuner.allowed(v, constraints.get(name, []))]
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
    return None if _is_rejected(request, proposal) else proposal


def _tuner_step(request: AgentRequest, lessons: list[Lesson] | None = None
                ) -> tuner.Step | Failure | None:
    source = request.current_source or ""
    declared = tunables.read(source)
    if not declared:
        return Failure("offline agent: the kernel declares no TUNABLES and none of its block "
                       "sizes could be found, so there is nothing to tune. Declare block "
                       "sizes as module constants plus `TUNABLES = {\"NAME\": [choices]}` "
                       "(see docs/INTERFACES.md, Tunables).")
    obs = _observations(request, source, set(declared))
    # Blocks are chosen for the production shape (the size that is ranked) and must be
    # legal at the check shapes too (where correctness is checked).
    production = (request.task.production,) if request.task.production else ()
    dims = tuner.tiled_dims(list(declared), (*request.task.shapes, *production))
    constraints = _constraints(request, list(declared), tunables.config_of(source))
    # What fits VMEM at the production shape, scaled from the compiler's own figure there.
    vmem = tuner.vmem_model(request.history, request.last_eval, request.current_source,
                            tuner.tiled_dims(list(declared), production), request.chip) \
        if production else None
    return (_seed(source, obs, lessons or [], dims)
            or tuner.diagnosed_step(source, obs, dims, request.diagnosis, constraints, vmem)
            or tuner.next_step(source, obs, dims, constraints, vmem))


def _observations(request: AgentRequest, source: str, names: set[str]) -> tuner.Observations:
    """What was measured, plus every configuration the person rejected (as infinitely
    slow: the search never proposes it again)."""
    obs = tuner.observations_from(request.history, source, request.last_eval, names,
                                  request.current_version)
    for entry in request.rejected:
        config = entry.get("config")
        if isinstance(config, dict) and set(config) == names:
            obs.add(config, "rejected", None, None)
    return obs


def _tried_text(request: AgentRequest, source: str) -> str:
    """What happened to the configurations around the best, as it happened: measured,
    failed, rejected by the person (never "measured" for one that never ran)."""
    names = set(tunables.read(source))
    rejected = {tuner.config_key(e["config"]) for e in request.rejected
                if isinstance(e.get("config"), dict) and set(e["config"]) == names}
    measured = tuner.observations_from(request.history, source, request.last_eval, names,
                                       request.current_version)
    ran = {k for k, v in measured.score.items() if v != tuner.FAILED}
    failed = {k for k, v in measured.score.items() if v == tuner.FAILED} - rejected
    parts = [f"{len(ran)} measured"]
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
    return tuner.constraints_from_notes(notes, names, current)


def _is_rejected(request: AgentRequest, proposal: Proposal) -> bool:
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
    if top is None or top.basis != "memory_floor" or top.value is None:
        return ""
    tied = [(k, r) for k, r in obs.rank.items() if r is not None and r.basis == "memory_floor"
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
    ranked = [(rank, h) for h in request.history if h.get("status") == "correct"
              and (rank := Rank.from_json(h.get("rank"))) is not None and rank.ranked]
    if ranked:  # the one ordering (Rank.key), earliest on ties
        rank, top = max(ranked, key=lambda pair: pair[0].key())
        steps.append(f"Best so far: v{top.get('version')}, {rank.words()}.")
    heard = _heard(request) if request.user_message else None
    summary = "offline plan: template, rule-based fixes, tuning"
    if request.user_message:
        asked = _as_asked(request) if request.current_source is not None else None
        if isinstance(asked, Proposal):
            steps.insert(0, f"0. First, as you asked: {asked.summary.removesuffix(' (as you asked)')}.")
            summary = f"offline plan: {asked.summary}, then tuning"
        took = heard.took() if heard else ""
        said = f"You asked: “{words_clip(request.user_message)}”. " + (
            f"Taken: {took}." if took else "Nothing in it is something the offline agent's "
            "rules can do (it reads block sizes, \"larger\"/\"smaller\" and techniques).")
        if heard and heard.techniques:
            said += (" The offline agent has no rule for " + ", ".join(heard.techniques)
                     + ": that is a change of the kernel's structure; edit the kernel yourself "
                     "or use Claude for it. Its own steps follow.")
            summary = f"offline plan: no rule for {', '.join(heard.techniques)}; tuning"
        steps.insert(0, said)
    plan = "\n".join(steps)
    return Proposal("plan", summary, plan=plan, rationale=plan, meta={"via": "offline"})


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
    rank = ranking(result) if result else None
    if rank is not None and rank.ranked:
        # The number that ranks versions, worded as kernels.judge.result says it (Rank.words):
        # an estimate names its chip (and shape), a measurement says so; beside a
        # compiler figure, how far such figures hold.
        trust = rank.trust_words()
        lines.append(f"- ranking number: {rank.words()}"
                     + (f" (such figures, measured: {trust})" if trust else ""))
    if timing.get("median_ms") is not None:
        what = ("host simulation time (the CPU interpreting the kernel: not TPU "
                "performance, never a speedup)" if timing.get("mode") == "tpu-interpret"
                else "measured time")
        lines.append(f"- {what}: median {timing['median_ms']:.4g} ms "
                     f"over {timing.get('iters', '?')} iterations")
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
