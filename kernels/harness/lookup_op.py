"""The worker op ``lookup_api``: the installed JAX's own signature and docstring for a name.

Payload ``{name}``: a dotted name, with the usual short prefixes (``pl`` =
``jax.experimental.pallas``, ``pltpu`` = ``jax.experimental.pallas.tpu``, ``jnp``,
``lax``). Answered in the worker because that is where JAX is imported, so the answer
always matches the version that will run the kernel. Reply: ``{resolved, kind,
signature, doc, fields, jax_version}``, or ``{error, suggestions}`` when the name does
not resolve (close names from the module it got to).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any

from kernels.harness.ops import op

ALIASES = {"pl": "jax.experimental.pallas", "pltpu": "jax.experimental.pallas.tpu",
           "jnp": "jax.numpy", "lax": "jax.lax", "np": "numpy"}
MAX_DOC_CHARS = 6000


@op("lookup_api")
def lookup_api(payload: dict[str, Any]) -> dict[str, Any]:
    import jax

    name = str(payload.get("name") or "").strip().strip("`").removesuffix("()")
    if not name:
        return {"error": "lookup_api needs a name, e.g. 'pl.BlockSpec'", "suggestions": []}
    head, _, rest = name.partition(".")
    full = f"{ALIASES[head]}.{rest}" if head in ALIASES and rest else ALIASES.get(name, name)
    parts = full.split(".")
    obj: Any = None
    resolved = ""
    for i in range(len(parts), 0, -1):  # the longest importable module prefix
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        resolved = ".".join(parts[:i])
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                near = difflib.get_close_matches(attr, [a for a in dir(obj)
                                                        if not a.startswith("_")], n=5)
                return {"error": f"{resolved} has no attribute {attr!r} in JAX "
                                 f"{jax.__version__}",
                        "suggestions": [f"{resolved}.{n}" for n in near]}
            obj = getattr(obj, attr)
            resolved += f".{attr}"
        break
    if obj is None:
        return {"error": f"no module named {parts[0]!r}", "suggestions": sorted(ALIASES)}
    return {"resolved": resolved, "kind": _kind(obj), "signature": _signature(obj),
            "doc": (inspect.getdoc(obj) or "")[:MAX_DOC_CHARS], "fields": _fields(obj),
            "jax_version": jax.__version__}


def _kind(obj: Any) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    return "function" if callable(obj) else type(obj).__name__


def _signature(obj: Any) -> str | None:
    if inspect.ismodule(obj):
        return None
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return None


def _fields(obj: Any) -> list[str] | None:
    import dataclasses

    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        return [f"{f.name}: {getattr(f.type, '__name__', f.type)}" for f in dataclasses.fields(obj)]
    return None
