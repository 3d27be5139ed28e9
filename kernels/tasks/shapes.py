"""The shapes of a task written by ``tilewright new``: what the user gave, and the check
shapes shrunk from it (``kernels.tasks.new`` writes the task).

``parse_shapes`` reads ``NAME=DTYPE[DIMS][:LOW..HIGH]`` specs (the grammar is in
``kernels.tasks.new``'s docstring) into ``Shapes``; ``derive_check``, ``derive_long`` and
``derive_held_out`` shrink the given (production) sizes to a check configuration a
Pallas kernel runs through TPU interpret mode in seconds, a longer one, and a held-out
one. ``NewTaskError`` is what every step of ``tilewright new`` raises. App side: no JAX.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from tilewright.kernels.errors import Advised
from tilewright.profiling.chips import LANE, SUBLANE, tile_unit

DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64",
          "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8",
          "u32": "uint32", "bool": "bool"}
SHORT = {v: k for k, v in DTYPES.items()}
# The largest input a check shape may have (elements): 256 x 512, about what the bundled
# tasks check with, which a Pallas kernel runs through TPU interpret mode in seconds.
CHECK_ELEMENTS = 256 * 512
DEFAULT_INT_RANGE = (0, 100)


class NewTaskError(Advised, ValueError):
    """What is wrong with what ``tilewright new`` was given, and what to do instead."""


# -- shapes -----------------------------------------------------------------------------

@dataclass
class InputSpec:
    name: str
    dtype: str  # numpy name: float32, bfloat16, int32, ...
    dims: list[str]  # dimension names, in order
    low: float | str | None = None  # value range; a str names a dimension
    high: float | str | None = None

    def describe(self) -> str:
        return f"{self.name} {SHORT.get(self.dtype, self.dtype)}[{','.join(self.dims)}]"


@dataclass
class Shapes:
    """The function's array inputs (in call order) and the sizes of their dimensions."""

    inputs: list[InputSpec]
    dims: dict[str, int]  # name -> production size, in order of first use
    axes: dict[str, list[str]] = field(default_factory=dict)  # name -> "x[0]", ...

    def shape_of(self, spec: InputSpec, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(sizes[d] for d in spec.dims)


_SPEC = re.compile(r"^\s*(?P<name>[A-Za-z_]\w*)\s*=\s*(?P<dtype>\w+)\s*\[(?P<dims>[^\]]*)\]"
                   r"\s*(?::\s*(?P<low>[^.\s][^\s]*?)\s*\.\.\s*(?P<high>\S+))?\s*$")


def parse_shapes(specs: list[str], split: bool = False) -> Shapes:
    """``["x=f32[4096,1024]", "w=f32[1024]"]`` -> the inputs and their dimensions.
    Raises ``NewTaskError`` naming the spec that does not parse.

    A bare number takes the name of an earlier axis of that size (a matmul's shared
    size), else one of its own. With ``split``, an input's axes never share a name with
    each other (a square ``x=f32[4096,4096]`` gets ``x_0`` and ``x_1``, so its check shape
    can be non-square and a row/column mix-up shows), and a later input's bare number
    takes the name of the axis it lines up with from the end (``gamma[4096]`` with
    ``x``'s last axis), as broadcasting does. ``tilewright new`` tries split names first
    and shares them again where the reference needs equal sizes."""
    parsed: list[tuple[str, str, list[tuple[str | None, int | None]], Any, Any]] = []
    named: dict[str, int] = {}
    for text in specs:
        m = _SPEC.match(text)
        if not m:
            raise NewTaskError(f"--shape {text!r} is not NAME=DTYPE[DIMS]",
                               "e.g. --shape x=f32[4096,1024] (dims: numbers, rows=4096, or "
                               "a size named elsewhere), --shape s=f32[] for a scalar")
        dtype = DTYPES.get(m["dtype"].lower()) or (m["dtype"].lower()
                                                   if m["dtype"].lower() in SHORT else None)
        if dtype is None:
            raise NewTaskError(f"--shape {text!r}: unknown dtype {m['dtype']!r}",
                               "one of " + ", ".join(DTYPES))
        dims: list[tuple[str | None, int | None]] = []
        for raw in (d.strip() for d in m["dims"].split(",") if d.strip()):
            name, _, size = raw.partition("=")
            name, size = name.strip(), size.strip()
            if not size and name.isdigit():
                dims.append((None, _positive(name, text)))
            elif not size:
                if not name.isidentifier():
                    raise NewTaskError(f"--shape {text!r}: {raw!r} is not a size",
                                       "a number, NAME=NUMBER, or a NAME given a size elsewhere")
                dims.append((name, None))
            else:
                if not name.isidentifier():
                    raise NewTaskError(f"--shape {text!r}: {name!r} is not a valid size name")
                value = _positive(size, text)
                if named.get(name, value) != value:
                    raise NewTaskError(f"size {name} is given as {named[name]} and as {value}")
                named[name] = value
                dims.append((name, value))
        if any(p[0] == m["name"] for p in parsed):
            raise NewTaskError(f"--shape {m['name']} is given twice")
        parsed.append((m["name"], dtype, dims, _bound(m["low"]), _bound(m["high"])))

    by_value: dict[int, list[str]] = {}
    for name, value in named.items():
        by_value.setdefault(value, []).append(name)
    from_end: dict[str, int] = {}  # a name's axis counted from the end, where it was made
    dims_out: dict[str, int] = {}
    axes: dict[str, list[str]] = {}
    inputs = []
    for input_name, dtype, dims, low, high in parsed:
        names = []
        for axis, (name, value) in enumerate(dims):
            if name is None and split:  # an axis of its own within this input
                assert value is not None
                free = [c for c in by_value.get(value, []) if c not in names]
                aligned = [c for c in free if from_end.get(c) == len(dims) - 1 - axis]
                name = (aligned or free or [f"{input_name}_{axis}"])[0]
                if name not in named:
                    by_value.setdefault(value, []).append(name)
                    named[name] = value
                    from_end[name] = len(dims) - 1 - axis
            elif name is None:  # a bare number: the named size of that value, else its own
                assert value is not None
                candidates = by_value.get(value, [])
                if len(candidates) > 1:
                    raise NewTaskError(
                        f"--shape {input_name}: the size {value} could be any of "
                        f"{', '.join(candidates)}",
                        f"write the name instead of the number ({candidates[0]})")
                name = candidates[0] if candidates else f"{input_name}_{axis}"
                if not candidates:
                    by_value[value] = [name]
                    named[name] = value
            elif name not in named:
                raise NewTaskError(f"--shape {input_name}: size {name!r} is never given a value",
                                   f"write {name}=NUMBER in one of the shapes")
            dims_out.setdefault(name, named[name])
            axes.setdefault(name, []).append(f"{input_name}[{axis}]")
            names.append(name)
        for bound in (low, high):
            if isinstance(bound, str) and bound not in named:
                raise NewTaskError(f"--shape {input_name}: range bound {bound!r} is neither a "
                                   "number nor a size", "e.g. :0..1, :0..vocab")
        if low is not None and dtype == "bool":
            raise NewTaskError(f"--shape {input_name}: a bool input takes no range")
        inputs.append(InputSpec(input_name, dtype, names, low, high))
    clash = sorted((set(dims_out) & {s.name for s in inputs}) | (set(dims_out) & {
        "key", "keys", "jax", "jnp"}))
    if clash:
        raise NewTaskError(f"the size name {clash[0]!r} is also an input or a name "
                           "make_inputs uses", "give the size another name")
    for bound_name in {b for s in inputs for b in (s.low, s.high) if isinstance(b, str)}:
        dims_out.setdefault(bound_name, named[bound_name])
        axes.setdefault(bound_name, []).append("a value range")
    return Shapes(inputs, dims_out, axes)


def _positive(text: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise NewTaskError(f"--shape {spec!r}: {text!r} is not a whole number") from None
    if value <= 0:
        raise NewTaskError(f"--shape {spec!r}: sizes must be positive, got {value}")
    return value


def _bound(text: str | None) -> float | str | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text if text.isidentifier() else _raise_bound(text)


def _raise_bound(text: str) -> Any:
    raise NewTaskError(f"range bound {text!r} is neither a number nor a size name")


def shapes_from_signature(inputs: list[tuple[str, list[int], str]],
                          split: bool = False) -> Shapes:
    """Shapes learned from example inputs (name, shape, dtype), as if given by --shape."""
    specs = [f"{name}={dtype}[{','.join(str(d) for d in shape)}]"
             for name, shape, dtype in inputs]
    return parse_shapes(specs, split)


def shares_within_an_input(specs: list[str]) -> bool:
    """Whether ``parse_shapes`` without ``split`` gives some input one name for two of
    its axes (a square matrix): splitting them would change the task."""
    shapes = parse_shapes(specs)
    return any(len(set(s.dims)) < len(s.dims) for s in shapes.inputs)


# -- check shapes -----------------------------------------------------------------------

def _floors(shapes: Shapes, granules: dict[str, int] | None = None) -> dict[str, int]:
    """How far a dimension may shrink: a last axis keeps 128 lanes, the one before 8
    sublanes (so blocks stay aligned), other axes may go down to 1; a dimension the
    kernel tiles keeps at least one of its blocks (``granules``)."""
    floors: dict[str, int] = {}
    for spec in shapes.inputs:
        for back, dim in enumerate(reversed(spec.dims), start=1):
            floors[dim] = max(floors.get(dim, 1), tile_unit(back))
    for dim, granule in (granules or {}).items():
        floors[dim] = max(floors.get(dim, 1), granule)
    return {d: min(floors.get(d, 1), v) for d, v in shapes.dims.items()}


def batch_like(shapes: Shapes) -> set[str]:
    """Dimensions that are never one of an input's last two axes: batches, heads,
    layers. They are shrunk first (the kernel's tiles live in the last two axes)."""
    minor = {d for spec in shapes.inputs for d in spec.dims[-2:]}
    return {d for d in shapes.dims if d not in minor}


def largest_input(shapes: Shapes, sizes: dict[str, int]) -> tuple[int, InputSpec | None]:
    best: tuple[int, InputSpec | None] = (0, None)
    for spec in shapes.inputs:
        n = math.prod(shapes.shape_of(spec, sizes))
        if n > best[0]:
            best = (n, spec)
    return best


def _shrunk(value: int, floor: int, granule: int = 1) -> int:
    """One step down: half, kept a multiple of the kernel's block (``granule``) and of
    the alignment the original had."""
    half = value // 2
    if granule > 1:
        return max(floor, half // granule * granule)
    for unit in (LANE, SUBLANE):
        if value % unit == 0 and half >= unit:
            return half // unit * unit
    return max(floor, half)


def block_granules(shapes: Shapes, operands: list[dict[str, Any]]) -> dict[str, int]:
    """Per named dimension, the block the kernel tiles it with at the production shape
    (its ``pallas_call`` operands: array shape and block, as the static analysis reads
    them): the check sizes must be whole multiples of it. An operand is matched to the
    input of the same shape, else an axis to the one dimension of that size; an axis the
    block covers whole, or a squeezed one, asks nothing."""
    by_size: dict[int, list[str]] = {}
    for name, size in shapes.dims.items():
        by_size.setdefault(size, []).append(name)
    granules: dict[str, int] = {}
    for op in operands:
        shape, block = op.get("shape") or [], op.get("block") or []
        if op.get("memory_space") == "hbm" or len(shape) != len(block):
            continue
        spec = next((s for s in shapes.inputs
                     if list(shapes.shape_of(s, shapes.dims)) == list(shape)), None)
        for axis, (size, b) in enumerate(zip(shape, block, strict=True)):
            if b is None or b >= size or b <= 1:
                continue
            names = [spec.dims[axis]] if spec is not None else by_size.get(int(size), [])
            if len(names) != 1:
                continue  # which dimension it is cannot be told
            granules[names[0]] = math.lcm(granules.get(names[0], 1), int(b))
    return granules


def derive_check(shapes: Shapes, budget: int = CHECK_ELEMENTS,
                 granules: dict[str, int] | None = None) -> dict[str, int]:
    """Sizes for the check configuration: the production sizes shrunk until the largest
    input holds at most ``budget`` elements. Batch-like dimensions go first (down to 2,
    then the others, then down to 1), then the largest of the others; a dimension the
    kernel tiles stays a whole multiple of its block (``granules``), at least one."""
    granules = granules or {}
    sizes = dict(shapes.dims)
    floors = _floors(shapes, granules)
    batch = batch_like(shapes)
    for batch_floor in (2, 1):
        while True:
            count, spec = largest_input(shapes, sizes)
            if spec is None or count <= budget:
                return sizes
            movable = [d for d in dict.fromkeys(spec.dims) if sizes[d] > floors[d]]
            first = [d for d in movable if d in batch and sizes[d] > batch_floor]
            if first:
                dim = max(first, key=lambda d: sizes[d])
                sizes[dim] = max(batch_floor, _shrunk(sizes[dim], floors[dim]))
                continue
            others = [d for d in movable if d not in batch]
            if not others:
                break  # only batch dimensions left: go down to 1 in the next pass
            dim = max(others, key=lambda d: (sizes[d], -spec.dims.index(d)))
            sizes[dim] = max(floors[dim], _shrunk(sizes[dim], floors[dim],
                                                   granules.get(dim, 1)))
    return sizes  # as small as alignment and the kernel's blocks allow


def check_notes(shapes: Shapes, check: dict[str, int],
                granules: dict[str, int] | None = None) -> dict[str, str]:
    """Why each check size is what it is, for ``tilewright new`` to say: "shrunk from
    4096 (batch-like, first)", "kept at 512 (a whole multiple of the kernel's 512
    blocks)"."""
    granules = granules or {}
    batch = batch_like(shapes)
    notes = {}
    for dim, size in shapes.dims.items():
        now = check.get(dim, size)
        if dim in granules:
            blocks = f"a whole multiple of the kernel's {granules[dim]}-blocks"
            notes[dim] = f"shrunk from {size} ({blocks})" if now < size else f"kept ({blocks})"
        elif now < size:
            notes[dim] = f"shrunk from {size}" + (" (batch-like: first)" if dim in batch else "")
    return notes


def derive_long(shapes: Shapes, check: dict[str, int],
                budget: int = CHECK_ELEMENTS,
                granules: dict[str, int] | None = None) -> dict[str, int] | None:
    """A check configuration with the largest input's last axis as long as in
    production (up to 2048): the other sizes shrink instead. A kernel that splits what
    must stay whole (a row of a norm or a softmax) passes a shape where one block covers
    the row and fails this one. None when it would equal ``check``."""
    granules = granules or {}
    count, spec = largest_input(shapes, shapes.dims)
    if spec is None or not spec.dims:
        return None
    last = spec.dims[-1]
    floors = _floors(shapes, granules)
    sizes = dict(shapes.dims)
    longest = max(check[last], 2048)
    if granules.get(last, 1) > 1:
        longest = max(check[last], longest // granules[last] * granules[last])
    sizes[last] = min(sizes[last], longest)
    while True:
        count, spec = largest_input(shapes, sizes)
        if spec is None or count <= budget:
            break
        movable = [d for d in dict.fromkeys(spec.dims) if d != last and sizes[d] > floors[d]]
        if not movable:
            break
        dim = max(movable, key=lambda d: sizes[d])
        sizes[dim] = max(floors[dim], _shrunk(sizes[dim], floors[dim], granules.get(dim, 1)))
    if largest_input(shapes, sizes)[0] > 2 * budget or sizes[last] <= check[last]:
        return None
    return sizes if sizes != check else None


def derive_held_out(shapes: Shapes, check: dict[str, int],
                    granules: dict[str, int] | None = None,
                    budget: int = CHECK_ELEMENTS) -> dict[str, int] | None:
    """A second small configuration the agent never sees: the check sizes with their
    largest shrinkable dimension halved (another shape catches hard-coded sizes); where
    nothing can shrink (every dimension at one of the kernel's blocks), one of them
    doubled, within four times the check budget."""
    granules = granules or {}
    floors = _floors(shapes, granules)
    movable = [d for d in check if check[d] > floors[d] and d in floors]
    if movable:
        dim = max(movable, key=lambda d: check[d])
        held = dict(check)
        held[dim] = max(floors[dim], _shrunk(check[dim], floors[dim], granules.get(dim, 1)))
        return held if held != check else None
    for dim in sorted(check, key=lambda d: check[d]):
        if check[dim] * 2 > shapes.dims.get(dim, 0):
            continue
        held = {**check, dim: check[dim] * 2}
        if largest_input(shapes, held)[0] <= 4 * budget:
            return held
    return None
