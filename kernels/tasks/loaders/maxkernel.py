"""The MaxKernel task layout: ``kernel_task.yaml`` + ``reference.py``.

``kernel_task.yaml`` holds ``task_id``, ``description``, ``input_gen_code`` (Python
source defining ``get_inputs()``, which returns ``(dynamic_args, static_args)`` or a
list of such pairs, one per input configuration), and optionally ``atol``/``rtol``
(a number, or a list with one number per configuration) and ``sort_outputs``.
``reference.py`` defines ``computation(*dynamic_args, *static_args)``; the static
arguments are the trailing ``static_argnums``. A candidate defines ``computation``.

How tilewright reads it:

- Each configuration returned by ``get_inputs()`` is a shape configuration named
  ``config_<i>`` with params ``{"index": i}``, all of size ``small`` (tilewright runs
  what the task asks; shrink with ``--set``). The app side cannot run
  ``get_inputs``, so it counts configurations from a per-configuration ``atol``/``rtol``
  list or from a literal list in ``get_inputs``'s return statement; when neither tells,
  the worker's runtime finds the real count (``TaskRuntime.configs()``). The
  production shape is the first configuration with the sizes as written.
- ``--set KEY=VALUE`` replaces every literal named KEY in ``input_gen_code``: a
  ``KEY = <literal>`` assignment (module level or inside ``get_inputs``) or a
  ``'KEY': <literal>`` entry of a dict display (``config = {'batch_size': 4096}``), which
  is where MaxKernel tasks keep their sizes. The overrides appear in every
  configuration's params.
- Fresh inputs per trial: ``get_inputs()`` seeds itself, so the worker folds the
  trial's key into every key it creates (and re-seeds numpy's generators).
- Default tolerances, when the YAML gives none: 1e-2, like MaxKernel's evaluator.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import yaml

from tilewright.kernels.source.literals import literal_sites
from tilewright.kernels.tasks.loaders.pysource import PySource, parse_literal
from tilewright.kernels.tasks.task import ShapeConfig, Task, TaskError, UnknownOverride

DEFAULT_TOL = 1e-2


def load(root: Path, overrides: dict[str, Any] | None = None) -> Task:
    path = root / "kernel_task.yaml"
    try:
        text = path.read_text()
    except OSError as exc:
        raise TaskError(path, f"cannot read: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        raise TaskError(path, f"YAML syntax error: {getattr(exc, 'problem', None) or exc}",
                        line=mark.line + 1 if mark else None,
                        expected="valid YAML (see docs/TASK_FORMATS.md)") from exc
    if not isinstance(data, dict):
        raise TaskError(path, "the file is not a mapping",
                        expected="task_id, description, input_gen_code, atol, rtol keys")
    lines = _value_lines(node)
    code = data.get("input_gen_code")
    if not isinstance(code, str) or not code.strip():
        raise TaskError(path, "input_gen_code is missing or not a string",
                        line=_line(lines, "input_gen_code"),
                        expected="input_gen_code: | followed by Python defining get_inputs()")
    # A block scalar (``|``) starts on the line after its key: code line 1 is that line.
    offset = lines.get("input_gen_code", 0)
    gen = PySource.parse(path, code, line_offset=offset)
    get_inputs = gen.require("get_inputs", "get_inputs() -> (dynamic_args, static_args) "
                             "or a list of them (inside input_gen_code)")

    ref_path = root / "reference.py"
    if not ref_path.is_file():
        raise TaskError(root, "kernel_task.yaml found but reference.py is missing",
                        expected="reference.py defining computation(*dynamic, *static)")
    PySource.parse(ref_path).require("computation", "computation(*dynamic_args, *static_args)")

    atol, atols = _tolerance(data, "atol", path, lines)
    rtol, rtols = _tolerance(data, "rtol", path, lines)
    literal_count = _literal_list_length(gen, get_inputs.name)
    lists = [len(x) for x in (atols, rtols) if x is not None]
    count = literal_count if literal_count is not None else max(lists, default=1)
    warnings = []
    if any(n != count for n in lists):
        # MaxKernel's evaluator reuses a list's last entry for the configurations it lacks
        warnings.append(f"{path}:{_line(lines, 'atol') or _line(lines, 'rtol')}: atol/rtol "
                        f"list lengths {lists} differ from the {count} input configuration(s); "
                        "the last entry is reused, as MaxKernel's evaluator does")
    atols = _fit(atols, count)
    rtols = _fit(rtols, count)

    params = _overrides(gen, overrides, path)
    shapes = tuple(
        ShapeConfig(f"config_{i}", {"index": i, **params}, "small",
                    atol=atols[i] if atols else None, rtol=rtols[i] if rtols else None)
        for i in range(count)
    )
    meta: dict[str, Any] = {
        "task_id": data.get("task_id"),
        # per-configuration tolerances, for configurations the worker counts itself
        "atols": atols, "rtols": rtols,
        "configs_counted": bool(atols or rtols or literal_count is not None),
        "input_gen_line_offset": offset,
        "sort_outputs": bool(data.get("sort_outputs", False)),
    }
    if overrides:
        meta["overrides"] = dict(overrides)
    if warnings:
        meta["warnings"] = warnings
    task_id = data.get("task_id")
    # The production shape: the first configuration as input_gen_code writes it
    # (``--set`` shrinks the check shapes only).
    production, production_meta = shapes[0], None
    if params:
        production = ShapeConfig("production", {"index": 0}, "large",
                                 atol=shapes[0].atol, rtol=shapes[0].rtol)
        production_meta = {k: v for k, v in meta.items() if k != "overrides"}
        production_meta["configs_counted"] = True
    return Task(
        name=task_id if isinstance(task_id, str) and task_id else root.name,
        root=root, layout="maxkernel",
        description=str(data.get("description") or "").strip(), reference_path=ref_path,
        shapes=shapes, atol=atol, rtol=rtol, require_pallas=True,
        kernel_path=None, input_gen_path=path, meta=meta,
        production=production, production_meta=production_meta,
    )


def _value_lines(node: yaml.Node | None) -> dict[str, int]:
    """0-based line of each top-level value, +1 for block scalars (content starts below)."""
    out: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                block = isinstance(value, yaml.ScalarNode) and value.style in ("|", ">")
                out[key.value] = value.start_mark.line + (1 if block else 0)
    return out


def _line(lines: dict[str, int], key: str) -> int | None:
    return lines[key] + 1 if key in lines else None


def _tolerance(data: dict[str, Any], key: str, path: Path,
               lines: dict[str, int]) -> tuple[float, list[float] | None]:
    value = data.get(key, DEFAULT_TOL)
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise TaskError(path, f"{key} has {v!r}", line=_line(lines, key),
                            expected="a non-negative number or a list of them, one per "
                                     "input configuration")
    if isinstance(value, list):
        if not value:
            raise TaskError(path, f"{key} is an empty list", line=_line(lines, key),
                            expected="one number per input configuration")
        return float(max(value)), [float(v) for v in value]
    return float(value), None


def _fit(values: list[float] | None, count: int) -> list[float] | None:
    """A per-configuration list stretched (last entry reused) or cut to ``count``."""
    if values is None:
        return None
    return (values + [values[-1]] * count)[:count]


def _literal_list_length(gen: PySource, function: str) -> int | None:
    """N when ``get_inputs`` ends in ``return [pair, pair, ...]``; 1 for ``return (d, s)``."""
    for node in gen.tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            returns = [n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value]
            if len(returns) != 1:
                return None
            value = returns[0].value
            if isinstance(value, ast.List):
                return len(value.elts)
            if isinstance(value, ast.Tuple) and len(value.elts) == 2:
                return 1
    return None


def _overrides(gen: PySource, overrides: dict[str, Any] | None, path: Path) -> dict[str, Any]:
    """Validate ``--set`` keys against the literals ``input_gen_code`` sets (see literal_sites)."""
    sites = literal_sites(gen.tree)
    params: dict[str, Any] = {}
    for key, raw in (overrides or {}).items():
        if key not in sites or key == "index":
            raise UnknownOverride(path, f"--set {key}={raw}: input_gen_code sets no literal named {key!r}",
                            expected="one of " + ", ".join(sorted(sites))
                            if sites else "input_gen_code has no named literals to set")
        params[key] = parse_literal(raw) if isinstance(raw, str) else raw
    return params


def named_sizes(path: Path) -> dict[str, Any]:
    """The named literals of a task's ``input_gen_code`` as written (``--set`` keys and
    their values; the first site of a name when it has several)."""
    code = (yaml.safe_load(path.read_text()) or {}).get("input_gen_code") or ""
    try:
        sites = literal_sites(ast.parse(code))
    except SyntaxError:
        return {}
    found: dict[str, Any] = {}
    for name, nodes in sites.items():
        try:
            found[name] = ast.literal_eval(nodes[0])
        except (ValueError, SyntaxError):
            continue
    return found
