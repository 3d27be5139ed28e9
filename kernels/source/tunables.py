"""The tunables convention: what a kernel lets an autotuner change, read and rewritten with ``ast``.

A kernel declares its knobs as module-level constants plus one literal dict::

    BLOCK_ROWS = 64
    BLOCK_COLS = 512
    TUNABLES = {"BLOCK_ROWS": [8, 16, 32, 64, 128, 256], "BLOCK_COLS": [128, 256, 512]}

Each name in ``TUNABLES`` is a module-level constant assigned exactly once to a literal.
``read`` returns ``{name: (current, choices)}``; ``apply`` rewrites only the right-hand
side of those assignments and keeps every other byte of the source.

TPU legality: a block's last two dimensions must be multiples of (8, 128) or equal the
array's dimensions. Which tunable tiles which axis is inferred from its name
(``*ROWS``/``*_M``/``*_Q``/``*_KV`` tile sublanes: multiples of 8; ``*COLS``/``*_N``/
``*_K``/``*LANES`` tile lanes: multiples of 128), or declared explicitly with an optional
``TUNABLE_ALIGN = {"BLOCK_K": 128}``.

A tunable that sizes nothing, a choice between two ways of computing the same thing
(``F32_PASSES``: a float32 product in 6 bf16 MXU passes or 3), is declared a switch:
``TUNABLE_SWITCHES = ("F32_PASSES",)``. The tuner measures each of a switch's values once,
from the best configuration so far, before it bisects block sizes; it never grows one,
widens its choices or counts it in a block's VMEM. App-side module: no JAX.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from tilewright.profiling.chips import LANE, SUBLANE


class TunablesError(ValueError):
    """A ``TUNABLES`` declaration that does not follow the convention; says where and why."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line else message)


def module_assigns(tree: ast.Module) -> dict[str, list[ast.Assign | ast.AnnAssign]]:
    found: dict[str, list[ast.Assign | ast.AnnAssign]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            found.setdefault(node.target.id, []).append(node)
    return found


def _literal_dict(assigns: dict[str, list], name: str) -> dict[str, Any] | None:
    nodes = assigns.get(name)
    if not nodes:
        return None
    node = nodes[-1]
    try:
        value = ast.literal_eval(node.value)
    except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
        raise TunablesError(f"{name} must be a literal dict", node.lineno) from exc
    if not isinstance(value, dict):
        raise TunablesError(f"{name} must be a dict, got {type(value).__name__}", node.lineno)
    return value


# Parsing runs in the app process (the event loop the UI shares): a source bigger than
# any real kernel (a hostile or runaway one: 30 MB took CPython's parser over a minute)
# is not analysed. The harness still judges it; only the tunables view is skipped.
MAX_PARSE_CHARS = 1_000_000


def _parse(source: str) -> tuple[ast.Module, dict[str, list]]:
    if len(source) > MAX_PARSE_CHARS:
        raise TunablesError(f"source too large to analyse ({len(source):,} characters; "
                            f"the limit is {MAX_PARSE_CHARS:,})", None)
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise TunablesError(f"syntax error: {exc.msg}", exc.lineno) from exc
    return tree, module_assigns(tree)


def read(source: str) -> dict[str, tuple[Any, list[Any]]]:
    """``{name: (current_value, choices)}`` for every declared tunable; ``{}`` when none."""
    _tree, assigns = _parse(source)
    declared = _literal_dict(assigns, "TUNABLES")
    if declared is None:
        return {}
    out: dict[str, tuple[Any, list[Any]]] = {}
    for name, choices in declared.items():
        nodes = assigns.get(name)
        if not nodes:
            raise TunablesError(f"TUNABLES names {name!r} but the module never assigns it")
        if len(nodes) > 1:
            raise TunablesError(f"{name} is assigned {len(nodes)} times; assign it once",
                                nodes[1].lineno)
        try:
            current = ast.literal_eval(nodes[0].value)
        except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
            raise TunablesError(f"{name} must be assigned a literal", nodes[0].lineno) from exc
        if not isinstance(choices, list | tuple) or not choices:
            raise TunablesError(f"TUNABLES[{name!r}] must be a non-empty list of values")
        out[name] = (current, list(choices))
    return out


def switches(source: str) -> tuple[str, ...]:
    """The declared tunables named in ``TUNABLE_SWITCHES`` (a literal tuple or list of
    names), in its order; () when there is none."""
    _tree, assigns = _parse(source)
    nodes = assigns.get("TUNABLE_SWITCHES")
    if not nodes:
        return ()
    try:
        value = ast.literal_eval(nodes[-1].value)
    except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
        raise TunablesError("TUNABLE_SWITCHES must be a literal tuple of names",
                            nodes[-1].lineno) from exc
    if not isinstance(value, tuple | list) or not all(isinstance(v, str) for v in value):
        raise TunablesError("TUNABLE_SWITCHES must be a tuple of tunable names",
                            nodes[-1].lineno)
    declared = read(source)
    unknown = [v for v in value if v not in declared]
    if unknown:
        raise TunablesError(f"TUNABLE_SWITCHES names what TUNABLES does not declare: "
                            f"{', '.join(unknown)}", nodes[-1].lineno)
    return tuple(value)


def alignment(source: str) -> dict[str, int]:
    """The alignment each tunable must respect: TUNABLE_ALIGN, else inferred from its name."""
    _tree, assigns = _parse(source)
    explicit = _literal_dict(assigns, "TUNABLE_ALIGN") or {}
    return {name: int(explicit.get(name) or infer_alignment(name)) for name in read(source)}


_LANE_NAME = re.compile(r"(COLS?|LANES?|_N|_K|^BN|^BK|_D|HEAD_DIM)$")
_SUBLANE_NAME = re.compile(r"(ROWS?|SUBLANES?|_M|_Q|_KV|^BM|^BQ|_B|BATCH)$")


def infer_alignment(name: str) -> int:
    """Alignment a block tunable needs on TPU from its name; 1 when the name says nothing."""
    upper = name.upper()
    if _LANE_NAME.search(upper):
        return LANE
    if _SUBLANE_NAME.search(upper):
        return SUBLANE
    return 1


def is_legal(name: str, value: Any, align: int, dims: tuple[int, ...] = ()) -> bool:
    """Whether a value may be proposed: an aligned positive int that tiles every given dim.

    A value at least as large as a dim is legal (kernels clamp with ``min(BLOCK, n)``, and a
    block equal to the array dimension is always allowed); a smaller one must divide it.
    Non-integer tunables (flags, strings) are always legal.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return True
    if value <= 0:
        return False
    if any(value < dim and dim % value for dim in dims):
        return False
    if dims and all(value >= dim for dim in dims):
        return True  # clamps to the full dimension: always a legal block
    return align <= 1 or value % align == 0


def legal_choices(source: str, dims: dict[str, tuple[int, ...]] | None = None) -> dict[str, list]:
    """Each tunable's choices filtered for TPU legality (alignment, and dims if known)."""
    dims = dims or {}
    aligns = alignment(source)
    return {name: [v for v in choices if is_legal(name, v, aligns[name], dims.get(name, ()))]
            for name, (_cur, choices) in read(source).items()}


def nearest_legal(name: str, value: int, choices: list[Any], align: int,
                  dims: tuple[int, ...] = ()) -> Any | None:
    """The legal choice closest to ``value`` (ties go to the smaller, safer block)."""
    legal = [c for c in choices if isinstance(c, int) and is_legal(name, c, align, dims)]
    if not legal:
        return None
    return min(legal, key=lambda c: (abs(c - value), c))


def apply(source: str, changes: dict[str, Any]) -> str:
    """Rewrite the assignments of the named tunables; every other byte stays as it was."""
    if not changes:
        return source
    declared = read(source)
    unknown = [name for name in changes if name not in declared]
    if unknown:
        raise TunablesError(
            f"not a declared tunable: {', '.join(unknown)} (declared: {', '.join(declared) or 'none'})")
    for name, value in changes.items():
        try:
            ast.literal_eval(repr(value))
        except (ValueError, SyntaxError) as exc:
            raise TunablesError(f"{name}: {value!r} is not a literal value") from exc
    _tree, assigns = _parse(source)
    lines = source.splitlines(keepends=True)
    # Rewrite bottom-up so earlier offsets stay valid.
    edits = sorted(((assigns[name][0].value, value) for name, value in changes.items()),
                   key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True)
    for node, value in edits:
        start, end = node.lineno - 1, node.end_lineno - 1
        head = lines[start][:char_offset(lines[start], node.col_offset)]
        tail = lines[end][char_offset(lines[end], node.end_col_offset):]
        lines[start:end + 1] = [head + repr(value) + tail]
    return "".join(lines)


def widen(source: str, choices: dict[str, list[Any]]) -> str:
    """Replace the declared choices of the named tunables (the ``TUNABLES`` dict is
    rewritten, its other entries kept); every other byte stays as it was."""
    declared = read(source)
    unknown = [name for name in choices if name not in declared]
    if unknown:
        raise TunablesError(f"not a declared tunable: {', '.join(unknown)}")
    _tree, assigns = _parse(source)
    node = assigns["TUNABLES"][-1].value
    merged = {name: list(choices.get(name, values)) for name, (_cur, values) in declared.items()}
    lines = source.splitlines(keepends=True)
    start, end = node.lineno - 1, node.end_lineno - 1
    head = lines[start][:char_offset(lines[start], node.col_offset)]
    tail = lines[end][char_offset(lines[end], node.end_col_offset):]
    lines[start:end + 1] = [head + repr(merged) + tail]
    return "".join(lines)


def menu_free(source: str) -> str:
    """``source`` with every declared tunable's choices emptied: two sources that differ
    only in the choices they declare (the menu the tuner reads, not what the kernel
    runs: a widened ``TUNABLES``) read the same. A source without tunables, or one
    that does not parse, comes back as it is."""
    try:
        declared = read(source)
    except TunablesError:
        return source
    return widen(source, {name: [] for name in declared}) if declared else source


def char_offset(line: str, byte_offset: int) -> int:
    # ast reports UTF-8 byte offsets; convert for lines with non-ASCII text.
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="ignore"))


def config_of(source: str) -> dict[str, Any]:
    """The current value of each tunable: the point in the search space a source sits at."""
    return {name: current for name, (current, _choices) in read(source).items()}
