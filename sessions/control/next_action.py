"""The controller's planner: a pure function from the folded state to its next step.

``next_action(state, settings, after, now=...)`` says what the controller's job loop
does next, given what it just finished (``after``: a run, a profile, a ``checkout`` or
a ``stop`` it carried out; None when it is idle): apply an approval an interruption
left unapplied, decide or evaluate in autonomous mode, ask the agent, profile, fix, or
stop autonomous mode on a budget or a rule. Like the search's planner
(``sessions.search.planner``) it has no side effects: the ``Controller`` performs what it
returns and folds the events that appends, so a resumed session and a live one take the
same steps from the same events.
"""

from __future__ import annotations

from tilewright.sessions import autonomy
from tilewright.sessions.actions import ControllerAction, ask
from tilewright.sessions.autonomy import ControllerSettings
from tilewright.sessions.control.agent_request import next_role
from tilewright.sessions.state import SessionState

__all__ = ["next_action"]


def next_action(state: SessionState, settings: ControllerSettings,
                after: ControllerAction | None, *, now: float) -> ControllerAction | None:
    """The next step after ``after`` (None: idle), or None when nothing is to be done;
    ``now`` is the log's clock (the wall budget)."""
    follow: ControllerAction | None = None
    if after is not None and after.kind == "run" and after.version is not None:
        follow = _after_eval(state, settings, after.version, now)
    elif after is not None and after.kind == "profile":
        if after.by == "auto" and state.mode == "auto":
            follow = _auto_continue(state, settings, now)  # the diagnosis goes along
    elif after is not None and after.kind == "checkout":
        return ask(next_role(state))  # from the version checked out
    return follow or _idle(state, settings, now)


def _idle(s: SessionState, settings: ControllerSettings, now: float
          ) -> ControllerAction | None:
    """What to do next when nothing is running, read from the folded state."""
    prop = s.unapplied_approval()
    if prop is not None:
        return ControllerAction("apply", proposal=prop.id)
    if s.mode != "auto":
        return None
    if s.pending is not None:
        return ControllerAction("auto_decide", proposal=s.pending)
    if s.current is not None and _needs_eval(s, s.current):
        return ControllerAction("run", version=s.current, by="auto")
    return _auto_continue(s, settings, now)


def _needs_eval(s: SessionState, number: int) -> bool:
    return not any(r.version == number and r.kind == "eval" and not r.interrupted
                   for r in s.runs.values())


def _auto_continue(s: SessionState, settings: ControllerSettings, now: float
                   ) -> ControllerAction:
    """Autonomous mode between steps: stop on a budget or rule, else ask the agent."""
    reason = autonomy.budget_exhausted(s, settings, now)
    if reason is None and s.agent_finished:
        reason = "agent_finished"  # its search is complete: asking again repeats it
    if reason is None and s.agent_failures and (
            s.agent_failures >= settings.max_agent_failures
            or not s.agent_failure_retryable):
        reason = "agent_failed"  # asking again would get the same answer
    if reason is not None:
        return ControllerAction("stop", reason=reason)
    current = s.versions.get(s.current) if s.current is not None else None
    if current is not None and current.failed \
            and s.fix_streak >= max(1, settings.auto_fix_attempts) \
            and s.best is not None and s.best != s.current:
        # Fixing is not converging: go back to the best kernel and improve that.
        return ControllerAction("checkout", version=s.best)
    return ask(next_role(s))


def _after_eval(s: SessionState, settings: ControllerSettings, number: int, now: float
                ) -> ControllerAction | None:
    """What follows the evaluation of ``number``."""
    version = s.versions[number]
    if version.status in (None, "error", "cancelled"):
        return None
    if version.error_kind == "task":
        # The task itself failed (its reference, its inputs, its size under the
        # worker's limits): no kernel can be judged until the task changes, so
        # neither the fixer nor another proposal is asked.
        return ControllerAction("stop", reason="task_error") if s.mode == "auto" else None
    if s.mode == "auto":
        reason = autonomy.stop_rule(s, settings) or autonomy.budget_exhausted(s, settings, now)
        if reason is not None:
            return ControllerAction("stop", reason=reason)
        if autonomy.should_profile(s, number, settings):
            return ControllerAction("profile", version=number, by="auto")
        return _auto_continue(s, settings, now)
    if s.pending is not None or number != s.current:
        return None
    if s.agent_finished:
        return None  # it said it has nothing more to try: asking again repeats that
    if version.failed and version.origin == "user-edit":
        # The person's own edit: theirs to fix, said plainly with the way back (the
        # agent is not asked, and nothing of it is put down to the agent).
        return ControllerAction("own_edit_failed", version=number)
    if version.failed:
        if s.fix_streak < settings.auto_fix_attempts:
            return ask("fix")
        return None  # the user decides: request_proposal("fix"), an edit, a revert
    return ask(next_role(s)) if settings.propose_after_run else None
