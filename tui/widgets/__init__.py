"""The workbench's panes and small widgets.

Each pane is presentation only: it is handed plain data (sources, rows, profile JSON)
by the screen that owns it and posts messages when the user picks something. No pane
talks to the controller, imports ``sessions`` internals, or imports jax.
"""
