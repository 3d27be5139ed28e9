"""The judge's fork server: its children start from a process that imported JAX once.

Importing JAX and Pallas costs a new Python process about 1.5 s of CPU, and the judge
starts many children: a candidate process per distinct candidate (plus the spare that
waits for the next one) and its TPU compile processes. The zygote holds JAX, Pallas and
the harness modules its children run, imported once, initializes no backend (so it has
no thread of XLA's that a fork could cut in half; the one thread besides its own is
OpenBLAS's, which shuts down around a fork), and forks a child per request. The worker
makes it by forking itself once it has imported JAX, before its backend and its
threads start (``Zygote.fork_here``: the zygote closes every descriptor of the worker's
but stdin, stdout and stderr, the app's socket included); a process without JAX, or a
judge whose zygote died, starts one as ``python -P -m
tilewright.kernels.worker.candidate.zygote`` (``Zygote.start``). Its processes are named
``tw-zygote``, ``tw-candidate`` and ``tw-compiler`` in ``top`` and ``ps -o comm`` (their
command line is the one they were forked from). The child is what ``subprocess.Popen`` would have made: its descriptors
are the judge's socket end and stderr pipe (passed over the control socket) and the
zygote's stdin and stdout, nothing else; its environment, working directory and
arguments are the request's; it runs the module's ``main(argv)`` and exits through the
interpreter's normal shutdown. A fork costs the child about 0.05 s.

What a fork cannot give is an import-time setting that differs: JAX reads its
``JAX_*`` options and numpy its thread counts when they are imported. A request whose
environment differs from the zygote's in such a variable (``IMPORT_TIME``) is refused
and the judge starts that child the ordinary way (``Zygote.spawn`` returns None).

Children are the zygote's, not the judge's, so the zygote reaps them and tells the judge
each one's wait status; ``Forked`` gives the judge the part of ``Popen`` it uses (pid,
stderr, ``poll``, ``wait``). The zygote dies with the judge and the children with the
zygote (``PR_SET_PDEATHSIG``). It runs no candidate code and keeps no candidate's
state: every child is a copy of the zygote as it was before any child ran. If it dies,
the judge starts its children the ordinary way until a new zygote is ready.

Worker-side (the judge), and the zygote process itself.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

# Variables read when JAX, jaxlib or numpy are imported (or when Python starts): a child
# whose environment differs from the zygote's in one of them cannot be a fork of it.
IMPORT_TIME = ("JAX_", "XLA_", "TF_", "OPENBLAS_", "OMP_", "MKL_", "GOTO", "NPY_",
               "PYTHON", "LD_")
# What the zygote imports before it forks: JAX, Pallas and the modules its children run.
PRELOAD = ("jax", "jax.numpy", "jax.experimental.pallas", "jax.experimental.pallas.tpu",
           "jax.export",
           "tilewright.kernels.worker.candidate.main",
           "tilewright.kernels.worker.tpu.compiler",
           "tilewright.kernels.worker.runtime", "tilewright.kernels.worker.execution",
           "tilewright.kernels.worker.errors",
           "tilewright.kernels.worker.evaluation.integrity")
# What it forks, and each one's process name (top, ps -o comm: its command line is the
# zygote's, which is the worker's when the worker forked it).
CHILD_MODULES = {"tilewright.kernels.worker.candidate.main": "tw-candidate",
                 "tilewright.kernels.worker.tpu.compiler": "tw-compiler"}
NAME = "tw-zygote"
MESSAGE_LIMIT = 1 << 20
PR_SET_NAME = 15
READY_TIMEOUT_S = 180.0
REPLY_TIMEOUT_S = 30.0
MAX_RESTARTS = 3  # a zygote that keeps dying is given up: children start the ordinary way


def import_time(env: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The variables of ``env`` a process reads once, when it starts or imports JAX."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME)}


def same_at_import(env: dict[str, str], before: dict[str, str], after: dict[str, str]) -> bool:
    """Whether a process started with ``env`` would be what the zygote is after its
    imports: ``before`` and ``after`` are the zygote's import-time variables before and
    after them (importing JAX sets some, e.g. ``TF_CPP_MIN_LOG_LEVEL``, when unset: an
    ``env`` without one gets the same value from the same import)."""
    theirs = import_time(env)
    for key in set(theirs) | set(after):
        if theirs.get(key) == after.get(key):
            continue
        if key not in theirs and key not in before:
            continue  # the import sets it in the child as it did here
        return False
    return True


# -- the judge's side ---------------------------------------------------------------------

class Forked:
    """A child the zygote forked, as the judge sees it: ``pid`` (of the judge's PID
    namespace), ``stderr`` (the read end of its stderr pipe), ``poll`` and ``wait``
    (the exit code as ``Popen`` gives it: negative for a signal)."""

    def __init__(self, zygote: Zygote, pid: int, stderr: Any) -> None:
        self.zygote = zygote
        self.pid = pid
        self.stderr = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        until = None if timeout is None else time.monotonic() + timeout
        code = self.zygote.exit_code(self.pid, until)
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        self.returncode = code
        return code


class _OwnChild:
    """A zygote this process forked (``Zygote.fork_here``): what the judge needs of a
    ``Popen`` (``pid``, ``kill``, ``wait``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        until = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (the worker's after-request reap)
                self.returncode = -int(signal.SIGKILL)
                break
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                break
            if until is not None and time.monotonic() > until:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return self.returncode


class Zygote:
    """The judge's handle on its fork server: ``fork_here`` (the worker, once it has
    imported JAX and before it starts a thread of its own) or ``start`` it (a process
    that has not imported JAX), then ``spawn`` children from it. Thread-safe: compile
    threads start their processes while the main thread starts a candidate's."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | _OwnChild | None = None
        self.sock: socket.socket | None = None
        self.pid: int | None = None  # the zygote's own pid, once it said it is ready
        self.ids = 0
        self.replies: dict[int, dict[str, Any]] = {}
        self.exits: dict[int, int] = {}  # child pid -> wait status
        self.dead = False
        self.why: str | None = None  # why children are started the ordinary way
        self.started: tuple[dict[str, str], str] | None = None  # (env, cwd) of ``start``
        self.restarts = 0
        self.cond = threading.Condition()
        self.send_lock = threading.Lock()
        self.start_lock = threading.Lock()

    def start(self, env: dict[str, str], cwd: str) -> None:
        """Start the zygote (once; again after it died) with ``env``: the environment
        its children share at import time."""
        with self.start_lock:
            self._start(env, cwd)

    def _start(self, env: dict[str, str], cwd: str) -> None:
        with self.cond:
            if self.proc is not None and not self.dead:
                return
            self.proc = None
            self.dead, self.pid, self.why = False, None, None
            self.replies.clear()
            self.started = (dict(env), cwd)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-P", "-m", __name__, "--fd", str(theirs.fileno()),
                 "--parent", str(os.getpid())],
                pass_fds=(theirs.fileno(),), close_fds=True, stdin=subprocess.DEVNULL,
                env=env, cwd=cwd)
        except OSError as exc:
            mine.close()
            with self.cond:
                self.dead, self.why = True, f"the zygote did not start: {exc}"
            return
        finally:
            theirs.close()
        with self.cond:
            self.proc, self.sock = proc, mine
        threading.Thread(target=self._read, args=(proc, mine), daemon=True,
                         name="tilewright-zygote").start()

    def fork_here(self, env: dict[str, str], cwd: str, before: dict[str, str],
                  fd: int | None = None) -> None:
        """Make this process's fork the zygote: no second import of JAX. Call it after
        importing JAX and before any thread but the main one can hold a lock (no
        backend yet); ``before`` is this process's ``import_time`` variables as it
        started; ``env`` and ``cwd`` are for a zygote ``start``ed if this one dies.
        Nothing but stdin, stdout, stderr and its control socket stays open in it;
        ``fd``: the descriptor number this process's command line names (``--fd``),
        which the control socket, and each child's channel, then take."""
        import importlib

        with self.start_lock:
            with self.cond:
                if self.proc is not None and not self.dead:
                    return
                self.dead, self.pid, self.why = False, None, None
                self.replies.clear()
                self.started = (dict(env), cwd)
            for name in PRELOAD:
                importlib.import_module(name)
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            parent = os.getpid()
            pid = os.fork()
            if pid == 0:  # the zygote: it never returns
                control = theirs.detach()
                mine.detach()
                if fd is not None and fd > 2 and fd != control:
                    os.dup2(control, fd)  # (closes what it was: the app's socket)
                    os.close(control)
                    control = fd
                os._exit(_zygote(control, parent, before, close_first=True))
            theirs.close()
            proc = _OwnChild(pid)
            with self.cond:
                self.proc, self.sock = proc, mine
            threading.Thread(target=self._read, args=(proc, mine), daemon=True,
                             name="tilewright-zygote").start()

    def _read(self, proc: subprocess.Popen[bytes] | _OwnChild, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(MESSAGE_LIMIT)
                message = json.loads(data) if data else None
            except (OSError, ValueError):
                message = None
            with self.cond:
                if self.proc is not proc:  # replaced meanwhile
                    return
                if not isinstance(message, dict):
                    self.dead = True
                    self.why = self.why or "the zygote exited"
                    self.cond.notify_all()
                    break
                kind = message.get("type")
                if kind == "ready":
                    self.pid = int(message["pid"])
                elif kind == "exited":
                    self.exits[int(message["pid"])] = int(message["status"])
                elif kind in ("forked", "refused"):
                    self.replies[int(message["id"])] = message
                self.cond.notify_all()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(5.0)
        sock.close()

    def _ready(self, deadline: float) -> bool:
        with self.cond:
            while self.pid is None and not self.dead:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return self.pid is not None and not self.dead

    def spawn(self, module: str, args: list[str], env: dict[str, str], cwd: str,
              fd: int) -> Forked | None:
        """Fork ``python -m module --fd N --parent <zygote> *args`` with ``env`` and
        ``cwd``, its descriptor N the judge's ``fd`` (its socket end). None: the child must
        be started the ordinary way (no zygote, or ``env`` differs from its own at import
        time); ``why`` says which."""
        if module not in CHILD_MODULES or self.started is None:
            return None
        if self.dead:  # killed or crashed: a new one for the children after this one
            if self.restarts < MAX_RESTARTS:
                self.restarts += 1
                self.start(*self.started)
            return None
        if not self._ready(time.monotonic() + READY_TIMEOUT_S):
            return None
        read_end, write_end = os.pipe()
        with self.cond:
            self.ids += 1
            ident = self.ids
        request = {"type": "fork", "id": ident, "module": module,
                   "argv": ["--parent", str(self.pid), *args], "env": env, "cwd": cwd}
        try:
            with self.send_lock:
                assert self.sock is not None
                socket.send_fds(self.sock, [json.dumps(request).encode()], [fd, write_end])
        except (OSError, AssertionError, TypeError, ValueError):
            os.close(read_end)
            return None
        finally:
            os.close(write_end)
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        with self.cond:
            while ident not in self.replies and not self.dead:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            reply = self.replies.pop(ident, None)
        if reply is None or reply.get("type") != "forked":
            os.close(read_end)
            with self.cond:
                self.why = (reply or {}).get("reason") or self.why or "the zygote did not answer"
            return None
        return Forked(self, int(reply["pid"]), os.fdopen(read_end, "rb", buffering=0))

    def exit_code(self, pid: int, until: float | None = 0.0) -> int | None:
        """The exit code of child ``pid`` (negative: the signal that ended it), waiting
        until ``until`` (None: for ever); None while it runs. A child of a zygote that
        died is dead too (it dies with its parent): it reads as killed."""
        with self.cond:
            while pid not in self.exits:
                if self.dead:
                    return -int(signal.SIGKILL)
                left = None if until is None else until - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.cond.wait(left)
            return os.waitstatus_to_exitcode(self.exits[pid])

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None and not self.dead else []


@functools.cache
def zygote() -> Zygote:
    """This judge's fork server (started by ``start``; before that every child starts
    the ordinary way)."""
    return Zygote()


def start(env: dict[str, str], cwd: str) -> None:
    """Start the judge's zygote now, with its children's environment at import time."""
    zygote().start(env, cwd)


def kept_pids() -> list[int]:
    """The zygote's pid, which the worker's after-request cleanup spares (with the
    candidate and compile processes below it, which it spares anyway)."""
    return zygote().pids() if zygote.cache_info().currsize else []


# -- the zygote process ---------------------------------------------------------------

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
    a freshly forked child (the request and its two descriptors). ``before``: the
    import-time variables as this process started."""
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    after = import_time(os.environ)
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
            data, fds, _flags, _addr = socket.recv_fds(sock, MESSAGE_LIMIT, 2)
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
        if len(fds) != 2:
            reason = "a fork request needs two descriptors"
        elif request.get("module") not in CHILD_MODULES:
            reason = f"not a module the zygote starts: {request.get('module')!r}"
        elif not same_at_import(request.get("env") or {}, before, after):
            reason = "its environment differs at import time"
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

    channel, stderr = fds
    os.dup2(stderr, 2)
    os.close(stderr)
    # The judge's socket end takes the control socket's number, so the command line this
    # process shows (the zygote's, ``--fd N``) names its own channel.
    os.dup2(channel, control)
    os.close(channel)
    channel = control
    # Nothing of the zygote's stays open: 0 and 1 are the judge's (as Popen leaves them),
    # 2 the new pipe, ``channel`` the judge's socket end.
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
    """The zygote's life: serve fork requests on ``control`` until the judge closes it
    (0), and in each forked child, become the requested process and exit with its code
    (never returning: the stack below is the zygote's, or the worker's it was forked
    from). ``close_first``: close every other descriptor (a zygote forked from the
    worker holds the worker's, the app's socket among them)."""
    from tilewright.kernels.confinement.linux import PR_SET_DUMPABLE, prctl
    from tilewright.kernels.worker.startup import die_with_parent

    die_with_parent(parent)
    _name(NAME)
    prctl(PR_SET_DUMPABLE, 0)  # its children's memory is its own: no sibling reads it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if close_first:
        os.closerange(3, control)
        os.closerange(control + 1, 65536)
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


def main(argv: list[str] | None = None) -> int:
    import argparse
    import importlib

    from tilewright.kernels.worker.startup import isolate_path

    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--fd", type=int, required=True, help="inherited control socket")
    parser.add_argument("--parent", type=int, required=True, help="pid of the judge")
    args = parser.parse_args(argv)
    isolate_path()
    before = import_time(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    return _zygote(args.fd, args.parent, before, close_first=False)


if __name__ == "__main__":
    sys.exit(main())
