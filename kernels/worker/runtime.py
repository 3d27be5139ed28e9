"""A task at run time, whatever its layout: inputs, reference, flops, candidate entry.

Worker-side (imports JAX). ``load_runtime(task.to_spec())`` imports the task's
reference once and adapts the three layouts to one interface:

- ``configs()``: the shape configurations (MaxKernel: counted by running
  ``get_inputs()`` when the app side could not count them statically).
- ``make_inputs(config, key) -> (dynamic_args, static_args)``: fresh inputs for a key.
  Native: ``make_inputs(key, **params)``. JAXBench and MaxKernel input builders seed
  themselves, so the trial key is folded into every PRNG key they create (and into
  numpy's seeds) while they run: new key, new inputs, same distributions.
- ``reference(*dynamic, *static)``; ``flops(config, dynamic) -> float | None``;
  ``tolerance(config, dtype) -> (atol, rtol)``.
- ``load_candidate(source, filename)``: compiles the candidate under ``filename`` (so
  tracebacks carry its line numbers), runs it in a fresh module and returns its entry
  point (``kernel``, ``workload`` or ``computation``); ``MissingEntryPoint`` otherwise.
  Syntax errors and exceptions at import propagate unchanged for the harness to classify.

A task whose own code misbehaves (an input builder returning the wrong type, a
reference that fails to import) raises ``TaskError`` naming the file and what was
expected.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import linecache
import os
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tilewright.kernels.source.literals import replace_literals
from tilewright.kernels.tasks.task import ShapeConfig, Task, TaskError

_module_ids = itertools.count(1)
SIGNATURES = {"computation": "computation(*dynamic_args, *static_args)"}


class MissingEntryPoint(Exception):
    """The candidate ran but defines no callable entry point."""

    def __init__(self, filename: str, entry: str, found: list[str]) -> None:
        self.filename = filename
        self.entry = entry
        hint = f" (it defines: {', '.join(found)})" if found else ""
        signature = SIGNATURES.get(entry, f"{entry}(*inputs)")
        super().__init__(f"{filename} defines no function `{entry}`{hint}; a candidate for "
                         f"this task must define `def {signature}`")


def load_runtime(task_spec: dict[str, Any]) -> TaskRuntime:
    """The runtime for ``Task.to_spec()`` output; imports the task's reference."""
    task = Task.from_spec(task_spec)
    cls = {"native": NativeRuntime, "jaxbench": JaxBenchRuntime,
           "maxkernel": MaxKernelRuntime}[task.layout]
    return cls(task)


class TaskRuntime:
    """Layout-independent view of a task inside the worker."""

    def __init__(self, task: Task) -> None:
        self.task = task
        try:
            source = task.reference_source()
        except OSError as exc:
            raise TaskError(task.reference_path, f"cannot read: {exc.strerror or exc}") from exc
        with task_imports(task.root):
            self.ref_module = _import_task_file(task.reference_path, source)
        self._candidate_name: str | None = None

    # -- shapes --------------------------------------------------------------------
    def configs(self) -> list[ShapeConfig]:
        return list(self.task.shapes)

    def configs_for(self, platform: str) -> list[ShapeConfig]:
        """Configurations meant for a host (as ``Task.shapes_for``): small ones on CPU."""
        return [c for c in self.configs() if platform != "cpu" or c.size == "small"]

    def tolerance(self, config: ShapeConfig, dtype: Any = None) -> tuple[float, float]:
        """(atol, rtol) for a comparison: the shape's own, else the output dtype's, else the task's."""
        per_dtype = self.task.meta.get("tolerances", {}).get(str(np.dtype(dtype))
                                                              if dtype is not None else "", {})
        atol = config.atol if config.atol is not None else per_dtype.get("atol", self.task.atol)
        rtol = config.rtol if config.rtol is not None else per_dtype.get("rtol", self.task.rtol)
        return float(atol), float(rtol)

    # -- the layout-specific parts -------------------------------------------------
    def make_inputs(self, config: ShapeConfig, key: jax.Array) -> tuple[tuple, tuple]:
        raise NotImplementedError

    def reference(self, *args: Any) -> Any:
        with task_imports(self.task.root):
            return self._reference_fn()(*args)

    def input_signature(self, config: ShapeConfig) -> tuple[list[Any], list[Any], str]:
        """The inputs' shapes and dtypes without building them: the input builder runs
        under ``jax.eval_shape`` (TPU-sized tasks cost nothing), or for real when it
        needs concrete values (Python control flow on arrays). Returns (dynamic
        ShapeDtypeStructs, static args, how: ``abstract`` or ``concrete``).
        Raises ``TaskError`` when the builder fails."""
        statics: list[tuple] = []

        def build() -> tuple:
            dyn, static = self.make_inputs(config, None)
            statics.append(static)  # static args are Python values: kept out of the trace
            return dyn

        try:
            dyn = jax.eval_shape(build)
            static = statics[-1]
            how = "abstract"
        except TaskError as exc:
            if not isinstance(exc.__cause__, jax.errors.JAXTypeError | TypeError):
                raise
            dyn, static = self.make_inputs(config, jax.random.PRNGKey(0))
            dyn = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in dyn)
            how = "concrete"
        return list(dyn), list(static), how

    def small_integer_inputs(self, config: ShapeConfig, dyn: list[Any],
                             limit: int = 1 << 16) -> dict[int, Any]:
        """The values of the inputs that are small integer arrays (group sizes, offsets,
        lengths: what a kernel's loop bounds are computed from), built at ``config`` from
        the task's own recipe with a fixed key; nothing else is built (the input builder
        runs under ``jit`` returning only those, so XLA never makes the big arrays).
        Empty when there are none or the builder cannot run that way."""
        wanted = [i for i, a in enumerate(dyn)
                  if np.issubdtype(np.dtype(a.dtype), np.integer)
                  and int(np.prod(a.shape)) <= limit]
        if not wanted:
            return {}
        cache = self.__dict__.setdefault("_tilewright_small_inputs", {})
        key = (config.name, json.dumps(config.params, sort_keys=True, default=str),
               tuple(wanted))
        if key in cache:  # the same every evaluation: built once per runtime
            return cache[key]

        def build(key: Any) -> tuple:
            made, _static = self.make_inputs(config, key)
            return tuple(made[i] for i in wanted)

        try:
            values = jax.jit(build)(jax.random.PRNGKey(0))
        except Exception:  # Python control flow on values, a builder that needs more
            values = None
        cache[key] = {} if values is None else \
            {i: np.asarray(v) for i, v in zip(wanted, values, strict=True)}
        return cache[key]

    def flops(self, config: ShapeConfig, inputs: tuple) -> float | None:
        return None

    def _reference_fn(self) -> Callable[..., Any]:
        return getattr(self.ref_module, self.task.entry)

    # -- candidates ----------------------------------------------------------------
    def load_candidate(self, source: str, filename: str) -> Callable[..., Any]:
        """Run the candidate's source in a fresh module; return its entry point."""
        if self._candidate_name:
            sys.modules.pop(self._candidate_name, None)
        name = f"tilewright_candidate_{next(_module_ids)}"
        self._candidate_name = name
        from tilewright.kernels.worker import pallas_compat

        pallas_compat.install()  # older Pallas names load (a no-op where already added)
        with task_imports(self.task.root):  # a kernel may import the task's helpers
            module = _exec_source(source, filename, name)
        self._prepare_candidate(module)
        entry = getattr(module, self.task.entry, None)
        if not callable(entry):
            found = sorted(k for k, v in vars(module).items()
                           if callable(v) and not k.startswith("_")
                           and getattr(v, "__module__", None) == name)
            raise MissingEntryPoint(filename, self.task.entry, found)
        return entry

    def _prepare_candidate(self, module: types.ModuleType) -> None:
        """Hook: JAXBench candidates get the same CONFIG overrides as the baseline."""


class NativeRuntime(TaskRuntime):
    def make_inputs(self, config: ShapeConfig, key: jax.Array) -> tuple[tuple, tuple]:
        fn = self.ref_module.make_inputs
        key = jax.random.PRNGKey(0) if key is None else key
        out = _task_call(fn, self.task.reference_path, key, **config.params)
        return _arrays(out, self.task.reference_path, fn, "make_inputs", "a tuple of arrays"), ()

    def _reference_fn(self) -> Callable[..., Any]:
        return self.ref_module.reference

    def flops(self, config: ShapeConfig, inputs: tuple) -> float | None:
        fn = getattr(self.ref_module, "flops", None)
        return _as_flops(fn(*_dynamic(inputs)), self.task.reference_path, fn) if fn else None


class JaxBenchRuntime(TaskRuntime):
    def __init__(self, task: Task) -> None:
        super().__init__(task)
        self._apply(self.ref_module)

    def _apply(self, module: types.ModuleType) -> None:
        """Write the configuration's overrides into a module's CONFIG (or its globals)."""
        config = getattr(module, "CONFIG", None)
        for key, value in self.task.shapes[0].params.items():
            if key == "dtype":
                continue
            if isinstance(config, dict) and key in config:
                config[key] = value
            else:
                setattr(module, key, value)

    def _prepare_candidate(self, module: types.ModuleType) -> None:
        self._apply(module)

    def make_inputs(self, config: ShapeConfig, key: jax.Array) -> tuple[tuple, tuple]:
        self._apply(self.ref_module)
        fn = self.ref_module.create_inputs
        kwargs = {}
        if _accepts(fn, "dtype"):
            kwargs["dtype"] = jnp.dtype(config.params.get(
                "dtype", self.task.meta.get("dtype", "float32")))
        with _seeded_by(key):
            out = _task_call(fn, self.task.reference_path, **kwargs)
        # Trailing Python scalars (a group count, a flag) are static arguments of workload.
        static: tuple = ()
        if isinstance(out, tuple | list):
            split = len(out)
            while split and isinstance(out[split - 1], int | float | bool | str | None):
                split -= 1
            out, static = tuple(out[:split]), tuple(out[split:])
        return _arrays(out, self.task.reference_path, fn, "create_inputs",
                       "a tuple of arrays (workload(*inputs) is called with them)"), static

    def flops(self, config: ShapeConfig, inputs: tuple) -> float | None:
        fn = getattr(self.ref_module, "get_flops", None)
        if fn is None:
            return None
        value = fn() if not _accepts_positional(fn) else fn(*_dynamic(inputs))
        return _as_flops(value, self.task.reference_path, fn)


class MaxKernelRuntime(TaskRuntime):
    def __init__(self, task: Task) -> None:
        super().__init__(task)
        assert task.input_gen_path is not None
        yaml_text = task.input_gen_path.read_text()
        import yaml  # worker side only; the loader has validated the file already

        code = yaml.safe_load(yaml_text)["input_gen_code"]
        overrides = {k: v for k, v in task.shapes[0].params.items() if k != "index"}
        if overrides:  # same line numbers: tracebacks still match the YAML file
            code = replace_literals(code, overrides)
        offset = int(task.meta.get("input_gen_line_offset", 0))
        # Pad with blank lines so tracebacks point at the YAML file's own line numbers.
        # MaxKernel's harness execs input_gen_code in a module that has already imported
        # these: 33 of its 50 public tasks write `def get_inputs(dtype=jnp.bfloat16)`.
        preset = {"jax": jax, "jnp": jnp, "np": np, "os": os, "time": time, "json": json}
        try:
            self.gen_module = _exec_source("\n" * offset + code, str(task.input_gen_path),
                                           f"tilewright_input_gen_{next(_module_ids)}",
                                           task_file=True, preset=preset)
        except SyntaxError as exc:
            raise TaskError(task.input_gen_path, f"input_gen_code: syntax error: {exc.msg}",
                            line=exc.lineno) from exc
        except Exception as exc:
            raise TaskError(task.input_gen_path, f"running input_gen_code failed: "
                            f"{type(exc).__name__}: {exc}",
                            line=_line_in(exc, task.input_gen_path)) from exc
        self._cache: tuple[bytes, list] | None = None
        self._configs: list[ShapeConfig] | None = None

    def configs(self) -> list[ShapeConfig]:
        if self._configs is None:
            if self.task.meta.get("configs_counted", True):
                self._configs = list(self.task.shapes)
            else:
                count = len(self._pairs(jax.random.key(0)))
                base = self.task.shapes[0]
                extra = {k: v for k, v in base.params.items() if k != "index"}
                atols = self.task.meta.get("atols") or []
                rtols = self.task.meta.get("rtols") or []

                def pick(values: list[float], i: int) -> float | None:
                    return values[min(i, len(values) - 1)] if values else None  # reuse last

                self._configs = [ShapeConfig(f"config_{i}", {"index": i, **extra}, "small",
                                             atol=pick(atols, i), rtol=pick(rtols, i))
                                 for i in range(count)]
        return self._configs

    def make_inputs(self, config: ShapeConfig, key: jax.Array) -> tuple[tuple, tuple]:
        pairs = self._pairs(key)
        index = int(config.params.get("index", 0))
        if index >= len(pairs):
            raise TaskError(self.task.input_gen_path or self.task.root,
                            f"get_inputs() returned {len(pairs)} configuration(s); "
                            f"{config.name} asks for index {index}",
                            expected="as many configurations as atol/rtol list entries")
        return pairs[index]

    def _pairs(self, key: jax.Array) -> list[tuple[tuple, tuple]]:
        stamp = b"" if key is None else np.asarray(jax.random.key_data(key)).tobytes()
        if key is not None and self._cache and self._cache[0] == stamp:
            return self._cache[1]
        fn = self.gen_module.get_inputs
        with _seeded_by(key):
            out = _task_call(fn, self.task.input_gen_path)
        pairs = _input_pairs(out, self.task.input_gen_path, fn)
        self._cache = (stamp, pairs)
        return pairs


# -- helpers ---------------------------------------------------------------------------

def _exec_source(source: str, filename: str, name: str, task_file: bool = False,
                 preset: dict[str, Any] | None = None) -> types.ModuleType:
    code = compile(source, filename, "exec", dont_inherit=True)
    # Tracebacks and inspect.getsource read lines through linecache: keep the text there
    # even when the file exists only in the app (a proposed candidate).
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    module.__dict__.update(preset or {})
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    try:
        exec(code, module.__dict__)
    except BaseException:
        if not task_file:
            sys.modules.pop(name, None)
        raise
    return module


def _import_task_file(path: Path, source: str | None = None) -> types.ModuleType:
    """Import a task's own Python file (or ``source``, its effective text: sizes rewritten
    by ``--set``); its failures are the task's, reported as TaskError."""
    if source is None:
        try:
            source = path.read_text()
        except OSError as exc:
            raise TaskError(path, f"cannot read: {exc.strerror or exc}") from exc
    name = f"tilewright_task_{path.stem}_{next(_module_ids)}"
    try:
        return _exec_source(source, str(path), name, task_file=True)
    except SyntaxError as exc:
        raise TaskError(path, f"syntax error: {exc.msg}", line=exc.lineno) from exc
    except Exception as exc:
        raise TaskError(path, f"importing it failed: {type(exc).__name__}: {exc}",
                        line=_line_in(exc, path)) from exc


# What marks a directory as a task's (its modules are that task's own).
_TASK_FILES = ("task.toml", "reference.py", "baseline.py", "kernel_task.yaml")


@contextlib.contextmanager
def task_imports(root: Path | str) -> Iterator[None]:
    """Imports resolve to this task's own modules while its code runs: its directory
    first on ``sys.path``, and a module of the same name that another task's directory
    provided (a worker serves many tasks: two tasks made by ``tilewright new`` from one
    file each have a ``model.py``, every converted task a ``bench_production.py``) is
    dropped from ``sys.modules`` so it is found again here. Modules from anywhere else
    (the standard library, installed packages) are never touched."""
    root = Path(root).resolve()
    local = {p.stem for p in root.glob("*.py")} | {p.parent.name for p in root.glob(
        "*/__init__.py")}
    for name in list(sys.modules):
        module = sys.modules.get(name)
        if name.split(".")[0] not in local or module is None:
            continue
        found = getattr(module, "__file__", None)
        if not found:
            continue
        home = Path(found).resolve().parent
        if name.count(".") == 0 and home == root:
            continue
        owner = home if name.count(".") == 0 else home.parent
        if owner != root and any((owner / f).exists() for f in _TASK_FILES):
            del sys.modules[name]  # another task's module of the same name
    entry = str(root)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def _task_call(fn: Callable[..., Any], path: Path | None, *args: Any, **kwargs: Any) -> Any:
    """Call the task's own input builder: its exceptions are the task's fault, reported
    as a ``TaskError`` naming the task file and the line that failed."""
    try:
        if path is not None:
            with task_imports(Path(path).parent):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)
    except TaskError:
        raise
    except Exception as exc:
        name = getattr(fn, "__name__", "the input builder")
        where = Path(path) if path else Path("?")
        raise TaskError(where, f"{name}() failed: {type(exc).__name__}: {exc}",
                        line=_line_in(exc, where),
                        expected="an input builder that runs on its own") from exc


def _line_in(exc: BaseException, path: Path) -> int | None:
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
    return lines[-1] if lines else None


def _describe(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"an array of shape {tuple(value.shape)}"
    if isinstance(value, tuple | list):
        inner = ", ".join(type(v).__name__ for v in value[:4])
        return f"a {type(value).__name__} of ({inner}{', ...' if len(value) > 4 else ''})"
    return f"a {type(value).__name__}"


def _arrays(out: Any, path: Path | None, fn: Any, what: str, expected: str) -> tuple:
    line = getattr(getattr(fn, "__code__", None), "co_firstlineno", None)
    if not isinstance(out, tuple | list):
        hint = " (return (x,) for a single input)" if hasattr(out, "shape") else ""
        raise TaskError(path or "?", f"{what} returned {_describe(out)}{hint}", line=line,
                        expected=expected)
    arrays = []
    for i, value in enumerate(out):
        if isinstance(value, np.ndarray):
            value = jnp.asarray(value)
        if not isinstance(value, jax.Array):
            raise TaskError(path or "?", f"{what} returned {_describe(out)}: element {i} is "
                            f"{type(value).__name__}, not an array", line=line, expected=expected)
        arrays.append(value)
    return tuple(arrays)


def _input_pairs(out: Any, path: Path | None, fn: Any) -> list[tuple[tuple, tuple]]:
    """Normalize get_inputs()'s result to a list of (dynamic_args, static_args)."""
    expected = "(dynamic_args, static_args) or a list of such pairs"

    def is_pair(x: Any) -> bool:
        return (isinstance(x, tuple | list) and len(x) == 2
                and isinstance(x[0], tuple | list) and isinstance(x[1], tuple | list))

    if is_pair(out) and not (isinstance(out, list) and all(is_pair(x) for x in out)):
        items = [out]
    elif isinstance(out, list) and out and all(is_pair(x) for x in out):
        items = out
    else:
        line = getattr(getattr(fn, "__code__", None), "co_firstlineno", None)
        raise TaskError(path or "?", f"get_inputs() returned {_describe(out)}", line=line,
                        expected=expected)
    return [(_arrays(d, path, fn, "get_inputs() dynamic_args", "a tuple of arrays"), tuple(s))
            for d, s in items]


def _dynamic(inputs: tuple) -> tuple:
    """Accept either the dynamic args or the (dynamic, static) pair make_inputs returned."""
    if len(inputs) == 2 and all(isinstance(x, tuple) for x in inputs):
        return inputs[0]
    return inputs


def _as_flops(value: Any, path: Path | None, fn: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        line = getattr(getattr(fn, "__code__", None), "co_firstlineno", None)
        raise TaskError(path or "?", f"{fn.__name__} returned {_describe(value)}", line=line,
                        expected="a number of floating-point operations") from None


def _accepts(fn: Any, name: str) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _accepts_positional(fn: Any) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
               and p.default is p.empty for p in params)


def salt_of(key: jax.Array | None) -> int:
    """The integer folded into a task's own seeds for a trial key (0 for None: the
    abstract pass of ``input_signature``, which only needs shapes)."""
    return 0 if key is None else int(jax.random.randint(key, (), 0, 2**31 - 1))


@contextlib.contextmanager
def _seeded_by(key: jax.Array | None) -> Iterator[None]:
    """Fold ``key`` into every PRNG key and numpy seed created inside the block."""
    salt = salt_of(key)
    random = jax.random
    saved = (random.key, random.PRNGKey, np.random.seed, np.random.default_rng)
    orig_key, orig_prng, orig_seed, orig_rng = saved

    def key_fn(seed: Any, *args: Any, **kwargs: Any) -> jax.Array:
        return random.fold_in(orig_key(seed, *args, **kwargs), salt)

    def prng_fn(seed: Any, *args: Any, **kwargs: Any) -> jax.Array:
        return random.fold_in(orig_prng(seed, *args, **kwargs), salt)

    def seed_fn(seed: Any = None) -> None:
        orig_seed((seed + salt) % 2**32 if isinstance(seed, int) else seed)

    def rng_fn(seed: Any = None) -> np.random.Generator:
        return orig_rng([seed % 2**32, salt] if isinstance(seed, int) else seed)

    random.key, random.PRNGKey = key_fn, prng_fn
    np.random.seed, np.random.default_rng = seed_fn, rng_fn
    try:
        yield
    finally:
        random.key, random.PRNGKey, np.random.seed, np.random.default_rng = saved
