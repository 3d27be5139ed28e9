"""Traces and numbers.

Profile capture around a candidate's timed iterations (inside a worker), conversion of
xprof trace data into our ``Timeline`` model and op summaries, static analysis of every
``pallas_call`` (blocks, VMEM, alignment, flops, intensity), the chip table and the
roofline. The lowest layer: imports nothing from ``kernels``, ``agents``, ``sessions``
or ``tui``.

Modules: ``chips`` (chip table, roofline), ``timeline`` (the model, op summary,
Chrome-trace export), ``convert`` (xprof -> Timeline, Pallas share), ``report`` (rich
rendering) and ``digest`` (plain text) of the ``tilewright.profile/1`` JSON; worker-side,
importing JAX lazily: ``capture`` (jax.profiler around the timed iterations) and
``static`` with its helpers ``static_blocks``, ``static_walk`` and ``static_rules``.
"""

SCHEMA = "tilewright.profile/1"  # the profile JSON's schema tag (``tilewright profile --json``)
