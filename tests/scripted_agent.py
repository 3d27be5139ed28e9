"""A scripted agent for tests: a real ``agents.base.Agent`` that replies from a script.

Each call to ``propose`` takes the next step of the script. A step is a ``Proposal``,
a ``Failure``, or a function ``request -> Proposal | Failure`` (to build a reply from
what the controller sent). Every request is recorded in ``requests`` so a test can
check what the agent was told (notes, roles, last results). ``text`` is streamed as
``TextDelta``s, and each reply reports ``usage``.

``hold`` (an ``asyncio.Event``), when given, makes every reply stream its first delta
and then wait until the event is set: a test can cancel an answer mid-stream and
check that the stream was closed (``closed`` counts replies whose ``finally`` ran).
When the script runs out, the agent answers with a ``Failure``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable

from tilewright.agents.base import (
    AgentEvent,
    AgentRequest,
    Failure,
    Finished,
    Proposal,
    ProposalReady,
    TextDelta,
    Usage,
    UsageReport,
)

Step = Proposal | Failure | Finished | Callable[[AgentRequest], Proposal | Failure]


class ScriptedAgent:
    name = "scripted"
    label = "scripted test agent"

    def __init__(self, script: Iterable[Step] = (), *, text: str = "Here is my proposal.",
                 usage: Usage | None = None, hold: asyncio.Event | None = None) -> None:
        self.script: list[Step] = list(script)
        self.text = text
        self.usage = usage or Usage(input_tokens=100, output_tokens=50, cost_usd=0.001)
        self.hold = hold
        self.requests: list[AgentRequest] = []
        self.closed = 0  # replies whose stream was closed (finished or cancelled)
        self.started = asyncio.Event()  # set when a reply has begun streaming

    def add(self, *steps: Step) -> None:
        self.script.extend(steps)

    async def propose(self, request: AgentRequest) -> AsyncIterator[AgentEvent]:
        self.requests.append(request)
        try:
            words = self.text.split(" ")
            yield TextDelta(words[0])
            self.started.set()
            if self.hold is not None:
                await self.hold.wait()
            for word in words[1:]:
                yield TextDelta(" " + word)
            yield UsageReport(self.usage)
            if not self.script:
                yield Failure("the script has no more replies")
                return
            step = self.script.pop(0)
            reply = step(request) if callable(step) else step
            if isinstance(reply, Failure | Finished):
                yield reply
            else:
                yield ProposalReady(reply, text=self.text)
        finally:
            self.closed += 1


def kernel(source: str, summary: str = "new kernel") -> Proposal:
    return Proposal(kind="kernel", summary=summary, rationale="scripted", source=source)


def tuning(summary: str = "retune", **changes: object) -> Proposal:
    return Proposal(kind="tuning", summary=summary, rationale="scripted", tuning=dict(changes))


def plan(steps: str, summary: str = "a plan") -> Proposal:
    return Proposal(kind="plan", summary=summary, rationale="scripted", plan=steps)
