"""The profile request's half in the candidate process (the judge's half is
``kernels.worker.requests.profile_op``): the static analysis of the candidate's
pallas_calls, its outputs' shapes and a traced capture, written into this process's
scratch dir for the judge to copy out. Candidate code runs here, never in the judge."""

from __future__ import annotations

import json
import pickle
import tempfile
import time
from typing import Any


class CandidateFault(Exception):
    """Raised in the candidate process: the candidate's code failed (``status``,
    ``kind``) while being profiled."""

    def __init__(self, status: str, kind: str, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.status, self.kind, self.exc = status, kind, exc


def run_in_candidate(entry: Any, header: dict[str, Any], blob: bytes) -> dict[str, Any]:
    """In the candidate process (``kernels.worker.candidate.main``'s ``profile`` op): the
    static analysis of the candidate's pallas_calls, its outputs' shapes and, unless
    ``static_only``, ``iters`` traced calls, with the trace in this process's scratch
    dir (its TMPDIR). Candidate failures raise ``CandidateFault``."""
    import jax

    from tilewright.kernels.pool import protocol
    from tilewright.kernels.worker.execution import execution_mode, reset_interpret_state
    from tilewright.profiling import chips
    from tilewright.profiling.capture import capture
    from tilewright.profiling.static import analyze_callable, tpu_context

    dyn, static = pickle.loads(blob)  # from the judge: trusted direction
    target = chips.get_chip(str(header["chip"]))
    interpret = bool(header.get("interpret"))
    t0 = time.perf_counter()
    try:
        analysis = analyze_callable(entry, tuple(dyn), tuple(static), chip=target,
                                    task_flops=header.get("task_flops"))
        with tpu_context(target):
            outputs = jax.tree_util.tree_leaves(
                jax.eval_shape(lambda *d: entry(*d, *static), *dyn))
    except BaseException as exc:
        raise CandidateFault("compile_error", "exit" if isinstance(exc, SystemExit)
                             else "trace", exc) from None
    reply: dict[str, Any] = {
        # plain JSON (numpy scalars as numbers), as the judge's own reply would encode it
        "analysis": json.loads(protocol.encode(analysis)[protocol.HEADER.size:]),
        "outputs": [[list(o.shape), str(o.dtype)] for o in outputs],
        "static_s": time.perf_counter() - t0, "capture": None}
    if header.get("static_only"):
        return reply
    t0 = time.perf_counter()
    logdir = tempfile.mkdtemp(prefix="profile-")
    static_argnums = tuple(range(len(dyn), len(dyn) + len(static))) or None
    fn = jax.jit(entry, static_argnums=static_argnums)
    run, args = fn, (*dyn, *static)
    try:
        if interpret:
            # Off a TPU the kernel is traced as if on the target chip, so APIs that ask
            # for the TPU's tiling (emit_pipeline) work there too, and then run outside
            # that context with its pallas_calls interpreted (jax 0.12 refuses to run a
            # program traced under an abstract mesh alone)
            from tilewright.kernels.worker.candidate.programs import interpreted

            with execution_mode(interpret), tpu_context(target):
                closed = jax.make_jaxpr(lambda *d: entry(*d, *static))(*dyn)
            run, args = jax.jit(interpreted(closed)), tuple(jax.tree.leaves(dyn))
        with execution_mode(interpret):
            cap = capture(run, args, logdir, iters=int(header.get("iters") or 3),
                          python_tracer=bool(header.get("python_tracer")))
    except BaseException as exc:
        if interpret:
            reset_interpret_state()
        raise CandidateFault("runtime_error", "exit" if isinstance(exc, SystemExit)
                             else "runtime", exc) from None
    reply["capture"] = {k: cap.get(k) for k in ("logdir", "run_dir", "iter_ms", "log")}
    reply["capture_s"] = time.perf_counter() - t0
    return reply
