"""The steps the two schedulers take: one action type each.

``ControllerAction`` is what the controller's planner (``sessions.control.next_action``) and its
commands hand the job loop: ``ask``, ``auto_decide``, ``apply``, ``run`` and
``profile`` are jobs; ``checkout``, ``stop`` and ``own_edit_failed`` are the planner's
decisions the loop carries out on the way (a ``kernel.checkout``, autonomous mode's
stop, the notice about the person's own failed edit).

``SearchAction`` is what the search's planner (``sessions.search.planner``) lists: one
small type per step (``Evaluate``, ``ProfileNode``, ``Decide``, ``ApplyProposal``,
``Expand``, ``Select``), each with the fields it needs and a ``key`` that identifies it
among the actions in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

SlotKey = tuple[int, int, int | None, int]  # lineage, round, parent version, slot


class _Keyed:
    """``key``: the action's kind and the fields (``keyed_by``) that identify it among
    the actions in flight."""

    kind: ClassVar[str]
    keyed_by: ClassVar[tuple[str, ...]]

    @property
    def key(self) -> str:
        return ":".join([self.kind, *(str(getattr(self, name)) for name in self.keyed_by)])


# -- the controller -----------------------------------------------------------------------

ControllerKind = Literal["ask", "auto_decide", "apply", "run", "profile",  # jobs
                         "checkout", "stop", "own_edit_failed"]  # the planner's decisions

# What the loop does without announcing a job (``controller.busy``): it carries them out
# on the way to the next job.
DECISIONS: frozenset[str] = frozenset({"checkout", "stop", "own_edit_failed"})


@dataclass(frozen=True)
class ControllerAction:
    """One step of the controller's job loop."""

    kind: ControllerKind
    version: int | None = None  # run, profile, checkout, own_edit_failed; ask: about it
    proposal: str | None = None  # auto_decide, apply
    role: str = "tune"  # ask: implement, plan, tune, fix, analyze
    message: str | None = None  # ask: the person's words for the agent
    by: str = "user"  # run, profile: who asked (user, auto)
    reason: str | None = None  # stop: why autonomous mode stops

    @property
    def job(self) -> str:
        """What the controller shows as busy: agent, run, profile or step."""
        return {"ask": "agent", "run": "run", "profile": "profile"}.get(self.kind, "step")


def ask(role: str, message: str | None = None, version: int | None = None
        ) -> ControllerAction:
    return ControllerAction("ask", role=role, message=message, version=version)


# -- the search ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluate(_Keyed):
    """Evaluate a search node that has no result yet."""

    version: int
    kind: ClassVar[Literal["evaluate"]] = "evaluate"
    keyed_by: ClassVar[tuple[str, ...]] = ("version",)


@dataclass(frozen=True)
class ProfileNode(_Keyed):
    """Profile a node the planner found due (``plan.profile_due``)."""

    version: int
    kind: ClassVar[Literal["profile"]] = "profile"
    keyed_by: ClassVar[tuple[str, ...]] = ("version",)


@dataclass(frozen=True)
class Decide(_Keyed):
    """Decide a proposal an interruption left undecided."""

    proposal: str
    slot: SlotKey
    kind: ClassVar[Literal["decide"]] = "decide"
    keyed_by: ClassVar[tuple[str, ...]] = ("proposal",)


@dataclass(frozen=True)
class ApplyProposal(_Keyed):
    """Apply a proposal an interruption left approved but without its version."""

    proposal: str
    slot: SlotKey
    kind: ClassVar[Literal["apply"]] = "apply"
    keyed_by: ClassVar[tuple[str, ...]] = ("proposal",)


@dataclass(frozen=True)
class Expand(_Keyed):
    """Fill a slot with a child: the agent's (``role``) or the search's own tuning step."""

    slot: SlotKey
    role: str = "tune"  # implement, tune, fix
    proposer: str = "agent"  # agent | tuning
    kind: ClassVar[Literal["expand"]] = "expand"
    keyed_by: ClassVar[tuple[str, ...]] = ("slot",)


@dataclass(frozen=True)
class Select(_Keyed):
    """Select a lineage's beam for a round."""

    lineage: int
    round: int
    kind: ClassVar[Literal["select"]] = "select"
    keyed_by: ClassVar[tuple[str, ...]] = ("lineage", "round")


SearchAction = Evaluate | ProfileNode | Decide | ApplyProposal | Expand | Select
