"""The Textual application and the command line.

Panes, widgets, screens, key bindings and their ``.tcss``: presentation only. It talks
to ``sessions`` through controller commands and observes the persisted events. The
``cli`` module is the ``tilewright`` entry point; it imports each subcommand lazily so
that headless commands never pay for textual. Never imports jax.
"""

import os as _os

# Textual draws at most MAX_FPS frames a second, and a change waits for the next frame
# slot: at its default 60 a keypress that lands just after a frame waits up to 17 ms
# before anything is drawn. 120 halves that wait at no measurable cost while an agent
# streams (benchmarks/host_speed/tui_latency.py; the app draws ~24 frames/s either way). Textual
# reads TEXTUAL_FPS when it is first imported, which is after this package in every
# entry point; a value the user set wins.
_os.environ.setdefault("TEXTUAL_FPS", "120")
