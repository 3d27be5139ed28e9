"""The offline agent: proposes without a model and without a key.

It writes a first kernel from a template for the task's family (``templates``), repairs
common failures with rules (``fixes``), and tunes the kernel's declared TUNABLES one
change at a time (``tuner``; its steps as proposals in ``tuning``), remembering what it
measured through the request's history. It streams its rationale as text like any agent
and ends with one ``ProposalReady`` or a ``Failure`` that says what it cannot do and what
to do instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from typing import Any

from tilewright.agents import base as events  # what ``propose`` streams
from tilewright.agents.base import AgentRequest, Answer, Failure, Finished, Proposal
from tilewright.agents.memory import Lesson
from tilewright.agents.offline import fixes, templates, tuner, words
from tilewright.agents.offline.tuning import (
    best_text,
    floor_note,
    grow_past_choices,
    is_rejected,
    lessons_for,
    observations,
    remember_convergence,
    step_meta,
    tried_text,
    tuner_step,
    was_measured,
)
from tilewright.kernels.judge.rank import best_of, ranking
from tilewright.kernels.source import inferred, tunables

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
        lessons = lessons_for(request) if self.remember else []
        outcome = decide(request, lessons)
        if isinstance(outcome, Answer):
            for piece in re.split(r"(?<=\n)", outcome.text):
                if piece:
                    yield events.TextDelta(piece)
            yield outcome
            return
        if isinstance(outcome, Failure | Finished):
            if self.remember and isinstance(outcome, Finished):
                stored = remember_convergence(request)
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
    obs = observations(request, source, set(declared))
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
        measured = entry.tunables
        if measured is None or set(measured) != set(config):
            continue
        numbers = entry.numbers
        text = " ".join(str(x) for x in (numbers.get("tpu_message"), entry.summary) if x)
        failed = entry.status != "correct" or numbers.get("compile") == "error"
        if not failed or not fixes._VMEM_MSG.search(text):
            continue
        if all(not isinstance(v, int) or not isinstance(measured[k], int) or v >= measured[k]
               for k, v in config.items()):
            return f"v{entry.version} with " + " ".join(
                f"{k}={v}" for k, v in measured.items()) + " did not"
    return None


_TEMPLATE = " template from the reference"
_VARIANT = ", larger blocks"


def _templates_tried(request: AgentRequest) -> dict[str, list[tuple[str, str | None]]]:
    """Family -> [(summary, status)] of the template versions proposed so far: evaluated
    ones (the history, with their status), rejected ones, and siblings a search proposed
    beside this request ("already tried: v2: matmul template ... (not run)")."""
    found: dict[str, list[tuple[str, str | None]]] = {}
    entries = [(h.summary, h.status) for h in request.history]
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
    one rarely is. Once a family the reference suggests has a kernel that has not
    failed (correct, or not yet run), the families it does not suggest (listed after the
    fallback: a convolution's tail in the elementwise template leaves the convolution to
    XLA, never ranked) are no starting point worth a version beside it."""
    proposed = _templates_tried(request)
    tried = set(proposed)
    families = templates.infer_families(request.task)
    likely = families[:families.index(templates.FALLBACK)] \
        if templates.FALLBACK in families else families
    settled = next((f for f in likely if any(status in (None, "correct")
                                              for _s, status in proposed.get(f, []))), None)
    unfit: list[str] = []
    too_big = _whole_array_too_big(request)
    for family in families:
        if settled and family not in likely and family != templates.FALLBACK:
            return Failure(f"offline agent: the {settled} template is this task's starting "
                           "point (correct or not yet run) and no other family fits its "
                           "reference; tune it instead", retryable=False)
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
    """The family's template with every block one legal notch larger than the
    template's own choice (at the production shape's dims); None when none can grow. A
    switch stays as written (True is no larger block than False: MaxKernel's 29k got
    its SPLIT_COLS flipped here with its blocks, and the tuner took the switch for
    measured)."""
    try:
        source, why = templates.write_template(request.task, family)
    except templates.TemplateError:
        return None
    declared = tunables.read(source)
    production = (request.task.production,) if request.task.production else ()
    dims = tuner.tiled_dims(list(declared), (*request.task.shapes, *production))
    space = tuner.search_space(source, dims)
    current = tunables.config_of(source)
    switches = tunables.switches(source)
    config = {}
    for name, value in current.items():
        larger = [v for v in space.get(name, []) if type(v) is int and type(value) is int
                  and v > value and name not in switches]
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


# Bytes per element of the dtypes a task's arrays are named by (the brief's and the eval
# JSON's spellings)
_ITEM_BYTES = {"f32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "f16": 2, "float16": 2,
               "i32": 4, "int32": 4, "u32": 4, "uint32": 4, "i8": 1, "int8": 1, "u8": 1,
               "uint8": 1, "f64": 8, "float64": 8, "i64": 8, "int64": 8, "bool": 1,
               "i16": 2, "int16": 2}


def _whole_array_too_big(request: AgentRequest) -> str | None:
    """Why the whole-array fallback cannot work at the production shape: its inputs exceed
    the scoped VMEM there, as the last evaluation measured them, or (before any: a search's
    root candidates) the brief's production arrays exceed a core's VMEM. JAXBench's 8192
    GEMMs spent one of four evaluations on it, refused each time. None when unknown."""
    tpu = (request.last_eval or {}).get("tpu") or {}
    limit = tpu.get("vmem_limit_bytes")
    shapes = tpu.get("input_shapes") or []
    if not limit or not shapes:
        return _arrays_exceed_vmem(request)
    total = 0
    for text in shapes:
        kind, _, dims = str(text).partition("[")
        count = 1
        for d in dims.rstrip("]").split(","):
            count *= int(d) if d.strip().isdigit() else 1
        total += count * _ITEM_BYTES.get(kind, 4)
    if total <= limit:
        return None
    return (f"its inputs alone ({total / 2**20:.0f} MiB at the production shape "
            f"{tpu.get('shape_label') or ''}) exceed the {limit / 2**20:.0f} MiB of scoped VMEM "
            f"a kernel gets on {tpu.get('chip')}")


def _arrays_exceed_vmem(request: AgentRequest) -> str | None:
    """The production arrays' bytes against a whole core's VMEM on the request's chip."""
    from tilewright.profiling.chips import get_chip

    production = request.task.production or {}
    arrays = [*(production.get("inputs") or []), *(production.get("outputs") or [])]
    try:
        chip = get_chip(request.chip) if request.chip else None
        capacity = chip.vmem_bytes if chip is not None and chip.kind == "tpu" else None
        total = sum(math.prod(int(d) for d in shape) * _ITEM_BYTES[str(dtype)]
                    for shape, dtype in arrays)
    except (KeyError, TypeError, ValueError):  # an unknown chip or dtype: nothing known
        return None
    if not arrays or not capacity or total <= capacity:
        return None
    return (f"its arrays ({total / 2**20:.0f} MiB at the production shape) exceed the "
            f"{capacity / 2**20:.0f} MiB of VMEM a {request.chip} core has")


def _fix(request: AgentRequest) -> Proposal | Failure:
    source = request.current_source or ""
    result = request.last_eval or {}
    fix = fixes.suggest_fix(source, result)
    if fix is not None and fix.tuning is not None and was_measured(request, fix.tuning):
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
        if not is_rejected(request, proposal):
            return proposal
    # No rule matched: when a correct configuration exists, keep searching from it.
    step = tuner_step(request)
    error = (result.get("error") or {})
    what = f"{result.get('status', 'failed')}: {error.get('message') or (result.get('correctness') or {}).get('reason') or 'see the evaluation'}"
    if isinstance(step, tuner.Step) and _has_correct(request):
        return Proposal("tuning", step.summary,
                        rationale=f"The current version failed ({_clip(what)}), and no repair "
                                  f"rule yields a configuration not yet measured; the failed one "
                                  f"is now excluded. {step.rationale}",
                        tuning=step.changes, meta=step_meta(step))
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
            if _known_not_to_fit(request, config) is None and not was_measured(
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
    step = tuner_step(request, lessons)
    if isinstance(step, Failure):
        return step
    if step is None:
        grown = grow_past_choices(request, source)
        if grown is not None:
            return grown
        return Finished(f"offline agent: {CONVERGED}{best_text(request)}: "
                        f"{tried_text(request, source)}. Try a structural change (edit, or "
                        "Claude) to go further.")
    hidden = floor_note(observations(request, source, set(tunables.read(source))))
    rationale = step.rationale + (f" Note:{hidden[1:]}." if hidden else "")
    return Proposal("tuning", step.summary, rationale=rationale, tuning=step.changes,
                    meta=step_meta(step))


def _make_tunable(request: AgentRequest, source: str) -> Proposal | Failure | None:
    """A kernel without TUNABLES (a user's own): declare the block sizes it fixes as
    TUNABLES; where none can be found, propose the offline agent's own template for
    the task instead of giving up. None when that was proposed and rejected already."""
    made = inferred.infer(source)
    if made is not None:  # a user's own kernel: make its block sizes tunable first
        new_source, choices = made
        names = ", ".join(f"{k} (now {tunables.config_of(new_source)[k]})" for k in choices)
        proposal = Proposal(
            "kernel", "declare the kernel's block sizes as TUNABLES",
            rationale=("The kernel declares no TUNABLES, but it fixes block sizes: "
                       f"{names}. This names them as module constants with aligned "
                       "neighbouring choices (TUNABLES, TUNABLE_ALIGN) and changes nothing "
                       "else, so the tuner can size them next."),
            source=new_source, meta={"via": "tuner", "rule": "infer_tunables"})
        if not is_rejected(request, proposal):
            return proposal
    template = _template(request)
    if isinstance(template, Proposal):
        found = "its block sizes were declined" if made is not None else \
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


def _has_correct(request: AgentRequest) -> bool:
    return any(h.status == "correct" for h in request.history)


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
    ranked = [h for h in request.history
              if h.status == "correct" and h.rank is not None and h.rank.ranked]
    top = best_of(ranked, lambda h: h.rank)  # the one rule of "best"
    if top is not None and top.rank is not None:
        steps.append(f"Best so far: v{top.version}, {top.rank.words()}.")
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
