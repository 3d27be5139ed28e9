"""Worker process main loop: ``python -m tilewright.kernels.worker.main --fd N --parent PID``.

Imports JAX once, then answers requests framed on the inherited socket ``N``
(``kernels.pool.protocol``) by dispatching to ``kernels.worker.ops.OPS``. Its
stdout and stderr are a capture file owned by the app, which reads it per request:
nothing a candidate or XLA prints reaches the user's terminal. The worker dies with
its parent: PR_SET_PDEATHSIG on Linux, and a watchdog thread that notices a changed
parent pid (covers other platforms and a parent that died before prctl ran).

It is started with ``python -P`` (no current or script directory on ``sys.path``: a
planted ``argparse.py`` beside a task never runs) in its scratch directory. Before
anything else (single-threaded, before JAX) it confines itself
(``kernels.confinement.confine``: namespaces, Landlock on reads and writes, rlimits;
the report travels with the "ready" message), and after every request it kills
whatever processes the candidate left behind, empties its private ``/dev/shm`` and
checks that its own harness modules are unchanged (``recycle`` in the reply if not).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

from tilewright.kernels import confinement
from tilewright.kernels.judge.result import EvalResult
from tilewright.kernels.pool import protocol
from tilewright.kernels.pool.env import scrub_current_process
from tilewright.kernels.worker.execution import keep_compiled_programs
from tilewright.kernels.worker.startup import die_with_parent, isolate_path, warm_up, watch_parent
from tilewright.kernels.worker.tpu.tpu_compile import prepare_environment


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


def _device_memory_mb() -> int:
    """The chip's memory this process holds, in MiB (0 on a CPU host): on a TPU host the
    chip's buffers are mapped into the holder's address space, and where the kernel
    counts those pages as resident (gVisor, on the v5e at hand: a gelu at 8192x8192
    with its input sets on the chip took the worker past a 16 GiB watch), the app's
    memory watch leaves room for them."""
    import jax

    device = jax.devices()[0]
    if device.platform == "cpu":
        return 0
    try:
        stats = device.memory_stats() or {}
    except Exception:
        stats = {}
    return int(stats.get("bytes_limit", 0)) >> 20


def serve(sock: socket.socket, confined: dict[str, Any] | None = None) -> None:
    from tilewright.kernels.worker import ops
    from tilewright.kernels.worker.candidate import judge
    from tilewright.kernels.worker.evaluation import integrity
    from tilewright.kernels.worker.tpu import compile_pool

    ops.load_plugins()
    # The serving process's pid as the app sees it (inside a PID namespace getpid() is 2,
    # and the namespace's own /proc numbers it that way): the app watches its memory.
    # ``local_pid`` lets the app find it in its own subtree whatever /proc says.
    _send(sock, {"type": "ready", **ops.hello({}), "confinement": confined,
                 "serving_pid": confinement.host_pid(), "local_pid": os.getpid(),
                 "device_memory_mb": _device_memory_mb()})
    # The judge runs no candidate code; its harness modules must stay as they are now.
    # Anything else (a module rewritten, jax.config changed) means it was exposed to
    # something unexpected: the app replaces it after the reply.
    snapshot = integrity.ModuleSnapshot()
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
        lock = threading.Lock()  # progress frames come from the judge's compile thread
        ids = {"id": reply["id"], "nonce": reply["nonce"], "open": True}
        ops.set_progress(functools.partial(_send_progress, sock, lock, ids))
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
        with lock:  # no progress frame of this request may follow its reply
            ids["open"] = False
            ops.set_progress(None)
        reply["handler_s"] = time.perf_counter() - started
        # Whatever the candidate forked (setsid, double fork, a listener) ends with the
        # request that started it.
        try:
            reply["leftover_processes"] = confinement.kill_descendants(
                keep=judge.kept_pids() + compile_pool.kept_pids())
        except OSError:
            reply["leftover_processes"] = None
        # Shared memory is nobody's resident memory: empty the namespace's /dev/shm, and
        # replace a candidate process that used it (it may hold deleted files open).
        if confinement.empty_private_shm():
            judge.recycle_candidate("it left files in /dev/shm")
        changed = snapshot.changed()
        _config, restored = snapshot.restore_config()
        if changed or not restored:
            reply["recycle"] = ("the judge's own modules changed: " + ", ".join(changed[:5])
                                if changed else "the judge's jax.config could not be restored")
            _withhold_verdict(request, reply)
        _flush_stdio()
        _send(sock, reply)


def _send_progress(sock: socket.socket, lock: threading.Lock, ids: dict[str, Any],
                   data: dict[str, Any]) -> None:
    """A progress frame of the request ``ids`` names (its id and nonce), while that
    request has not been answered."""
    with lock:
        if ids.get("open"):
            sock.sendall(protocol.encode({"id": ids["id"], "nonce": ids["nonce"],
                                          "progress": data}))


def _withhold_verdict(request: dict[str, Any], reply: dict[str, Any]) -> None:
    """A judge whose harness changed during an evaluation cannot be believed: only task
    code runs in it (the reference, the input builder), so the task is blamed and no
    verdict is given."""
    result = reply.get("result")
    if request.get("op") != "eval" or not isinstance(result, dict) or "status" not in result:
        return
    judged = EvalResult.from_json(result)
    judged.withhold(reply["recycle"])
    reply["result"] = judged.to_json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilewright.kernels.worker.main")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket for requests")
    parser.add_argument("--parent", type=int, required=True, help="pid of the app process")
    parser.add_argument("--scratch", default=None, help="the only writable directory")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    isolate_path()
    scrub_current_process()
    # Before JAX loads libtpu: no estimate flag here (the judge's estimator processes,
    # kernels.worker.tpu.compiler, have it: with it every compile pays for the estimator).
    prepare_environment(dump_parent=args.scratch, estimates=False)
    scratch = args.scratch or os.environ.get("TMPDIR") or "/tmp"
    confined = confinement.confine(scratch)  # may fork: we continue as PID 1 of a namespace
    watch_parent()
    # Ctrl-C in the user's terminal is the app's business, not ours.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    sock.setblocking(True)
    from tilewright.kernels.worker.candidate import judge  # none imports JAX
    from tilewright.kernels.worker.tpu import reference

    before = dict(os.environ)
    import jax  # noqa: F401  -- once, up front: this is what makes the worker warm

    # The zygote is a fork of this process, now: JAX imported, no backend and no thread
    # of ours started yet. The candidate process is its first fork (its readiness is
    # what the first evaluation waits for); it warms up while we do.
    judge.fork_zygote(before, args.fd)
    judge.process().start()
    # Set after the fork (the zygote's children compile no program of the judge's) and
    # before the first compile.
    keep_compiled_programs(confined)
    # The backend opens here: on a TPU host this process holds the chip for its life (its
    # children run on the CPU, kernels.worker.chip), and a first kernel pays Mosaic's start.
    from tilewright.kernels.worker import chip

    try:
        warm_up(kernel=True)
        failed = chip.quiet_failure()  # JAX fell back to the CPU: say why, do not judge
        if failed is not None:
            raise RuntimeError(f"Unable to initialize backend 'tpu': {failed}")
    except Exception as exc:
        if not chip.is_busy_message(str(exc)):
            if "backend 'tpu'" not in str(exc):
                raise
            print(f"TpuStartError: the TPU is attached but its backend did not start, so "
                  f"nothing is judged (set JAX_PLATFORMS=cpu to judge on the CPU): {exc}",
                  file=sys.stderr, flush=True)
            return 3
        # One line the app's start-up error quotes (``WorkerStartError``): who holds it.
        print(f"ChipBusyError: {chip.busy_error(exc)}", file=sys.stderr, flush=True)
        return 3
    # (The compile processes start on their first cache miss: forks of the zygote.)
    reference.BOOK.start()
    serve(sock, confined)
    return 0


if __name__ == "__main__":
    sys.exit(main())
