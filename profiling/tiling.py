"""The TPU's block tiling rule, written once.

A TPU vector register is 8 sublanes by 128 lanes (of 32-bit words). A ``pallas_call``
block's last axis is laid along the lanes and the one before it along the sublanes, so
the Mosaic lowering takes a block whose last two dims are each a multiple of that unit
or equal to the whole array's dim (``tiles``). Types narrower than 32 bits pack along
the sublanes: a bf16 tile is (16, 128), an int8 one (32, 128) (``tile_rows``).

The task shapes (how far a check shape may shrink), the tunables (which block values
may be proposed), the static analysis (whether a BlockSpec lowers) and the offline
agent's fix for a misaligned block all read the rule from here. App-side: no JAX.
"""

from __future__ import annotations

from collections.abc import Sequence

LANE, SUBLANE = 128, 8


def unit(axis_from_end: int) -> int:
    """The tile unit of an axis counted from the end (1: the last, lanes; 2: sublanes);
    other axes are free (1)."""
    return LANE if axis_from_end == 1 else SUBLANE if axis_from_end == 2 else 1


def tiles(block: int, full: int, unit_: int) -> bool:
    """Whether a block dim lowers: a multiple of its unit, or the array's whole dim."""
    return block == full or block % unit_ == 0


def misaligned(block: Sequence[int], shape: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """``(axis, block, array dim, unit)`` for each of a block's last two dims that breaks
    the rule (rank-2 and up; rank-1 blocks have a rule of their own in the static
    analysis)."""
    if len(block) < 2 or len(block) != len(shape):
        return []
    out = []
    for back in (2, 1):
        axis = len(block) - back
        if not tiles(block[axis], shape[axis], unit(back)):
            out.append((axis, block[axis], shape[axis], unit(back)))
    return out


def tile_rows(itemsize: int) -> int:
    """Sublanes a tile holds for a type of ``itemsize`` bytes: 8 for 32-bit types, 16
    for bf16, 32 for int8."""
    return SUBLANE * max(1, 4 // max(1, itemsize))
