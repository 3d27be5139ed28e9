"""Who decides a proposal: one typed protocol for the person, the auto-approver and the
search's rules.

``SessionCore.decide(pid, policy)`` asks a policy and records its ``Decision`` as the
``user.decision`` event (the only way a proposal becomes a kernel version). A policy
answers with:

- a ``Decision`` (approve, reject or edit, with who made it: ``user`` or ``auto``);
- a ``Halt`` (autonomous mode stops instead of deciding: a budget is used up);
- ``None`` (nobody decides now: the proposal waits in the log, for the person's
  command; a step-mode session survives a restart that way).

``PersonApproval`` is the person's decision as a Future the front end resolves (as the
Agent SDK's ``can_use_tool`` callback or Toad's permission Future work); ``AutoApproval``
is autonomous mode's rules; ``SearchRules`` are the search's, handing what they do not
settle to the person or approving it. Each is a pure function of the folded state and
the proposal, plus the Future for the person: nothing here writes an event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from tilewright.sessions.autonomy import ControllerSettings, budget_exhausted, duplicate_of
from tilewright.sessions.state import ProposalInfo, SessionState

# ``sessions.core.same_program.SameProgram``: the correct version a proposal already is at
# the production shape, or None
SameAs = Callable[[SessionState, ProposalInfo], Awaitable[int | None]]

if TYPE_CHECKING:
    from tilewright.sessions.search.graph import SearchState

__all__ = ["ApprovalPolicy", "AutoApproval", "Decision", "Halt", "PersonApproval",
           "SearchRules", "Verdict"]


@dataclass(frozen=True)
class Decision:
    """What was decided about one proposal, and by whom (``user`` or ``auto``)."""

    decision: Literal["approve", "reject", "edit"]
    by: Literal["user", "auto"]
    note: str | None = None
    source: str | None = None  # an edit's source (the person's own kernel)
    plan: str | None = None  # a plan approved in the person's own wording
    # A rejection because the proposal is that correct version's program at the production
    # shape (``sessions.core.same_program``): measured already, its number stands for it.
    same_as: int | None = None


@dataclass(frozen=True)
class Halt:
    """Autonomous mode stops instead of deciding (``auto.stop`` with this reason)."""

    reason: str


Verdict = Decision | Halt | None


class ApprovalPolicy(Protocol):
    async def decide(self, state: SessionState, proposal: ProposalInfo) -> Verdict:
        """The verdict on ``proposal`` given the folded state (see the module doc)."""
        ...


class PersonApproval:
    """The person decides: ``decide`` waits on a Future that ``resolve`` (the front
    end's approve/reject) or ``withdraw`` (a pruned branch) completes. ``on_wait`` is
    told when a proposal starts waiting, so a scheduler can wake its observers."""

    def __init__(self, on_wait: Callable[[str], None] | None = None) -> None:
        self._waiting: dict[str, asyncio.Future[Decision]] = {}
        self._on_wait = on_wait

    async def decide(self, state: SessionState, proposal: ProposalInfo) -> Decision:
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._waiting[proposal.id] = future
        if self._on_wait is not None:
            self._on_wait(proposal.id)
        try:
            return await future
        finally:
            self._waiting.pop(proposal.id, None)

    def awaiting(self) -> list[str]:
        """Proposals waiting for the person, oldest first."""
        return [pid for pid, future in self._waiting.items() if not future.done()]

    def resolve(self, pid: str, decision: Decision) -> None:
        future = self._waiting.get(pid)
        if future is None or future.done():
            raise ValueError(f"{pid} is not awaiting a decision")
        future.set_result(decision)

    def withdraw(self, pid: str, note: str) -> None:
        """Reject a waiting proposal on the person's behalf (its branch was pruned)."""
        future = self._waiting.get(pid)
        if future is not None and not future.done():
            future.set_result(Decision("reject", "user", note))


class AutoApproval:
    """Autonomous mode's approver: stop on a used-up budget, reject a kernel identical to
    one already measured, or the same program at the production shape as a correct one
    (``same_as``; re-running it measures nothing new), approve the rest."""

    def __init__(self, settings: ControllerSettings, now: Callable[[], float],
                 same_as: SameAs | None = None) -> None:
        self.settings = settings
        self._now = now
        self.same_as = same_as

    async def decide(self, state: SessionState, proposal: ProposalInfo) -> Verdict:
        if state.mode != "auto" or state.pending != proposal.id:
            return None  # switched to step mode meanwhile: the person decides
        reason = budget_exhausted(state, self.settings, self._now())
        if reason is not None:
            return Halt(reason)
        same = duplicate_of(state, proposal.source_blob)
        if same is not None:
            return Decision("reject", "auto", f"identical to v{same}, which was already "
                                              "measured; propose something different")
        found = await _same_program(self.same_as, state, proposal)
        if state.mode != "auto" or state.pending != proposal.id:
            return None  # switched to step mode while the judge was asked
        return found or Decision("approve", "auto")


async def _same_program(same_as: SameAs | None, state: SessionState,
                        proposal: ProposalInfo) -> Decision | None:
    """The rejection of a proposal that is a correct version's production program."""
    if same_as is None:
        return None
    from tilewright.sessions.core.same_program import same_program_note

    number = await same_as(state, proposal)
    return None if number is None else Decision("reject", "auto", same_program_note(number),
                                                same_as=number)


class SearchRules:
    """The search's approver: a child of a pruned branch, a duplicate and a proposal
    without source are rejected by rule; the rest is approved (``approval = "auto"``) or
    handed to ``person`` (human-in-the-loop search)."""

    def __init__(self, search: SearchState, person: ApprovalPolicy | None = None,
                 same_as: SameAs | None = None) -> None:
        self.search = search
        self.person = person or PersonApproval()
        self.same_as = same_as

    async def decide(self, state: SessionState, proposal: ProposalInfo) -> Verdict:
        base = proposal.base_version
        nodes = self.search.nodes
        if base is not None and base in nodes and nodes[base].pruned:
            return Decision("reject", "auto", f"branch v{base} was pruned")
        same = duplicate_of(state, proposal.source_blob)
        if same is not None:
            return Decision("reject", "auto", f"identical to v{same}; propose something "
                                              "different")
        if not proposal.source_blob:
            return Decision("reject", "auto", "the proposal carries no kernel source")
        found = await _same_program(self.same_as, state, proposal)
        if found is not None:
            return found
        config = self.search.config
        if config is None or config.approval == "auto":
            return Decision("approve", "auto")
        return await self.person.decide(state, proposal)
