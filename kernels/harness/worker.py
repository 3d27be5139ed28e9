"""Worker process main loop: ``python -m kernels.harness.worker --fd N --parent PID``.

Imports JAX once, then answers requests framed on the inherited socket ``N``
(``kernels.harness.protocol``) by dispatching to ``kernels.harness.ops.OPS``. Its
stdout and stderr are a capture file owned by the app, which reads it per request:
nothing a candidate or XLA prints reaches the user's terminal. The worker dies with
its parent: PR_SET_PDEATHSIG on Linux, and a watchdog thread that notices a changed
parent pid (covers other platforms and a parent that died before prctl ran).

Before anything else (single-threaded, before JAX) it confines itself
(``kernels.confinement.confine``: namespaces, Landlock, rlimits; the report travels
with the "ready" message), and after every request it kills whatever processes the
candidate left behind.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

from kernels import confinement
from kernels.harness import protocol
from kernels.harness.tpu_compile import prepare_environment
from kernels.worker_env import scrub_current_process

PR_SET_PDEATHSIG = 1
WATCHDOG_PERIOD_S = 0.5


def die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still covers it
    if os.getppid() != parent_pid:
        os._exit(0)  # the parent died before we could ask to follow it


def watch_parent() -> None:
    """A thread that exits when the parent changes (started after ``confine``, which
    may have forked us into a namespace whose parent shows as pid 0)."""
    parent_pid = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_PERIOD_S)
            if os.getppid() != parent_pid:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    try:
        sock.sendall(protocol.encode(message))
    except OSError:
        os._exit(0)  # the app is gone


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def serve(sock: socket.socket, confined: dict[str, Any] | None = None) -> None:
    from kernels.harness import ops

    ops.load_plugins()
    # The serving process's pid as the app sees it (inside a PID namespace getpid() is 1):
    # the app watches this one's memory.
    host_pid = int(os.readlink("/proc/self")) if os.path.exists("/proc/self") else os.getpid()
    _send(sock, {"type": "ready", **ops.hello({}), "confinement": confined,
                 "serving_pid": host_pid})
    while True:
        try:
            request = protocol.recv_blocking(sock)
        except (OSError, protocol.ProtocolError):
            request = None
        if request is None:
            return
        reply: dict[str, Any] = {"id": request.pop("id", None), "nonce": request.pop("nonce", None)}
        handler = ops.OPS.get(str(request.get("op")))
        started = time.perf_counter()
        if handler is None:
            reply.update(ok=False, error={"type": "UnknownOp", "message":
                         f"unknown op {request.get('op')!r}; known: {sorted(ops.OPS)}"})
        else:
            try:
                reply.update(ok=True, result=handler(request.get("payload") or {}))
            except BaseException as exc:  # SystemExit from candidate code must not end us
                reply.update(ok=False, error={
                    "type": type(exc).__name__, "message": str(exc),
                    "traceback": "".join(traceback.format_exception(exc)),
                })
        reply["handler_s"] = time.perf_counter() - started
        # Whatever the candidate forked (setsid, double fork, a listener) ends with the
        # request that started it.
        try:
            from kernels.harness.judge import kept_pids

            reply["leftover_processes"] = confinement.kill_descendants(keep=kept_pids())
        except OSError:
            reply["leftover_processes"] = None
        _flush_stdio()
        _send(sock, reply)


def warm_up() -> None:
    """Pay the one-time costs before announcing readiness, not in the first evaluation:
    importing Pallas, initializing the backend, and running one tiny kernel (in TPU
    interpret mode off-TPU) so the interpreter's and the compiler's caches are filled."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    x = jnp.zeros((8, 128), jnp.float32)
    call = jax.jit(lambda x: pl.pallas_call(
        copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x))
    try:
        if jax.devices()[0].platform == "tpu":
            jax.block_until_ready(call(x))
        else:
            with pltpu.force_tpu_interpret_mode():
                jax.block_until_ready(call(x))
    except Exception:  # a warm-up problem must not keep the worker from serving
        traceback.print_exc()
        if jax.devices()[0].platform != "tpu":
            pltpu.reset_tpu_interpret_mode_state()


def child_main(argv: list[str] | None, prog: str, serve: Any, *, confine: bool,
               warm: bool, estimates: bool = False) -> int:
    """Start-up of a judge's child process (the candidate process, the reference
    compiler): die with the judge, the estimate flag before JAX loads libtpu (dumping
    under its own scratch dir), optionally its own confinement, then ``serve`` the
    inherited socket. ``warm`` runs one interpreted kernel first (the candidate process
    runs kernels; the reference compiler only compiles)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the judge")
    parser.add_argument("--parent", type=int, required=True, help="pid of the judge")
    parser.add_argument("--scratch", required=True, help="its own scratch directory")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    prepare_environment(dump_parent=args.scratch, estimates=estimates)
    if confine:
        confinement.confine(args.scratch)  # may fork: we continue inside new namespaces
    watch_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    sock.setblocking(True)
    import jax  # noqa: F401

    if warm:
        warm_up()
    serve(sock)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.harness.worker")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket for requests")
    parser.add_argument("--parent", type=int, required=True, help="pid of the app process")
    parser.add_argument("--scratch", default=None, help="the only writable directory")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    scrub_current_process()
    # Before JAX loads libtpu: no estimate flag here (the judge's estimator processes,
    # kernels.harness.compiler, have it: with it every compile pays for the estimator).
    prepare_environment(dump_parent=args.scratch, estimates=False)
    scratch = args.scratch or os.environ.get("TMPDIR") or "/tmp"
    confined = confinement.confine(scratch)  # may fork: we continue as PID 1 of a namespace
    watch_parent()
    # Ctrl-C in the user's terminal is the app's business, not ours.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    sock.setblocking(True)
    import jax  # noqa: F401  -- once, up front: this is what makes the worker warm

    warm_up()
    from kernels.harness import judge

    judge.process().start()  # the candidate process imports JAX while we wait for work
    serve(sock, confined)
    return 0


if __name__ == "__main__":
    sys.exit(main())
