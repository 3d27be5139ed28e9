"""The judge's side of the candidate process (``kernels.worker.candidate.main``).

The worker process the app talks to is the judge: it keeps the inputs, reference
outputs, comparisons, integrity decisions and the baseline's timing, and never imports
candidate code. Candidate code runs in one child process per worker, started here,
confined like the worker (the worker's namespaces, its own Landlock domain: reads of
Python, the system and the app's task copies under ``<scratch>/tasks``, writes to its
own scratch directory, which goes with it), started with ``python -P`` in that
directory, connected by a socketpair framed by ``kernels.worker.candidate.wire``. The child
inherits no other descriptor (not the app's socket) and never sees the reply nonce.
Its pids are mapped to /proc entries only through this process's own subtree
(``kernels.confinement.proc_entry``), so limits, pauses and kills reach its processes
and no other worker's.

A candidate process that crashes, exits, hangs past the deadline (per phase), grows
past the memory limit or breaks the protocol (a forged or oversized reply) is killed
with every descendant and replaced; ``CandidateFailure.kind`` says which. While the
judge times the XLA baseline the candidate process tree is stopped (SIGSTOP) and
continued after (SIGCONT), so it cannot compete for the CPU or the interpreter lock.
The process is kept warm between evaluations unless the last one left it untrustworthy
(tampering, threads, a jax.config it could not put back).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Iterator
from typing import Any

from tilewright.kernels import confinement
from tilewright.kernels.judge.process_failure import exited, signal_death
from tilewright.kernels.pool import forks
from tilewright.kernels.pool.env import ESTIMATE_CACHE
from tilewright.kernels.pool.protocol import ProtocolError
from tilewright.kernels.tasks.copies import TASKS_DIRNAME
from tilewright.kernels.worker import chip
from tilewright.kernels.worker.candidate import wire

STARTUP_TIMEOUT_S = 180.0
DEFAULT_MEMORY_MB = 16 * 1024


class CandidateFailure(Exception):
    """The candidate process had to be killed: ``kind`` is timeout, crashed, exited,
    memory or protocol (a reply that does not answer the request, or is malformed).
    ``fatal`` is the native library's last fatal log line when it aborted the process
    (glog's ``F...] Check failed: ...``); ``compiler`` says that line came from the TPU
    compiler (LLO, Mosaic): the kernel crashed the compiler, not the kernel's own run."""

    def __init__(self, kind: str, message: str, fatal: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.fatal = fatal
        self.compiler = bool(fatal and _COMPILER_SOURCE.search(fatal))


# What the candidate process writes to stderr is forwarded to the judge's (the worker's
# capture) up to this much per process; the last _TAIL_BYTES are kept to say why it died.
_FORWARD_LIMIT = 8 << 20
_TAIL_BYTES = 32 << 10
# glog's fatal line: "F1201 05:37:27.880631      62 llo_module.cc:66] Check failed: ..."
_FATAL_LINE = re.compile(r"^F\d{4} [\d:.]+\s+\d+ ([\w./-]+:\d+)\] (.+)$", re.MULTILINE)
_COMPILER_SOURCE = re.compile(r"llo_|jellyfish|mosaic|tpu_compil|LLO_CHECK", re.IGNORECASE)


def _pending(fd: int) -> int:
    """Bytes waiting in a pipe (FIONREAD); 0 when it cannot be asked."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def fatal_line(tail: bytes) -> str | None:
    """The last glog fatal line in ``tail`` ("file:line] message"), if any."""
    found = _FATAL_LINE.findall(tail.decode("utf-8", "replace"))
    if not found:
        return None
    where, message = found[-1]
    return f"{where}] {message.strip()}"[:2000]


class _StderrPump:
    """Forwards the candidate process's stderr to ours and keeps its tail: the fatal
    line of a native abort (the TPU compiler's checks) is how a crash is explained."""

    def __init__(self, pipe: Any) -> None:
        self.tail = bytearray()
        self.forwarded = 0
        # Once a held-out shape configuration runs, what the process writes is withheld
        # from the request's capture (which the agent reads) and kept here for the person.
        self.holding = False
        self.held = bytearray()
        self._pipe = pipe
        self._fd = pipe.fileno()
        self._lock = threading.Lock()  # held from a read until its bytes are written
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="tilewright-candidate-stderr")
        self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            ready, _, _ = select.select([self._fd], [], [], 0.5)
            if ready:
                with self._lock:
                    self._pass_on()

    def _pass_on(self) -> None:
        try:
            chunk = os.read(self._fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            self._closed = True
            with contextlib.suppress(OSError):
                self._pipe.close()
            return
        if self.holding:
            self.held += chunk[:max(_TAIL_BYTES - len(self.held), 0)]
        elif self.forwarded < _FORWARD_LIMIT:
            with contextlib.suppress(OSError):
                os.write(2, chunk[:_FORWARD_LIMIT - self.forwarded])
            self.forwarded += len(chunk)
        self.tail += chunk
        del self.tail[:-_TAIL_BYTES]

    def hold(self) -> None:
        """From now on, withhold what the process writes (``held``): a held-out shape
        configuration runs, and whatever the candidate prints from here (its shapes, its
        element counts, even later) must not reach the agent."""
        self.sync()
        with self._lock:
            self.holding = True

    def release(self) -> None:
        """Pass output on again (a new evaluation begins), forgetting what was held."""
        with self._lock:
            self.holding = False
            self.held.clear()

    def sync(self, timeout: float = 0.5) -> None:
        """Return once what the process wrote so far is passed on (the judge calls it
        after each reply, so a request's output lands in that request's capture)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._closed or _pending(self._fd) == 0:
                    return
            time.sleep(0.001)

    def drained(self, timeout: float = 1.0) -> bytes:
        """The tail once the pipe has closed (or ``timeout`` passed: a descendant may
        still hold it open)."""
        self._thread.join(timeout)
        return bytes(self.tail)


_ERROR_LINE = re.compile(r"^(?:[\w.]+(?:Error|Exception)|F\d{4} .*?\]|ABORTED|RuntimeError)"
                         r"[: ].*$", re.MULTILINE)


def _last_error(tail: bytes) -> str | None:
    """The last error line a process wrote before it died (a Python exception's, a
    native fatal log line's), for the message that says why it did not start."""
    found = _ERROR_LINE.findall(tail.decode("utf-8", "replace"))
    return found[-1].strip()[:600] if found else None


def _host_pid(pid: int) -> int | None:
    """The /proc entry of ``pid`` (a pid of this process's namespace, below it): found
    through our own subtree, never the first entry anywhere with that namespace pid
    (with two workers on a host that was the other worker's candidate)."""
    return confinement.proc_entry(pid)


def _ns_depth(proc: str) -> int:
    return max(len(confinement.ns_pids(proc)), 1)


class CandidateProcess:
    """One child process of the judge: started on demand, replaced after a failure.
    ``module`` is what it runs: the candidate harness, or a TPU compile process
    (``kernels.worker.tpu.compiler``, kept apart for libtpu's aborts); ``env`` is added to
    its environment."""

    def __init__(self, module: str = "tilewright.kernels.worker.candidate.main",
                 env: dict[str, str] | None = None) -> None:
        self.module = module
        self.env = dict(env or {})  # added to the child's environment
        self.proc: subprocess.Popen[bytes] | forks.Forked | None = None
        self.stderr: _StderrPump | None = None
        self.sock: socket.socket | None = None
        self.ready = False
        self.ids = 0
        self.started = 0  # how many processes this judge has started
        self.memory_limit_mb = DEFAULT_MEMORY_MB
        self.scratch_root = os.environ.get("TMPDIR") or tempfile.gettempdir()
        # The app copies each task there (kernels.tasks.copies): the only task files the
        # candidate process may read (its Landlock domain is fixed when it starts).
        self.tasks_dir = os.path.join(self.scratch_root, TASKS_DIRNAME)
        self.scratch: str | None = None  # the running process's own scratch dir

    # -- life cycle ------------------------------------------------------------------
    def start(self) -> None:
        """Start a process now (it imports JAX in parallel with whatever we do next)."""
        if self.proc is not None:
            return
        scratch = tempfile.mkdtemp(prefix="candidate-", dir=self.scratch_root)
        self.scratch = scratch
        with contextlib.suppress(OSError):
            os.makedirs(self.tasks_dir, exist_ok=True)
        mine, theirs = socket.socketpair()
        args = ["--scratch", scratch, "--read", self.tasks_dir]
        env = {**_candidate_env(scratch), **self.env}
        try:
            # A fork of the judge's zygote, which imported JAX once (the same process,
            # about 1.5 s of CPU sooner); else, as the zygote would have made it: -P and
            # the scratch dir as its working directory, so nothing beside a task or in
            # the app's directory shadows a module it imports.
            self.proc = forks.zygote().spawn(self.module, args, env, scratch,
                                              theirs.fileno()) or subprocess.Popen(
                [sys.executable, "-P", "-m", self.module, "--fd", str(theirs.fileno()),
                 "--parent", str(os.getpid()), *args],
                pass_fds=(theirs.fileno(),), close_fds=True, stdin=subprocess.DEVNULL,
                stderr=subprocess.PIPE, env=env, cwd=scratch)
        finally:
            theirs.close()
        self.stderr = _StderrPump(self.proc.stderr)
        self.sock = mine
        self.ready = False
        self.started += 1

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def ensure(self, deadline: float) -> None:
        self.start()
        if self.ready:
            return
        pump = self.stderr
        try:
            header, _ = self._recv(max(deadline, time.monotonic() + 1.0), 1 << 16)
        except CandidateFailure as failure:
            # No candidate code has run in it yet: whatever stopped it is the host's or
            # the harness's (a chip it must not open, an import), never the kernel's.
            said = _last_error(pump.drained(0.5)) if pump is not None else None
            if said and chip.is_busy_message(said):
                said = str(chip.busy_error(said))
            raise CandidateFailure("start", "the candidate process did not start ("
                                   + failure.message + ")"
                                   + (f": {said}" if said else "")) from None
        if header.get("type") != "ready":
            self.kill()
            raise CandidateFailure("protocol", "the candidate process did not start (no "
                                   "ready message)")
        self.ready = True

    def kill(self) -> None:
        """Kill the process and every process below it; the next ``start`` is fresh."""
        if self.proc is None:
            return
        pids = self._tree()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.wait(5.0)
        if self.sock is not None:
            self.sock.close()
        if self.scratch:  # what it wrote (a trace, junk) goes with it
            shutil.rmtree(self.scratch, ignore_errors=True)
        self.proc, self.sock, self.ready, self.stderr = None, None, False, None
        self.scratch = None

    def _tree(self) -> list[int]:
        """Our candidate process and its descendants, as pids of our namespace."""
        if self.proc is None:
            return []
        root = _host_pid(self.proc.pid)
        found = [self.proc.pid]
        if root is None:  # already gone
            return found
        for host in confinement.descendants(root):
            local = confinement.local_pid(host)
            if local is not None:
                found.append(local)
        return found

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP the whole tree (it cannot run while the judge times the baseline)."""
        stopped = confinement.stop_all(self._tree, rounds=3) if self.proc is not None else []
        try:
            yield
        finally:
            for pid in stopped:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)

    def rss_mb(self) -> float:
        """The largest resident size in the tree (forked children share their pages:
        a sum would count a fork flood many times over)."""
        total = 0
        root = _host_pid(self.proc.pid) if self.proc is not None else None
        if root is None:  # not started, or gone: nothing of ours is resident
            return 0.0
        for host in (root, *confinement.descendants(root)):
            with contextlib.suppress(OSError, ValueError, IndexError), \
                    open(f"/proc/{host}/statm") as fh:
                total = max(total, int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
        return total / (1 << 20)

    # -- requests ----------------------------------------------------------------------
    def request(self, op: str, header: dict[str, Any], blob: bytes, deadline: float,
                max_blob: int = 1 << 20) -> tuple[dict[str, Any], bytes]:
        """One round trip; raises CandidateFailure (the process was killed)."""
        self.ensure(deadline)
        assert self.sock is not None
        self.ids += 1
        try:
            wire.send(self.sock, {**header, "op": op, "id": self.ids}, blob)
        except OSError:
            raise self._death() from None
        reply, data = self._recv(deadline, max_blob)
        if self.stderr is not None:
            self.stderr.sync()
        if reply.get("id") != self.ids or "ok" not in reply:
            self.kill()
            raise CandidateFailure("protocol", "the candidate process sent a message that "
                                   "does not answer this request (a forged reply?); it was "
                                   "killed")
        return reply, data

    def _recv(self, deadline: float, max_blob: int) -> tuple[dict[str, Any], bytes]:
        assert self.sock is not None

        def watch() -> None:
            if self.rss_mb() > self.memory_limit_mb:
                raise CandidateFailure("memory", "")

        try:
            return wire.recv(self.sock, deadline, max_header=16 << 20, max_blob=max_blob,
                             tick=watch)
        except wire.ChannelTimeout:
            self.kill()
            raise CandidateFailure("timeout", "the candidate did not finish before the "
                                   "deadline (the evaluation's --timeout, counted from the "
                                   "last finished phase); its process was killed") from None
        except CandidateFailure as failure:
            self.kill()
            raise CandidateFailure("memory", f"the candidate process exceeded the memory "
                                   f"limit of {self.memory_limit_mb} MB and was killed (a "
                                   "huge allocation or a leak)") from failure
        except ProtocolError as exc:
            self.kill()
            raise CandidateFailure("protocol", f"the candidate process sent a malformed "
                                   f"reply ({exc}); it was killed") from None
        except (wire.ChannelClosed, OSError):
            raise self._death() from None

    def _death(self) -> CandidateFailure:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                code = None
        pump = self.stderr
        self.kill()
        fatal = fatal_line(pump.drained()) if pump is not None else None
        if code is not None and code < 0:
            said = f" ({fatal})" if fatal else ""
            return CandidateFailure("crashed", "the candidate process crashed: "
                                    f"{signal_death(code)}{said}", fatal)
        return CandidateFailure("exited", exited(code, "the candidate process"))


def _candidate_env(scratch: str) -> dict[str, str]:
    """The judge's (already allowlisted) environment, with the candidate's own scratch
    and without the judge's libtpu dump directory (the candidate cannot write there; it
    prepares its own, ``kernels.worker.tpu.tpu_compile.prepare_environment``)."""
    from tilewright.kernels.confinement import ENV_WRITABLE
    from tilewright.kernels.worker.tpu import tpu_compile

    env = {**os.environ, "TMPDIR": scratch}
    # One process holds each chip, the judge: its children run JAX on the CPU (a
    # candidate's program reaches the chip exported, kernels.worker.chip).
    env["JAX_PLATFORMS"] = chip.CHILD_PLATFORMS
    # The judge's estimate cache is the judge's: a child could plant an answer there.
    env.pop(ENV_WRITABLE, None)
    env.pop(ESTIMATE_CACHE, None)
    dump = env.pop(tpu_compile.DUMP_ENV, None)
    if dump:
        flag = f"{tpu_compile.FLAG}={dump}"
        env["LIBTPU_INIT_ARGS"] = env.get("LIBTPU_INIT_ARGS", "").replace(flag, "").strip()
    env.pop(tpu_compile.STATE_ENV, None)
    return env


def start_zygote() -> None:
    """Start the judge's fork server (``kernels.worker.zygote``) as a process of its own, with the
    candidates' environment (each child's own scratch is set at its fork)."""
    root = os.environ.get("TMPDIR") or tempfile.gettempdir()
    forks.start(_candidate_env(root), root)


def fork_zygote(before: dict[str, str], fd: int) -> None:
    """Fork this process (the worker, JAX imported, no backend yet) into the judge's
    zygote; ``before``: its environment before it imported JAX; ``fd``: the number
    its command line gives its socket (the zygote's children show the same line)."""
    root = os.environ.get("TMPDIR") or tempfile.gettempdir()
    from tilewright.kernels.worker import zygote

    zygote.fork_here(forks.zygote(), _candidate_env(root), root, before, fd)


def pickled(dyn: tuple, static: tuple, shapes_only: bool = False) -> bytes:
    """Inputs for the candidate process: leaves as host numpy arrays (pickle protocol 5,
    raw buffers; the candidate unpickles what the judge sends, never the reverse).
    ``shapes_only``: arrays as ``jax.ShapeDtypeStruct`` (the exported route: the candidate
    only traces and exports, and a trace never sees values; at 8192x8192 the arrays took
    about 5 s to pickle and send, and never reached the candidate on the chip's route)."""
    import jax
    import numpy as np

    def host(a: Any) -> Any:
        if shapes_only and isinstance(a, jax.Array | np.ndarray):
            return jax.ShapeDtypeStruct(a.shape, a.dtype)
        return np.asarray(a) if isinstance(a, jax.Array) else a

    return pickle.dumps((jax.tree.map(host, tuple(dyn)), tuple(static)), protocol=5)


class _Candidates:
    """The candidate process serving the current candidate, the source it has run (its
    sha256), how many distinct sources this worker has been given, and a spare that no
    candidate has run in, started ahead for the next one.
    (One object: the judge's module snapshot watches its modules' attributes.)"""

    def __init__(self) -> None:
        self.current: CandidateProcess | None = None
        self.served: str | None = None
        self.given = 0
        self.spare: CandidateProcess | None = None


_CANDIDATES = _Candidates()


def process() -> CandidateProcess:
    """The candidate process of the candidate being judged (``assign`` chooses it)."""
    if _CANDIDATES.current is None:
        _CANDIDATES.current = CandidateProcess()
    return _CANDIDATES.current


def assign(source: str) -> CandidateProcess:
    """The candidate process ``source`` is judged in: the one that already ran this very
    source (evaluated again, then profiled), else a process no candidate has run in (the
    spare, warm since the last candidate finished). A candidate never inherits what an
    earlier one left in a process: a patched JAX function, a native thread, a cache.

    The worker's first candidate gets the process started with the worker; a spare is
    kept from the second distinct candidate on (``prepare_spare``)."""
    import hashlib

    c = _CANDIDATES
    digest = hashlib.sha256(source.encode()).hexdigest()
    if c.current is not None and c.served == digest and c.current.proc is not None:
        return c.current
    if c.current is not None and c.served is None and c.current.proc is not None:
        fresh = c.current  # started, never given a candidate (the worker's first)
    else:
        if c.current is not None:
            c.current.kill()
        fresh, c.spare = (c.spare or CandidateProcess()), None
    if fresh.proc is not None and fresh.proc.poll() is not None:
        fresh.kill()  # it died waiting (killed from outside): this candidate gets a new one
    fresh.start()
    c.current, c.served = fresh, digest
    c.given += 1
    prepare_spare()  # the next candidate's process imports JAX while this one is judged
    return fresh


def prepare_spare() -> None:
    """Start the next candidate's process now (it imports JAX and warms up while the
    agent thinks), unless one is ready, or this worker has been given only one candidate
    so far: a worker asked to judge once (``tilewright eval``, ``verify``, a pool's
    worker that gets one candidate of a search) would pay for a process it never uses,
    started while it judges. The second distinct candidate starts its own process (the
    wait for a candidate process to start, once: about 0.15 s of CPU forked from the
    zygote off a TPU) and from then on a spare waits for the next."""
    if _CANDIDATES.given < 2:
        return
    if _CANDIDATES.spare is None:
        _CANDIDATES.spare = CandidateProcess()
    _CANDIDATES.spare.start()


def recycle_candidate(reason: str) -> None:
    """Replace the current candidate process (a fresh one starts warming up at once);
    the next candidate, even the same source, gets a clean one."""
    current = _CANDIDATES.current
    if current is not None and current.proc is not None:
        current.kill()
        current.start()
    _CANDIDATES.served = None


def kept_pids() -> list[int]:
    """The candidate processes' pids (of this namespace), which the worker's
    after-request cleanup must spare (as it spares the compile processes,
    ``compile_pool.kept_pids``)."""
    return [p.pid for p in (_CANDIDATES.current, _CANDIDATES.spare)
            if p is not None and p.pid is not None] + forks.kept_pids()
