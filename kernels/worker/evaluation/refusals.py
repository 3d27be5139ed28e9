"""The program the TPU compile estimates is the program the trials run.

The TPU lowering, the TPU compile and its estimate take a program's TPU branches; off a
TPU the trials run its CPU branches in interpret mode. A candidate that makes them differ
(``lax.platform_dependent(tpu=fast_wrong, default=slow_right)``) or that runs its own
kernels in interpret mode (``interpret=``: the harness alone chooses the mode, after these
checks) would be ranked by a program that never ran: ``program_refusal`` (from
``platform_refusals`` and ``interpret_refusals``) says so before anything runs, with the
line of the candidate's file. A guarded module (``integrity.GUARDED_MODULES``): a
candidate that patches it is caught.
"""

from __future__ import annotations

from typing import Any

from tilewright.kernels.worker.evaluation.integrity import eqns as walk
from tilewright.kernels.worker.evaluation.integrity import line_number, pallas_eqns

_TPU_SIDE = ("tpu", "mosaic")
_HOST_SIDE = ("cpu",)
# JAX's own platform-dependent code whose branches compute the same thing (a Mosaic
# lowering of the same operation): (file suffix, function) of the frame that called
# ``platform_dependent``.
BENIGN_PLATFORM_CALLERS = (("jax/_src/numpy/lax_numpy.py", "diagonal"),)


def _branch_for(platforms: Any, name: str) -> int | None:
    default = None
    for index, names in enumerate(platforms):
        if names is None:
            default = index
        elif name in names:
            return index
    return default


def _caller_of_platform_dependent(eqn: Any) -> tuple[str, str] | None:
    """(file, function) of the frame that called ``lax.platform_dependent``."""
    frames = list(getattr(getattr(eqn.source_info, "traceback", None), "frames", []))
    for i, frame in enumerate(frames):
        if frame.function_name == "platform_dependent" and i + 1 < len(frames):
            return frames[i + 1].file_name, frames[i + 1].function_name
    return None


def platform_refusals(jaxpr: Any, filename: str) -> list[dict[str, Any]]:
    """Platform-dependent switches whose TPU branch is not the branch the host runs."""
    found = []
    eqns = list(walk(jaxpr, into_kernels=True))
    # lax.platform_dependent is a platform_index feeding a cond that names the platforms
    # of its branches; a platform_index used any other way (bound directly, its number
    # used in arithmetic or a plain switch) is refused when the TPU and the host would
    # get different numbers.
    paired = {id(e.invars[0]) for e in eqns if e.primitive.name == "cond"
              and e.params.get("branches_platforms") and e.invars}
    for eqn in eqns:
        if eqn.primitive.name == "platform_index" and eqn.outvars \
                and id(eqn.outvars[0]) not in paired:
            platforms = eqn.params.get("platforms") or ()
            tpu = {_branch_for(platforms, n) for n in _TPU_SIDE}
            host = {_branch_for(platforms, n) for n in _HOST_SIDE}
            if tpu != host:
                line = line_number(eqn, filename)
                found.append({
                    "kind": "platform_dependent", "line": line,
                    "message": "a platform_index" + (f" at line {line}" if line else "")
                               + " gives the TPU another number than this host: the "
                               "TPU compile would rank a program the trials never ran",
                    "hint": "Compute the same thing on every platform."})
    for eqn in eqns:
        platforms = eqn.params.get("branches_platforms") if eqn.primitive.name == "cond" \
            else None
        if not platforms:
            continue
        branches = eqn.params["branches"]
        tpu = {i for i in (_branch_for(platforms, n) for n in _TPU_SIDE) if i is not None}
        host = {i for i in (_branch_for(platforms, n) for n in _HOST_SIDE) if i is not None}
        texts = {str(branches[i].jaxpr) for i in tpu | host}
        if len(texts) <= 1:
            continue  # the same computation whichever platform runs it
        caller = _caller_of_platform_dependent(eqn)
        if caller and any(caller[0].endswith(f) and caller[1] == fn
                          for f, fn in BENIGN_PLATFORM_CALLERS):
            continue
        line = line_number(eqn, filename)
        names = ", ".join("/".join(n) if n else "default" for n in platforms)
        found.append({
            "kind": "platform_dependent", "line": line,
            "message": "jax.lax.platform_dependent (branches: " + names + ")"
                       + (f" at line {line}" if line else "") + " runs a different "
                       "computation on the TPU than on this host: the TPU compile and its "
                       "estimate would rank a program the trials never ran",
            "hint": "Write one computation for every platform (no lax.platform_dependent "
                    "or lax.platform_index); the harness itself runs kernels in TPU "
                    "interpret mode off-TPU."})
    return found


def interpret_refusals(jaxpr: Any, filename: str) -> list[dict[str, Any]]:
    """``pallas_call``s whose ``interpret`` the candidate set (True, InterpretParams, or
    a ``force_tpu_interpret_mode`` around its own call)."""
    found = []
    for eqn in pallas_eqns(jaxpr):
        mode = eqn.params.get("interpret", False)
        if mode is False or mode is None:
            continue
        line = line_number(eqn, filename)
        found.append({
            "kind": "interpret_param", "line": line,
            "message": f"pallas_call{f' at line {line}' if line else ''} sets interpret="
                       f"{type(mode).__name__ if not isinstance(mode, bool) else mode}: an "
                       "interpreted kernel runs on the host, never on the TPU that the "
                       "estimate is for",
            "hint": "Remove interpret= (and any force_tpu_interpret_mode) from the kernel; "
                    "off-TPU the harness runs every pallas_call in TPU interpret mode "
                    "itself."})
    return found


def program_refusal(jaxpr: Any, filename: str) -> dict[str, Any] | None:
    """The first reason the traced program cannot be judged as it would run on a TPU
    (``platform_refusals``, ``interpret_refusals``), as an error object; None if none."""
    found = interpret_refusals(jaxpr, filename) + platform_refusals(jaxpr, filename)
    if not found:
        return None
    first = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return {"kind": first["kind"], "message": first["message"] + more,
            "line": first["line"], "hint": first["hint"], "traceback": None}
