"""A native task written from a function in the user's own code (``tilewright new``).

The user names a function (``model.py:fused_ln``) and the shapes and dtypes of its
array arguments at the size they run it (``x=f32[4096,1024]``). From that this module
writes a task directory the loaders read like any other:

- ``<module>.py``: the function and only what it needs from its module (imports,
  helpers, constants), copied with ``ast``, so a module that imports torch or trains a
  model at import time still gives a reference that imports cleanly in a worker;
  sibling modules it imports are copied beside it.
- ``reference.py``: ``make_inputs(key, **dims)`` (random arrays of those shapes and
  dtypes, fresh per key) and ``reference(*inputs)``, which calls the function (with
  any ``--arg`` keyword values bound).
- ``task.toml``: the given shape as the ``production`` configuration (``production =
  true``; ``size = "large"`` when it is too big to run in TPU interpret mode on a
  CPU), a ``check`` configuration shrunk from it (or given) for the correctness trials,
  and a smaller ``held_out`` one.
- ``kernel.py``: an optional starting kernel.

Shapes: ``NAME=DTYPE[DIMS]`` with DTYPE one of ``f32 bf16 f16 f64 i8 i16 i32 i64 u8
u32 bool`` (or the full names) and DIMS comma-separated: a number (``4096``), a named
size (``rows=4096``) or the name of a size given elsewhere (``rows``). Equal numbers
are one dimension (they shrink together); name them to keep them apart
(``[m=4096,k=4096]``). An optional ``:LOW..HIGH`` after the brackets gives the value
range (uniform floats, integers in [LOW, HIGH)); HIGH may name a size
(``ids=i32[batch]:0..vocab``). Floats are standard normal by default, integers in
[0, 100), booleans fair coins.

App side: no JAX. What cannot be checked statically is checked by ``kernels.cli.new``
in a worker after writing (inputs build, the reference runs at every shape).
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tilewright.kernels.tasks.shapes import (
    CHECK_ELEMENTS,
    DEFAULT_INT_RANGE,
    DTYPES,
    LANE,
    SHORT,
    SUBLANE,
    InputSpec,
    NewTaskError,
    Shapes,
    block_granules,
    check_notes,
    derive_check,
    derive_held_out,
    derive_long,
    largest_input,
    parse_shapes,
    shapes_from_signature,
)

# Names a task directory uses for itself: a copied module may not take them.
RESERVED_MODULES = {"reference", "kernel", "task", "baseline", "jax", "numpy"}

# The shapes' names, re-exported: ``kernels.tasks.new`` is the module ``tilewright new``
# and ``tilewright convert`` use.
__all__ = ["CHECK_ELEMENTS", "DTYPES", "LANE", "SHORT", "SUBLANE", "InputSpec", "NewTaskError",
           "Shapes", "TaskPlan", "UserFunction", "block_granules", "check_notes",
           "derive_check", "derive_held_out",
           "derive_long", "parse_shapes", "plan_task", "prepare", "read_function",
           "shapes_from_signature", "starting_kernel", "write_task"]

# -- the user's function ------------------------------------------------------------------

@dataclass
class Param:
    name: str
    has_default: bool
    kind: str  # positional | keyword | var_positional | var_keyword


@dataclass
class UserFunction:
    path: Path
    name: str
    params: list[Param]
    line: int


def parse_target(text: str, what: str = "--from") -> tuple[Path, str]:
    """``path/to/model.py:fn`` -> (path, fn). Raises ``NewTaskError``."""
    path_text, sep, fn = text.rpartition(":")
    if not sep or not fn.isidentifier() or not path_text:
        raise NewTaskError(f"{what} {text!r} is not FILE.py:FUNCTION",
                           f"e.g. {what} model.py:fused_ln")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise NewTaskError(f"{what} {text!r}: no file {path}")
    return path.resolve(), fn


def read_function(path: Path, name: str) -> tuple[UserFunction, ast.Module, str]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise NewTaskError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        tree = ast.parse(text, str(path))
    except SyntaxError as exc:
        raise NewTaskError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from exc
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                 and n.name == name), None)
    if node is None:
        found = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        raise NewTaskError(f"{path} defines no top-level function {name!r}",
                           "functions there: " + (", ".join(found) or "none"))
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    params = [Param(a.arg, i >= first_default, "positional") for i, a in enumerate(positional)]
    if args.vararg:
        params.append(Param(args.vararg.arg, True, "var_positional"))
    params += [Param(a.arg, d is not None, "keyword")
               for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg:
        params.append(Param(args.kwarg.arg, True, "var_keyword"))
    return UserFunction(path, name, params, node.lineno), tree, text


def call_plan(fn: UserFunction, input_names: list[str], args: dict[str, Any]
              ) -> tuple[list[str], dict[str, Any]]:
    """Which inputs go positionally and which keyword values are bound, checked against
    the function's signature. Returns (inputs in call order, bound keywords)."""
    by_name = {p.name: p for p in fn.params}
    accepts_any = any(p.kind == "var_keyword" for p in fn.params)
    for name in [*input_names, *args]:
        if name not in by_name and not accepts_any:
            raise NewTaskError(f"{fn.name}() has no parameter {name!r}",
                               "its parameters: " + ", ".join(p.name for p in fn.params))
    both = set(input_names) & set(args)
    if both:
        raise NewTaskError(f"{sorted(both)[0]} is given both a --shape and an --arg")
    missing = [p.name for p in fn.params if p.kind in ("positional", "keyword")
               and not p.has_default and p.name not in input_names and p.name not in args]
    if missing:
        raise NewTaskError(f"{fn.name}() needs {', '.join(missing)}, which got no --shape "
                           "and no --arg",
                           f"give each a shape (--shape {missing[0]}=f32[...]) or a value "
                           f"(--arg {missing[0]}=...)")
    order = [p.name for p in fn.params if p.name in input_names]
    order += [n for n in input_names if n not in order]  # through **kwargs
    return order, dict(args)


def parse_args(pairs: list[str]) -> dict[str, Any]:
    """``["eps=1e-6", "axis=-1"]`` -> ``{"eps": 1e-6, "axis": -1}`` (Python literals)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise NewTaskError(f"--arg {pair!r} is not NAME=VALUE", "e.g. --arg eps=1e-6")
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise NewTaskError(f"--arg {pair!r}: {value.strip()!r} is not a Python literal",
                               "numbers, strings in quotes, True/False, None, tuples") from None
    return out


# -- copying what the function needs ---------------------------------------------------------

def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _read(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _start_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", None) or []
    return min([node.lineno, *(d.lineno for d in decorators)])


def extract(tree: ast.Module, text: str, names: list[str]) -> tuple[str, list[ast.stmt]]:
    """The module's statements that ``names`` need (transitively): imports, functions,
    classes and assignments whose names they read, in their original order and text.
    ``from __future__`` imports always come along. Returns (source, statements)."""
    lines = text.splitlines(keepends=True)
    items = [n for n in tree.body if _defined(n) or (isinstance(n, ast.ImportFrom)
             and n.module == "__future__")]
    needed: set[str] = set(names)
    keep: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, node in enumerate(items):
            if i in keep:
                continue
            future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
            if future or _defined(node) & needed:
                keep.add(i)
                needed |= _read(node)
                changed = True
    kept = [items[i] for i in sorted(keep)]
    out = ""
    for node in kept:
        chunk = "".join(lines[_start_line(node) - 1:node.end_lineno])
        chunk = chunk if chunk.endswith("\n") else chunk + "\n"
        gap = "\n\n" if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef
                                    | ast.ClassDef) else "\n" if out and not out.endswith(
            "\n\n") and not _is_import(node) else ""
        out += (gap if out else "") + chunk
    return out, kept


def _is_import(node: ast.stmt) -> bool:
    return isinstance(node, ast.Import | ast.ImportFrom)


def docstring_summary(tree: ast.Module, name: str) -> str | None:
    """The first paragraph of the function's docstring, on one line."""
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                 and n.name == name), None)
    doc = ast.get_docstring(node) if node is not None else None
    if not doc:
        return None
    return " ".join(doc.strip().split("\n\n")[0].split())


def sibling_modules(statements: list[ast.stmt], directory: Path) -> list[Path]:
    """Modules beside the user's file that the copied statements import: they are
    copied too (a file, or a package directory). Relative imports are refused."""
    found: list[Path] = []
    for node in statements:
        if isinstance(node, ast.ImportFrom) and node.level:
            raise NewTaskError(
                f"line {node.lineno}: a relative import (from {'.' * node.level}"
                f"{node.module or ''} import ...) cannot be copied into a task",
                "import the package by its absolute name (installed in this environment), "
                "or move the function into a module of its own")
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        for module in modules:
            top = module.split(".")[0]
            for candidate in (directory / f"{top}.py", directory / top):
                exists = candidate.is_file() or (candidate / "__init__.py").is_file()
                if exists and candidate not in found:
                    found.append(candidate)
    return found


def module_name(path: Path) -> str:
    stem = re.sub(r"\W", "_", path.stem)
    if stem in RESERVED_MODULES or not stem.isidentifier():
        stem = f"user_{stem}"
    return stem


# -- writing the task -------------------------------------------------------------------

@dataclass
class TaskPlan:
    """Everything a new native task is made of, before it is written."""

    name: str
    description: str
    shapes: Shapes
    production: dict[str, int]
    check: dict[str, int]
    held_out: dict[str, int] | None
    check_long: dict[str, int] | None
    production_large: bool
    atol: float = 1e-5
    rtol: float = 1e-5
    family: str | None = None

    def configs(self) -> list[tuple[str, dict[str, int], dict[str, Any]]]:
        """(name, sizes, reserved keys) per configuration, production first."""
        out: list[tuple[str, dict[str, int], dict[str, Any]]] = []
        if self.production == self.check:
            out.append(("production", self.production, {"production": True}))
        else:
            out.append(("production", self.production,
                        {"production": True,
                         "size": "large" if self.production_large else "small"}))
            out.append(("check", self.check, {}))
        if self.check_long is not None and self.check_long != self.production:
            out.append(("check_long", self.check_long, {}))
        if self.held_out is not None:
            out.append(("held_out", self.held_out, {"held_out": True}))
        return out


def plan_task(name: str, shapes: Shapes, check: dict[str, int] | None = None,
              description: str = "", family: str | None = None,
              granules: dict[str, int] | None = None) -> TaskPlan:
    """The configurations of a task: production as given, check derived (or given);
    ``granules``: the block each dimension is tiled with by the user's kernel
    (``block_granules``), which the derived sizes stay whole multiples of."""
    production = dict(shapes.dims)
    if check:
        unknown = sorted(set(check) - set(production))
        if unknown:
            raise NewTaskError(f"--check {unknown[0]}: no such size",
                               "sizes: " + ", ".join(production))
        check = {**derive_check(shapes, granules=granules), **check}
    else:
        check = derive_check(shapes, granules=granules)
    large = largest_input(shapes, production)[0] > CHECK_ELEMENTS
    held = derive_held_out(shapes, check, granules)
    long = derive_long(shapes, check, granules=granules)
    # 16-bit float inputs: float32 outputs computed from them still differ at ~1e-3.
    half = {s.dtype for s in shapes.inputs} & {"bfloat16", "float16"}
    tol = 2e-2 if half else 1e-5
    return TaskPlan(name, description, shapes, production, check, held, long, large, tol,
                    tol, family)


def tolerance_note(plan: TaskPlan) -> str:
    """The tolerance ``new`` writes, and why, as ``new`` prints it."""
    if plan.atol >= 1e-2:
        return (f"atol = rtol = {plan.atol:g}: the inputs are 16-bit floats; a bf16/f16 "
                "output is also judged against the reference computed in f32 from the same "
                "inputs, the bf16 reference's own error allowed, so a more precise kernel "
                "(f32 statistics) is not called wrong, and one that drops a term still is")
    return f"atol = rtol = {plan.atol:g}: float32 inputs and outputs"


def toml_text(plan: TaskPlan, origin: str) -> str:
    """task.toml: the configurations with a comment per size saying what it sizes."""
    desc = plan.description or f"`{origin}` as a Pallas TPU kernel."
    lines = [f"# Written by `tilewright new` from {origin}.",
             "# production: the size you run (compile verdicts and estimates are for it);",
             "# check, check_long and held_out: shrunk from it for the correctness trials.",
             f"name = {_toml_str(plan.name)}",
             f"description = {_toml_str(desc)}"]
    if plan.family:
        lines.append(f"family = {_toml_str(plan.family)}")
    why = ("# atol/rtol: 2e-2 because the inputs are 16-bit floats (outputs computed from them "
           "differ at ~1e-3 from one correct program to another)" if plan.atol >= 1e-2 else
           "# atol/rtol: 1e-5, float32 inputs and outputs")
    lines += ["require_pallas = true", why, f"atol = {plan.atol:g}", f"rtol = {plan.rtol:g}",
              "",
              "# bf16 and f16 outputs: also judged against the reference computed in f32 from",
              "# the same inputs, with the bf16 reference's own error allowed, so a kernel",
              "# more precise than the reference (f32 statistics) is not called wrong.",
              "[tolerance.bfloat16]", "atol = 2e-2", "rtol = 2e-2", "",
              "[tolerance.float16]", "atol = 1e-2", "rtol = 1e-2"]
    for config, sizes, reserved in plan.configs():
        lines += ["", f"[shapes.{config}]"]
        for dim, value in sizes.items():
            where = ", ".join(plan.shapes.axes.get(dim, []))
            lines.append(f"{dim} = {value}" + (f"  # {where}" if where else ""))
        for key, value in reserved.items():
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_str(value)
    return repr(value)


def make_inputs_text(shapes: Shapes, defaults: dict[str, int], order: list[str]) -> str:
    """``make_inputs(key, **sizes)``: one random array per input, fresh per key."""
    by_name = {s.name: s for s in shapes.inputs}
    params = ", ".join(f"{d}={defaults[d]}" for d in shapes.dims)
    body = [f"def make_inputs(key{', ' + params if params else ''}):",
            '    """Random inputs at the given sizes (defaults: the check shape); '
            'a new key, new values."""',
            f"    keys = jax.random.split(key, {max(1, len(order))})"]
    for i, name in enumerate(order):
        spec = by_name[name]
        shape = "(" + "".join(f"{d}, " for d in spec.dims).rstrip(" ") + ")"
        if len(spec.dims) > 1:
            shape = "(" + ", ".join(spec.dims) + ")"
        dtype = f"jnp.{spec.dtype}" if spec.dtype != "bool" else "jnp.bool_"
        if spec.dtype == "bool":
            expr = f"jax.random.bernoulli(keys[{i}], 0.5, {shape})"
        elif spec.dtype.startswith(("int", "uint")):
            low, high = (spec.low if spec.low is not None else DEFAULT_INT_RANGE[0],
                         spec.high if spec.high is not None else DEFAULT_INT_RANGE[1])
            expr = f"jax.random.randint(keys[{i}], {shape}, {low}, {high}, {dtype})"
        elif spec.low is not None or spec.high is not None:
            low = spec.low if spec.low is not None else 0.0
            high = spec.high if spec.high is not None else 1.0
            expr = f"jax.random.uniform(keys[{i}], {shape}, jnp.float32, {low}, {high})"
            expr += f".astype({dtype})" if spec.dtype != "float32" else ""
        else:
            expr = f"jax.random.normal(keys[{i}], {shape}, jnp.float32)"
            expr += f".astype({dtype})" if spec.dtype != "float32" else ""
        body.append(f"    {name} = {expr}")
    body.append(f"    return ({', '.join(order)}{',' if len(order) == 1 else ''})")
    return "\n".join(body) + "\n"


def reference_text(fn: UserFunction, module: str, shapes: Shapes, order: list[str],
                   bound: dict[str, Any], defaults: dict[str, int]) -> str:
    """reference.py: imports the copied function, builds inputs, calls it."""
    alias = fn.name if fn.name not in ("make_inputs", "reference", "flops", "jax", "jnp") \
        else f"_user_{fn.name}"
    imported = fn.name if alias == fn.name else f"{fn.name} as {alias}"
    given = ", ".join(s.describe() for s in sorted(shapes.inputs, key=lambda s: order.index(s.name)))
    bound_text = "".join(f", {k}={v!r}" for k, v in bound.items())
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    positional = ", ".join(order)
    return (
        f'"""Reference for the {fn.name} task: `{fn.name}` from {fn.path}, copied into\n'
        f"{module}.py here with what it needs from its module (by `tilewright new`,\n"
        f"{stamp}). Inputs: {given}.\n"
        '"""\n\n'
        "import jax\nimport jax.numpy as jnp\n\n"
        f"from {module} import {imported}\n\n"
        f"# Where the reference came from; `tilewright export` names the kernel after it.\n"
        f"SOURCE_FUNCTION = {f'{module}:{fn.name}'!r}\n\n\n"
        + make_inputs_text(shapes, defaults, order) + "\n\n"
        f"def reference({positional}):\n"
        f"    return {alias}({positional}{bound_text})\n"
    )


def write_task(dest: Path, plan: TaskPlan, fn: UserFunction, tree: ast.Module, text: str,
               order: list[str], bound: dict[str, Any], kernel: str | None = None,
               force: bool = False) -> list[Path]:
    """Write the task directory; returns the files written. Refuses a non-empty
    directory unless ``force``."""
    prepare(dest, force)
    copied, statements = extract(tree, text, [fn.name])
    siblings = sibling_modules(statements, fn.path.parent)
    module = module_name(fn.path)
    header = (f"# Copied by `tilewright new` from {fn.path}: `{fn.name}` and what it needs\n"
              "# from that module. This copy is the task's reference; edit it here (or run\n"
              "# `tilewright new` again) when your function changes.\n\n")
    written = []
    for path in siblings:
        target = dest / path.name
        if path.is_dir():
            shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                            dirs_exist_ok=True)
        else:
            shutil.copyfile(path, target)
        written.append(target)
    (dest / f"{module}.py").write_text(header + copied)
    written.append(dest / f"{module}.py")
    (dest / "reference.py").write_text(reference_text(fn, module, plan.shapes, order, bound,
                                                      plan.check))
    (dest / "task.toml").write_text(toml_text(plan, f"{fn.path.name}:{fn.name}"))
    written += [dest / "reference.py", dest / "task.toml"]
    if kernel is not None:
        (dest / "kernel.py").write_text(kernel)
        written.append(dest / "kernel.py")
    return written


def prepare(dest: Path, force: bool) -> None:
    if dest.exists() and not dest.is_dir():
        raise NewTaskError(f"{dest} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise NewTaskError(f"{dest} exists and is not empty",
                           "choose another --out DIR, or pass --force to overwrite its files")
    dest.mkdir(parents=True, exist_ok=True)


def starting_kernel(spec: str, entries: tuple[str, ...] = ("kernel",)
                    ) -> tuple[str, list[Path]]:
    """``--kernel FILE[:FUNCTION]``: the kernel's text for kernel.py (with ``kernel =
    FUNCTION`` added when its entry has another name) and sibling modules it imports.
    Without FUNCTION the first of ``entries`` the file defines is the entry."""
    path_text, sep, fn = spec.rpartition(":")
    if sep and fn.isidentifier() and path_text.endswith(".py"):
        path, given = Path(path_text).expanduser(), True
    else:
        path, fn, given = Path(spec).expanduser(), entries[0], False
    if not path.is_file():
        raise NewTaskError(f"--kernel {spec!r}: no file {path}")
    text = path.read_text()
    try:
        tree = ast.parse(text, str(path))
    except SyntaxError as exc:
        raise NewTaskError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from exc
    names = {n for node in tree.body for n in _defined(node)}
    if not given:
        fn = next((e for e in entries if e in names), fn)
    if fn not in names:
        raise NewTaskError(f"--kernel {spec!r}: {path.name} defines no {fn!r}",
                           "name the entry point: --kernel FILE.py:FUNCTION")
    if fn != "kernel":
        text = text.rstrip("\n") + f"\n\n\nkernel = {fn}  # the entry point tilewright calls\n"
    return text, sibling_modules(list(tree.body), path.parent)
