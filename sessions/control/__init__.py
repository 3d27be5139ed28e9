"""The controller: step mode and autonomy over one session core.

``controller`` is the one asyncio object that owns the propose, decide, apply, run loop
for a live session; ``plan`` its planner, a pure function from the folded state to the
next step (the search's planner is ``sessions.search.plan``); ``context`` what the agent
is told, built from the folded state; ``tools`` the session's answers to the agent's
read-only tools."""
