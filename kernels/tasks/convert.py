"""A JAXBench or MaxKernel task converted to the native layout (``tilewright new --from DIR``).

A benchmark task has one size, the one its authors ran (TPU-sized), and sizes it in
ways only its own code knows: a ``CONFIG`` dict, module constants, literals copied into
``create_inputs``, a ``config`` dict inside MaxKernel's ``get_inputs``. The conversion
does not reinterpret that code. It keeps the benchmark's input builder and reference,
once per *variant*: ``production`` (the task as written, or as ``--set`` sizes it) and
``check`` (shrunk with the loaders' own ``--set`` rewriting, derived or given with
``--check KEY=VALUE``). Each variant is a module of the task (``bench_production.py``,
``bench_check.py``) holding the effective source, sizes applied.

``reference.py`` then has ``make_inputs(key, variant, index)``, which calls the
variant's input builder with the trial's key folded into every PRNG key it creates
(the benchmark seeds itself with a fixed key: a new key gives new values with the same
distributions), and ``reference(*inputs)``, which finds the variant by the inputs'
shapes and calls its reference with its static arguments. ``task.toml`` names the
production configuration (``production = true``, ``size = "large"`` when too big for
interpret mode on a CPU) and the check ones.

App side: no JAX. The worker is reached through a callable (``request(op, payload)``)
so this module stays free of the pool.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tilewright.kernels.tasks.new import CHECK_ELEMENTS, LANE, SUBLANE, NewTaskError, prepare

Request = Callable[[str, dict[str, Any]], dict[str, Any]]
PREAMBLE = ("import json\nimport os\nimport time\n\nimport jax\nimport jax.numpy as jnp\n"
            "import numpy as np\n\n")


def convert(source: Path, dest: Path, name: str, production_set: list[str],
            check_set: list[str], request: Request, *, kernel: str | None = None,
            family: str | None = None, description: str | None = None,
            force: bool = False) -> dict[str, Any]:
    """Write the native task; returns the summary ``tilewright new`` prints."""
    from tilewright.kernels.tasks.loaders import load_task, parse_overrides
    from tilewright.kernels.tasks.task import TaskError

    try:
        production_overrides = parse_overrides(production_set)
        task = load_task(source, production_overrides)
    except (TaskError, ValueError) as exc:
        raise NewTaskError(str(exc)) from exc
    if task.layout == "native":
        raise NewTaskError(f"{source} is a native task already",
                           f"use it as it is: tilewright eval --task {source}")
    production = _signatures(task, request)
    statics = {tuple(c["static"]) for c in production}
    if len(statics) > 1:
        raise NewTaskError(
            f"{source.name} passes different static arguments per configuration "
            f"({', '.join(str(list(s)) for s in sorted(statics))}); a native kernel takes "
            "only the arrays, so it could not tell them apart",
            f"keep it in its own layout: tilewright eval --task {source} (and --set for "
            "its sizes)")
    sizes = _size_keys(task)
    if check_set:
        try:
            check_overrides = {**production_overrides, **parse_overrides(check_set)}
        except ValueError as exc:
            raise NewTaskError(str(exc)) from exc
    else:
        check_overrides = {**production_overrides,
                           **_derive_check(sizes, production, production_overrides)}
    check_overrides = {k: v for k, v in check_overrides.items()}
    try:
        check_task = load_task(source, check_overrides)
    except TaskError as exc:
        raise NewTaskError(f"the derived check sizes do not apply: {exc}",
                           "give them yourself: --check KEY=VALUE (repeatable)") from exc
    check = _signatures(check_task, request)
    largest_check = max((_elements(s) for c in check for s, _ in c["inputs"]), default=0)
    if largest_check > 8 * CHECK_ELEMENTS and not check_set:
        raise NewTaskError(
            f"could not shrink {source.name} to a size interpret mode runs in seconds "
            f"(its largest check input has {largest_check:,} elements)",
            "give the check sizes: --check KEY=VALUE (the keys: "
            + (", ".join(sizes) or "none found") + ")")
    same = [c["inputs"] for c in check] == [c["inputs"] for c in production]

    prepare(dest, force)
    written: list[Path] = []
    variants = {"production": task} if same else {"production": task, "check": check_task}
    for variant, vtask in variants.items():
        path = dest / f"bench_{variant}.py"
        path.write_text(_variant_source(vtask, variant, source))
        written.append(path)
    if task.layout == "maxkernel":
        ref = dest / "bench_reference.py"
        ref.write_text(f"# The MaxKernel reference of {source}, copied by `tilewright new`.\n"
                       + task.reference_path.read_text())
        written.append(ref)
    signatures = {"production": production, **({} if same else {"check": check})}
    (dest / "reference.py").write_text(_reference_text(task, source, signatures))
    written.append(dest / "reference.py")
    configs = _configs(task, production, check, same)
    (dest / "task.toml").write_text(_toml(name, task, source, configs, family, description))
    written.append(dest / "task.toml")
    if kernel:
        from tilewright.kernels.tasks.new import starting_kernel

        text, _siblings = starting_kernel(kernel, entries=("kernel", task.entry))
        (dest / "kernel.py").write_text(text)
        written.append(dest / "kernel.py")
    notes = []
    if statics and next(iter(statics)):
        notes.append(f"the static arguments {list(next(iter(statics)))} are bound in "
                     "reference.py: a kernel takes only the arrays")
    if task.kernel_path is not None and not kernel:
        notes.append(f"{task.kernel_path.name} was not copied (a benchmark's optimized kernel "
                     "may read its CONFIG at the production size); pass --kernel "
                     f"{task.kernel_path} to start from it")
    return {"name": name, "directory": str(dest.resolve()),
            "from": f"{task.layout} task {source}", "files": [p.name for p in written],
            "configs": [{"name": c["name"], "sizes": c["sizes"],
                         **{k: v for k, v in c.items() if k in ("production", "size",
                                                                  "held_out")}}
                        for c in configs],
            "notes": notes}


def _signatures(task: Any, request: Request) -> list[dict[str, Any]]:
    """The inputs each configuration builds, from a worker (under ``jax.eval_shape``)."""
    reply = request("inputs", {"task": task.to_spec()})
    if reply.get("error"):
        error = reply["error"]
        where = f"{error.get('file')}:{error.get('line')}" if error.get("line") else \
            error.get("file") or task.root
        raise NewTaskError(f"{where}: the task's inputs cannot be built: {error.get('message')}",
                           f"check it with `tilewright tasks {task.root}`")
    return reply["configs"]


def _elements(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _size_keys(task: Any) -> dict[str, int]:
    """The integer sizes ``--set`` can change: CONFIG keys and module constants
    (JAXBench), named literals of ``input_gen_code`` (MaxKernel)."""
    import ast

    from tilewright.kernels.source.literals import literal_sites
    from tilewright.kernels.tasks.loaders.pysource import PySource

    out: dict[str, int] = {}
    if task.layout == "jaxbench":
        config = task.meta.get("config") or {}
        out.update({k: v for k, v in config.items() if type(v) is int})
        constants = PySource.parse(task.reference_path).literal_constants()
        out.update({k: v for k, v in constants.items()
                    if type(v) is int and k != "CONFIG" and not k.startswith("_")})
    elif task.layout == "maxkernel":
        import yaml

        code = yaml.safe_load(task.input_gen_path.read_text())["input_gen_code"]
        for key, nodes in literal_sites(ast.parse(code)).items():
            values = [ast.literal_eval(n) for n in nodes]
            if values and all(type(v) is int and v == values[0] for v in values):
                out[key] = values[0]
    return {k: v for k, v in out.items() if v > 1}


def _derive_check(sizes: dict[str, int], production: list[dict[str, Any]],
                  fixed: dict[str, Any]) -> dict[str, int]:
    """Check sizes: halve the size keys behind the largest input's largest dimension
    until the predicted largest input fits ``CHECK_ELEMENTS``. Keys of equal value
    move together (a literal shared by two keys must be rewritten for both)."""
    inputs = [list(shape) for c in production for shape, _ in c["inputs"]]
    values = {k: v for k, v in sizes.items() if k not in fixed}
    lane = {shape[-1] for shape in inputs if shape}
    sublane = {shape[-2] for shape in inputs if len(shape) > 1}
    for _ in range(64):
        if not inputs:
            break
        largest = max(inputs, key=_elements)
        if _elements(largest) <= CHECK_ELEMENTS:
            break
        movable = []
        for dim in sorted(set(largest), reverse=True):
            floor = LANE if dim in lane else SUBLANE if dim in sublane else 1
            keys = [k for k, v in values.items() if v == dim]
            if keys and dim // 2 >= floor:
                movable = keys
                break
        if not movable:
            break
        old = values[movable[0]]
        new = old // 2
        for key in movable:
            values[key] = new
        inputs = [[new if d == old else d for d in shape] for shape in inputs]
    return {k: v for k, v in values.items() if v != sizes[k]}


def _variant_source(task: Any, variant: str, source: Path) -> str:
    """The benchmark's input builder and reference with this variant's sizes applied,
    as the worker would run them."""
    params = {k: v for k, v in task.shapes[0].params.items() if k not in ("index", "dtype")}
    head = (f"# The {variant} variant of the {task.layout} task {source}, written by\n"
            f"# `tilewright new`: its code with these sizes applied: "
            f"{params or 'as written'}.\n")
    if task.layout == "jaxbench":
        text = task.reference_source()
        if params:
            config = task.meta.get("config") or {}
            lines = ["", "", "# Sizes of this variant (what `--set` does at run time)."]
            for key, value in params.items():
                if key in config:
                    lines.append(f"CONFIG[{key!r}] = {value!r}")
                else:
                    lines.append(f"{key} = {value!r}")
            text = text.rstrip("\n") + "\n".join(lines) + "\n"
        return head + text
    import yaml

    from tilewright.kernels.source.literals import replace_literals

    code = yaml.safe_load(task.input_gen_path.read_text())["input_gen_code"]
    if params:
        code = replace_literals(code, params)
    return (head + "# MaxKernel runs input_gen_code with these already imported.\n"
            + PREAMBLE + code.rstrip("\n") + "\n\n\nfrom bench_reference import computation"
            "  # noqa: E402\n")


def _configs(task: Any, production: list[dict[str, Any]], check: list[dict[str, Any]],
             same: bool) -> list[dict[str, Any]]:
    """task.toml's configurations: one production (the largest), the check ones."""
    def size_of(config: dict[str, Any]) -> int:
        return max((_elements(s) for s, _ in config["inputs"]), default=0)

    tolerances = {s.name: (s.atol, s.rtol) for s in task.shapes}
    top = max(range(len(production)), key=lambda i: size_of(production[i]))
    index = _index_of(production[top], top)
    entry: dict[str, Any] = {"name": "production",
                             "sizes": {"variant": "production", "index": index},
                             "production": True, "tolerance": tolerances.get(
                                 production[top]["name"], (None, None))}
    if not same and size_of(production[top]) > CHECK_ELEMENTS:
        entry["size"] = "large"
    out = [entry]
    # Check configurations: the shrunk variant's, or (nothing was shrunk) the
    # benchmark's other configurations as they are.
    variant, pool = ("production", production) if same else ("check", check)
    for i, config in enumerate(pool):
        if config.get("held_out") or (same and i == top):
            continue
        name = "check" if len(pool) == 1 else f"check_{i}"
        out.append({"name": name, "sizes": {"variant": variant,
                                            "index": _index_of(config, i)},
                    "tolerance": tolerances.get(config["name"], (None, None)),
                    "inputs": config["inputs"]})
    entry["inputs"] = production[top]["inputs"]
    return out


def _index_of(config: dict[str, Any], position: int) -> int:
    name = str(config.get("name", ""))
    return int(name.split("_")[-1]) if name.startswith("config_") else position


def _toml(name: str, task: Any, source: Path, configs: list[dict[str, Any]],
          family: str | None, description: str | None) -> str:
    from tilewright.kernels.tasks.new import _toml_str, _toml_value

    desc = description or task.description or f"{task.layout} task {source.name}"
    lines = [f"# Written by `tilewright new` from the {task.layout} task {source}.",
             "# production: the benchmark's own size (compile verdicts and estimates are",
             "# for it); check: shrunk with --set for the correctness trials.",
             f"name = {_toml_str(name)}", f"description = {_toml_str(' '.join(desc.split()))}"]
    if family:
        lines.append(f"family = {_toml_str(family)}")
    lines += ["require_pallas = true", f"atol = {task.atol:g}", f"rtol = {task.rtol:g}"]
    for config in configs:
        shapes = ", ".join("[" + ",".join(map(str, s)) + "] " + d for s, d in config["inputs"])
        lines += ["", f"# inputs: {shapes}", f"[shapes.{config['name']}]"]
        for key, value in config["sizes"].items():
            lines.append(f"{key} = {_toml_value(value)}")
        for key in ("production", "size"):
            if key in config:
                lines.append(f"{key} = {_toml_value(config[key])}")
        atol, rtol = config.get("tolerance") or (None, None)
        if atol is not None:
            lines.append(f"atol = {atol:g}")
        if rtol is not None:
            lines.append(f"rtol = {rtol:g}")
    return "\n".join(lines) + "\n"


def _reference_text(task: Any, source: Path, signatures: dict[str, list[dict[str, Any]]]
                    ) -> str:
    variants = list(signatures)
    by_key = {f"{v}:{_index_of(c, i)}": {"inputs": c["inputs"], "static": c["static"]}
              for v, configs in signatures.items() for i, c in enumerate(configs)}
    static_lines = ",\n".join(
        f"    {k!r}: ({''.join(s + ', ' for s in info['static'])})"
        for k, info in by_key.items())
    signature_lines = ",\n".join(f"    {k!r}: {info['inputs']!r}" for k, info in by_key.items())
    dtype = (task.shapes[0].params.get("dtype") or task.meta.get("dtype") or "float32") \
        if task.layout == "jaxbench" else None
    if task.layout == "jaxbench":
        build = (f"        out = module.create_inputs(dtype=jnp.{dtype})\n"
                 if _takes_dtype(task) else "        out = module.create_inputs()\n")
        split = ("    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)\n"
                 "    arrays = tuple(a for a in out if hasattr(a, 'shape'))\n")
        call = ("    return module.workload(*inputs, *_STATIC[key])\n\n\n"
                "def flops(*inputs):\n"
                "    module = _VARIANTS[_key_of(inputs).split(':')[0]]\n"
                "    fn = getattr(module, 'get_flops', None)\n"
                "    if fn is None:\n        return None\n"
                "    try:\n        return fn()\n"
                "    except TypeError:  # some take the inputs\n"
                "        return fn(*inputs)\n")
    else:
        build = "        out = module.get_inputs()\n"
        split = ("    pairs = out if isinstance(out, list) else [out]\n"
                 "    arrays = tuple(pairs[index][0])\n")
        call = "    return module.computation(*inputs, *_STATIC[key])\n"
    imports = "".join(f"import bench_{v}\n" for v in variants)
    return (
        f'"""Reference for the {task.layout} task {source.name}, converted to the native '
        f"layout by\n`tilewright new`. The benchmark's own input builder and reference run "
        f"once per\nvariant (bench_<variant>.py: its code with that variant's sizes); "
        f'reference() finds\nthe variant by the shapes of its inputs."""\n\n'
        "import contextlib\n\nimport jax\nimport jax.numpy as jnp\nimport numpy as np\n\n"
        + imports + "\n"
        + "_VARIANTS = {" + ", ".join(f"{v!r}: bench_{v}" for v in variants) + "}\n"
        "# The inputs (shape, dtype) each variant and configuration builds.\n"
        "_SIGNATURES = {\n" + signature_lines + ",\n}\n"
        "# Trailing static (Python) arguments of the benchmark's reference.\n"
        "_STATIC = {\n" + static_lines + ",\n}\n\n\n"
        "@contextlib.contextmanager\n"
        "def _seeded(key):\n"
        '    """Fold ``key`` into every PRNG key (and numpy seed) the benchmark creates: it\n'
        '    seeds itself with a fixed key, so a new key gives new values, same distributions."""\n'
        "    salt = jax.random.bits(key, (), jnp.uint32)\n"
        "    try:\n        np_salt = int(salt)\n"
        "    except Exception:  # traced for shapes only: numpy draws need no salt\n"
        "        np_salt = 0\n"
        "    random = jax.random\n"
        "    saved = (random.key, random.PRNGKey, np.random.seed, np.random.default_rng)\n"
        "    orig_key, orig_prng, orig_seed, orig_rng = saved\n"
        "    random.key = lambda seed, *a, **k: random.fold_in(orig_key(seed, *a, **k), salt)\n"
        "    random.PRNGKey = lambda seed, *a, **k: random.fold_in(orig_prng(seed, *a, **k), salt)\n"
        "    np.random.seed = lambda seed=None: orig_seed(\n"
        "        (seed + np_salt) % 2**32 if isinstance(seed, int) else seed)\n"
        "    np.random.default_rng = lambda seed=None: orig_rng(\n"
        "        [seed % 2**32, np_salt] if isinstance(seed, int) else seed)\n"
        "    try:\n        yield\n    finally:\n"
        "        random.key, random.PRNGKey, np.random.seed, np.random.default_rng = saved\n\n\n"
        "def make_inputs(key, variant=" + repr(variants[-1]) + ", index=0):\n"
        "    module = _VARIANTS[variant]\n"
        "    with _seeded(key):\n" + build + split
        + "    return arrays\n\n\n"
        "def _key_of(inputs, exact=True):\n"
        "    found = [[list(a.shape), str(a.dtype)] for a in inputs]\n"
        "    for key, signature in _SIGNATURES.items():\n"
        "        if signature == found:\n"
        "            return key\n"
        "    # Other sizes of the same arrays (the judge halves an axis to price a program\n"
        "    # too big to estimate whole): the first variant, production first, with the same\n"
        "    # ranks and dtypes runs them; a size its code cannot take still fails there.\n"
        "    for key, signature in _SIGNATURES.items():\n"
        "        if not exact and [[len(s), d] for s, d in signature] == \\\n"
        "                [[len(s), d] for s, d in found]:\n"
        "            return key\n"
        "    raise ValueError(f'inputs {found} match no variant of this task: '\n"
        "                     f'{sorted(_SIGNATURES)} (re-run `tilewright new` for other sizes)')\n\n\n"
        "def reference(*inputs):\n"
        "    key = _key_of(inputs, exact=False)\n"
        "    module = _VARIANTS[key.split(':')[0]]\n"
        + call
    )


def _takes_dtype(task: Any) -> bool:
    from tilewright.kernels.tasks.loaders.pysource import PySource

    fn = PySource.parse(task.reference_path).functions().get("create_inputs")
    return bool(fn and fn.accepts_keyword("dtype"))
