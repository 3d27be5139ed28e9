"""The zygote process: JAX imported once, a fork per child (``kernels.pool.forks``).

It imports JAX, Pallas and the harness modules its children run (``PRELOAD``), starts no
backend (so it has no thread of XLA's that a fork could cut in half; the one thread
besides its own is OpenBLAS's, which shuts down around a fork), and answers fork
requests on its control socket: each names a module of ``forks.CHILD_MODULES``, its
arguments, environment and working directory, and carries the child's socket, stdout
and stderr. It refuses a request whose environment differs from its own at import
time, reaps its children and reports their wait statuses. In a forked child it becomes
the requested process (``_become``) and exits with its code; it never returns.

Two ways to be one: ``python -P -m tilewright.kernels.worker.zygote --fd N --parent P``
(the app's zygote, and a judge's when its first died), or ``fork_here`` (the worker,
once it has imported JAX and before its backend and threads start: the zygote closes
every descriptor of the worker's but stdin, stdout and stderr, the app's socket
included).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import sys
import tempfile
from typing import Any

from tilewright.kernels.pool.forks import (
    CHILD_MODULES,
    DIFFERS,
    MESSAGE_LIMIT,
    NAME,
    OwnChild,
    Zygote,
    import_time,
    same_at_import,
)
from tilewright.kernels.worker import chip

PR_SET_NAME = 15

# What the zygote imports before it forks: JAX, Pallas and the modules its children run.
PRELOAD = ("jax", "jax.numpy", "jax.experimental.pallas", "jax.experimental.pallas.tpu",
           "jax.export",
           "tilewright.kernels.worker.main", "tilewright.kernels.worker.candidate.main",
           "tilewright.kernels.worker.tpu.compiler",
           "tilewright.kernels.worker.runtime", "tilewright.kernels.worker.execution",
           "tilewright.kernels.worker.errors",
           "tilewright.kernels.worker.evaluation.integrity",
           "tilewright.kernels.worker.evaluation.evaluate",
           "tilewright.kernels.worker.candidate.channel",
           "tilewright.kernels.worker.candidate.production",
           "tilewright.profiling.static_blocks")
# What a candidate process imports on its first interpreted kernel (``pallas_call``'s
# interpret rule imports both interpreters lazily): the zygote itself imports them, not
# the worker it may be forked from, which interprets no kernel. About 0.2 s of CPU once
# per zygote instead of once per candidate process (a fork to ready: 0.60 -> 0.39 s of
# CPU on a 2-core host, benchmarks/host_speed/process_start.py). Private paths that move between JAX
# versions: one that is gone or fails to import costs only that time.
CHILD_PRELOAD = ("jax._src.pallas.mosaic.interpret.interpret_pallas_call",
                 "jax._src.pallas.mosaic_gpu.interpret.interpret_pallas_call",
                 "jaxlib.mlir.dialects.mhlo")


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        os._exit(0)  # the judge is gone


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"type": "exited", "pid": pid, "status": status})


def _serve(sock: socket.socket, parent: int, before: dict[str, str]
           ) -> tuple[dict[str, Any], list[int]] | None:
    """Answer fork requests until the judge closes the socket (None) or this process is
    a freshly forked child (the request, with the environment it will have, and its
    three descriptors). ``before``: this process's environment as it started."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    after = import_time(os.environ)
    # What the imports set in the environment (libtpu's TPU_SKIP_MDS_QUERY, absl's log
    # level...): a child imports nothing again, so it gets them as a fresh process would.
    added = {k: v for k, v in os.environ.items() if before.get(k) != v}
    # What is imported by now lives as long as any child: out of the collector's reach,
    # so a child's collections do not walk (and copy, page by page) the zygote's heap.
    gc.freeze()
    _send(sock, {"type": "ready", "pid": os.getpid()})
    while True:
        ready, _, _ = select.select([sock, wake_read], [], [], 0.5)
        if os.getppid() != parent:
            os._exit(0)
        if wake_read in ready:
            with contextlib.suppress(BlockingIOError, OSError):
                while os.read(wake_read, 512):
                    pass
        _reap(sock)
        if sock not in ready:
            continue
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MESSAGE_LIMIT, 3)
        except OSError:
            return None
        if not data:
            return None
        try:
            request = json.loads(data)
            ident = request["id"]
        except (ValueError, KeyError, TypeError):
            for fd in fds:
                os.close(fd)
            continue
        reason = None
        if len(fds) != 3:
            reason = "a fork request needs three descriptors"
        elif request.get("module") not in CHILD_MODULES:
            reason = f"not a module the zygote starts: {request.get('module')!r}"
        elif not same_at_import(request.get("env") or {}, import_time(before), after):
            reason = DIFFERS
        if reason is not None:
            for fd in fds:
                os.close(fd)
            _send(sock, {"type": "refused", "id": ident, "reason": reason})
            continue
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(wake_read)
            os.close(wake_write)
            sock.detach()
            request["env"] = {**added, **(request.get("env") or {})}
            return request, fds
        for fd in fds:
            os.close(fd)
        _send(sock, {"type": "forked", "id": ident, "pid": pid})


def _name(name: str) -> None:
    """This process's name in top and ``ps -o comm``."""
    with contextlib.suppress(Exception):
        from tilewright.kernels.confinement.linux import libc_handle

        libc_handle().prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _become(request: dict[str, Any], fds: list[int], control: int) -> int:
    """In the forked child: take the request's descriptors, environment, directory and
    arguments, and run its module as ``python -m`` would (its ``main(argv)``)."""
    import importlib

    channel, stdout, stderr = fds
    if request.get("session"):
        os.setsid()
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    for fd in {stdout, stderr}:
        os.close(fd)
    # The judge's socket end takes the control socket's number, so the command line this
    # process shows (the zygote's, ``--fd N``) names its own channel.
    os.dup2(channel, control)
    os.close(channel)
    channel = control
    # Nothing of the zygote's stays open: 0 is its stdin (as Popen leaves it), 1 and 2
    # the ones the request passed, ``channel`` the caller's socket end.
    os.closerange(3, channel)
    os.closerange(channel + 1, 65536)
    _name(CHILD_MODULES[request["module"]])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    tempfile.tempdir = None  # TMPDIR is the child's own scratch
    module = importlib.import_module(request["module"])
    argv = ["--fd", str(channel), *request["argv"]]
    sys.argv = [module.__file__ or request["module"], *argv]
    return int(module.main(argv) or 0)


def _zygote(control: int, parent: int, before: dict[str, str], close_first: bool) -> int:
    """The zygote's life: serve fork requests on ``control`` until its parent closes it
    (0), and in each forked child, become the requested process and exit with its code
    (never returning: the stack below is the zygote's, or the worker's it was forked
    from). ``close_first``: close every other descriptor (a zygote forked from the
    worker holds the worker's, the app's socket among them), and die with the parent
    by ``PR_SET_PDEATHSIG`` (its main thread forked us). A zygote started as a process
    of its own may have been started by a thread of its parent that ends before the
    parent does (the signal follows that thread): it watches its parent's pid instead,
    twice a second (``_serve``)."""
    from tilewright.kernels.confinement.linux import PR_SET_DUMPABLE, prctl
    from tilewright.kernels.worker.startup import die_with_parent

    if close_first:
        die_with_parent(parent)
    elif os.getppid() != parent:
        os._exit(0)
    _name(NAME)
    prctl(PR_SET_DUMPABLE, 0)  # its children's memory is its own: no sibling reads it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if close_first:
        os.closerange(3, control)
        os.closerange(control + 1, 65536)
    _preload_for_children()
    child = _serve(socket.socket(fileno=control), parent, before)
    if child is None:
        return 0
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in any new Python
    code = 1
    try:
        code = _become(*child, control=control)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    # The end of a process: what it registered to run at exit, its buffered output.
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _preload_for_children() -> None:
    import importlib

    for name in CHILD_PRELOAD:
        with contextlib.suppress(Exception):  # the child imports it itself, or fails there
            importlib.import_module(name)


def fork_here(server: Zygote, env: dict[str, str], cwd: str, before: dict[str, str],
              fd: int | None = None) -> None:
    """Fork this process into ``server``'s zygote: no second import of JAX. Call it
    after importing JAX and before any thread but the main one can hold a lock (no
    backend yet); ``before``: this process's environment before it imported JAX;
    ``env`` and ``cwd``: for a zygote started if this one dies. Nothing but stdin,
    stdout, stderr and its control socket stays open in it; ``fd``: the descriptor
    number this process's command line names (``--fd``), which the control socket,
    and each child's channel, then take."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the zygote: it never returns
        # The worker may hold a TPU chip; nothing forked from here may open one
        # (libtpu admits one process per chip): its children run JAX on the CPU.
        chip.pin_to_cpu()
        control = theirs.detach()
        mine.detach()
        if fd is not None and fd > 2 and fd != control:
            os.dup2(control, fd)  # (closes what it was: the app's socket)
            os.close(control)
            control = fd
        os._exit(_zygote(control, parent, before, close_first=True))
    theirs.close()
    server.adopt(OwnChild(pid), mine, env, cwd)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import importlib

    from tilewright.kernels.worker.startup import isolate_path

    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--fd", type=int, required=True, help="inherited control socket")
    parser.add_argument("--parent", type=int, required=True, help="pid of the judge")
    args = parser.parse_args(argv)
    isolate_path()
    before = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    return _zygote(args.fd, args.parent, before, close_first=False)


if __name__ == "__main__":
    sys.exit(main())
