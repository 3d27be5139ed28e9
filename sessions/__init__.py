"""The session engine.

The append-only event log (``events.jsonl`` plus content-addressed blobs), state as a
fold over events, the asyncio controller that enforces approval in code, autonomous
mode with budgets and stop rules, resume, replay, reports and graph search. Headless:
never imports textual or jax; the TUI drives it through commands and observes it
through the same events that are persisted.
"""
