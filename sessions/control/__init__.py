"""The controller: step mode and autonomy over one session core.

``controller`` is the one asyncio object that owns the propose, decide, apply, run loop
for a live session; ``next_action`` its planner, a pure function from the folded state to
the next step (the search's planner is ``sessions.search.planner``); ``agent_request``
builds the agent's request from the folded state and picks the role it plays next (what
the model reads is worded from that request by ``agents.prompts.context``); ``tools`` the
session's answers to the agent's read-only tools."""
