"""The native task layout: ``task.toml`` + ``reference.py`` + optional ``kernel.py``.

``task.toml`` schema (every key optional unless marked)::

    name = "softmax"              # default: the directory name
    description = "Row softmax"   # one paragraph shown to people and agents
    family = "rowwise"            # elementwise | rowwise | matmul | attention | ...
    require_pallas = true         # candidates must contain a pallas_call (default true)
    atol = 1e-5                   # default tolerances (float32 comparison)
    rtol = 1e-5

    [tolerance.bfloat16]          # per-dtype tolerances, picked by the reference
    atol = 2e-2                   # output's dtype when it matches
    rtol = 2e-2

    [shapes.small]                # a named shape configuration: every key except the
    rows = 256                    # reserved ones below is passed to
    cols = 512                    # make_inputs(key, **params)

    [shapes.tall]
    rows = 512
    cols = 256
    held_out = true               # used for correctness, never shown to an agent (one at most)

    [shapes.v5e]
    rows = 8192
    cols = 8192
    size = "large"                # "small" (default): runs everywhere, CPU interpret mode
                                  # included; "large": only on real hardware
    production = true             # the size the user runs (one at most): compile
                                  # verdicts, estimates and rankings are for it

Reserved keys in a shape table: ``size``, ``held_out``, ``atol``, ``rtol`` (per-shape
tolerance overrides), ``production``. Without ``[shapes]`` the task has one small
configuration named ``default`` that calls ``make_inputs(key)``. Without a
``production = true`` the production shape is the largest visible configuration (by
the product of its integer parameters).

``reference.py`` defines ``make_inputs(key, **shape)`` returning a tuple of arrays,
``reference(*inputs)``, and optionally ``flops(*inputs)``. ``kernel.py``, when present,
is the starting candidate and defines ``kernel(*inputs)``.

``--set KEY=VALUE`` sets shape parameter KEY in every check configuration that has it
(or in all of them when ``make_inputs`` accepts KEY); ``--set NAME.KEY=VALUE`` targets
the configuration NAME only. The production shape is chosen before ``--set`` and keeps
its written sizes.
"""

from __future__ import annotations

import datetime
import re
import tomllib
from pathlib import Path
from typing import Any

from tilewright.kernels.tasks.loaders.pysource import PySource, parse_literal
from tilewright.kernels.tasks.task import ShapeConfig, Task, TaskError, UnknownOverride

TOP_LEVEL_KEYS = {"name", "description", "family", "require_pallas", "atol", "rtol",
                  "tolerance", "shapes"}
SHAPE_RESERVED = {"size", "held_out", "atol", "rtol", "production"}
DTYPES = {"float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64",
          "uint8", "uint32", "float8_e4m3fn", "float8_e5m2"}


def load(root: Path, overrides: dict[str, Any] | None = None) -> Task:
    toml_path = root / "task.toml"
    text = _read(toml_path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"at line (\d+)", str(exc))
        raise TaskError(toml_path, f"TOML syntax error: {exc}",
                        line=int(match.group(1)) if match else None,
                        expected="valid TOML (see docs/TASK_FORMATS.md)") from exc
    unknown = sorted(set(data) - TOP_LEVEL_KEYS)
    if unknown:
        raise TaskError(toml_path, f"unknown key {unknown[0]!r}",
                        line=_line_of(text, rf"^\s*{re.escape(unknown[0])}\s*="),
                        expected="one of " + ", ".join(sorted(TOP_LEVEL_KEYS)))

    ref_path = root / "reference.py"
    if not ref_path.is_file():
        raise TaskError(root, "task.toml found but reference.py is missing",
                        expected="reference.py defining make_inputs(key, **shape) and "
                                 "reference(*inputs)")
    ref = PySource.parse(ref_path)
    make_inputs = ref.require("make_inputs", "make_inputs(key, **shape) -> tuple of arrays")
    ref.require("reference", "reference(*inputs)")
    if not make_inputs.params and not make_inputs.var_positional:
        raise TaskError(ref_path, "make_inputs takes no arguments", line=make_inputs.line,
                        expected="def make_inputs(key, **shape): the first argument is a "
                                 "jax.random key")

    atol = _number(data, "atol", 1e-5, toml_path, text)
    rtol = _number(data, "rtol", 1e-5, toml_path, text)
    require_pallas = data.get("require_pallas", True)
    if not isinstance(require_pallas, bool):
        raise TaskError(toml_path, "require_pallas must be true or false",
                        line=_line_of(text, r"^\s*require_pallas\s*="), expected="a boolean")
    for key in ("name", "description", "family"):
        if key in data and not isinstance(data[key], str):
            raise TaskError(toml_path, f"{key} must be a string",
                            line=_line_of(text, rf"^\s*{key}\s*="), expected="a quoted string")

    shapes = _shapes(data.get("shapes"), toml_path, text)
    production = _production(data.get("shapes"), shapes, toml_path, text)
    meta: dict[str, Any] = {"tolerances": _tolerances(data.get("tolerance"), toml_path, text)}
    for shape in shapes:
        for param in shape.params:
            if not make_inputs.accepts_keyword(param):
                raise TaskError(toml_path, f"shape {shape.name!r} sets {param!r}, which "
                                f"make_inputs (reference.py:{make_inputs.line}) does not accept",
                                line=_line_of(text, rf"^\s*\[shapes\.{re.escape(shape.name)}\]"),
                                expected="parameters of make_inputs: "
                                         + ", ".join(make_inputs.params[1:]))
    if overrides:
        shapes = _apply_overrides(shapes, overrides, make_inputs, toml_path)
        meta["overrides"] = dict(overrides)

    kernel_path = root / "kernel.py"
    warnings = _check_kernel(kernel_path) if kernel_path.is_file() else []
    if warnings:
        meta["warnings"] = warnings
    return Task(
        name=data.get("name", root.name), root=root, layout="native",
        description=data.get("description", "").strip(), reference_path=ref_path,
        shapes=shapes, atol=atol, rtol=rtol, require_pallas=require_pallas,
        family=data.get("family"),
        kernel_path=kernel_path if kernel_path.is_file() else None, meta=meta,
        production=production,
    )


def _production(table: Any, shapes: tuple[ShapeConfig, ...], path: Path,
                text: str) -> ShapeConfig:
    """The configuration marked ``production = true`` (one at most, never held out), else
    the largest visible one by the product of its integer parameters (ties: the first
    written). Chosen before ``--set``, which shrinks check shapes only."""
    marked = []
    for name, entry in (table or {}).items():
        flag = entry.get("production", False) if isinstance(entry, dict) else False
        if not isinstance(flag, bool):
            raise TaskError(path, f"shapes.{name}.production must be a boolean",
                            line=_line_of(text, rf"^\s*\[shapes\.{re.escape(name)}\]"),
                            expected="production = true")
        if flag:
            marked.append(name)
    if len(marked) > 1:
        raise TaskError(path, f"{len(marked)} shapes are marked production ({', '.join(marked)})",
                        line=_line_of(text, rf"^\s*\[shapes\.{re.escape(marked[1])}\]"),
                        expected="at most one production = true")
    by_name = {s.name: s for s in shapes}
    if marked:
        chosen = by_name[marked[0]]
        if chosen.held_out:
            raise TaskError(path, f"shapes.{chosen.name} is both held out and production",
                            line=_line_of(text, rf"^\s*\[shapes\.{re.escape(chosen.name)}\]"),
                            expected="the production shape is shown to agents: not held out")
        return chosen
    visible = [s for s in shapes if not s.held_out]
    return max(visible, key=_volume)  # max keeps the first of equals


def _volume(shape: ShapeConfig) -> int:
    volume = 1
    for value in shape.params.values():
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            volume *= value
    return volume


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise TaskError(path, f"cannot read: {exc.strerror or exc}") from exc


def _line_of(text: str, pattern: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if re.search(pattern, line):
            return number
    return None


def _number(table: dict[str, Any], key: str, default: float, path: Path, text: str,
            where: str = "") -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise TaskError(path, f"{where}{key} must be a non-negative number, got {value!r}",
                        line=_line_of(text, rf"^\s*{key}\s*="), expected="e.g. 1e-5")
    return float(value)


def _tolerances(table: Any, path: Path, text: str) -> dict[str, dict[str, float]]:
    if table is None:
        return {}
    line = _line_of(text, r"^\s*\[tolerance")
    if not isinstance(table, dict):
        raise TaskError(path, "tolerance must be a table of dtypes", line=line,
                        expected="[tolerance.bfloat16] atol = ..., rtol = ...")
    out: dict[str, dict[str, float]] = {}
    for dtype, entry in table.items():
        if dtype not in DTYPES or not isinstance(entry, dict):
            raise TaskError(path, f"tolerance.{dtype} is not a dtype table", line=line,
                            expected="one of " + ", ".join(sorted(DTYPES)))
        extra = set(entry) - {"atol", "rtol"}
        if extra:
            raise TaskError(path, f"tolerance.{dtype} has unknown key {sorted(extra)[0]!r}",
                            line=line, expected="atol and rtol")
        out[dtype] = {k: _number(entry, k, 0.0, path, text, f"tolerance.{dtype}.")
                      for k in entry}
    return out


def _shapes(table: Any, path: Path, text: str) -> tuple[ShapeConfig, ...]:
    if table is None:
        return (ShapeConfig("default", {}),)
    if not isinstance(table, dict) or not table:
        raise TaskError(path, "shapes must hold named tables", line=_line_of(text, r"^\s*shapes"),
                        expected="[shapes.small] rows = 256 ...")
    shapes = []
    for name, entry in table.items():
        line = _line_of(text, rf"^\s*\[shapes\.{re.escape(name)}\]")
        if not isinstance(entry, dict):
            raise TaskError(path, f"shapes.{name} must be a table", line=line,
                            expected=f"[shapes.{name}] with key = value lines")
        size = entry.get("size", "small")
        if size not in ("small", "large"):
            raise TaskError(path, f"shapes.{name}.size is {size!r}", line=line,
                            expected='"small" (runs on CPU too) or "large" (hardware only)')
        held_out = entry.get("held_out", False)
        if not isinstance(held_out, bool):
            raise TaskError(path, f"shapes.{name}.held_out must be a boolean", line=line,
                            expected="held_out = true")
        tol = {k: _number(entry, k, 0.0, path, text, f"shapes.{name}.")
               for k in ("atol", "rtol") if k in entry}
        params = {k: v for k, v in entry.items() if k not in SHAPE_RESERVED}
        for key, value in params.items():
            if isinstance(value, datetime.date | datetime.time):  # TOML dates: not a shape
                raise TaskError(path, f"shapes.{name}.{key} is a date/time", line=line,
                                expected="numbers, strings, booleans or lists of them")
        shapes.append(ShapeConfig(name, params, size, held_out, tol.get("atol"), tol.get("rtol")))
    held = [s.name for s in shapes if s.held_out]
    if len(held) > 1:
        raise TaskError(path, f"{len(held)} shapes are held out ({', '.join(held)})",
                        line=_line_of(text, rf"^\s*\[shapes\.{re.escape(held[1])}\]"),
                        expected="at most one held_out = true")
    if len(held) == len(shapes):
        raise TaskError(path, "every shape is held out", expected="at least one visible shape")
    return tuple(shapes)


def _apply_overrides(shapes: tuple[ShapeConfig, ...], overrides: dict[str, Any], make_inputs,
                     path: Path) -> tuple[ShapeConfig, ...]:
    names = {s.name for s in shapes}
    params = [dict(s.params) for s in shapes]
    key_arg = make_inputs.params[0] if make_inputs.params else None  # the PRNG key
    for raw_key, raw_value in overrides.items():
        value = parse_literal(raw_value) if isinstance(raw_value, str) else raw_value
        target, _, key = raw_key.rpartition(".")
        if target and target not in names:
            raise UnknownOverride(path, f"--set {raw_key}={raw_value}: no shape named {target!r}",
                            expected="one of " + ", ".join(sorted(names)))
        hit = False
        for shape, p in zip(shapes, params, strict=True):
            if target and shape.name != target:
                continue
            if key in p or (make_inputs.accepts_keyword(key) and key != key_arg):
                p[key] = value
                hit = True
        if not hit:
            known = sorted({k for p in params for k in p} | set(make_inputs.params[1:]))
            raise UnknownOverride(path, f"--set {raw_key}={raw_value}: no shape parameter {key!r}",
                            expected="one of " + ", ".join(known) if known else
                            "make_inputs takes no shape parameters")
    return tuple(ShapeConfig(s.name, p, s.size, s.held_out, s.atol, s.rtol)
                 for s, p in zip(shapes, params, strict=True))


def _check_kernel(path: Path) -> list[str]:
    """Problems of the starting kernel, reported as warnings: a broken start is allowed."""
    try:
        source = PySource.parse(path)
    except TaskError as exc:
        return [str(exc)]
    if "kernel" not in source.functions() and "kernel" not in source.assignments():
        return [f"{path}: defines no `kernel` (the entry point a candidate must define)"]
    return []
