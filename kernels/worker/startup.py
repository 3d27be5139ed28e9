"""How a harness process starts: the worker (the judge) and the judge's children.

Every process that runs harness code starts the same way, before it imports JAX:
it dies with its parent (``PR_SET_PDEATHSIG`` on Linux, and a watchdog thread that
notices a changed parent pid, for other platforms and for a parent that died before
prctl ran), keeps no relative ``sys.path`` entry (a planted ``argparse.py`` beside a
task never runs; the processes are started with ``python -P`` in their scratch dirs),
and warms up before it says it is ready (``warm_up``: its backend; on a TPU, where it
runs kernels, one tiny kernel too) so the first evaluation does not pay for that.
``child_main`` is the whole start-up of the judge's
children: the candidate process (``kernels.worker.candidate.main``, confined on its own)
and the TPU compile processes (``kernels.worker.tpu.compiler``, inside the judge's
confinement). The worker's own start-up is ``kernels.worker.main.main``.
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

from tilewright.kernels import confinement
from tilewright.kernels.worker.tpu.tpu_compile import prepare_environment

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


def warm_up(kernel: bool = True) -> None:
    """Pay the one-time costs before announcing readiness, not in the first evaluation:
    initializing the backend with one tiny jitted program, and on a TPU (``kernel``, the
    candidate process) compiling and running one tiny Pallas kernel, so Mosaic's and the
    TPU compiler's first use is paid too. Off a TPU no kernel is interpreted here: the
    interpreter's programs are compiled for each kernel's own shapes, so interpreting a
    tiny one up front cost 0.29 s of CPU and spared the first kernel run after it 0.14 s
    (a gelu at 64x256, three calls; 2-core CPU host): CPU that the process warming up
    takes from the evaluation in flight (a spare warms while the last candidate is
    judged). The Pallas interpreters themselves are imported by the zygote
    (``zygote.CHILD_PRELOAD``)."""
    import jax
    import jax.numpy as jnp

    x = jnp.zeros((8, 128), jnp.float32)
    if not kernel or jax.devices()[0].platform != "tpu":
        jax.block_until_ready(jax.jit(lambda x: x + 1.0)(x))
        return
    from jax.experimental import pallas as pl

    def copy(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    call = jax.jit(lambda x: pl.pallas_call(
        copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x))
    try:
        jax.block_until_ready(call(x))
    except Exception:  # a warm-up problem must not keep the worker from serving
        traceback.print_exc()


def isolate_path() -> None:
    """No relative ``sys.path`` entries (the current directory): the app starts workers
    with ``python -P``, this covers a worker started by hand. What was imported before
    this runs came from Python's own directories (with -P)."""
    sys.path[:] = [p for p in sys.path if p and os.path.isabs(p)]


def child_main(argv: list[str] | None, prog: str, serve: Any, *, confine: bool,
               warm: bool, estimates: bool = False) -> int:
    """Start-up of a judge's child process (the candidate process, the reference
    compiler): die with the judge, the estimate flag before JAX loads libtpu (dumping
    under its own scratch dir), optionally its own confinement, then ``serve`` the
    inherited socket. ``warm``: ``warm_up`` first (the candidate process runs kernels;
    the compile processes only compile)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the judge")
    parser.add_argument("--parent", type=int, required=True, help="pid of the judge")
    parser.add_argument("--scratch", required=True, help="its own scratch directory")
    parser.add_argument("--read", action="append", default=[],
                        help="a path it may read besides Python's and the system's")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    isolate_path()
    prepare_environment(dump_parent=args.scratch, estimates=estimates)
    if confine:
        # may fork: we continue inside new namespaces
        confinement.confine(args.scratch, [p for p in args.read if os.path.exists(p)])
    watch_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    sock.setblocking(True)
    import jax  # noqa: F401

    if warm:
        warm_up()
    serve(sock)
    return 0
