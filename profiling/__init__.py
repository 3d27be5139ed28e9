"""Traces and numbers.

Profile capture around a candidate's timed iterations (inside a worker), conversion of
xprof trace data into our ``Timeline`` model and op summaries, static analysis of every
``pallas_call`` (blocks, VMEM, alignment, flops, intensity), the chip table and the
roofline. JAX is imported lazily and only by code that runs inside a worker. The
lowest layer: imports nothing from ``kernels``, ``agents``, ``sessions`` or ``tui``.
"""

SCHEMA = "tilewright.profile/1"  # the profile JSON's schema tag (``tilewright profile --json``)
