"""Loading bundled tasks at test sizes.

A bundled task's production shape is TPU-sized (compile verdicts and estimates are for
it); a test that is about something else (a hostile probe, the controller's loop)
shrinks the production shape too, so a whole-array probe kernel is judged at the size
it runs at: ``load_small("gelu", rows=64, cols=256)``.
"""

from __future__ import annotations

from typing import Any

from tilewright.kernels.tasks.loaders import PRODUCTION_PREFIX, load_task
from tilewright.kernels.tasks.task import Task


def small_overrides(**sizes: Any) -> dict[str, str]:
    """``--set`` pairs that set the check shapes and the production shape alike."""
    pairs = {k: str(v) for k, v in sizes.items()}
    return {**pairs, **{PRODUCTION_PREFIX + k: v for k, v in pairs.items()}}


def load_small(name: str, **sizes: Any) -> Task:
    return load_task(name, small_overrides(**sizes))


def load_small_production(name: str, **sizes: Any) -> Task:
    """The task's own check shapes, with its production shape shrunk to ``sizes``: for a
    test of correctness whose production compile would cost minutes at TPU sizes."""
    return load_task(name, {PRODUCTION_PREFIX + k: str(v) for k, v in sizes.items()})
