"""The JAXBench workload layout: one ``baseline.py`` per task directory.

``baseline.py`` defines ``CONFIG`` (a dict literal; sizes and metadata),
``create_inputs(dtype=...)`` returning a tuple of arrays, ``workload(*inputs)`` (the
reference, and the entry point a candidate must define) and optionally
``get_flops()``. Everything else in the file (``benchmark()``, ``__main__``) is
ignored.

How tilewright reads it:

- One check configuration, ``default``, of size ``small``: tilewright runs what you
  asked for, on every host. JAXBench sizes are TPU-sized; on a CPU shrink them with
  ``--set KEY=VALUE``. The production shape (``production``, what compile verdicts,
  estimates and rankings are for) is CONFIG and the hard-coded sizes as written. KEY is a ``CONFIG`` key, or else a module-level constant
  assigned a literal (the KernelBench-derived workloads keep sizes there); the
  overrides become the configuration's params and are written into the baseline's and
  the candidate's ``CONFIG`` (or module globals) before inputs are built.
- ``dtype``: the task runs as JAXBench benchmarks it: JAXBench's harness (its
  ``harness/evaluator.py`` and ``runner.py``) calls ``create_inputs(dtype=jnp.bfloat16)``
  whenever ``create_inputs`` takes a ``dtype``, whatever its default (33 of the 50 public
  tasks default to float32 and are still benchmarked in bfloat16); one that takes no
  dtype builds what it builds. ``--set dtype=float32`` (or bfloat16, float16) asks for
  another. A 16-bit output is judged against the reference computed in float32 from the
  same inputs, the written reference's own rounding allowed.
- Tolerances: ``CONFIG['atol']``/``CONFIG['rtol']`` when present, else JAXBench's 1e-2.
- Fresh inputs per trial: ``create_inputs`` seeds itself (``jax.random.key(42)``), so
  the worker re-seeds it by folding the trial's key into every key it creates.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from tilewright.kernels.source.literals import number_sites
from tilewright.kernels.tasks.loaders.pysource import Function, PySource, parse_literal
from tilewright.kernels.tasks.task import ShapeConfig, Task, TaskError, UnknownOverride

DEFAULT_TOL = 1e-2  # JAXBench's harness: np.allclose(atol=rtol=1e-2)
DTYPES = ("float32", "bfloat16", "float16")


def load(root: Path, overrides: dict[str, Any] | None = None) -> Task:
    path = root / "baseline.py"
    src = PySource.parse(path)
    create_inputs = src.require("create_inputs", "create_inputs(dtype=jnp.float32) -> tuple of arrays")
    src.require("workload", "workload(*inputs)")
    config = _config(src)
    constants = {k: v for k, v in src.literal_constants().items()
                 if k != "CONFIG" and not k.startswith("_")}

    params, rewrites = _apply_overrides(src, config, constants, overrides, path,
                                        create_inputs.accepts_keyword("dtype"),
                                        create_inputs.line)

    meta: dict[str, Any] = {
        "config": {**config, **{k: v for k, v in params.items() if k in config}},
        "dtype": params.get("dtype", published_dtype(create_inputs)),
        "has_flops": "get_flops" in src.functions(),
    }
    if rewrites:
        # [[old, new], ...]: hard-coded sizes replaced in baseline.py (see _apply_overrides)
        meta["literal_rewrites"] = [[old, new] for old, new in rewrites.items()]
    if overrides:
        meta["overrides"] = dict(overrides)
    optimized = root / "optimized.py"
    check = ShapeConfig("default", params, "small")
    # The production shape: CONFIG and the hard-coded sizes as written (``--set`` only
    # shrinks the check shape); the dtype asked for is kept, it is not a size.
    production, production_meta = check, None
    if any(k != "dtype" for k in params):
        production = ShapeConfig("production", {k: v for k, v in params.items()
                                                if k == "dtype"}, "large")
        production_meta = {"config": config, "dtype": meta["dtype"],
                           "has_flops": meta["has_flops"]}
    return Task(
        name=root.name, root=root, layout="jaxbench",
        description=_description(src, config), reference_path=path,
        shapes=(check,),
        atol=_tol(config, "atol", path), rtol=_tol(config, "rtol", path),
        require_pallas=True, family=None,
        kernel_path=optimized if optimized.is_file() else None, meta=meta,
        production=production, production_meta=production_meta,
    )


def published_dtype(create_inputs: Function) -> str:
    """The dtype JAXBench benchmarks the task in: bfloat16 whenever ``create_inputs``
    takes a ``dtype`` (its harness passes ``dtype=jnp.bfloat16`` then); otherwise the
    inputs are what the function builds, and float32 stands for that here."""
    return "bfloat16" if create_inputs.accepts_keyword("dtype") else "float32"


def _apply_overrides(src: PySource, config: dict[str, Any], constants: dict[str, Any],
                     overrides: dict[str, Any] | None, path: Path, takes_dtype: bool,
                     inputs_line: int) -> tuple[dict[str, Any], dict[Any, Any]]:
    """Validate ``--set`` pairs and decide how each one reaches the inputs.

    A key reaches them in one of three ways, or it is refused (never silently ignored):

    - the baseline reads ``CONFIG['key']`` somewhere: the value is written into CONFIG;
    - a module-level constant of that name: the module global is set;
    - the KernelBench-derived workloads copy CONFIG's numbers into literals
      (``jax.random.uniform(key, (4096, 8192))``): every literal equal to the old value
      is rewritten, provided that value identifies the key. When two keys share the
      value (``in_features`` = ``out_features`` = 8192) both must be set, to the same
      new value, or the literal cannot be attributed and the override is refused with
      the line that hard-codes it.

    Returns the params and the ``{old: new}`` literal rewrites.
    """
    params: dict[str, Any] = {}
    for key, raw in (overrides or {}).items():
        value = parse_literal(raw) if isinstance(raw, str) else raw
        if key == "dtype":
            if value not in DTYPES:
                raise TaskError(path, f"--set dtype={value}: unsupported dtype",
                                expected="one of " + ", ".join(DTYPES))
            if not takes_dtype:
                raise TaskError(path, f"--set dtype={value}: create_inputs takes no dtype parameter",
                                line=inputs_line, expected="def create_inputs(dtype=...)")
        elif key not in config and key not in constants:
            known = sorted([*config, *constants, "dtype"])
            raise UnknownOverride(path, f"--set {key}={raw}: not a CONFIG key nor a module-level constant",
                            expected="one of " + ", ".join(known))
        params[key] = value

    read_keys = _config_keys_read(src)
    literal_keys = [k for k in params if k in config and k not in read_keys and k != "dtype"]
    rewrites: dict[Any, Any] = {}
    if not literal_keys:
        return params, rewrites
    sites = number_sites(src.tree)
    for key in literal_keys:
        old, new = config[key], params[key]
        if type(old) not in (int, float) or type(new) not in (int, float):
            raise TaskError(path, f"--set {key}={new!r}: baseline.py never reads CONFIG[{key!r}] "
                            f"and its value {old!r} is not a number that could be hard-coded",
                            expected="a CONFIG key that the baseline reads")
        where = [s for s in sites if type(s.value) is type(old) and s.value == old]
        if not where:
            raise UnknownOverride(path, f"--set {key}={new}: baseline.py never reads CONFIG[{key!r}] "
                            f"and no literal {old!r} appears in its functions, so the override "
                            "cannot reach the inputs", line=inputs_line,
                            expected="a key create_inputs uses; its sizes are hard-coded")
        sharing = sorted(k for k, v in config.items()
                         if k != key and type(v) is type(old) and v == old and k not in read_keys)
        clash = [k for k in sharing if params.get(k, old) != new]
        if clash:
            first = where[0]
            raise TaskError(path, f"--set {key}={new}: the size {old!r} is hard-coded "
                            f"({first.function}, line {first.line}) and also equals "
                            f"CONFIG[{clash[0]!r}], so the literal cannot be attributed to "
                            f"{key!r}", line=first.line,
                            expected=f"set {', '.join(clash)} to {new!r} as well (the same "
                                     "value), or edit baseline.py to read CONFIG")
        if old in rewrites and rewrites[old] != new:
            raise TaskError(path, f"--set {key}={new}: conflicting values for the literal {old!r}",
                            line=where[0].line)
        if old != new:
            rewrites[old] = new
    return params, rewrites


def _config_keys_read(src: PySource) -> set[str]:
    """CONFIG keys the baseline reads by name: the key's string appears somewhere other
    than CONFIG's own display (``CONFIG['M']``, ``C = CONFIG; C['M']``, ``.get('M')``)."""
    own: set[int] = set()
    node = src.assignments().get("CONFIG")
    if node is not None and isinstance(node.value, ast.Dict):
        own = {id(k) for k in node.value.keys if k is not None}
    return {n.value for n in ast.walk(src.tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in own}


def _config(src: PySource) -> dict[str, Any]:
    """CONFIG's literal entries; non-literal values (``jnp.bfloat16``) are kept as source text."""
    node = src.assignments().get("CONFIG")
    if node is None:
        return {}
    if not isinstance(node.value, ast.Dict):
        raise TaskError(src.path, "CONFIG is not a dict literal", line=src.line_of(node),
                        expected="CONFIG = {'M': 1024, ...}")
    config: dict[str, Any] = {}
    for key, value in zip(node.value.keys, node.value.values, strict=True):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            raise TaskError(src.path, "CONFIG keys must be string literals",
                            line=src.line_of(key or value), expected="CONFIG = {'M': 1024, ...}")
        try:
            config[key.value] = ast.literal_eval(value)
            json.dumps(config[key.value])  # it travels to the worker in the task's spec
        except (ValueError, TypeError, SyntaxError, RecursionError):
            config[key.value] = ast.unparse(value)
    return config


def _tol(config: dict[str, Any], key: str, path: Path) -> float:
    value = config.get(key, DEFAULT_TOL)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise TaskError(path, f"CONFIG[{key!r}] is {value!r}", expected="a non-negative number")
    return float(value)


def _description(src: PySource, config: dict[str, Any]) -> str:
    doc = (ast.get_docstring(src.tree) or "").strip()
    if doc:
        return doc.split("\n\n")[0]
    name = config.get("name")
    return f"JAXBench workload {name}" if isinstance(name, str) else "JAXBench workload"
