"""What the matmul template reads of a task's sizes: the product's rows and columns at
production (from which an epilogue that mixes them gets a kernel of its own), the blocks
to start from by the operands' width, and the kernel text that reads the sizes a
reference hard-codes from the product's own sizes when it is traced."""

from __future__ import annotations

from tilewright.agents.base import TaskBrief
from tilewright.agents.offline.reference_reading import operand_dtypes

_SIZE_HELPER = '''

# The product's full sizes while the kernel is traced (set by the entry point): the sizes
# the reference hard-codes are read from them (`_size`), not written in.
_DIMS = {}


def _size(check, production):
    """The product's dimension (n, m or k, in that order) that a size the reference
    hard-codes stands for: ``production`` as written, ``check`` at the check shapes."""
    for name in ("n", "m", "k"):
        if _DIMS.get(name) in (check, production):
            return _DIMS[name]
    raise ValueError(f"the reference's hard-coded size {production} ({check} at the check "
                     f"shapes) is none of the product's sizes {_DIMS}")
'''

_SIZE_SET = """
    _DIMS.update(m=m, n=n, k=k)"""


# Rows of the product at production from which a row-mixing epilogue gets its own kernel:
# with every row in one block the fused kernel needs about rows x 512 x 14 bytes for
# 512-column blocks (f32 accumulator, output, the epilogue's room), past a 64 MiB VMEM_CAP
# from about 9,000 rows; 31k's 16384x8192 @ 8192x8192 (bf16) was left 128-column blocks
# (0.54x of XLA measured on a v5e).
SPLIT_ROWS_FROM = 8192


def _production_rows(brief: TaskBrief, lhs: int) -> int:
    """The product's rows at production: the lhs's leading axes (0 when not known)."""
    inputs = (brief.production or {}).get("inputs") or []
    if lhs >= len(inputs) or len(inputs[lhs][0]) < 2:
        return 0
    rows = 1
    for d in list(inputs[lhs][0])[:-1]:
        rows *= int(d)
    return rows


# Columns of the product at production from which a column-mixing epilogue gets its own
# kernel: every column in one block, its rows shrink to fit VMEM and w is read once per
# row block. 45k's group norm (32-wide groups, each padded to 128 lanes) of 4096x8192 @
# 8192x8192 (bf16) was left 64-row blocks: w read 64 times, 0.33x of XLA on a v5e.
SPLIT_COLS_FROM = 8192


def _production_cols(brief: TaskBrief, rhs: int, transposed: bool) -> int:
    """The product's columns at production: the rhs's last axis, or its next to last
    where it is used transposed ((n, k)); 0 when not known."""
    inputs = (brief.production or {}).get("inputs") or []
    if rhs >= len(inputs) or len(inputs[rhs][0]) < 2:
        return 0
    return int(list(inputs[rhs][0])[-2 if transposed else -1])


def _matmul_blocks(brief: TaskBrief) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) to start from: for 16-bit inputs the Pallas TPU guide's
    fastest at 4096^3 on v5e, (512, 1024, 1024); for float32 (1024, 1024, 512): output
    tiles as large, so each operand is re-read from HBM as few times, with a K block half
    as long for the doubled bytes (about 32 MiB with double buffering and the epilogue's
    room, which the kernel asks for with vmem_limit_bytes)."""
    return (512, 1024, 1024) if _narrow_operands(brief) else (1024, 1024, 512)


def _narrow_operands(brief: TaskBrief) -> bool:
    """Whether the task's operands are 16-bit or narrower."""
    dtypes = operand_dtypes(brief)
    return bool(dtypes) and dtypes <= {"bfloat16", "float16", "int8", "bf16", "f16", "i8"}
