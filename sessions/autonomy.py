"""Autonomous mode's limits: budgets, stop rules, and the auto-approver's judgement.

Budgets count what autonomous mode has spent since it last began (a switch to auto
starts a fresh allowance): iterations (new kernel versions), tokens (input, cache and
output), cost in USD, and wall time. Stop rules: no better best (``Rank.key``) in K
consecutive evaluations, and a target speedup reached (by a measured speedup or the TPU
compiler's estimated one: a roofline bound or a host simulation ratio never reaches
it). Each check is a pure function of the folded state, so a resumed session stops for
the same reasons a live one would.
``should_profile`` says when autonomous mode profiles a version (each new best, and at
most every N evaluations otherwise) so that a diagnosis reaches the next request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tilewright.agents.config import Budgets, Config, ControllerConfig, coerce
from tilewright.sessions.state import SessionState

__all__ = ["STOP_REASONS", "TARGET_SOURCES", "Budgets", "ControllerSettings",
           "agent_repeating", "budget_exhausted", "duplicate_of", "should_profile",
           "stop_rule", "stop_words", "target_reached"]

# ``auto.stop`` reasons in words, for every front end (TUI, auto, replay, reports).
STOP_REASONS = {
    "budget:iterations": "its iteration budget is used up",
    "budget:tokens": "its token budget is used up",
    "budget:cost": "its cost budget is used up",
    "budget:wall": "its time budget is used up",
    "budget": "a budget is used up",
    "no_improvement": "no better kernel came in a while",
    "target_reached": "the best kernel's speedup (measured, or the TPU compiler's "
                      "estimate) reached the target",
    "agent_finished": "the agent has nothing more to try",
    "agent_failed": "the agent could not propose anything",
    "agent_repeating": "the agent kept proposing kernels already measured",
    "task_error": "the task itself failed, not the kernel (see Problems): fix the task "
                  "or make it smaller with --set",
    "interrupted": "the app stopped while it ran",
    "disconnect": "the connection to the terminal dropped",
    "terminated": "the app was told to stop (SIGTERM)",
    "user": "you switched it off",
}


def stop_words(reason: str | None, settings: ControllerSettings | None = None) -> str:
    """A stop reason as a person says it, with the limit where one applies:
    "its iteration budget (8) is used up", "no better kernel in 5 evaluations"."""
    reason = str(reason or "")
    if settings is not None:
        b = settings.budgets
        limits = {"budget:iterations": b.iterations, "budget:tokens": b.tokens,
                  "budget:cost": b.cost_usd, "budget:wall": b.wall_s}
        if limits.get(reason) is not None:
            unit = {"budget:cost": "$", "budget:wall": "s"}.get(reason, "")
            limit = limits[reason]
            shown = f"${limit:g}" if unit == "$" else f"{limit:g}{unit}"
            return STOP_REASONS[reason].replace("budget is", f"budget ({shown}) is")
        if reason == "no_improvement" and settings.stop_after_no_improvement:
            return f"no better kernel in {settings.stop_after_no_improvement} evaluations"
        if reason == "target_reached" and settings.target_speedup is not None:
            return STOP_REASONS[reason].replace(
                "the target", f"the target ({settings.target_speedup:g}x)")
    return STOP_REASONS.get(reason) or STOP_REASONS.get(reason.split(":")[0]) or \
        reason.replace("_", " ")


class ControllerSettings(ControllerConfig):
    """``[controller]`` with ``[budgets]``; every default is ``agents.config``'s."""

    budgets: Budgets = Budgets()

    @classmethod
    def from_config(cls, config: Config | Mapping[str, Any] | None) -> ControllerSettings:
        """From the validated config (a plain dict is validated the same way)."""
        c = coerce(config)
        return cls(budgets=c.budgets, **vars(c.controller))


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


# The sources whose value is a speedup a target can be reached by: measured on a TPU,
# or the TPU compiler's estimate against the XLA reference's. A roofline rank is only a
# lower bound, and a host simulation ratio says nothing about a TPU.
TARGET_SOURCES = ("device_time", "tpu_estimate")


def target_reached(state: SessionState, target: float | None) -> bool:
    """Whether the best version's speedup reaches ``target`` (``TARGET_SOURCES`` only)."""
    best = state.best_rank
    return (target is not None and best is not None and best.source in TARGET_SOURCES
            and best.value is not None and best.value >= target)


def stop_rule(state: SessionState, settings: ControllerSettings) -> str | None:
    """The ``auto.stop`` reason when a stop rule fires after an evaluation; the
    "no improvement" count is the fold's (``Rank.key``)."""
    if target_reached(state, settings.target_speedup):
        return "target_reached"
    k = settings.stop_after_no_improvement
    if k is not None and k > 0 and state.evals_without_improvement >= k:
        return "no_improvement"
    return None


# Proposals in a row that autonomous mode rejects as a measured version's program, in
# multiples of ``max_agent_failures``, before it stops as "agent_repeating": each costs a
# trace, not an evaluation, and tells the tuner something.
SAME_PROGRAM_ALLOWANCE = 4


def agent_repeating(state: SessionState, settings: ControllerSettings) -> bool:
    """Whether the auto-approver has turned down enough proposals in a row to stop."""
    return (state.auto_rejections >= settings.max_agent_failures
            or state.same_program_rejections >= SAME_PROGRAM_ALLOWANCE
            * settings.max_agent_failures)


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
