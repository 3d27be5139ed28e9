"""Integrity checks that keep a candidate honest.

- ``contains_pallas_call``: does the candidate's jaxpr hold a ``pallas_call`` at all
  (a task that requires Pallas rejects plain-XLA rewrites).
- ``ModuleSnapshot``: the harness runs the candidate in its own process, so it checks
  that the candidate did not patch the libraries the harness and the reference use
  (``numpy``, ``jax.numpy``, ...); a tampering candidate is rejected and the worker
  recycled.
- ``outputs_identical``: same inputs twice must give the same bits (``nondeterministic``).
- ``is_degenerate``: a reference output that is constant (zeros included) cannot tell a
  kernel that ignores its inputs from one that computes; flagged
  ``degenerate_reference`` (a property of the task and its inputs, the same every time).
- ``outside_compute``: non-trivial operations on full-size operands outside every
  ``pallas_call`` in the traced program: the XLA-computes-then-Pallas-copies trick;
  flagged ``compute_outside_kernel``.
- ``check_lowering``: the judge's own reading of a check shape's TPU lowering (the
  StableHLO text the candidate process sends): a Pallas kernel or none, against the
  candidate process's word (a contradiction is ``harness_tampering``), and compute
  outside the kernels (``hlo_outside_compute``).
- ``kernels.worker.evaluation.refusals`` (``program_refusal``): the program the TPU
  compile estimates must be the program the trials run.

- ``ModuleSnapshot.restore_config``: jax.config options a candidate changed are put back
  (flag ``jax_config_changed``) so they cannot leak into the next candidate.

Flags (strings in ``integrity.flags``): no_pallas_call, nondeterministic,
suspicious_speedup, degenerate_reference, compute_outside_kernel, harness_tampering,
background_threads, jax_config_changed. ``kernels.judge.rank.DISQUALIFYING_FLAGS`` lists the
ones that keep a correct kernel from being ranked "best".
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import FunctionType
from typing import Any

import numpy as np

SUSPICIOUS_SPEEDUP = 10.0

# Modules whose attributes the harness and references rely on. ``__main__`` is the
# process's own harness module (``python -m tilewright.kernels.worker.candidate.main`` runs it there).
GUARDED_MODULES = (
    "builtins",
    "numpy",
    "numpy.random",
    "jax",
    "jax.numpy",
    "jax.lax",
    "jax.random",
    "jax.experimental.pallas",
    "jax.experimental.pallas.tpu",
    "time",
    "math",
    "tilewright.kernels.worker.evaluation.evaluate",
    "tilewright.kernels.worker.evaluation.integrity",
    "tilewright.kernels.worker.evaluation.refusals",
    "tilewright.kernels.worker.evaluation.timing",
    "tilewright.kernels.worker.evaluation.compare",
    "tilewright.kernels.worker.evaluation.exported",
    "tilewright.kernels.worker.evaluation.on_chip",
    "tilewright.kernels.worker.chip",
    "tilewright.kernels.worker.runtime",
    "tilewright.kernels.worker.execution",
    "tilewright.kernels.worker.candidate.main",
    "tilewright.kernels.worker.candidate.wire",
    "tilewright.kernels.worker.errors",
    "tilewright.kernels.worker.tpu.tpu_compile",
    "tilewright.kernels.worker.candidate.judge",
    "tilewright.kernels.worker.candidate.channel",
    "tilewright.kernels.worker.tpu.verdict",
    "tilewright.kernels.worker.tpu.production_run",
    "tilewright.kernels.confinement",
    "tilewright.kernels.confinement.linux",
    "tilewright.kernels.confinement.processes",
    "tilewright.kernels.confinement.namespaces",
    "tilewright.kernels.confinement.landlock",
    "tilewright.kernels.judge.result",
    "tilewright.kernels.judge.rank",
    "tilewright.kernels.judge.options",
    "tilewright.kernels.judge.process_failure",
    "__main__",
)
# Harness globals that change by design (caches, helper processes and executors made
# on first use): not compared. A guarded module's cache missing here would make every
# request look like tampering (the judge recycled after each one).
MUTABLE_GLOBALS = {
    "tilewright.kernels.worker.execution": {"_RUNTIMES"},
    "tilewright.kernels.worker.tpu.tpu_compile": {"_TARGETS", "_EXECUTOR"},
    "tilewright.kernels.worker.candidate.judge": {"_PROCESS"},
    "tilewright.kernels.worker.evaluation.integrity": {"_BORN_IN_CANDIDATE"},
    "tilewright.kernels.worker.tpu.production_run": {"_POOL"},
    "tilewright.kernels.confinement.processes": {"_HOST_PID", "_APP_PROTECTED"},
}
_HARNESS = ("tilewright.kernels.", "tilewright.profiling.", "__main__")
_PLAIN = (str, bytes, int, float, complex, bool, type(None))


def _function_state(value: Any) -> tuple[Any, ...] | None:
    """Identity of what a function runs: its code, defaults and closure cells."""
    if not isinstance(value, FunctionType):
        value = getattr(value, "__func__", None)  # bound, static and class methods
        if not isinstance(value, FunctionType):
            return None
    code = value.__code__
    cells = []
    for cell in getattr(value, "__closure__", None) or ():
        try:
            cells.append(id(cell.cell_contents))
        except ValueError:  # an empty cell
            cells.append(None)
    return (id(code), id(getattr(value, "__defaults__", None)),
            id(getattr(value, "__kwdefaults__", None)), tuple(cells))


def _content(value: Any, depth: int = 3) -> Any:
    """A comparable picture of a plain container's contents (identity below ``depth``
    and for anything that is not plain data)."""
    if isinstance(value, _PLAIN):
        return value
    if depth <= 0:
        return ("id", id(value))
    if isinstance(value, dict):
        return ("dict", tuple((_content(k, depth - 1), _content(v, depth - 1))
                              for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_content(v, depth - 1) for v in value))
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, tuple(sorted(repr(_content(v, depth - 1))
                                                   for v in value)))
    return ("id", id(value), _function_state(value))


def _member_state(value: Any) -> Any:
    if isinstance(value, property):
        return ("property", id(value), *(_function_state(f) for f in
                                         (value.fget, value.fset, value.fdel)))
    return (id(value), _function_state(value))


def _module_state(name: str, module: Any) -> dict[str, Any]:
    harness = name.startswith(_HARNESS)
    mutable = MUTABLE_GLOBALS.get(name, set())
    state: dict[str, Any] = {}
    if not harness:  # thousands of attributes, checked around every timed call: cheap
        for attr, value in list(vars(module).items()):
            state[attr] = (id(value), id(value.__code__)) if type(value) is FunctionType \
                else id(value)
        return state
    for attr, value in list(vars(module).items()):
        if attr in mutable:
            continue
        if attr.startswith("__"):
            state[attr] = ("id", id(value))
        elif isinstance(value, type) and getattr(value, "__module__", None) in (
                name, getattr(module, "__name__", name)):
            state[attr] = ("class", id(value), tuple(
                (k, _member_state(v)) for k, v in list(vars(value).items())
                if k not in ("__dict__", "__weakref__", "__doc__")))
        else:
            state[attr] = _content(value)
    return state


def _changed_members(before: Any, now: Any) -> list[str]:
    """For a class: the members whose state differs."""
    if not (isinstance(before, tuple) and isinstance(now, tuple) and before[:1] == ("class",)
            and now[:1] == ("class",) and before[1] == now[1]):
        return []
    old, new = dict(before[2]), dict(now[2])
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def _sub_jaxprs(value: Any) -> list[Any]:
    """Jaxprs nested in an equation parameter (pjit, cond branches, scan, custom_vjp...)."""
    found = []
    items = value if isinstance(value, (list, tuple)) else [value]
    for item in items:
        inner = getattr(item, "jaxpr", None)
        if hasattr(item, "eqns"):
            found.append(item)
        elif inner is not None and hasattr(inner, "eqns"):
            found.append(inner)
    return found


_KERNELS = ("pallas_call", "core_map")


def eqns(jaxpr: Any, into_kernels: bool) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and of the jaxprs nested in it; kernel bodies too
    only with ``into_kernels``."""
    stack = [getattr(jaxpr, "jaxpr", jaxpr)]
    seen: set[int] = set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for eqn in current.eqns:
            yield eqn
            if not into_kernels and eqn.primitive.name in _KERNELS:
                continue
            for param in eqn.params.values():
                stack.extend(_sub_jaxprs(param))


def pallas_eqns(jaxpr: Any) -> Iterator[Any]:
    """Every pallas_call (or core_map) equation in ``jaxpr`` and its nested jaxprs."""
    return (eqn for eqn in eqns(jaxpr, into_kernels=False) if eqn.primitive.name in _KERNELS)


def contains_pallas_call(jaxpr: Any) -> bool:
    """True when ``jaxpr`` (a Jaxpr or ClosedJaxpr) or any nested jaxpr calls Pallas."""
    return next(pallas_eqns(jaxpr), None) is not None


def pallas_call_lines(jaxpr: Any, filename: str) -> list[int]:
    """Lines of ``filename`` where the jaxpr's pallas_calls were made (innermost frame):
    where to point when an interpreted kernel fails at run time without a traceback."""
    lines = {line_number(eqn, filename) for eqn in pallas_eqns(jaxpr)}
    return sorted(line for line in lines if line is not None)


class ModuleSnapshot:
    """What the guarded modules hold, to detect monkeypatching: per attribute its
    identity; for functions also their code, defaults and closure cells (a candidate
    that swaps ``compare.__code__`` keeps the function object); for harness modules
    (``kernels.*``, the process's ``__main__``) also the members of the classes they
    define and the contents of their plain containers (a set of allowed primitives
    with one more in it keeps its identity).

    A tripwire, not a wall: in a candidate process the candidate can rewrite this class
    too, which is why the judge trusts nothing it reports (docs/SECURITY.md)."""

    def __init__(self, modules: tuple[str, ...] = GUARDED_MODULES) -> None:
        import importlib

        self.state: dict[str, dict[str, Any]] = {}
        for name in modules:
            if name.startswith("tilewright.kernels.") and name not in sys.modules:
                # Our own harness modules are imported now, so that one a candidate
                # imports (to patch it) is already covered.
                with contextlib.suppress(Exception):
                    importlib.import_module(name)
            module = sys.modules.get(name)
            if module is not None:
                self.state[name] = _module_state(name, module)
        self.threads = {t.ident for t in threading.enumerate()}
        self.tasks = _os_threads()  # every OS thread, Python's or not
        self.config = _jax_config_values()

    def restore_config(self) -> tuple[list[str], bool]:
        """Put back any jax.config option the candidate changed (x64, matmul precision,
        ...), so it cannot leak into the next candidate. Returns (changed names, whether
        every one could be restored)."""
        import jax

        now = _jax_config_values()
        changed = sorted(k for k in self.config if now.get(k, self.config[k]) != self.config[k])
        restored = True
        for name in changed:
            try:
                jax.config.update(name, self.config[name])
            except Exception:
                restored = False
        return changed, restored

    def changed(self) -> list[str]:
        """``module.attr`` names (``module.Class.member`` for a class's member) that were
        replaced, deleted or rewritten since the snapshot.

        New attributes are ignored: jax and numpy add submodules lazily.
        """
        changes = []
        for name, before in self.state.items():
            module = sys.modules.get(name)
            now = _module_state(name, module) if module is not None else {}
            for attr, value in before.items():
                if attr not in now:
                    changes.append(f"{name}.{attr}")
                elif now[attr] != value:
                    members = _changed_members(value, now[attr])
                    changes.extend(f"{name}.{attr}.{m}" for m in members) if members \
                        else changes.append(f"{name}.{attr}")
        return changes

    def new_threads(self) -> list[str]:
        """Threads started since the snapshot and still running: Python's (by name),
        and native ones the ``threading`` module never sees (a ``pthread_create``
        through ``ctypes``), counted from ``/proc/self/task``. A native thread counts
        when it was born while candidate Python ran (``candidate_code``: its import and
        its traces): the runtime starts threads of its own as programs compile and run
        (XLA's CPU client, interpret mode's callbacks), named like the process, and
        those are not the candidate's."""
        found = [t.name for t in threading.enumerate()
                 if t.ident not in self.threads and t.is_alive()]
        python = {t.native_id for t in threading.enumerate()}
        for tid, comm in _os_threads().items():
            if tid in _BORN_IN_CANDIDATE and tid not in self.tasks and tid not in python:
                found.append(f"native thread {tid} ({comm or 'unnamed'})")
        return found


# OS threads born while candidate Python ran (its import, its traces), this process.
_BORN_IN_CANDIDATE: set[int] = set()


@contextlib.contextmanager
def candidate_code() -> Iterator[None]:
    """Around every stretch of candidate Python: the OS threads born in it are noted
    (``ModuleSnapshot.new_threads`` reports those still running at the end)."""
    before = set(_os_threads())
    try:
        yield
    finally:
        _BORN_IN_CANDIDATE.update(set(_os_threads()) - before)


def _os_threads() -> dict[int, str]:
    """This process's OS threads: tid -> its name (``/proc/self/task``)."""
    found: dict[int, str] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                found[int(tid)] = fh.read().strip()
        except (OSError, ValueError):
            continue
    return found


def _jax_config_values() -> dict[str, Any]:
    config = getattr(sys.modules.get("jax"), "config", None)
    values = getattr(config, "values", None)
    return dict(values) if isinstance(values, dict) else {}


def outputs_identical(first: list[np.ndarray], second: list[np.ndarray]) -> bool:
    if len(first) != len(second):
        return False
    return all(a.shape == b.shape and (np.array_equal(a, b)  # one pass when no NaN
                                       or np.array_equal(a, b, equal_nan=True))
               for a, b in zip(first, second, strict=True))


def is_degenerate(reference: list[np.ndarray], atol: float | None = None) -> bool:
    """Every reference leaf constant (all zeros included), or empty: a kernel that
    returns that constant passes whatever the inputs. (``atol`` is accepted for old
    callers; the loose-tolerance case is handled by the comparison's scale rules.)"""
    for r in reference:
        if r.size > 1:  # no masked copy where the extremes are finite (at 8192x8192: 1 s)
            top, bottom = float(r.max()), float(r.min())
            if np.isfinite(top) and np.isfinite(bottom) and top != bottom:
                return False
        finite = r[np.isfinite(r)]
        if finite.size == 1 or (finite.size and float(finite.max()) != float(finite.min())):
            return False  # a single value (a loss, a norm) varies across trials instead
    return True


# Primitives that only move, reshape or convert data: free to appear outside a kernel.
MOVEMENT = {
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice",
    "dynamic_slice", "dynamic_update_slice", "concatenate", "pad", "copy", "copy_p",
    "iota", "rev", "gather", "convert_element_type", "bitcast_convert_type",
    "reduce_precision", "stop_gradient", "split", "device_put", "select_n",
    "optimization_barrier", "sharding_constraint", "mesh_cast", "pvary",
    "scatter",  # x.at[i].set(y): placement only (scatter-add and friends compute)
}
FULL_SIZE_SHARE = 0.25  # an operand this share of the largest input/output is "full size"


WHILE_REPEATS = 4  # a while loop's trip count is unknown: its body counts this often
# ... but a matrix product in such a loop counts as full size (its work is unbounded).
UNBOUNDED_IN_LOOPS = frozenset({"dot_general", "conv_general_dilated", "ragged_dot"})


def outside_compute(jaxpr: Any, filename: str) -> list[str]:
    """Non-trivial equations outside every pallas_call, when together they touch "full
    size" worth of elements.

    "Full size": FULL_SIZE_SHARE of the elements of the program's largest input or
    output. What counts is the sum over the equations (each one's largest operand or
    result, times its loop's trip count: a scan's length, WHILE_REPEATS for a while
    loop; the larger branch of a cond), so the work cut into four 20% chunks is found
    as surely as one 80% operation. Data movement (reshape, transpose, pad, casts,
    gathers) is allowed; arithmetic, reductions, dots and convolutions are not.
    Returns a description per counted equation (primitive, shapes, candidate line),
    largest first, or [] when the sum stays below the threshold.
    """
    closed = getattr(jaxpr, "jaxpr", jaxpr)
    sizes = [_numel(v.aval) for v in (*closed.invars, *closed.outvars) if hasattr(v, "aval")]
    largest = max(sizes, default=0)
    threshold = FULL_SIZE_SHARE * largest
    if threshold <= 0:
        return []
    budget = [20000]  # equations visited at most (shared sub-jaxprs are walked per use)

    def walk(current: Any, weight: int, in_while: bool = False) -> list[tuple[int, str]]:
        items: list[tuple[int, str]] = []
        for eqn in current.eqns:
            budget[0] -= 1
            if budget[0] < 0:
                break
            name = eqn.primitive.name
            if name in ("pallas_call", "core_map"):
                continue
            if name == "cond":  # one branch runs: count the heavier one
                options = [walk(b.jaxpr, weight, in_while)
                           for b in eqn.params.get("branches", ())]
                items.extend(max(options, key=lambda found: sum(n for n, _ in found),
                                 default=[]))
                continue
            repeat = {"scan": int(eqn.params.get("length") or 1),
                      "while": WHILE_REPEATS}.get(name, 1)
            nested = [j for p in eqn.params.values() for j in _sub_jaxprs(p)]
            if nested:  # pjit, scan, while, custom_jvp...: look inside, not at the wrapper
                for inner in nested:
                    items.extend(walk(inner, weight * repeat, in_while or name == "while"))
                continue
            if name in MOVEMENT:
                continue
            if in_while and name in UNBOUNDED_IN_LOOPS:
                # A matrix product in a loop whose trip count is known only at run time
                # (many tiny dots can add up to the whole matmul): its work cannot be
                # bounded, so it counts as full size.
                shapes = " ".join(_aval_text(v.aval) for v in eqn.invars if hasattr(v, "aval"))
                items.append((int(threshold) + 1, f"{name}({shapes}){_line_of(eqn, filename)}"
                              " in a while loop of run-time length"))
                continue
            avals = [v.aval for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval")]
            biggest = max((_numel(a) for a in avals), default=0)
            if biggest <= 1:
                continue  # scalar bookkeeping (loop counters, offsets)
            shapes = " ".join(_aval_text(v.aval) for v in eqn.invars if hasattr(v, "aval"))
            times = f" x{weight}" if weight > 1 else ""
            items.append((biggest * weight, f"{name}({shapes}){_line_of(eqn, filename)}{times}"))
        return items

    found = walk(closed, 1)
    total = sum(n for n, _ in found)
    if total < threshold:
        return []
    found.sort(key=lambda item: -item[0])
    described = [text for _, text in found]
    if found[0][0] < threshold:  # no single operation is full size: say why it counts
        described.append(f"together {total / largest:.0%} of the largest input/output's "
                         "elements computed outside the kernel")
    return described


# StableHLO operations that compute (not data movement), as the judge scans the TPU
# lowering for work done outside the Pallas kernel (whose body is opaque to this scan).
_HLO_COMPUTE = re.compile(
    r"= stablehlo\.(add|subtract|multiply|divide|remainder|power|maximum|minimum|negate|"
    r"abs|exponential|exponential_minus_one|log|log_plus_one|logistic|tanh|sine|cosine|"
    r"sqrt|rsqrt|cbrt|erf|atan2|dot_general|dot|convolution|reduce|reduce_window|"
    r"cumsum|sort)\b[^\n]*")
_TENSOR = re.compile(r"tensor<((?:\d+x)+)[a-z]")


def hlo_outside_compute(text: str, largest: int) -> list[str]:
    """Compute operations in a lowered program (StableHLO text, where a Pallas kernel is
    one opaque custom call) that together touch at least FULL_SIZE_SHARE of ``largest``
    elements: work outside every Pallas kernel (summed, like ``outside_compute``)."""
    threshold = FULL_SIZE_SHARE * largest
    if threshold <= 0:
        return []
    total = 0
    found = set()
    for match in _HLO_COMPUTE.finditer(text):
        sizes = [int(np.prod([int(d) for d in dims.rstrip("x").split("x")]))
                 for dims in _TENSOR.findall(match.group(0))]
        if sizes and max(sizes) > 1:
            total += max(sizes)
            found.add(f"stablehlo.{match.group(1)} (TPU lowering)")
    return sorted(found) if total >= threshold else []


PALLAS_CUSTOM_CALL = "tpu_custom_call"  # how a Pallas TPU kernel appears in StableHLO


@dataclass(frozen=True)
class LoweringCheck:
    """The judge's reading of one check shape's TPU lowering: is there a Pallas kernel,
    does that contradict what the candidate process said, what is computed outside."""

    has_pallas: bool
    contradicted: bool
    outside: tuple[str, ...]


def check_lowering(hlo_text: str | None, claims_pallas: bool, reported_outside: Iterable[str],
                   largest: int) -> LoweringCheck:
    """Decide from the lowering where there is one (off-TPU kernels with host callbacks
    are not lowered: then the candidate process's word stands). ``reported_outside`` is
    the candidate process's jaxpr scan; ``largest`` the elements of the largest input
    or output, the measure of "full size"."""
    has_pallas = claims_pallas if hlo_text is None else PALLAS_CUSTOM_CALL in hlo_text
    outside: list[str] = []
    if has_pallas:
        outside = list(reported_outside)
        if hlo_text is not None:
            outside += hlo_outside_compute(hlo_text, largest)
    return LoweringCheck(has_pallas, hlo_text is not None and claims_pallas != has_pallas,
                         tuple(outside))


def _numel(aval: Any) -> int:
    shape = getattr(aval, "shape", ())
    return int(np.prod(shape)) if shape else 1


def _aval_text(aval: Any) -> str:
    dtype = getattr(aval, "dtype", "")
    return f"{dtype}{list(getattr(aval, 'shape', ()))}"


def _line_of(eqn: Any, filename: str) -> str:
    line = line_number(eqn, filename)
    return f" at line {line}" if line else ""


def line_number(eqn: Any, filename: str) -> int | None:
    traceback = getattr(eqn.source_info, "traceback", None)
    frames = [f for f in getattr(traceback, "frames", []) if f.file_name == filename]
    return frames[0].line_num if frames else None
