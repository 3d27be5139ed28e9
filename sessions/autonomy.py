"""Autonomous mode's limits: budgets, stop rules, and the auto-approver's judgement.

Budgets count what autonomous mode has spent since it last began (a switch to auto
starts a fresh allowance): iterations (new kernel versions), tokens (input, cache and
output), cost in USD, and wall time. Stop rules: no improvement of the best speedup in
K consecutive evaluations, and a target speedup reached. Each check is a pure function
of the folded state, so a resumed session stops for the same reasons a live one would.
``should_profile`` says when autonomous mode profiles a version (each new best, and at
most every N evaluations otherwise) so that a diagnosis reaches the next request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sessions.state import SessionState


@dataclass(frozen=True)
class Budgets:
    iterations: int | None = 20
    tokens: int | None = 400_000
    cost_usd: float | None = 5.0
    wall_s: float | None = 3600.0


@dataclass(frozen=True)
class ControllerSettings:
    budgets: Budgets = Budgets()
    auto_fix_attempts: int = 2  # step mode: failures sent back to the fixer unasked
    stop_after_no_improvement: int | None = 5
    target_speedup: float | None = None
    propose_after_run: bool = True  # step mode: ask for the next proposal after a run
    max_agent_failures: int = 3  # auto mode: consecutive agent failures before stopping
    # Auto mode profiles each new best version, and any correct one once this many
    # evaluations passed without a profile (None: only new bests); each profile gives a
    # diagnosis that goes into the next request.
    profile_best: bool = True
    profile_every: int | None = 5
    open_with_plan: bool = False  # step mode: a new session opens by asking for a plan
    record_lessons: bool = True  # write a lesson (agents.memory) when the session ends

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> ControllerSettings:
        """Build from tui.settings' dict (``[budgets]`` and ``[controller]`` sections)."""
        config = config or {}
        b = config.get("budgets") or {}
        c = config.get("controller") or {}
        defaults = cls()
        budgets = Budgets(
            iterations=_opt_int(b.get("iterations", defaults.budgets.iterations)),
            tokens=_opt_int(b.get("tokens", defaults.budgets.tokens)),
            cost_usd=_opt_float(b.get("cost_usd", defaults.budgets.cost_usd)),
            wall_s=_opt_float(b.get("wall_s", defaults.budgets.wall_s)))
        return cls(
            budgets=budgets,
            auto_fix_attempts=int(c.get("auto_fix_attempts", defaults.auto_fix_attempts)),
            stop_after_no_improvement=_opt_int(
                c.get("stop_after_no_improvement", defaults.stop_after_no_improvement)),
            target_speedup=_opt_float(c.get("target_speedup", defaults.target_speedup)),
            propose_after_run=bool(c.get("propose_after_run", defaults.propose_after_run)),
            max_agent_failures=int(c.get("max_agent_failures", defaults.max_agent_failures)),
            profile_best=bool(c.get("profile_best", defaults.profile_best)),
            profile_every=_opt_int(c.get("profile_every", defaults.profile_every)),
            open_with_plan=bool(c.get("open_with_plan", defaults.open_with_plan)),
            record_lessons=bool(c.get("record_lessons", defaults.record_lessons)))


def _opt_int(value: Any) -> int | None:
    return None if value is None or value is False else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None or value is False else float(value)


def budget_exhausted(state: SessionState, settings: ControllerSettings,
                     now_t: float) -> str | None:
    """The ``auto.stop`` reason for the first budget autonomous mode has used up."""
    b, spent = settings.budgets, state.auto_spent
    if b.iterations is not None and spent.iterations >= b.iterations:
        return "budget:iterations"
    if b.tokens is not None and spent.tokens >= b.tokens:
        return "budget:tokens"
    if b.cost_usd is not None and spent.cost_usd >= b.cost_usd:
        return "budget:cost"
    if b.wall_s is not None and state.auto_since_t is not None \
            and now_t - state.auto_since_t >= b.wall_s:
        return "budget:wall"
    return None


def stop_rule(state: SessionState, settings: ControllerSettings) -> str | None:
    """The ``auto.stop`` reason when a stop rule fires after an evaluation."""
    best = state.best_speedup
    if settings.target_speedup is not None and best is not None \
            and best >= settings.target_speedup:
        return "target_reached"
    k = settings.stop_after_no_improvement
    if k is not None and k > 0 and state.evals_without_improvement >= k:
        return "no_improvement"
    return None


def duplicate_of(state: SessionState, source_blob: str | None) -> int | None:
    """The version whose source is identical to a proposal's: the auto-approver rejects
    such proposals instead of re-running a kernel it already measured."""
    if not source_blob:
        return None
    for version in state.versions.values():
        if version.source_blob == source_blob:
            return version.number
    return None


def should_profile(state: SessionState, number: int, settings: ControllerSettings) -> bool:
    """Whether autonomous mode profiles ``number`` after its evaluation: a correct version
    not yet profiled that is the new best, or the first after ``profile_every``
    evaluations without a profile."""
    version = state.versions.get(number)
    if version is None or not version.correct or version.profile_blob:
        return False
    if settings.profile_best and state.best == number:
        return True
    every = settings.profile_every
    if not every or every <= 0:
        return False
    evals = 0
    for run in reversed(list(state.runs.values())):
        if run.kind == "profile":
            break
        if run.kind == "eval" and not run.cancelled:
            evals += 1
    return evals >= every
