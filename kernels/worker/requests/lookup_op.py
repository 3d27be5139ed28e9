"""The worker op ``lookup_api``: the installed JAX's own signature and docstring for a name.

Payload ``{name}``: a dotted name, with the usual short prefixes (``pl`` =
``jax.experimental.pallas``, ``pltpu`` = ``jax.experimental.pallas.tpu``, ``jnp``,
``lax``, ``np``). Answered in the worker because that is where JAX is imported, so the
answer always matches the version that will run the kernel. Reply: ``{resolved, kind,
signature, doc, fields, members, jax_version}``, or ``{error, suggestions}`` when the
name does not resolve (close names from the module it got to).

The model calls this tool without anyone's approval, and the judge answers it: a name
resolves only below the public API roots (``ROOTS``: ``jax``, ``numpy``), no part of it
may be private (a leading underscore), and a submodule is imported only when its file
lies inside that root's installed package. Nothing is ever imported from ``sys.path``
at large (the worker's has neither the current directory, nor a scratch dir), so a
module a candidate wrote can never be named into the judge.
"""

from __future__ import annotations

import difflib
import enum
import importlib
import importlib.util
import inspect
import os
import sys
from typing import Any

from tilewright.kernels.worker.ops import op

ALIASES = {"pl": "jax.experimental.pallas", "pltpu": "jax.experimental.pallas.tpu",
           "jnp": "jax.numpy", "lax": "jax.lax", "np": "numpy"}
ROOTS = ("jax", "numpy")  # the public API roots a name may resolve under
MAX_DOC_CHARS = 6000
MAX_MEMBERS = 60


@op("lookup_api")
def lookup_api(payload: dict[str, Any]) -> dict[str, Any]:
    import jax

    name = str(payload.get("name") or "").strip().strip("`").removesuffix("()")
    if not name:
        return {"error": "lookup_api needs a name, e.g. 'pl.BlockSpec'", "suggestions": []}
    head, _, rest = name.partition(".")
    full = f"{ALIASES[head]}.{rest}" if head in ALIASES and rest else ALIASES.get(name, name)
    parts = full.split(".")
    if parts[0] not in ROOTS:
        return {"error": f"lookup_api answers for the public APIs of {', '.join(ROOTS)} "
                         f"(and the short forms {', '.join(sorted(ALIASES))}); "
                         f"{parts[0]!r} is not one of them",
                "suggestions": [f"{ALIASES.get(a, a)}" for a in sorted(ALIASES)]}
    private = [p for p in parts if not p or (p.startswith("_") and not _dunder(p))]
    if private:
        return {"error": f"{full}: {private[0] or 'an empty part'!r} is not a public name "
                         "(lookup_api answers for public APIs only)", "suggestions": []}
    root = _root_module(parts[0])
    if root is None:
        return {"error": f"{parts[0]} is not installed in this worker", "suggestions": []}
    obj: Any = root
    resolved = parts[0]
    for attr in parts[1:]:
        if hasattr(obj, attr):
            obj = getattr(obj, attr)
        elif inspect.ismodule(obj) and (sub := _submodule(root, f"{resolved}.{attr}")):
            obj = sub
        else:
            near = difflib.get_close_matches(attr, [a for a in dir(obj)
                                                    if not a.startswith("_")], n=5)
            return {"error": f"{resolved} has no attribute {attr!r} in JAX "
                             f"{jax.__version__}",
                    "suggestions": [f"{resolved}.{n}" for n in near]}
        resolved += f".{attr}"
    return {"resolved": resolved, "kind": _kind(obj), "signature": _signature(obj),
            "doc": _doc(obj)[:MAX_DOC_CHARS], "fields": _fields(obj),
            "members": _members(obj), "jax_version": jax.__version__}


# The only underscored names answered: how a class is constructed or called. Others
# (``__class__``, ``__builtins__``, ``__loader__``) lead away from the public API.
PUBLIC_DUNDERS = ("__init__", "__call__", "__getitem__")


def _dunder(part: str) -> bool:
    return part in PUBLIC_DUNDERS


def _root_module(name: str) -> Any:
    """A root package, as the worker imported it (never looked up afresh on sys.path)."""
    module = sys.modules.get(name)
    if module is None:
        try:
            module = importlib.import_module(name)
        except ImportError:
            return None
    return module


def _package_dir(module: Any) -> str | None:
    paths = list(getattr(module, "__path__", None) or [])
    return os.path.realpath(paths[0]) if paths else None


def _submodule(root: Any, name: str) -> Any:
    """Import ``name`` only when it is a file of ``root``'s installed package."""
    base = _package_dir(root)
    if base is None:
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    locations = [origin] if origin else list(getattr(spec, "submodule_search_locations",
                                                      None) or [])
    if not locations or not all(
            os.path.commonpath([os.path.realpath(p), base]) == base for p in locations):
        return None
    try:
        return importlib.import_module(name)
    except Exception:  # an optional dependency missing: the name is not usable here
        return None


def _kind(obj: Any) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "enum" if issubclass(obj, enum.Enum) else "class"
    return "function" if callable(obj) else type(obj).__name__


def _signature(obj: Any) -> str | None:
    if inspect.ismodule(obj) or (inspect.isclass(obj) and issubclass(obj, enum.Enum)):
        return None
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return None


def _doc(obj: Any) -> str:
    """The object's own docstring: a class without one does not get its base class's
    (an Enum's members would be explained by Python's own ``Enum`` docstring)."""
    if inspect.isclass(obj):
        own = obj.__dict__.get("__doc__")
        return inspect.cleandoc(own) if isinstance(own, str) else ""
    return inspect.getdoc(obj) or ""


def _first_line(obj: Any) -> str:
    doc = _doc(obj) if inspect.isclass(obj) else (inspect.getdoc(obj) or "")
    return doc.strip().splitlines()[0][:160] if doc.strip() else ""


def _members(obj: Any) -> list[str] | None:
    """Enum members (``NAME = value``); a class's public methods, properties and
    attributes defined on it (``name(signature) - first doc line``); a module's public
    names."""
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return [f"{m.name} = {m.value!r}" for m in obj][:MAX_MEMBERS]
    if inspect.isclass(obj):
        found = []
        for klass in obj.__mro__:
            if klass is object or klass.__module__ == "builtins":
                continue
            for name, value in vars(klass).items():
                if name.startswith("_") or any(f.split("(")[0] == name for f in found):
                    continue
                found.append(_describe_member(name, value))
        return found[:MAX_MEMBERS] or None
    if inspect.ismodule(obj):
        names = getattr(obj, "__all__", None) or [n for n in dir(obj) if not n.startswith("_")]
        return sorted(str(n) for n in names)[:MAX_MEMBERS * 2] or None
    return None


def _describe_member(name: str, value: Any) -> str:
    target = getattr(value, "__func__", value)
    if isinstance(value, property):
        text, target = f"{name} (property)", value.fget
    elif callable(target):
        try:
            text = f"{name}{inspect.signature(target)}"
        except (TypeError, ValueError):
            text = f"{name}(...)"
    else:
        text = f"{name} = {value!r}"[:120]
    line = _first_line(target) if target is not None and not isinstance(
        target, int | float | str | bool | tuple) else ""
    return f"{text} - {line}" if line else text


def _fields(obj: Any) -> list[str] | None:
    import dataclasses

    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        return [f"{f.name}: {getattr(f.type, '__name__', f.type)}" for f in dataclasses.fields(obj)]
    return None
