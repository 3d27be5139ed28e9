"""Tunables for a kernel that declares none (``infer``).

A user's own kernel rarely follows the TUNABLES convention (``kernels.source.tunables``),
but it almost always fixes its block sizes somewhere a reader can see: module constants
(``BM = 128``), a tuple (``BLOCK = (128, 512)``), a dict (``BLOCKS = {"block_m": 128}``),
the defaults of a function or a ``functools.partial`` (``block_rows=256``), or literals in
the ``BlockSpec`` shapes. ``infer`` finds them, hoists the literals into module constants
and declares those as TUNABLES, changing nothing else. App-side module: no JAX.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from tilewright.kernels.source.tunables import (
    LANE,
    SUBLANE,
    TunablesError,
    char_offset,
    infer_alignment,
    module_assigns,
    read,
)

_SPEC_CALLS = {"BlockSpec"}
# Names that say "a block size": BLOCK_M, TILE, bm, block_rows, CHUNK_SIZE, tq, ...
_BLOCKISH = re.compile(r"(BLOCK|TILE|TILING|CHUNK)|^(B|T)(M|N|K|Q|KV|R|C|ROWS?|COLS?)$",
                       re.IGNORECASE)
_MIN_BLOCK = 8  # smaller ints in a shape are broadcast dims or counts, not block sizes


def _is_blockish(name: str) -> bool:
    return bool(_BLOCKISH.search(name))


def _parameter_defaults(node: ast.FunctionDef | ast.AsyncFunctionDef
                        ) -> list[tuple[ast.arg, ast.expr]]:
    """A function's parameters that have defaults, each with its default's node."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults,
                     strict=True))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
              if d is not None]
    return pairs


def _int_node(node: ast.AST | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


class _Knob:
    """One block size made tunable: its constant's name, value and alignment, and the
    literal nodes replaced by that name (none for a constant that exists already)."""

    def __init__(self, name: str, value: int, align: int | None, new: bool) -> None:
        self.name, self.value, self.align, self.new = name, value, align, new
        self.nodes: list[ast.AST] = []


class _Inference:
    def __init__(self, source: str, tree: ast.Module) -> None:
        self.source = source
        self.tree = tree
        self.assigns = module_assigns(tree)
        self.knobs: dict[str, _Knob] = {}
        # What a name or ``NAME[i]`` / ``NAME["key"]`` stands for: a knob's name.
        self.refs: dict[tuple[str, Any], str] = {}

    def _unique(self, base: str) -> str:
        base = re.sub(r"\W+", "_", base).strip("_").upper() or "BLOCK"
        if base[0].isdigit():
            base = "BLOCK_" + base
        name, n = base, 2
        while name in self.assigns or name in self.knobs:
            name, n = f"{base}_{n}", n + 1
        return name

    def _hoist(self, base: str, node: ast.AST, value: int, align: int | None = None,
               share: bool = False) -> str:
        """A new constant for the literal at ``node``. ``share``: a literal of the same
        value under the same name (``block_rows=256`` in two functions) reuses it."""
        if share:
            clean = re.sub(r"\W+", "_", base).strip("_").upper()
            knob = self.knobs.get(clean)
            if knob is not None and knob.new and knob.value == value:
                knob.nodes.append(node)
                return knob.name
        name = self._unique(base)
        knob = self.knobs[name] = _Knob(name, value, align, new=True)
        knob.nodes.append(node)
        return name

    def _single(self, name: str) -> ast.AST | None:
        nodes = self.assigns.get(name)
        return nodes[0].value if nodes and len(nodes) == 1 else None

    # -- where block sizes are declared ---------------------------------------------
    def module_constants(self, in_specs: set[str]) -> None:
        for name in self.assigns:
            value = _int_node(self._single(name))
            if value is not None and value >= _MIN_BLOCK and (
                    _is_blockish(name) or name in in_specs):
                self.knobs[name] = _Knob(name, value, None, new=False)
                self.refs[(name, None)] = name

    def tuples(self, in_specs: set[str]) -> None:
        for name in list(self.assigns):
            node = self._single(name)
            if not isinstance(node, ast.Tuple | ast.List) or not node.elts:
                continue
            values = [_int_node(e) for e in node.elts]
            if any(v is None for v in values) or max(values) < _MIN_BLOCK:  # type: ignore[type-var]
                continue
            if not (_is_blockish(name) or name in in_specs):
                continue
            suffixes = (["ROWS", "COLS"] if len(values) == 2 else
                        [str(i) for i in range(len(values))])
            stem = name if name.upper() != "BLOCK_SHAPE" else "BLOCK"
            for i, (element, value) in enumerate(zip(node.elts, values, strict=True)):
                if value is None or value < _MIN_BLOCK:
                    continue  # a broadcast dim (1) stays as it is
                default = LANE if i == len(values) - 1 else SUBLANE if len(values) == 2 \
                    else None
                knob = self._hoist(f"{stem}_{suffixes[i]}", element, value, default)
                self.refs[(name, i)] = knob
                self.refs[(name, i - len(values))] = knob

    def dicts(self) -> None:
        for name in list(self.assigns):
            node = self._single(name)
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "dict" \
                    and not node.args:
                pairs = [(k.arg, k.value) for k in node.keywords if k.arg]
            elif isinstance(node, ast.Dict):
                pairs = [(k.value, v) for k, v in zip(node.keys, node.values, strict=True)
                         if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            else:
                continue
            ints = [(key, value, _int_node(value)) for key, value in pairs]
            if not ints or not (_is_blockish(name) or all(_is_blockish(k) for k, _, _ in ints)):
                continue
            for key, value_node, value in ints:
                if value is None or value < _MIN_BLOCK:
                    continue
                base = key if _is_blockish(key) else f"{name}_{key}"
                self.refs[(name, key)] = self._hoist(base, value_node, value)

    def keyword_defaults(self) -> None:
        """``def kernel(x, block_rows=256)`` and ``functools.partial(f, block_m=128)``."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for arg, default in _parameter_defaults(node):
                    value = _int_node(default)
                    if value is not None and value >= _MIN_BLOCK and _is_blockish(arg.arg):
                        self._hoist(arg.arg, default, value, share=True)
            elif isinstance(node, ast.Call) and _callee(node) == "partial":
                for keyword in node.keywords:
                    value = _int_node(keyword.value)
                    if keyword.arg and value is not None and value >= _MIN_BLOCK \
                            and _is_blockish(keyword.arg):
                        self._hoist(keyword.arg, keyword.value, value, share=True)

    def call_keywords(self) -> None:
        """Block sizes passed as keywords to a constructor or a call: jax's own kernels
        take them that way (``BlockSizes(block_q=128, block_k_major=512)``,
        ``matmul(x, y, block_shape=(512, 512), block_k=512)``). Each int is hoisted into
        its own constant (shared by calls that pass the same keyword the same value); a
        tuple is hoisted element by element (``BLOCK_SHAPE_ROWS``, ``BLOCK_SHAPE_COLS``).
        ``BlockSpec`` and ``functools.partial`` have their own readers."""
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call) or _callee(node) in (*_SPEC_CALLS, "partial"):
                continue
            for keyword in node.keywords:
                if not keyword.arg or not _is_blockish(keyword.arg):
                    continue
                value = _int_node(keyword.value)
                if value is not None and value >= _MIN_BLOCK:
                    self._hoist(keyword.arg, keyword.value, value, share=True)
                    continue
                if isinstance(keyword.value, ast.Tuple | ast.List) and keyword.value.elts:
                    values = [_int_node(e) for e in keyword.value.elts]
                    if any(v is None for v in values):
                        continue
                    suffixes = (["ROWS", "COLS"] if len(values) == 2 else
                                [str(i) for i in range(len(values))])
                    for i, (element, v) in enumerate(zip(keyword.value.elts, values,
                                                         strict=True)):
                        if v is None or v < _MIN_BLOCK:
                            continue
                        default = LANE if i == len(values) - 1 else SUBLANE \
                            if len(values) == 2 else None
                        self._hoist(f"{keyword.arg}_{suffixes[i]}", element, v, default,
                                    share=True)

    def spec_literals(self) -> None:
        """Int literals in BlockSpec shapes: one constant per value and trailing position,
        so blocks that must agree keep agreeing."""
        by_key: dict[tuple[int, int], str] = {}
        for shape in self._spec_shapes():
            if not isinstance(shape, ast.Tuple | ast.List):
                continue
            for back, element in enumerate(reversed(shape.elts), start=1):
                value = _int_node(element)
                if back > 2 or value is None or value < _MIN_BLOCK:
                    continue
                key = (value, back)
                if key not in by_key:
                    base = "BLOCK_COLS" if back == 1 else "BLOCK_ROWS"
                    by_key[key] = self._hoist(base, element, value,
                                              LANE if back == 1 else SUBLANE)
                else:
                    self.knobs[by_key[key]].nodes.append(element)
        # The grid divides by the same literals (``x.shape[1] // 512``): rewrite those
        # too, where the value names one block size only.
        by_value: dict[int, list[str]] = {}
        for (value, _back), name in by_key.items():
            by_value.setdefault(value, []).append(name)
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call):
                continue
            for keyword in node.keywords:
                if keyword.arg != "grid":
                    continue
                for leaf in ast.walk(keyword.value):
                    value = _int_node(leaf)
                    if value is not None and len(by_value.get(value, [])) == 1:
                        self.knobs[by_value[value][0]].nodes.append(leaf)

    # -- how they are used ----------------------------------------------------------
    def _spec_shapes(self) -> list[ast.AST]:
        shapes = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and _callee(node) in _SPEC_CALLS:
                shape = node.args[0] if node.args else next(
                    (k.value for k in node.keywords if k.arg == "block_shape"), None)
                if shape is not None:
                    shapes.append(shape)
        return shapes

    def names_in_specs(self) -> set[str]:
        """Module names read inside BlockSpec shapes (directly, or through a local
        ``bm = min(BM, m)`` / ``bm, bn = BLOCK``)."""
        local: dict[str, set[str]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign):
                names = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
                for target in node.targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            local.setdefault(leaf.id, set()).update(names)
        found: set[str] = set()
        todo = [n.id for shape in self._spec_shapes() for n in ast.walk(shape)
                if isinstance(n, ast.Name)]
        while todo:
            name = todo.pop()
            if name in found:
                continue
            found.add(name)
            todo.extend(local.get(name, ()))
        return found

    def alignments(self) -> None:
        """A knob's alignment from where it lands in BlockSpec shapes (last dim: lanes,
        the one before: sublanes), else from its name, else from its tuple position."""
        aliases = self._aliases()
        seen: dict[str, int] = {}
        for shape in self._spec_shapes():
            if isinstance(shape, ast.Name) and isinstance(self._single(shape.id),
                                                          ast.Tuple | ast.List):
                size = len(self._single(shape.id).elts)  # type: ignore[union-attr]
                for i in range(size):
                    knob = self.refs.get((shape.id, i))
                    if knob is not None and size - i <= 2:
                        need = LANE if size - i == 1 else SUBLANE
                        seen[knob] = max(seen.get(knob, 1), need)
                continue
            if not isinstance(shape, ast.Tuple | ast.List):
                continue
            for back, element in enumerate(reversed(shape.elts), start=1):
                if back > 2:
                    break
                need = LANE if back == 1 else SUBLANE
                for knob in self._knobs_read(element, aliases):
                    seen[knob] = max(seen.get(knob, 1), need)
        for knob in self.knobs.values():
            by_name = infer_alignment(knob.name)
            knob.align = seen.get(knob.name) or (by_name if by_name > 1 else None) \
                or knob.align or SUBLANE

    def _aliases(self) -> dict[str, set[str]]:
        """Local names -> the knobs they were computed from (``bm = BLOCK[0]``,
        ``bm, bn = BLOCK``, ``bm = min(BLOCKS["m"], m)``, parameters' defaults)."""
        out: dict[str, set[str]] = {}
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                if isinstance(target, ast.Tuple | ast.List) and isinstance(node.value, ast.Name):
                    for i, leaf in enumerate(target.elts):
                        knob = self.refs.get((node.value.id, i))
                        if isinstance(leaf, ast.Name) and knob:
                            out.setdefault(leaf.id, set()).add(knob)
                elif isinstance(target, ast.Name):
                    knobs = self._knobs_read(node.value, out)
                    if knobs:
                        out.setdefault(target.id, set()).update(knobs)
        for node in ast.walk(self.tree):  # a parameter whose default is a knob
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for arg, default in _parameter_defaults(node):
                    knob = self._knob_of_node(default)
                    if knob:
                        out.setdefault(arg.arg, set()).add(knob)
        return out

    def _knob_of_node(self, node: ast.AST) -> str | None:
        for knob in self.knobs.values():
            if any(n is node for n in knob.nodes):
                return knob.name
        return None

    def _knobs_read(self, expr: ast.AST, aliases: dict[str, set[str]]) -> set[str]:
        found: set[str] = set()
        for leaf in ast.walk(expr):
            if isinstance(leaf, ast.Subscript) and isinstance(leaf.value, ast.Name):
                index = leaf.slice
                key = index.value if isinstance(index, ast.Constant) else \
                    -index.operand.value if isinstance(index, ast.UnaryOp) and isinstance(
                        index.op, ast.USub) and isinstance(index.operand, ast.Constant) \
                    else None
                knob = self.refs.get((leaf.value.id, key))
                if knob:
                    found.add(knob)
            elif isinstance(leaf, ast.Name):
                if (leaf.id, None) in self.refs:
                    found.add(self.refs[(leaf.id, None)])
                found.update(aliases.get(leaf.id, ()))
            knob = self._knob_of_node(leaf)
            if knob:
                found.add(knob)
        return found

    # -- the rewrite ----------------------------------------------------------------
    def rewrite(self) -> tuple[str, dict[str, list[int]]]:
        lines = self.source.splitlines(keepends=True)
        edits = [(node, knob.name) for knob in self.knobs.values() for node in knob.nodes]
        for node, name in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset),
                                 reverse=True):
            row = lines[node.lineno - 1]
            start = char_offset(row, node.col_offset)
            end = char_offset(row, node.end_col_offset)
            lines[node.lineno - 1] = row[:start] + name + row[end:]
        choices = {k.name: _neighbours(k.value, k.align or SUBLANE) for k in self.knobs.values()}
        align = {k.name: k.align or SUBLANE for k in self.knobs.values()}
        declaration = "".join(f"{k.name} = {k.value}\n" for k in self.knobs.values() if k.new)
        declaration += f"TUNABLES = {choices!r}\nTUNABLE_ALIGN = {align!r}\n"
        # After the imports, before the first statement that could use the constants.
        insert_at = 0
        for node in self.tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom) or _is_docstring(node):
                insert_at = node.end_lineno or insert_at
            else:
                break
        header = "\n# Block sizes found in the kernel, made tunable.\n" + declaration + "\n"
        lines.insert(insert_at, header)
        return "".join(lines), choices


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def infer(source: str) -> tuple[str, dict[str, list[int]]] | None:
    """Make a kernel without a ``TUNABLES`` declaration tunable. Block sizes are found in

    - module-level int constants read by BlockSpec shapes or named like block sizes
      (``BM = 128``, ``TILE_ROWS = 256``): they become tunables as they are;
    - module-level tuples of ints (``BLOCK = (128, 512)``) and dicts of them
      (``BLOCKS = {"block_m": 128, "block_n": 256}``, ``dict(bm=128)``): each size is
      hoisted into its own constant (``BLOCK_ROWS``, ``BLOCK_COLS``; ``BLOCK_M``) and
      the tuple or dict reads it;
    - defaults of block-size parameters (``def kernel(x, block_rows=256)``) and
      keywords of ``functools.partial`` calls (``partial(_call, block_m=128)``);
    - block-size keywords of any other call or constructor (``BlockSizes(block_q=128)``,
      ``matmul(x, y, block_shape=(512, 512), block_k=512)``: jax's own kernels);
    - int literals in ``BlockSpec`` shapes (``pl.BlockSpec((128, 512), ...)``), one
      constant per value and position, and the grid's matching literal.

    Each tunable's alignment comes from where it lands in a BlockSpec shape (last
    dim: 128 lanes; the one before: 8 sublanes), else from its name. Returns (the
    rewritten source with ``TUNABLES`` and ``TUNABLE_ALIGN`` declared, the choices:
    the size and its aligned neighbours), or None when nothing is found."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    try:
        if read(source):
            return None  # declared already
    except TunablesError:
        return None  # a broken declaration is the author's to fix, not to paper over
    inference = _Inference(source, tree)
    in_specs = inference.names_in_specs()
    inference.module_constants(in_specs)
    inference.tuples(in_specs)
    inference.dicts()
    inference.keyword_defaults()
    inference.call_keywords()
    inference.spec_literals()
    if not inference.knobs:
        return None
    inference.alignments()
    return inference.rewrite()


def _neighbours(value: int, unit: int) -> list[int]:
    """Power-of-two-ish choices around a block size, aligned to ``unit``."""
    out = {value}
    for factor in (0.25, 0.5, 2, 4):
        v = int(value * factor)
        if v >= unit and v % unit == 0:
            out.add(v)
    return sorted(out)


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant)
