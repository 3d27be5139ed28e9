"""Which measured version a proposal already is, where it counts: at the production shape.

A tuning that a kernel's own limits undo (``BLOCK_K 512 -> 2048`` in a kernel that halves
its K block until its blocks fit VMEM) is a new source but not a new program: evaluated,
it measures nothing a version did not. Only tunings are asked about: a new kernel with
the same program can still be a step (it declares its block sizes as TUNABLES, say). The
judge says which program a source is without compiling or running it
(``EvalOptions.identity_only``: the candidate traced at the production shape, the
trace's fingerprint back in seconds), and ``SameProgram`` keeps each source's answer by
the source's hash. The rules of autonomous mode and of the search
(``sessions.core.approval``) reject such a proposal before it spends an evaluation.

Only versions judged ``correct`` are matched: their production program was checked (its
kernels are the ones that ran correct at the check shapes), so the same program there has
the same verdict and the same number. A failed version is not matched: a proposal can
fail differently at the check shapes and still deserves its own evaluation.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from tilewright.kernels.judge.options import EvalOptions
from tilewright.kernels.tasks.task import Task
from tilewright.sessions.state import ProposalInfo, SessionState

if TYPE_CHECKING:
    from tilewright.sessions.evaluator import PoolEvaluator

# The identity is a trace, not a compile: a minute covers a slow host's biggest tasks.
IDENTITY_TIMEOUT_S = 60.0


class SameProgram:
    """``await same(state, proposal)``: the number of the correct version whose program at
    the production shape is the proposal's, or None (no such version, no source, or the
    judge could not say: the proposal is then evaluated as usual). ``read`` gives a blob's
    bytes, ``proposed`` the source a proposal would make (``SessionCore.proposed_source``:
    a tuning applied to the version it applies to, which carries no source of its own)."""

    def __init__(self, judge: PoolEvaluator, task: Task, read: Callable[[str], bytes],
                 proposed: Callable[[ProposalInfo], str]) -> None:
        self.judge, self.task, self.read, self.proposed = judge, task, read, proposed
        self._known: dict[str, str | None] = {}  # source's sha256 -> its program (or None)
        self._lock = asyncio.Lock()

    async def program(self, source: str) -> str | None:
        """The program of ``source`` at the production shape (asked once per source)."""
        key = hashlib.sha256(source.encode()).hexdigest()
        async with self._lock:
            if key not in self._known:
                self._known[key] = await self._ask(source)
            return self._known[key]

    async def _ask(self, source: str) -> str | None:
        options = replace(self.judge.options or EvalOptions(), identity_only=True,
                          timeout_s=IDENTITY_TIMEOUT_S)
        try:
            reply = await self.judge.estimate(self.task, source, options)
        except Exception:  # a judge that cannot say (a fake, a closed pool): evaluate it
            return None
        program = reply.get("program") if isinstance(reply, dict) else None
        return program if reply.get("status") == "ok" and isinstance(program, str) else None

    async def __call__(self, state: SessionState, proposal: ProposalInfo) -> int | None:
        measured = sorted((v for v in state.versions.values() if v.correct),
                          key=lambda v: v.number)
        if not measured or proposal.kind != "tuning":
            # (a new kernel with the same program can still be a step: one that declares
            # its block sizes as TUNABLES so they can be tuned next, or one that leaves out
            # what an earlier one did outside its program, a thread it started)
            return None
        try:
            source = self.proposed(proposal)
        except Exception:  # a tuning that cannot apply: the evaluation will say so
            return None
        if not source:
            return None
        texts = [(v.number, self.read(v.source_blob).decode()) for v in measured]
        same = next((n for n, text in texts if text == source), None)
        if same is not None:  # a tuning that sets what its base already has
            return same
        mine = await self.program(source)
        if mine is None:
            return None
        for number, text in texts:
            if await self.program(text) == mine:
                return number
        return None


def same_program_note(number: int) -> str:
    """The auto-approver's words for such a rejection."""
    return (f"the same program at the production shape as v{number}, which was already "
            f"measured: the change makes no difference there (a block size the kernel "
            f"clamps back, a switch its dtype ignores). Its number is v{number}'s; propose "
            "something different")
