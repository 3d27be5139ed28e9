"""Static checks of a task's Python sources, without running them.

The loaders run in the app process, which never imports JAX, so a reference file is
parsed with ``ast`` rather than imported: its top-level functions and their
parameters, and module-level literal assignments such as JAXBench's ``CONFIG``.
Every failure is a ``TaskError`` naming the file and the line.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilewright.kernels.tasks.task import TaskError


@dataclass(frozen=True)
class Function:
    """A top-level ``def``: its line and what it accepts."""

    name: str
    line: int
    params: tuple[str, ...]  # positional-or-keyword and keyword-only names, in order
    var_positional: bool
    var_keyword: bool

    def accepts_keyword(self, name: str) -> bool:
        return self.var_keyword or name in self.params


@dataclass(frozen=True)
class PySource:
    """A parsed Python file (or code block) and what the loaders need from it."""

    path: Path
    tree: ast.Module
    line_offset: int = 0  # for code embedded in another file (MaxKernel YAML)

    @classmethod
    def parse(cls, path: Path, text: str | None = None, line_offset: int = 0) -> PySource:
        """Parse ``text`` (or the file) or raise ``TaskError`` at the syntax error's line."""
        if text is None:
            try:
                text = path.read_text()
            except OSError as exc:
                raise TaskError(path, f"cannot read: {exc.strerror or exc}") from exc
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError as exc:
            line = (exc.lineno or 0) + line_offset or None
            raise TaskError(path, f"Python syntax error: {exc.msg}", line=line,
                            expected="valid Python source") from exc
        return cls(path, tree, line_offset)

    def functions(self) -> dict[str, Function]:
        found: dict[str, Function] = {}
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                found[node.name] = Function(
                    node.name, node.lineno + self.line_offset, tuple(names),
                    args.vararg is not None, args.kwarg is not None,
                )
        return found

    def require(self, name: str, signature: str) -> Function:
        """The top-level function ``name`` or a ``TaskError`` saying what to define."""
        fn = self.functions().get(name)
        if fn is None:
            raise TaskError(self.path, f"no top-level function `{name}`",
                            expected=f"def {signature}")
        return fn

    def assignments(self) -> dict[str, ast.Assign | ast.AnnAssign]:
        """Module-level ``NAME = ...`` statements (the last one wins, as at run time)."""
        found: dict[str, ast.Assign | ast.AnnAssign] = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = node
            elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                  and node.value is not None):
                found[node.target.id] = node
        return found

    def literal_constants(self) -> dict[str, Any]:
        """Module-level names bound to a Python literal (``batch_size = 16``)."""
        out: dict[str, Any] = {}
        for name, node in self.assignments().items():
            try:
                out[name] = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
        return out

    def line_of(self, node: ast.AST) -> int:
        return getattr(node, "lineno", 0) + self.line_offset

    def reads_name(self, function: str, name: str) -> bool:
        """Whether the top-level function ``function`` mentions ``name`` anywhere."""
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
                return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))
        return False


def parse_literal(text: str) -> Any:
    """A ``--set`` value: a Python literal when it parses as one, else the plain string.

    Only JSON-representable literals count (numbers, strings, booleans, None, lists,
    tuples, dicts): the value travels to the worker inside the task's JSON spec.
    """
    try:
        value = ast.literal_eval(text)
        json.dumps(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text
    return value
