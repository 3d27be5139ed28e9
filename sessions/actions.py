"""The steps a session driver takes: one ``Action`` type for the controller and search.

The controller's job loop performs ``ask``, ``auto_decide``, ``apply``, ``run`` and
``profile``; the search driver performs what its planner (``sessions.search.plan``)
lists: ``evaluate``, ``profile``, ``decide``, ``apply``, ``expand``, ``select``,
``finish``. Both read the fields they need; ``key`` identifies a search action among
those in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SlotKey = tuple[int, int, int | None, int]  # lineage, round, parent version, slot

ActionKind = Literal[
    "ask", "auto_decide", "apply", "run", "profile",  # the controller
    "evaluate", "decide", "expand", "select", "finish"]  # search (apply is shared)


@dataclass(frozen=True)
class Action:
    """One step a driver may take now."""

    kind: ActionKind
    key: str = ""  # search: identifies the action among those in flight
    version: int | None = None  # run, profile, evaluate; ask: the version asked about
    proposal: str | None = None  # auto_decide, apply, decide
    slot: SlotKey | None = None  # search: expand, select, decide, apply
    role: str = "tune"  # ask and expand: implement, plan, tune, fix, analyze
    proposer: str = "agent"  # expand: agent | tuning
    reason: str | None = None  # finish
    message: str | None = None  # ask: the person's words for the agent
    by: str = "user"  # run, profile: who asked (user, auto)

    @property
    def job(self) -> str:
        """What the controller shows as busy: agent, run, profile or step."""
        return {"ask": "agent", "run": "run", "profile": "profile"}.get(self.kind, "step")


def ask(role: str, message: str | None = None, version: int | None = None) -> Action:
    return Action("ask", role=role, message=message, version=version)
