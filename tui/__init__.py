"""The Textual application and the command line.

Panes, widgets, screens, key bindings and their ``.tcss``: presentation only. It talks
to ``sessions`` through controller commands and observes the persisted events. The
``cli`` module is the ``tilewright`` entry point; it imports each subcommand lazily so
that headless commands never pay for textual. Never imports jax.
"""
