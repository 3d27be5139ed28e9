"""Older Pallas TPU names, so kernels written for earlier JAX releases load and are judged.

Public kernels were written against several JAX releases. Names that both stacks we
support (jax 0.10.2 and 0.12) have dropped, and what they became:

- ``pltpu.TPUCompilerParams``  -> ``pltpu.CompilerParams``
- ``pltpu.TPUMemorySpace``     -> ``pltpu.MemorySpace`` (its ``ANY`` is now ``pl.ANY``)
- ``pltpu.ANY``                -> ``pl.ANY``

``install()`` adds each missing old name to ``jax.experimental.pallas.tpu`` as an alias
of the current object: it adds, never replaces, and a JAX that still has a name keeps
its own. It runs in the candidate process before the harness snapshots the modules it
relies on (so the aliases are the harness's, not the candidate's tampering), and again,
as a no-op, wherever a task runtime loads a candidate. Prompts and templates write the
current names (``agents/guide.md``).
"""

from __future__ import annotations

import types
from typing import Any


def aliases() -> dict[str, Any]:
    """The old names this JAX lacks, each bound to its current object."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    found: dict[str, Any] = {}
    if not hasattr(pltpu, "TPUCompilerParams") and hasattr(pltpu, "CompilerParams"):
        found["TPUCompilerParams"] = pltpu.CompilerParams
    if not hasattr(pltpu, "TPUMemorySpace") and hasattr(pltpu, "MemorySpace"):
        members = dict(pltpu.MemorySpace.__members__)
        if "ANY" not in members and hasattr(pl, "ANY"):
            members["ANY"] = pl.ANY
        found["TPUMemorySpace"] = types.SimpleNamespace(**members)
    if not hasattr(pltpu, "ANY") and hasattr(pl, "ANY"):
        found["ANY"] = pl.ANY
    return found


def install() -> list[str]:
    """Add the missing old names; the names added (none the second time)."""
    from jax.experimental.pallas import tpu as pltpu

    added = aliases()
    for name, value in added.items():
        setattr(pltpu, name, value)
    return sorted(added)
