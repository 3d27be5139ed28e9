"""Sizes written into a task's Python source, found and rewritten without running it.

``--set KEY=VALUE`` shrinks a task whose sizes are written as literals: a named literal
(``NAME = 4096``, a ``'NAME': 4096`` entry; ``literal_sites``, ``replace_literals``) in
MaxKernel input code, a hard-coded number inside a JAXBench workload's functions
(``number_sites``, ``rewrite_numbers``). Line numbers are kept, so tracebacks still
point at the task's own lines. Pure ``ast``: the app side (loaders) and the worker
(``kernels.worker.runtime``, ``Task.reference_source``) both use it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any


def _is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def literal_sites(tree: ast.Module) -> dict[str, list[ast.expr]]:
    """Every place a named literal is set, anywhere in the code (functions included).

    ``NAME = <literal>`` assignments and ``'NAME': <literal>`` entries of dict displays
    (``config = {'batch_size': 4096, ...}`` inside ``get_inputs``): the values that
    ``--set NAME=VALUE`` can replace in MaxKernel input code.
    """
    sites: dict[str, list[ast.expr]] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and _is_literal(node.value)):
            sites.setdefault(node.targets[0].id, []).append(node.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (isinstance(key, ast.Constant) and isinstance(key.value, str)
                        and _is_literal(value)):
                    sites.setdefault(key.value, []).append(value)
    return sites


def replace_literals(source: str, values: dict[str, Any]) -> str:
    """``source`` with every literal site of each name set to ``repr(value)``.

    Line numbers are kept (a multi-line literal becomes a parenthesized value padded
    with newlines), so tracebacks still point at the original lines. Raises KeyError
    for a name with no literal site.
    """
    sites = literal_sites(ast.parse(source))
    data = source.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    edits = []
    for name, value in values.items():
        if name not in sites:
            raise KeyError(name)
        for node in sites[name]:
            span = node.end_lineno - node.lineno  # type: ignore[operator]
            text = repr(value) if not span else "(" + repr(value) + "\n" * span + ")"
            edits.append((starts[node.lineno - 1] + node.col_offset,
                          starts[node.end_lineno - 1] + node.end_col_offset,  # type: ignore[index]
                          text.encode()))
    for begin, end, text in sorted(edits, reverse=True):
        data = data[:begin] + text + data[end:]
    return data.decode()


# Calls whose numeric arguments are counts or seeds, never sizes: a literal there is
# left alone even when it equals a size being changed (``jax.random.split(key, 2)``).
_NOT_SIZES = {"split", "range", "key", "PRNGKey", "fold_in", "seed", "default_rng",
              "RandomState", "enumerate"}
# Functions whose literals never matter for inputs or the reference.
_SKIPPED_FUNCTIONS = {"benchmark", "main"}


@dataclass(frozen=True)
class NumberSite:
    """A numeric literal inside a function of a task file: where a size is hard-coded."""

    value: int | float
    function: str
    line: int
    col: int
    end_col: int


def number_sites(tree: ast.Module) -> list[NumberSite]:
    """Numeric literals inside the module's top-level functions (not ``benchmark``),
    except arguments of count/seed calls (``split``, ``range``, ``key``, ...) and
    literals of a single line. Sorted by position."""
    excluded: set[int] = set()
    sites: list[NumberSite] = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if fn.name in _SKIPPED_FUNCTIONS:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                callee = node.func
                name = callee.attr if isinstance(callee, ast.Attribute) else \
                    getattr(callee, "id", None)
                if name in _NOT_SIZES:
                    for arg in [*node.args, *(k.value for k in node.keywords)]:
                        excluded.update(id(n) for n in ast.walk(arg))
        for node in ast.walk(fn):
            if (isinstance(node, ast.Constant) and type(node.value) in (int, float)
                    and id(node) not in excluded and node.lineno == node.end_lineno):
                sites.append(NumberSite(node.value, fn.name, node.lineno, node.col_offset,
                                        node.end_col_offset))  # type: ignore[arg-type]
    return sorted(sites, key=lambda s: (s.line, s.col))


def rewrite_numbers(source: str, values: dict[int | float, int | float] | list) -> str:
    """``source`` with every ``number_sites`` literal equal to a key of ``values`` (same
    type: 2 is not 2.0) replaced by its new value. Line numbers are kept.

    ``values`` may be a list of ``[old, new]`` pairs (how it travels in JSON)."""
    pairs = values.items() if isinstance(values, dict) else [tuple(p) for p in values]
    table = {(type(old), old): new for old, new in pairs}
    lines = source.splitlines(keepends=True)
    for site in reversed(number_sites(ast.parse(source))):
        new = table.get((type(site.value), site.value))
        if new is None:
            continue
        line = lines[site.line - 1].encode()
        line = line[:site.col] + repr(new).encode() + line[site.end_col:]
        lines[site.line - 1] = line.decode()
    return "".join(lines)
