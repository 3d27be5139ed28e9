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
2. Landlock (``landlock_create_ruleset(2)``): the filesystem is read-only except the
   worker's scratch directory and devices; TCP bind (and connect, when there is no
   network namespace and no TPU) is denied; signals and abstract UNIX sockets cannot
   reach processes outside; ptrace-style access to other processes (``/proc/<pid>/
   environ``, ``mem``) is denied.
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
NPROC_MARGIN = 256  # tasks (threads count) a worker may add beyond its own start-up need

# Environment knobs (documented in docs/SECURITY.md).
ENV_NETWORK = "TILEWRIGHT_CONFINE_NET"  # auto (default) | namespace | off
ENV_DISABLE = "TILEWRIGHT_CONFINE"  # "off": rlimits and descendant killing only
ENV_WRITABLE = "TILEWRIGHT_WORKER_WRITABLE"  # extra writable dirs, os.pathsep-separated


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
    """unshare user + pid (+ net) namespaces and fork: the child returns (it becomes PID 1
    and serves); the parent waits as a shim and never returns. Returns the report and
    None, or the report and the errno text when namespaces are not available."""
    uid, gid = os.getuid(), os.getgid()
    if _in_child_user_namespace():
        # The candidate process of a confined worker: it already lives in the worker's
        # user, pid and network namespaces. A nested user namespace cannot be mapped
        # (Landlock denies the write to /proc/self/uid_map), and a half set-up one would
        # leave this process unable to start threads: stay in the worker's.
        return {"active": False, "reason": "inside the worker's namespaces already "
                "(nested user namespaces cannot be mapped under Landlock)",
                "inherited": True}, None
    flags = CLONE_NEWUSER | CLONE_NEWPID | (CLONE_NEWNET if want_net else 0)
    why = _unshare(flags)
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
    report = {"active": True, "kinds": ["user", "pid"] + (["net"] if want_net else [])}
    # PID 1 of a namespace ignores signals it has no handler for (abort() in it would
    # turn into SIGSEGV, kill -9 from inside would do nothing): a tiny init is PID 1 and
    # the worker is its child. A pipe carries the worker's wait status out to the shim.
    read_end, write_end = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(read_end)
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))  # the shim dies: init dies: all die
        worker = os.fork()
        if worker == 0:
            os.close(write_end)
            _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
            return report, 0
        _init(worker, write_end)
    os.close(write_end)
    _shim(init, read_end)
    raise AssertionError("unreachable")


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


def _landlock(abi: int, writable: list[str], deny_connect: bool) -> dict[str, Any]:
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

        allow("/", read)
        # Devices: /dev/null, the TPU (/dev/accel*, /dev/vfio), and shared memory.
        allow("/dev", read | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV)
        if os.path.isdir("/dev/shm"):
            allow("/dev/shm", read | write)
        for path in writable:
            allow(path, read | write)
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), f"landlock_restrict_self: {_err()}")
    finally:
        os.close(ruleset)
    return {"active": True, "abi": abi, "writable": [*writable, "/dev (devices)", "/dev/shm"],
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


def confine(scratch: str) -> dict[str, Any]:
    """Confine this worker process (call while single-threaded, before importing JAX).

    May fork: with namespaces the calling process becomes a shim that never returns and
    the child continues as PID 1 of the new namespace. Returns the report."""
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
        abi = landlock_abi()
        extra = [p for p in os.environ.get(ENV_WRITABLE, "").split(os.pathsep)
                 if p and os.path.isdir(p)]
        if abi:
            try:
                report["filesystem"] = _landlock(abi, [scratch, *extra],
                                                 deny_connect=not tpu or bool(ns.get("active")
                                                                              and want_net))
            except OSError as exc:
                report["filesystem"] = {"active": False, "reason": str(exc)}
        else:
            report["filesystem"] = {
                "active": False, "reason": "Landlock unavailable (Linux < 5.13, or 'landlock' "
                "missing from the kernel's lsm= list): the candidate can write wherever this "
                "user can"}
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


def errno_name(code: int) -> str:
    return errno.errorcode.get(code, str(code))
