"""The judge's reference compiler: a helper process that compiles the task's XLA
reference for a TPU chip and returns the TPU compiler's static estimate.

Why a process of its own: libtpu aborts the process that compiles some programs (a
failed internal check, SIGABRT; measured on attention references in bf16, whose
"online-softmax" fusion fails an LLO type check). In the judge that abort took the
whole worker down and every evaluation of the task came back "crashed". Here it costs
the reference estimate only: the judge reads the fatal line from this process's stderr,
reports the estimate as unavailable with that line, remembers it for the task and
starts a fresh helper.

Trusted code only: the task's reference (the same the judge runs), never a candidate.
It runs inside the worker's confinement (a child of the judge) and uses the judge's
channel format (``kernels.harness.wire``, a ``ready`` message first). One request:
``{"op": "estimate", "id"}`` with a pickled ``{spec, shapes, static, chip}`` (shapes as
``(shape, dtype)`` pairs: an abstract topology needs no values); the reply carries
``estimate`` (or None) and ``message``.
"""

from __future__ import annotations

import pickle
import socket
import sys
from typing import Any

from kernels.harness import wire


def estimate(request: dict[str, Any]) -> dict[str, Any]:
    import jax

    from kernels.harness import tpu_compile
    from kernels.harness.execution import jitted_reference, task_runtime

    where, why = tpu_compile.target(str(request["chip"]))
    if where is None:
        return {"estimate": None, "message": why}
    runtime = task_runtime(request["spec"])
    dyn = tuple(jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in request["shapes"])
    static = tuple(request["static"])
    fn = jitted_reference(runtime, len(dyn), len(static))
    try:
        lowered = tpu_compile.lower(fn, dyn, static, where)
    except Exception as exc:
        return {"estimate": None, "message": f"the reference does not lower for "
                                             f"{where.chip}: {str(exc).strip()[:300]}"}
    found = tpu_compile.compile_lowered(lowered, where)
    if found["compile"] != "ok":
        return {"estimate": None, "message": tpu_compile.short(found.get("message") or "")}
    return {"estimate": found["estimate"], "message": found.get("estimate_unavailable")}


def serve(sock: socket.socket) -> None:
    wire.send(sock, {"type": "ready"})
    while True:
        try:
            header, blob = wire.recv(sock)
        except (wire.ChannelClosed, OSError, wire.ProtocolError):
            return
        reply: dict[str, Any] = {"id": header.get("id"), "ok": True}
        try:
            reply.update(estimate(pickle.loads(blob)))
        except Exception as exc:  # the task's reference failed: no estimate, say why
            reply.update(estimate=None, message=f"{type(exc).__name__}: {exc}"[:500])
        wire.send(sock, reply)


def main(argv: list[str] | None = None) -> int:
    from kernels.harness.worker import child_main

    # Inside the worker's confinement already (trusted code); no kernel to warm up.
    return child_main(argv, "python -m kernels.harness.refcompile", serve, confine=False,
                      warm=False)


if __name__ == "__main__":
    sys.exit(main())
