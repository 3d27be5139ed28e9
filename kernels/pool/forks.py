"""Forks of a process that imported JAX once: the client of the zygote.

Importing JAX and Pallas costs a new Python process about 1.5 s of CPU. The app starts
worker processes (one per pool slot, and again after a hang, a crash or a memory bomb)
and each worker, the judge, starts many children: a candidate process per distinct
candidate (plus the spare that waits for the next one) and its TPU compile processes.
Each of them is a fork of a **zygote** (``kernels.worker.zygote``: JAX, Pallas and the
harness imported, no backend, no thread of XLA's) where it can be: the app starts one
zygote for its workers (``Zygote.start``, quiet: the app's terminal is a screen), and
each worker forks itself into the judge's zygote once it has imported JAX
(``kernels.worker.zygote.fork_here``, which hands it to ``Zygote.adopt``). A fork costs
a child about 0.05 s.

A child is what ``subprocess.Popen`` would have made: its descriptors are our socket
end, its stdout and its stderr (passed over the control socket), and the zygote's
stdin, nothing else; its environment, working directory and arguments are the
request's, and optionally a session of its own. What a fork cannot give is an
import-time setting that differs: JAX reads its ``JAX_*`` options and numpy its thread
counts when they are imported. A request whose environment differs from the zygote's
in such a variable (``IMPORT_TIME``) is refused and the caller starts that child the
ordinary way (``Zygote.spawn`` returns None, ``why`` says why), as it does while the
zygote is gone (a new one is started for the children after) or with
``TILEWRIGHT_ZYGOTE=off``.

Children are the zygote's, not ours, so the zygote reaps them and reports each one's
wait status; ``Forked`` gives the caller the part of ``Popen`` it uses (pid, stderr,
``poll``, ``wait``). The zygote dies with us (a forked one by ``PR_SET_PDEATHSIG``, a
started one by watching our pid) and the children with the zygote. It runs no candidate code and keeps no state of a child's: every
child is a copy of the zygote as it was before any child ran. The processes are named
``tw-zygote``, ``tw-worker``, ``tw-candidate`` and ``tw-compiler`` in ``top`` and ``ps -o
comm`` (their command line is the one they were forked from).

No JAX here: the app uses it (``kernels.pool.process``), and so does the judge.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

IMPORT_TIME = ("JAX_", "XLA_", "TF_", "OPENBLAS_", "OMP_", "MKL_", "GOTO", "NPY_",
               "PYTHON", "LD_")
# What it forks, and each one's process name (top, ps -o comm: its command line is the
# zygote's, which is the worker's when the worker forked it).
CHILD_MODULES = {"tilewright.kernels.worker.candidate.main": "tw-candidate",
                 "tilewright.kernels.worker.tpu.compiler": "tw-compiler",
                 "tilewright.kernels.worker.main": "tw-worker"}
NAME = "tw-zygote"
ZYGOTE_MODULE = "tilewright.kernels.worker.zygote"
MESSAGE_LIMIT = 1 << 20
READY_TIMEOUT_S = 180.0
REPLY_TIMEOUT_S = 30.0
OFF_ENV = "TILEWRIGHT_ZYGOTE"  # "off": every process starts the ordinary way (debugging)
DIFFERS = "its environment differs at import time"  # why such a child is not forked
# A zygote that dies this many times in a row without forking a child is given up:
# children start the ordinary way.
MAX_RESTARTS = 3


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


class Forked:
    """A child the zygote forked, as its caller sees it: ``pid`` (of the caller's PID
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


class OwnChild:
    """A zygote this process forked (``kernels.worker.zygote.fork_here``): what we need
    of a ``Popen`` (``pid``, ``kill``, ``wait``)."""

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
    """Our handle on a fork server: ``start`` one (a process of its own) or ``adopt``
    the one this process forked, then ``spawn`` children from it. Thread-safe: the
    judge's compile threads start their processes while its main thread starts a
    candidate's."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | OwnChild | None = None
        self.sock: socket.socket | None = None
        self.pid: int | None = None  # the zygote's own pid, once it said it is ready
        self.ids = 0
        self.replies: dict[int, dict[str, Any]] = {}
        self.exits: dict[int, int] = {}  # child pid -> wait status
        self.dead = False
        self.why: str | None = None  # why children are started the ordinary way
        self.started: tuple[dict[str, str], str, bool] | None = None  # ``start``'s arguments
        self.restarts = 0
        self.cond = threading.Condition()
        self.send_lock = threading.Lock()
        self.start_lock = threading.Lock()

    def start(self, env: dict[str, str], cwd: str, quiet: bool = False) -> None:
        """Start the zygote (once; again after it died) with ``env``: the environment
        its children share at import time. ``quiet``: its own stdout and stderr go
        nowhere (the app's terminal is a screen; its children get theirs from us)."""
        with self.start_lock:
            self._start(env, cwd, quiet)

    def _start(self, env: dict[str, str], cwd: str, quiet: bool) -> None:
        with self.cond:
            if self.proc is not None and not self.dead:
                return
            self.proc = None
            self.dead, self.pid, self.why = False, None, None
            self.replies.clear()
            self.started = (dict(env), cwd, quiet)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-P", "-m", ZYGOTE_MODULE, "--fd", str(theirs.fileno()),
                 "--parent", str(os.getpid())],
                pass_fds=(theirs.fileno(),), close_fds=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL if quiet else None,
                stderr=subprocess.DEVNULL if quiet else None, env=env, cwd=cwd)
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

    def adopt(self, proc: OwnChild, sock: socket.socket, env: dict[str, str],
              cwd: str) -> None:
        """Take a zygote this process forked (``kernels.worker.zygote.fork_here``) with
        its control socket; ``env`` and ``cwd`` are for a zygote ``start``ed if this one
        dies."""
        with self.start_lock, self.cond:
            self.dead, self.pid, self.why = False, None, None
            self.replies.clear()
            self.started = (dict(env), cwd, False)
            self.proc, self.sock = proc, sock
        threading.Thread(target=self._read, args=(proc, sock), daemon=True,
                         name="tilewright-zygote").start()

    def _read(self, proc: subprocess.Popen[bytes] | OwnChild, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(MESSAGE_LIMIT)
                message = json.loads(data) if data else None
            except (OSError, ValueError):
                message = None
            with self.cond:
                if self.proc is not proc:  # replaced meanwhile
                    break
                try:
                    kind = message.get("type") if isinstance(message, dict) else None
                    if kind == "ready":
                        self.pid = int(message["pid"])
                    elif kind == "exited":
                        self.exits[int(message["pid"])] = int(message["status"])
                    elif kind in ("forked", "refused"):
                        self.replies[int(message["id"])] = message
                    else:
                        raise ValueError("not a message of the zygote's")
                except (KeyError, TypeError, ValueError):  # gone, or speaking nonsense
                    self.dead = True
                    self.why = self.why or "the zygote exited"
                    self.cond.notify_all()
                    break
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
              fd: int, output: int | None = None, session: bool = False) -> Forked | None:
        """Fork ``python -m module --fd N --parent <zygote> *args`` with ``env`` and
        ``cwd``, its descriptor N our ``fd`` (our socket end), its stdout ours (or
        ``output``), its stderr a new pipe (``Forked.stderr``; or ``output`` too);
        ``session``: in a session (and process group) of its own. None: the child must
        be started the ordinary way (no zygote, or ``env`` differs from its own at import
        time); ``why`` says which."""
        if module not in CHILD_MODULES or self.started is None:
            return None
        if os.environ.get(OFF_ENV, "").lower() == "off":
            self.why = f"{OFF_ENV}=off"
            return None
        if self.dead:  # killed or crashed: a new one for the children after this one
            if self.restarts < MAX_RESTARTS:
                self.restarts += 1
                self.start(*self.started)
            return None
        if not self._ready(time.monotonic() + READY_TIMEOUT_S):
            return None
        read_end, write_end = os.pipe() if output is None else (None, output)
        with self.cond:
            self.ids += 1
            ident = self.ids
        request = {"type": "fork", "id": ident, "module": module, "session": session,
                   "argv": ["--parent", str(self.pid), *args], "env": env, "cwd": cwd}
        try:
            with self.send_lock:
                assert self.sock is not None
                socket.send_fds(self.sock, [json.dumps(request).encode()],
                                [fd, 1 if output is None else output, write_end])
        except (OSError, AssertionError, TypeError, ValueError):
            if read_end is not None:
                os.close(read_end)
            return None
        finally:
            if read_end is not None:
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
            if read_end is not None:
                os.close(read_end)
            with self.cond:
                self.why = (reply or {}).get("reason") or self.why or "the zygote did not answer"
            return None
        with self.cond:
            self.restarts = 0  # it forks: only a zygote that dies before forking is given up
        return Forked(self, int(reply["pid"]), None if read_end is None
                      else os.fdopen(read_end, "rb", buffering=0))

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
    """This process's fork server (until it is started or adopted, every child starts
    the ordinary way)."""
    return Zygote()


def start(env: dict[str, str], cwd: str) -> None:
    """Start this process's zygote now, with its children's environment at import time."""
    zygote().start(env, cwd)


def kept_pids() -> list[int]:
    """The zygote's pid, which the worker's after-request cleanup spares (with the
    candidate and compile processes below it, which it spares anyway)."""
    return zygote().pids() if zygote.cache_info().currsize else []
