"""How code runs in this worker: the execution mode and what stays warm between requests.

- ``execution_mode(interpret)``: TPU interpret mode (``pltpu.force_tpu_interpret_mode``)
  off-TPU, nothing on a TPU; ``reset_interpret_state()`` after an exception there.
- ``compile_lowered(lowered, interpret)``: the XLA compile of a program to run here; an
  interpreted one with ``INTERPRETED_COMPILE``.
- ``task_runtime(spec)``: task runtimes cached per task (and reference file stamps), so
  a warm worker imports a reference once.
- ``keep_compiled_programs(confined)``: the judge's compiled XLA programs kept on disk
  for the next worker (where Landlock confines writes).
- ``jitted_reference(runtime, ...)``: one jitted reference per runtime and signature, so
  a warm worker compiles a reference once.
- ``rebound(closed, bind)``: a traced program evaluated equation by equation (nested
  jits inlined), each equation bound again by ``bind``: how a jaxpr runs with its
  kernels interpreted, or with each kernel in a jit named after it, and no candidate
  Python.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

_RUNTIMES: dict[str, Any] = {}  # task spec (+ file stamps) -> TaskRuntime
_RUNTIME_CACHE_SIZE = 8


def task_runtime(spec: dict[str, Any]) -> Any:
    from tilewright.kernels.worker.runtime import load_runtime

    stamps = []
    for key in ("reference_path", "input_gen_path"):
        if spec.get(key):
            with contextlib.suppress(OSError):
                stamps.append(os.stat(spec[key]).st_mtime_ns)
    cache_key = json.dumps(spec, sort_keys=True, default=str) + repr(stamps)
    if cache_key not in _RUNTIMES:
        if len(_RUNTIMES) >= _RUNTIME_CACHE_SIZE:
            _RUNTIMES.pop(next(iter(_RUNTIMES)))
        _RUNTIMES[cache_key] = load_runtime(spec)
    return _RUNTIMES[cache_key]


# The judge's own compiled XLA programs on disk (JAX's persistent compilation cache):
# a fresh worker compiles a task's inputs and reference once per machine, not once per
# process. A fresh worker's first evaluation of gelu at its three check shapes costs
# the judge 0.56 s of CPU with the programs on disk, 1.59 s without (softmax: 0.56 and
# 1.75 s; `python benchmarks/host_speed/eval_overhead.py`, 2-core CPU host). Every program is
# kept: loading even a tiny one costs less than compiling it, and a worker whose
# warm-up program is loaded starts no LLVM (140 MB resident when idle instead of 190).
XLA_CACHE_MIN_COMPILE_S = 0.0
XLA_CACHE_MAX_BYTES = 1 << 30
XLA_CACHE_ENV = "TILEWRIGHT_KEEP_PROGRAMS"  # "0": the judge keeps no compiled program


def keep_compiled_programs(confined: dict[str, Any] | None) -> str | None:
    """Keep the judge's compiled XLA programs (its inputs, the reference, the baseline's
    timing programs, the comparisons) under the judge's cache directory, in a folder
    for this machine's CPU. None, and nothing kept: without that directory, where
    Landlock does not confine writes, or with ``TILEWRIGHT_KEEP_PROGRAMS=0``.

    The judge runs no candidate code, and a candidate process can neither write there
    (Landlock) nor find it in its environment (``candidate.judge._candidate_env``);
    where writes are not confined, a candidate could plant a program the next judge
    would load, so none is loaded. Call it after the zygote is forked (its children
    must not inherit the setting) and before the first compile (JAX decides once per
    process whether to use the cache)."""
    from tilewright.kernels.pool.env import ESTIMATE_CACHE

    root = os.environ.get(ESTIMATE_CACHE)
    writes_confined = bool(((confined or {}).get("filesystem") or {}).get("active"))
    if not root or not writes_confined or os.environ.get(XLA_CACHE_ENV) == "0":
        return None
    try:
        import filelock  # noqa: F401  (the bounded cache locks its folder with it)
    except ImportError:
        return None
    import jax

    path = os.path.join(root, "xla", _host_tag())
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", XLA_CACHE_MIN_COMPILE_S)
    jax.config.update("jax_compilation_cache_max_size", XLA_CACHE_MAX_BYTES)
    return path


def _host_tag() -> str:
    """This machine's CPU as a folder name: XLA compiles CPU programs for the host's
    instruction set, which JAX's cache key does not name, and a home directory can be
    shared by different machines."""
    import hashlib
    import platform

    try:
        with open("/proc/cpuinfo") as fh:
            text = fh.read()
    except OSError:
        text = platform.processor()
    facts = sorted({line.split(":", 1)[-1].strip() for line in text.splitlines()
                    if line.startswith(("model name", "flags", "Features", "CPU part"))})
    return f"{platform.machine()}-{hashlib.sha256(chr(10).join(facts).encode()).hexdigest()[:12]}"


def jitted_reference(runtime: Any, n_dynamic: int, n_static: int) -> Any:
    """One jitted reference per runtime and signature: a warm worker reuses its compile."""
    import jax

    cache = runtime.__dict__.setdefault("_tilewright_jitted", {})
    if (n_dynamic, n_static) not in cache:
        static_argnums = tuple(range(n_dynamic, n_dynamic + n_static)) or None
        cache[n_dynamic, n_static] = jax.jit(runtime.reference, static_argnums=static_argnums)
    return cache[n_dynamic, n_static]


@contextlib.contextmanager
def execution_mode(interpret: bool) -> Iterator[None]:
    if not interpret:
        yield
        return
    from jax.experimental.pallas import tpu as pltpu

    with pltpu.force_tpu_interpret_mode():
        yield


def reset_interpret_state() -> None:
    from jax.experimental.pallas import tpu as pltpu

    pltpu.reset_tpu_interpret_mode_state()


# XLA's options for a program whose kernels the TPU interpreter simulates on the CPU.
# Its time goes to the interpreter's callbacks, not to code XLA could optimize, and its
# speed never ranks a kernel (host simulation time): compiled without the CPU fusion
# emitters and without LLVM's optimizations, the interpreted programs of the bundled
# tasks' kernels compiled in a third to a half of the time (gelu's starting kernel at
# 256x512, 64x2048 and 128x1024 on a 2-core CPU host: 2.0-2.4 s -> 0.6-0.8 s of CPU)
# and ran as fast. Their outputs differ from the optimized compile's in the last bits at
# most (each starting kernel at its default check shape, three seeds: 1.4e-6 on gelu's,
# an ulp; softmax's are identical): far inside every tolerance, and smaller than the gap
# between the CPU's transcendental functions and a TPU's, which the simulation never
# closes.
INTERPRETED_COMPILE: dict[str, Any] = {"xla_cpu_use_fusion_emitters": False,
                                       "xla_backend_optimization_level": 0}


def compile_lowered(lowered: Any, interpret: bool) -> Any:
    """``lowered.compile()``, with ``INTERPRETED_COMPILE`` when its kernels are
    interpreted; an XLA that does not know one of those options compiles with its own."""
    if not interpret:
        return lowered.compile()
    try:
        return lowered.compile(dict(INTERPRETED_COMPILE))
    except Exception as exc:
        if "No such compile option" not in str(exc):
            raise
        return lowered.compile()


Bind = Callable[[Any, list[Any]], list[Any]]


def bind_as_traced(eqn: Any, invals: list[Any], params: dict[str, Any] | None = None
                   ) -> list[Any]:
    """``eqn``'s primitive bound to ``invals`` (with ``params``, else its own), under its
    context: a list of its outputs."""
    with eqn.ctx.manager:
        outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(
            eqn.params if params is None else params))
    return outs if eqn.primitive.multiple_results else [outs]


# Equations whose inner program is the forward computation, evaluated in place when
# ``rebound`` expands them: custom derivative rules (the forward pass is what is judged),
# rematerialization.
_FORWARD = {"custom_vjp_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr",
            "remat2": "jaxpr", "checkpoint": "jaxpr"}


def has_pallas(jaxpr: Any) -> bool:
    """Whether a ``pallas_call`` is anywhere in ``jaxpr`` (nested programs included)."""
    from tilewright.kernels.worker.evaluation.integrity import contains_pallas_call

    return contains_pallas_call(jaxpr)


def rebound(closed: Any, bind: Bind = bind_as_traced,
            expand: bool = False) -> Callable[..., list[Any]]:
    """A function evaluating ``closed`` (a ClosedJaxpr) equation by equation, nested
    ``jit``s inlined (so effects are traced afresh), every other equation through
    ``bind(eqn, invals)``. Nothing else changes and no candidate Python runs.

    With ``expand``, every ``pallas_call`` the program reaches goes through ``bind``,
    wherever it sits: the forward program of a ``custom_vjp``/``custom_jvp`` (library
    kernels such as jax's flash attention) and of a ``checkpoint`` is evaluated in place,
    a ``cond`` is traced again branch by branch, and a ``scan`` whose body holds a kernel
    is unrolled (TPU interpret mode orders its kernels with ordered effects, which loop
    bodies cannot carry). A ``while`` loop around a kernel cannot be unrolled: it raises."""
    from jax.extend.core import Literal

    def evaluate(jaxpr: Any, consts: Any, *args: Any) -> list[Any]:
        env: dict[Any, Any] = {}

        def read(var: Any) -> Any:
            return var.val if isinstance(var, Literal) else env[var]

        env.update(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            name = eqn.primitive.name
            if name in ("pjit", "jit") and "jaxpr" in eqn.params:
                inner = eqn.params["jaxpr"]
                outs = evaluate(inner.jaxpr, inner.consts, *invals)
            elif expand and name in _FORWARD and has_pallas(eqn.params[_FORWARD[name]]):
                outs = _forward(eqn, invals)
            elif expand and name == "cond" and any(has_pallas(b)
                                                    for b in eqn.params["branches"]):
                outs = _cond(eqn, invals)
            elif expand and name == "scan" and has_pallas(eqn.params["jaxpr"]):
                outs = _unrolled(eqn, invals)
            elif expand and name == "while" and has_pallas(eqn.params["body_jaxpr"]):
                raise NotImplementedError(
                    "a pallas_call inside a while_loop with a run-time trip count cannot "
                    "run in TPU interpret mode off-TPU (its kernels are ordered; a loop "
                    "body cannot carry that): give the loop a static trip count "
                    "(lax.fori_loop with Python ints runs as a scan, which is unrolled)")
            else:
                outs = bind(eqn, invals)
            env.update(zip(eqn.outvars, outs, strict=True))
        return [read(v) for v in jaxpr.outvars]

    def _closed(inner: Any) -> tuple[Any, Any]:
        return (inner.jaxpr, inner.consts) if hasattr(inner, "consts") else (inner, ())

    def _forward(eqn: Any, invals: list[Any]) -> list[Any]:
        inner, consts = _closed(eqn.params[_FORWARD[eqn.primitive.name]])
        with eqn.ctx.manager:
            return evaluate(inner, consts, *invals)

    def _cond(eqn: Any, invals: list[Any]) -> list[Any]:
        import jax

        index, ops = invals[0], invals[1:]
        branches = [lambda *xs, b=b: evaluate(*_closed(b), *xs)
                    for b in eqn.params["branches"]]
        with eqn.ctx.manager:
            return list(jax.lax.switch(index, branches, *ops))

    def _unrolled(eqn: Any, invals: list[Any]) -> list[Any]:
        import jax.numpy as jnp

        p = eqn.params
        body, consts = _closed(p["jaxpr"])
        n_consts, n_carry, length = p["num_consts"], p["num_carry"], int(p["length"])
        fixed, carry = invals[:n_consts], list(invals[n_consts:n_consts + n_carry])
        xs = invals[n_consts + n_carry:]
        ys: list[list[Any]] = []
        order = range(length - 1, -1, -1) if p.get("reverse") else range(length)
        with eqn.ctx.manager:
            for i in order:
                outs = evaluate(body, consts, *fixed, *carry, *[x[i] for x in xs])
                carry, y = list(outs[:n_carry]), outs[n_carry:]
                ys.append(y)
            if p.get("reverse"):
                ys.reverse()
            stacked = [jnp.stack([y[j] for y in ys]) for j in range(len(ys[0]))] \
                if ys and ys[0] else [jnp.zeros((length, *v.aval.shape), v.aval.dtype)
                                      for v in eqn.outvars[n_carry:]]
        return [*carry, *stacked]

    def run(*args: Any) -> list[Any]:
        return evaluate(closed.jaxpr, closed.consts, *args)

    return run
