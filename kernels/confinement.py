"""Confinement of the worker processes that run candidate code (Linux kernel mechanisms).

Both sides use this module; it needs only the standard library (ctypes for the system
calls Python 3.11 does not wrap), so the app imports it without JAX.

App side: ``protect_app()`` marks the app process non-dumpable, so no other process of
the same user (a candidate included) can read ``/proc/<app>/environ`` or its memory
without CAP_SYS_PTRACE; ``kill_tree(pid)`` stops and then kills a worker with every
process below it (``setsid`` and double-forked children included).

Worker side: ``confine(scratch)`` runs first thing in ``kernels.harness.worker``, while
the process is still single-threaded, and applies what the kernel allows, strongest
first, recording what is active and, for each thing that is not, why:

1. user + PID (+ network) namespaces, via ``unshare(2)``: the process the app started
   stays behind as a tiny shim; inside, a small init is PID 1 and the worker is its
   child (when either ends, the kernel kills everything in the namespace, so nothing a
   candidate forks outlives it). In the new network namespace only a private loopback
   exists (no route out, listeners unreachable from outside).
   A mount namespace comes with them: the namespace's own ``/proc`` (only its own
   processes are visible, and their numbers are the namespace's) and a small private
   tmpfs on ``/dev/shm`` (shared memory is not resident memory: a candidate could park
   gigabytes there past the memory watch; the worker empties it after every request).
2. Landlock (``landlock_create_ruleset(2)``): reads are confined to what Python, JAX
   and the task need (``read_allowlist``: the Python installation and site-packages in
   use, tilewright's own packages, system libraries, a few ``/etc`` files, ``/proc``,
   ``/sys``, the device nodes JAX opens, the scratch dir and the paths the caller
   names), so ``~/.ssh``, ``~/.netrc``, cloud credentials, other sessions and the app's
   config are unreadable; writes are confined to the scratch directory and devices;
   TCP bind (and connect, when there is no network namespace and no TPU) is denied;
   signals and abstract UNIX sockets cannot reach processes outside; ptrace-style
   access to other processes (``/proc/<pid>/environ``, ``mem``) is denied.
3. rlimits: no core files, a file-size limit, RLIMIT_NPROC where the kernel applies it
   (not to uid 0). Resident memory is watched by the app (RLIMIT_AS breaks XLA, which
   reserves large address ranges).
4. ``PR_SET_CHILD_SUBREAPER`` and ``PR_SET_NO_NEW_PRIVS``; after every request the
   worker kills every descendant it finds (``kill_descendants``).

Where a stronger layer is unavailable the worker still starts, and the report (sent
with the worker's "ready" message, copied into every eval JSON as ``confinement``)
says so; nothing runs unconfined silently. See docs/SECURITY.md for the threat model.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import json
import os
import resource
import signal
import socket
import struct
import sys
import time
from typing import Any

# -- system call constants (Linux, all architectures with the generic syscall table) ---

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

CLONE_NEWNS = 0x00020000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

FILE_SIZE_LIMIT = 1 << 30  # 1 GiB: room for a profile, not for filling the disk
SHM_BYTES = 64 << 20  # the private /dev/shm: room for semaphores, not for a memory bomb
NPROC_MARGIN = 256  # tasks (threads count) a worker may add beyond its own start-up need

# Environment knobs (documented in docs/SECURITY.md).
ENV_NETWORK = "TILEWRIGHT_CONFINE_NET"  # auto (default) | namespace | off
ENV_DISABLE = "TILEWRIGHT_CONFINE"  # "off": rlimits and descendant killing only
ENV_WRITABLE = "TILEWRIGHT_WORKER_WRITABLE"  # extra writable dirs, os.pathsep-separated
ENV_READABLE = "TILEWRIGHT_WORKER_READABLE"  # extra readable paths, os.pathsep-separated
ENV_MOUNTS = "TILEWRIGHT_CONFINE_MOUNTS"  # "off": no mount namespace (host /proc, /dev/shm)
# Set by a worker whose mount namespace has its own tmpfs on /dev/shm; inherited by its
# candidate process (started by the judge, never by the candidate) so that both grant
# /dev/shm to Landlock only when it is that private mount.
ENV_PRIVATE_SHM = "TILEWRIGHT_PRIVATE_SHM"


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int = 0) -> int:
    libc = _libc()
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    return int(libc.prctl(option, arg, 0, 0, 0))


def _err() -> str:
    return os.strerror(ctypes.get_errno())


# -- app side ----------------------------------------------------------------------------

_APP_PROTECTED: str | None = None


def protect_app() -> str:
    """Mark this (the app's) process non-dumpable, once. Returns a one-line status."""
    global _APP_PROTECTED
    if _APP_PROTECTED is not None:
        return _APP_PROTECTED
    if not sys.platform.startswith("linux"):
        _APP_PROTECTED = "unprotected (not Linux)"
    elif _prctl(PR_SET_DUMPABLE, 0) == 0:
        _APP_PROTECTED = "non-dumpable"
    else:
        _APP_PROTECTED = f"dumpable (prctl failed: {_err()})"
    return _APP_PROTECTED


def _process_table() -> dict[int, int]:
    """pid -> parent pid of every process visible in /proc."""
    table: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[-1].split()
        with contextlib.suppress(IndexError, ValueError):
            table[int(entry)] = int(fields[1])
    return table


def descendants(root: int, table: dict[int, int] | None = None) -> list[int]:
    """Every process below ``root`` (children first found, then theirs)."""
    table = _process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def kill_tree(root: int, include_root: bool = True, rounds: int = 20) -> int:
    """Stop, then SIGKILL ``root`` and every process below it; returns how many were
    signalled. Stopping first keeps a forking process from adding children between the
    scan and the kill; the scan repeats until it finds nothing new."""
    if not sys.platform.startswith("linux"):
        return 0
    seen: set[int] = set()
    if include_root:
        with contextlib.suppress(OSError):
            os.kill(root, signal.SIGSTOP)
            seen.add(root)
    for _ in range(rounds):
        new = [p for p in descendants(root) if p not in seen]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
            seen.add(pid)
    for pid in seen:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(seen)


# -- worker side -------------------------------------------------------------------------

def kill_descendants(rounds: int = 20, keep: tuple[int, ...] | list[int] = ()) -> int:
    """Kill every process below this one and reap them (worker side, after each
    request). Works as PID 1 of a namespace and as a subreaper: either way every
    orphan a candidate made is still below us. ``keep``: children (pids of our own
    namespace) spared with everything below them (the judge's warm candidate process,
    which cleans up after itself)."""
    me = int(os.readlink("/proc/self")) if os.path.exists("/proc/self") else os.getpid()
    killed = 0
    for _ in range(rounds):
        table = _process_table()
        spared = {p for p, parent in table.items()
                  if parent == me and _local_pid(p) in keep}
        for root in list(spared):  # everything below a spared child stays too
            spared.update(descendants(root, table))
        found = [p for p in descendants(me, table) if p not in spared]
        if not found:
            break
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(_local_pid(pid), signal.SIGKILL)
        killed += len(found)
        _reap()
    _reap()
    return killed


def _local_pid(host_pid: int) -> int:
    """The pid as this process names it: /proc shows the host's numbers, but inside a
    PID namespace kill() takes the namespace's (the last field of NSpid)."""
    try:
        with open(f"/proc/{host_pid}/status") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return host_pid


# -- pids across PID namespaces ------------------------------------------------------
#
# Inside a worker's PID namespace getpid() and kill() use the namespace's numbers. With
# the namespace's own /proc (the usual case here) /proc uses them too; with the host's
# /proc (no mount namespace) it shows the host's. A namespace pid is mapped to its /proc
# entry only through this process's own subtree: two workers on one host both have a
# pid 3, and the first /proc entry whose NSpid says 3 may be the other worker's.

_HOST_PID: int | None = None  # the serving process's pid as the app names it


def ns_pids(entry: int | str) -> list[int]:
    """The NSpid chain of a /proc entry (outermost namespace first); [] when unreadable."""
    try:
        with open(f"/proc/{entry}/status") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def proc_is_own() -> bool:
    """Whether /proc numbers processes as this process does (its namespace's procfs, or
    no PID namespace at all)."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return True


def proc_entry(pid: int) -> int | None:
    """The /proc entry of ``pid`` (a pid as this process names it, of itself or of a
    process below it); None when it is not (or no longer) below us."""
    if proc_is_own():
        return pid
    me = int(os.readlink("/proc/self"))
    if pid == os.getpid():
        return me
    depth = max(len(ns_pids(me)), 1)
    for entry in descendants(me):
        chain = ns_pids(entry)
        if len(chain) >= depth and chain[depth - 1] == pid:
            return entry
    return None


def local_pid(entry: int) -> int | None:
    """The pid of a /proc entry below us as this process names it (for kill())."""
    if proc_is_own():
        return entry
    depth = max(len(ns_pids("self")), 1)
    chain = ns_pids(entry)
    return chain[depth - 1] if len(chain) >= depth else None


def find_in_subtree(root: int, pid: int, claimed: int | None = None) -> int | None:
    """App side: the /proc entry of the process that calls itself ``pid`` (its getpid(),
    inside its namespace) in the subtree of ``root`` (a process we started). ``claimed``
    is the entry that process believes it has; it is taken when it is in the subtree."""
    below = [root, *descendants(root)]
    if claimed is not None and claimed in below:
        return claimed
    for entry in below:
        chain = ns_pids(entry)
        if chain and chain[-1] == pid:
            return entry
    return None


def host_pid() -> int:
    """This serving process's pid as the app names it: recorded before the namespace's
    own /proc hid the host's numbers, else what /proc says."""
    if _HOST_PID is not None:
        return _HOST_PID
    try:
        return int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return os.getpid()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.002)  # killed children not yet zombies: give them a moment
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return


def tpu_host() -> bool:
    """A TPU is attached (device files), or JAX was told to use one."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if "tpu" in platforms:
        return True
    if platforms and "tpu" not in platforms:
        return False
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when unavailable (old kernel, not enabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                       ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(abi))


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _loopback_up() -> None:
    """Bring ``lo`` up in a fresh network namespace (a TPU runtime pinned to one chip
    talks to localhost)."""
    import fcntl

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s.fileno(), siocgifflags, req))[1]
        fcntl.ioctl(s.fileno(), siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up,
                                                          b""))


def _unshare(flags: int) -> str | None:
    """Returns None on success, else why not."""
    libc = _libc()
    if libc.unshare(ctypes.c_int(flags)) == 0:
        return None
    return _err()


def _enter_namespaces(want_net: bool) -> tuple[dict[str, Any], int | None]:
    """unshare user + pid (+ net) + mount namespaces and fork: the child returns (it
    becomes PID 1's child and serves); the parent waits as a shim and never returns.
    Returns the report and None, or the report and the errno text when namespaces are
    not available."""
    uid, gid = os.getuid(), os.getgid()
    if _in_child_user_namespace():
        # The candidate process of a confined worker: it already lives in the worker's
        # user, pid, mount and network namespaces. A nested user namespace cannot be
        # mapped (Landlock denies the write to /proc/self/uid_map), and a half set-up one
        # would leave this process unable to start threads: stay in the worker's.
        return {"active": False, "reason": "inside the worker's namespaces already "
                "(nested user namespaces cannot be mapped under Landlock)",
                "inherited": True}, None
    flags = CLONE_NEWUSER | CLONE_NEWPID | (CLONE_NEWNET if want_net else 0)
    if os.environ.get(ENV_MOUNTS, "").lower() == "off":  # debugging: the host's mounts
        mount_why: str | None = f"{ENV_MOUNTS}=off"
    else:
        mount_why = _unshare(flags | CLONE_NEWNS)
    mount_ns = mount_why is None
    why = None if mount_ns else _unshare(flags)
    if why is not None:
        return {"active": False, "reason": f"unshare(user, pid{', net' if want_net else ''}) "
                f"refused: {why} (unprivileged user namespaces disabled, e.g. "
                "kernel.apparmor_restrict_unprivileged_userns=1 or "
                "user.max_user_namespaces=0)"}, None
    with contextlib.suppress(OSError):
        _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    if want_net:
        _loopback_up()
    report: dict[str, Any] = {"active": True, "kinds": ["user", "pid"]
                              + (["net"] if want_net else []) + (["mount"] if mount_ns else [])}
    # PID 1 of a namespace ignores signals it has no handler for (abort() in it would
    # turn into SIGSEGV, kill -9 from inside would do nothing): a tiny init is PID 1 and
    # the worker is its child. A pipe carries the worker's wait status out to the shim;
    # another tells the worker, once init has made the private mounts, what they are
    # and the worker's host pid (read while /proc still showed the host's numbers).
    read_end, write_end = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(read_end)
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))  # the shim dies: init dies: all die
        go_read, go_write = os.pipe()
        worker = os.fork()
        if worker == 0:
            os.close(write_end)
            os.close(go_write)
            _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
            message = _read_all(go_read)
            os.close(go_read)
            global _HOST_PID
            try:
                told = json.loads(message or b"{}")
            except ValueError:
                told = {}
            _HOST_PID = told.get("host_pid") if isinstance(told.get("host_pid"), int) else None
            report["mounts"] = told.get("mounts") or {"private": False,
                                                       "reason": "init said nothing"}
            if (report["mounts"].get("dev_shm") or {}).get("private"):
                os.environ[ENV_PRIVATE_SHM] = "1"
            else:
                os.environ.pop(ENV_PRIVATE_SHM, None)
            return report, 0
        os.close(go_read)
        told = {"host_pid": _child_entry(worker),
                "mounts": _private_mounts() if mount_ns else {
                    "private": False, "reason": f"no mount namespace ({mount_why})"}}
        with contextlib.suppress(OSError):
            os.write(go_write, json.dumps(told).encode())
        os.close(go_write)
        _init(worker, write_end)
    os.close(write_end)
    _shim(init, read_end)
    raise AssertionError("unreachable")


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _child_entry(child: int) -> int | None:
    """The /proc entry (host numbering, while /proc is still the host's) of our only
    child, ``child`` in the namespace's numbering."""
    try:
        me = int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        return None
    try:
        with open(f"/proc/{me}/task/{me}/children") as fh:
            found = [int(x) for x in fh.read().split()]
        if len(found) == 1:
            return found[0]
    except (OSError, ValueError):
        pass
    for entry, parent in _process_table().items():
        if parent == me and ns_pids(entry)[-1:] == [child]:
            return entry
    return None


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> str | None:
    """mount(2); None on success, else why not."""
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                           ctypes.c_ulong, ctypes.c_char_p]
    def enc(value: str | None) -> bytes | None:
        return value.encode() if value is not None else None

    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) == 0:
        return None
    return _err()


def _private_mounts() -> dict[str, Any]:
    """In the new mount namespace (as PID 1 of the new PID namespace, so that a fresh
    procfs shows this namespace): our own /proc and a small tmpfs on /dev/shm. Nothing
    here reaches the host's mounts (the tree is made private first)."""
    why = _mount(None, "/", None, MS_REC | MS_PRIVATE)
    if why is not None:
        return {"private": False, "reason": f"making / private refused: {why}"}
    out: dict[str, Any] = {"private": True}
    why = _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    out["proc"] = {"private": True} if why is None else {
        "private": False, "reason": f"mounting a fresh /proc refused: {why} (a container "
        "that masks parts of /proc forbids it): other processes' command lines are visible"}
    if os.path.isdir("/dev/shm"):
        why = _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                     f"size={SHM_BYTES},mode=1777")
        out["dev_shm"] = {"private": True, "bytes": SHM_BYTES} if why is None else {
            "private": False, "reason": f"mounting a private tmpfs refused: {why}"}
    else:
        out["dev_shm"] = {"private": False, "reason": "no /dev/shm on this host"}
    return out


def _in_child_user_namespace() -> bool:
    """Whether this process lives in a user namespace a confined worker made: its
    uid_map is the one line ``uid uid 1`` that ``_enter_namespaces`` writes (a rootless
    container's map, with its ranges, does not look like that)."""
    try:
        with open("/proc/self/uid_map") as handle:
            fields = handle.read().split()
    except OSError:
        return False
    return len(fields) == 3 and fields[0] == fields[1] and fields[2] == "1"


def _close_fds(keep: int) -> None:
    for fd in range(3, 1024):  # the worker owns the channel: EOF must follow its death
        if fd != keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _init(worker: int, status_fd: int) -> None:
    """PID 1 of the namespace: reap orphans until the worker ends, pass its status on,
    and exit (the kernel then kills whatever is left in the namespace)."""
    _close_fds(status_fd)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
        if pid == worker:
            with contextlib.suppress(OSError):
                os.write(status_fd, struct.pack("=i", status))
            os._exit(0)


def _shim(init: int, status_fd: int) -> None:
    """The process the app started: wait for the namespace's init and exit as the worker
    did, so the app's classification (signal, exit code) stays right."""
    _close_fds(status_fd)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            _, status = os.waitpid(init, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
    with contextlib.suppress(OSError, struct.error):
        data = os.read(status_fd, 4)
        if len(data) == 4:
            status = struct.unpack("=i", data)[0]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), sig)
        time.sleep(1)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


# /etc entries Python, the C library and JAX read (name lookup, time zone, loader,
# certificates); nothing else under /etc (no shadow, no ssh host keys, no app configs).
ETC_READABLE = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "nsswitch.conf",
    "passwd", "group", "hosts", "host.conf", "resolv.conf", "gai.conf", "os-release",
    "lsb-release", "mime.types", "ssl", "pki", "ca-certificates", "alternatives",
)
# Whole trees with nothing of the user's in them: system programs and libraries, and the
# kernel's views (/proc is the namespace's own where a mount namespace is available).
SYSTEM_READABLE = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/sys",
                   "/proc")
# Device nodes JAX and the accelerators' runtimes open (read, write, ioctl).
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
DEVICE_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio", "/dev/nvidia*")


def _package_dirs() -> list[str]:
    """tilewright's own packages a worker imports (an editable install maps them from a
    checkout whose root also holds .git, .env files and the like: only these)."""
    here = os.path.dirname(os.path.abspath(__file__))  # .../kernels
    return [here, os.path.join(os.path.dirname(here), "profiling")]


def _is_checkout_root(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "kernels", "confinement.py"))


def _opens_home(real: str, home: str) -> bool:
    return real == "/" or home == real or home.startswith(real.rstrip("/") + "/")


def _opens_up(real: str, home: str, temp: str) -> bool:
    """Reading ``real`` would expose the user's files: the root, $HOME or a directory
    above it, a directory above the scratch dirs (other sessions' scratch, other users'
    temporary files), or a tilewright checkout's root (its .env files, .git)."""
    above_temp = temp.startswith(real.rstrip("/") + "/") and real not in SYSTEM_READABLE
    return _opens_home(real, home) or above_temp or _is_checkout_root(real)


def read_allowlist(extra: list[str] | tuple[str, ...] = ()
                   ) -> tuple[list[str], list[str], list[str]]:
    """What a confined worker may read: (paths, listable, refused), absolute paths.

    The Python installation and the site-packages in use (``sys.prefix``,
    ``sys.base_prefix``, ``sys.path`` entries), tilewright's packages, system trees, a
    few /etc files and ``extra``. A ``sys.path`` entry that would open up the user's
    files (``/``, ``$HOME`` or a directory above it, the temporary directory above the
    scratch dirs) is refused and listed. A tilewright checkout's root on ``sys.path``
    (running from a checkout without an install) is ``listable`` only: Python's import
    system lists it to find ``profiling/`` there, but its files (.env, .git) stay
    unreadable; the packages themselves are in ``paths``."""
    import sysconfig

    home = os.path.realpath(os.path.expanduser("~"))
    temp = os.path.realpath(os.environ.get("TMPDIR") or "/tmp")
    wanted: list[str] = [*SYSTEM_READABLE, *(f"/etc/{name}" for name in ETC_READABLE)]
    wanted += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
               os.path.realpath(sys.executable)]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            wanted.append(sysconfig.get_paths()[key])
    wanted += _package_dirs()
    refused: list[str] = []
    for entry in sys.path:
        if not entry or not os.path.isabs(entry):  # relative: the current directory's
            if not entry or os.path.isdir(entry):
                refused.append(entry or "(the current directory)")
            continue
        wanted.append(entry)
    wanted += list(extra)
    paths: list[str] = []
    listable: list[str] = []
    for path in wanted:
        real = os.path.realpath(path)
        if not os.path.exists(real):
            continue
        if _is_checkout_root(real) and path not in extra and not _opens_home(real, home):
            if real not in listable:
                listable.append(real)
            continue
        if _opens_up(real, home, temp) and (path not in extra or _opens_home(real, home)):
            refused.append(path)  # an extra path the user named may be a checkout or /tmp
            continue
        if real not in paths:
            paths.append(real)
    return paths, listable, sorted(set(refused))


def _landlock(abi: int, writable: list[str], readable: list[str],
              deny_connect: bool, listable: list[str] | tuple[str, ...] = ()
              ) -> dict[str, Any]:
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    read = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    write = (FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_CHAR | FS_MAKE_DIR
             | FS_MAKE_REG | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_BLOCK | FS_MAKE_SYM)
    if abi >= 2:
        write |= FS_REFER
    if abi >= 3:
        write |= FS_TRUNCATE
    handled_fs = read | write | (FS_IOCTL_DEV if abi >= 5 else 0)
    handled_net = 0
    if abi >= 4:
        handled_net = NET_BIND_TCP | (NET_CONNECT_TCP if deny_connect else 0)
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("QQQ", handled_fs, handled_net, scoped)
    elif abi >= 4:
        attr = struct.pack("QQ", handled_fs, handled_net)
    else:
        attr = struct.pack("Q", handled_fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {_err()}")
    shm_private = os.environ.get(ENV_PRIVATE_SHM) == "1"
    devices = [d for d in DEVICES if os.path.exists(d)]
    for pattern in DEVICE_GLOBS:
        devices += sorted(glob.glob(pattern))
    try:
        def allow(path: str, access: int) -> None:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    access &= FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE \
                        | FS_IOCTL_DEV
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access & handled_fs,
                                                               fd), 12)
                if libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                                ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), rule,
                                ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}): {_err()}")
            finally:
                os.close(fd)

        for path in readable:
            allow(path, read)
        for path in listable:  # names only, beneath too; no file's contents
            allow(path, FS_READ_DIR)
        # /dev: its listing (runtimes enumerate accelerators), and only the device nodes
        # named above; not /dev/shm unless it is this namespace's own tmpfs (the host's
        # holds other programs' shared memory).
        if os.path.isdir("/dev"):
            allow("/dev", FS_READ_DIR)
        for path in devices:
            allow(path, read | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV)
        if shm_private and os.path.isdir("/dev/shm"):
            allow("/dev/shm", read | write)
        for path in writable:
            allow(path, read | write)
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), f"landlock_restrict_self: {_err()}")
    finally:
        os.close(ruleset)
    return {"active": True, "abi": abi,
            "writable": [*writable, "device nodes"] + (["/dev/shm (private)"] if shm_private
                                                       else []),
            "reads": "confined", "listable_only": list(listable),
            "readable": [*readable, "device nodes"]
            + (["/dev/shm (private)"] if shm_private else []),
            "dev_shm": "private tmpfs, emptied after every request" if shm_private else
            "denied (not this namespace's own mount)",
            "tcp_bind": "denied" if abi >= 4 else "allowed (Landlock ABI < 4)",
            "tcp_connect": ("denied" if deny_connect else "allowed") if abi >= 4
            else "allowed (Landlock ABI < 4)",
            "signals_and_abstract_sockets": "scoped" if abi >= 6 else
            "not scoped (Landlock ABI < 6)"}


def _user_tasks(uid: int) -> int:
    """Tasks (threads included, as RLIMIT_NPROC counts them) owned by ``uid``."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}")
            if st.st_uid != uid:
                continue
            count += len(os.listdir(f"/proc/{entry}/task"))
        except OSError:
            continue
    return count


def _rlimits(host_uid: int | None = None) -> dict[str, Any]:
    report: dict[str, Any] = {}
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    report["core"] = 0
    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit = FILE_SIZE_LIMIT if hard == resource.RLIM_INFINITY else min(FILE_SIZE_LIMIT, hard)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    report["file_size_bytes"] = limit
    uid = os.getuid() if host_uid is None else host_uid
    if uid == 0:
        report["nproc"] = None
        report["nproc_reason"] = ("running as uid 0: the kernel does not apply RLIMIT_NPROC "
                                  "to root; leftover processes are killed after each request")
    else:
        cores = os.cpu_count() or 1
        limit = _user_tasks(uid) + NPROC_MARGIN + 8 * cores  # XLA starts threads per core
        _soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
        report["nproc"] = limit
    report["memory"] = ("resident memory watched by the app (RLIMIT_AS would break XLA's "
                        "address-space reservations)")
    return report


def confine(scratch: str, readable: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Confine this worker process (call while single-threaded, before importing JAX:
    a Landlock domain binds the calling thread and the threads and processes it starts
    later, never threads that exist already).

    ``readable``: paths readable besides ``read_allowlist``'s (the judge gives its
    candidate process the directory it copies tasks into). May fork: with namespaces
    the calling process becomes a shim that never returns and the child continues as
    PID 1's child in the new namespaces. Returns the report."""
    report: dict[str, Any] = {"level": "none", "namespaces": {"active": False},
                              "filesystem": {"active": False}, "network": {},
                              "processes": {}, "scratch": scratch}
    # The uid before any namespace: inside one, root looks like an ordinary user, and
    # the kernel would count every task of the real user against RLIMIT_NPROC.
    host_uid = os.getuid()
    if not sys.platform.startswith("linux"):
        report["reason"] = f"no confinement on {sys.platform} (Linux mechanisms only)"
        report["summary"] = "unconfined (not Linux)"
        return report
    report["no_new_privs"] = _prctl(PR_SET_NO_NEW_PRIVS, 1) == 0
    _prctl(PR_SET_DUMPABLE, 0)  # other candidates' workers cannot read this one either
    if os.environ.get(ENV_DISABLE, "").lower() == "off":
        report["namespaces"] = {"active": False, "reason": f"{ENV_DISABLE}=off"}
        report["filesystem"] = {"active": False, "reason": f"{ENV_DISABLE}=off"}
    else:
        net_choice = os.environ.get(ENV_NETWORK, "auto").lower()
        tpu = tpu_host()
        want_net = net_choice == "namespace" or (net_choice == "auto" and not tpu)
        net_reason = None
        if not want_net:
            net_reason = (f"{ENV_NETWORK}={net_choice}" if net_choice != "auto" else
                          "TPU host: the TPU runtime reads the VM's metadata server at "
                          f"start-up (set {ENV_NETWORK}=namespace to isolate anyway)")
        try:
            ns, _ = _enter_namespaces(want_net)
        except OSError as exc:  # e.g. uid_map refused: namespaces half set up
            ns = {"active": False, "reason": f"namespace set-up failed: {exc}"}
        report["namespaces"] = ns
        report["mounts"] = ns.pop("mounts", None) or (
            {"private": False, "reason": "inherited from the worker"} if ns.get("inherited")
            else {"private": False, "reason": "no namespaces"})
        abi = landlock_abi()
        extra = [p for p in os.environ.get(ENV_WRITABLE, "").split(os.pathsep)
                 if p and os.path.isdir(p)]
        more = [p for p in os.environ.get(ENV_READABLE, "").split(os.pathsep)
                if p and os.path.exists(p)]
        if abi:
            paths, listable, refused = read_allowlist([*readable, *more])
            try:
                report["filesystem"] = _landlock(abi, [scratch, *extra], paths,
                                                 deny_connect=not tpu or bool(ns.get("active")
                                                                              and want_net),
                                                 listable=listable)
                report["filesystem"]["refused"] = refused
            except OSError as exc:
                report["filesystem"] = {"active": False, "reason": str(exc)}
        else:
            report["filesystem"] = {
                "active": False, "reason": "Landlock unavailable (Linux < 5.13, or 'landlock' "
                "missing from the kernel's lsm= list): the candidate can read and write "
                "whatever this user can (~/.ssh, ~/.netrc, cloud credentials); only the "
                "redaction of what comes back stands between them and a result"}
        net_ns = bool(ns.get("active")) and "net" in ns.get("kinds", [])
        if net_ns:
            report["network"] = {"isolated": True, "how": "network namespace (loopback only)"}
        else:
            fs = report["filesystem"]
            how = (f"Landlock: TCP bind {fs.get('tcp_bind')}, connect {fs.get('tcp_connect')}"
                   if fs.get("active") else "none")
            report["network"] = {"isolated": False, "how": how,
                                 "reason": net_reason or ns.get("reason")}
    report["processes"] = {**_rlimits(host_uid), "subreaper": _prctl(PR_SET_CHILD_SUBREAPER, 1) == 0,
                           "pid_namespace": "pid" in report["namespaces"].get("kinds", []),
                           "leftovers": "killed after every request"}
    fs_on = report["filesystem"].get("active")
    ns_on = report["namespaces"].get("active")
    report["level"] = "strong" if fs_on and ns_on else "partial" if fs_on or ns_on \
        else "minimal"
    report["summary"] = summary(report)
    return report


def summary(report: dict[str, Any] | None) -> str:
    """A few words for a status bar: what is active, and the first thing missing."""
    if not report:
        return "confinement unknown"
    parts = []
    ns = report.get("namespaces") or {}
    if ns.get("active"):
        parts.append("ns:" + "+".join(ns.get("kinds", [])))
    if (report.get("filesystem") or {}).get("active"):
        parts.append("landlock")
    parts.append("rlimits")
    text = f"{report.get('level', 'none')} ({', '.join(parts)})"
    missing = [k for k in ("namespaces", "filesystem") if not (report.get(k) or {}).get("active")]
    if missing:
        text += f"; no {missing[0]}: {(report.get(missing[0]) or {}).get('reason', '?')[:60]}"
    return text


def empty_private_shm() -> int:
    """Remove everything in /dev/shm when it is this namespace's own tmpfs (the worker
    calls it after every request); returns how many entries were removed. The host's
    /dev/shm is never touched: it holds other programs' shared memory."""
    if os.environ.get(ENV_PRIVATE_SHM) != "1" or not os.path.isdir("/dev/shm"):
        return 0
    import shutil

    removed = 0
    for name in os.listdir("/dev/shm"):
        path = os.path.join("/dev/shm", name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed


def errno_name(code: int) -> str:
    return errno.errorcode.get(code, str(code))
