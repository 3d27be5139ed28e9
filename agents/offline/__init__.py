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

from agents.base import (
    AgentEvent,
    AgentRequest,
    Failure,
    Notice,
    Proposal,
    ProposalReady,
    TextDelta,
)
from agents.offline import fixes, templates, tuner
from kernels import tunables


class OfflineAgent:
    name = "offline"
    label = "offline agent"

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = config or {}

    async def propose(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        if request.user_message:
            yield Notice("The offline agent does not read chat messages; it follows its rules "
                         "(template, fixes, tuning). Set ANTHROPIC_API_KEY to talk to Claude.")
        outcome = decide(request)
        if isinstance(outcome, Failure):
            yield outcome
            return
        text = outcome.rationale or outcome.plan or outcome.summary
        for piece in re.split(r"(?<=[.:;])\s+", text):
            if piece:
                yield TextDelta(piece + " ")
        yield ProposalReady(outcome, text=text)


def decide(request: AgentRequest) -> Proposal | Failure:
    """The offline agent's whole policy, as a pure function of the request."""
    try:
        return _decide(request)
    except (templates.TemplateError, tunables.TunablesError, SyntaxError) as exc:
        return Failure(f"offline agent: {exc}")


def _decide(request: AgentRequest) -> Proposal | Failure:
    if request.role in ("plan", "analyze"):
        return _plan(request)
    if request.current_source is None:
        source, why = templates.write_template(request.task)
        return Proposal("kernel", f"{request.task.family} template from the reference",
                        rationale=why, source=source, meta={"via": "template"})
    failed = bool(request.last_eval) and request.last_eval.get("status") != "correct"
    if request.role == "fix" or failed:
        return _fix(request)
    return _tune(request)


def _fix(request: AgentRequest) -> Proposal | Failure:
    source = request.current_source or ""
    result = request.last_eval or {}
    fix = fixes.suggest_fix(source, result)
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
                                  f"rule matches; its configuration is now excluded. {step.rationale}",
                        tuning=step.changes, meta={"via": "tuner", "config": step.config})
    return Failure(f"offline agent: no rule-based fix for this failure ({_clip(what)}). Revert to "
                   "an earlier version, edit the kernel yourself, or use Claude (set "
                   "ANTHROPIC_API_KEY).")


def _tune(request: AgentRequest) -> Proposal | Failure:
    step = _tuner_step(request)
    if isinstance(step, Failure):
        return step
    if step is None:
        return Failure(f"offline agent: tuning converged{_best_text(request)}: every neighbour "
                       "of the best configuration has been measured. Try a structural change "
                       "(edit, or Claude) to go further.")
    return Proposal("tuning", step.summary, rationale=step.rationale, tuning=step.changes,
                    meta={"via": "tuner", "config": step.config})


def _tuner_step(request: AgentRequest) -> tuner.Step | Failure | None:
    source = request.current_source or ""
    declared = tunables.read(source)
    if not declared:
        return Failure("offline agent: the kernel declares no TUNABLES, so there is nothing to "
                       "tune. Declare block sizes as module constants plus "
                       "`TUNABLES = {\"NAME\": [choices]}` (see kernels/tunables.py).")
    obs = tuner.observations_from(request.history, source, request.last_eval, set(declared),
                                  request.current_version)
    return tuner.next_step(source, obs)


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


def _clip(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "…"
