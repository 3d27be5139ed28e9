"""First kernels written from a task's reference: elementwise, row-wise, matmul + epilogue.

The reference is plain ``jax.numpy`` code, so its math is correct on any block that
holds whole units of independent work: any tile for an elementwise function, whole
rows for a row-wise one (softmax, norms). The templates copy the reference function
into the kernel module (renamed ``_reference_math``, with the imports and module
constants it needs) and call it on the VMEM blocks inside a ``pl.pallas_call``. For a
matmul the reference's ``x @ w`` / ``jnp.dot(x, w)`` is cut out with ``ast``: the tiled
kernel accumulates it in float32 and the rest of the reference becomes the epilogue,
applied to the finished tile. Each template declares its block sizes as TUNABLES.

The families live in modules of their own: ``blockwise`` (elementwise, row-wise, the
whole-array fallback), ``matmul``, ``attention``, ``conv``, ``fused`` (cross entropy, the
gated MLP); ``kernel_text`` holds what their kernels share (VMEM helpers, the epilogue
analysis).
"""

from __future__ import annotations

from tilewright.agents.base import TaskBrief

# infer_families, REFERENCE_NAMES and TemplateError are part of this package's interface.
from tilewright.agents.offline.reference_reading import (  # noqa: F401
    FALLBACK,
    FAMILIES,
    REFERENCE_NAMES,
    TemplateError,
    infer_families,
)
from tilewright.agents.offline.templates.attention import attention
from tilewright.agents.offline.templates.blockwise import elementwise, rowwise, whole
from tilewright.agents.offline.templates.conv import conv
from tilewright.agents.offline.templates.fused import cross_entropy, gated_mlp
from tilewright.agents.offline.templates.matmul import matmul


def write_template(brief: TaskBrief, family: str | None = None) -> tuple[str, str]:
    """(kernel source, rationale) for the task's family (or ``family`` when given, for a
    task that declares none); ``TemplateError`` if none fits."""
    family = (family or brief.family or "").lower()
    if family == "elementwise":
        return elementwise(brief)
    if family in ("rowwise", "row-wise", "normalization", "reduction"):
        return rowwise(brief)
    if family == "matmul":
        return matmul(brief)
    if family == "attention":
        return attention(brief)
    if family == "conv":
        return conv(brief)
    if family == "cross_entropy":
        return cross_entropy(brief)
    if family == "gated_mlp":
        return gated_mlp(brief)
    if family == FALLBACK:
        return whole(brief)
    raise TemplateError(
        f"no offline template for family {brief.family or '(none declared)'}; templates exist "
        f"for {', '.join(FAMILIES)} (declare `family` in task.toml), or start from a kernel.py")
