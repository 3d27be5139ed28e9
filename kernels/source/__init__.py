"""Kernel source as text: read, rewritten and shown without running it.

The tunables convention an autotuner changes (``tunables``), sizes written into a
task's Python (``literals``), reading a kernel file safely (``files``), and text from
candidates, models and tasks made safe to print or write (``printable``). Pure
Python (``ast`` and strings): no JAX, nothing executed."""
