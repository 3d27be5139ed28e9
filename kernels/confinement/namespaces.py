"""Namespaces: user + PID (+ network) + mount, a tiny init as PID 1, private mounts.

``enter_namespaces`` unshares the namespaces and forks: the process the app started
stays behind as a shim that exits as the worker does, inside a small init is PID 1 and
the worker is its child (when either ends, the kernel kills everything in the namespace,
so nothing a candidate forks outlives it). In the new network namespace only a private
loopback exists. The mount namespace gives the namespace its own ``/proc`` and a small
private tmpfs on ``/dev/shm`` (shared memory is nobody's resident memory: the worker
empties it after every request). Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import socket
import struct
import time
from typing import Any

from tilewright.kernels.confinement.linux import (
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    PR_SET_PDEATHSIG,
    last_error,
    libc_handle,
    prctl,
)
from tilewright.kernels.confinement.processes import _process_table, ns_pids, set_host_pid

SHM_BYTES = 64 << 20  # the private /dev/shm: room for semaphores, not for a memory bomb
ENV_MOUNTS = "TILEWRIGHT_CONFINE_MOUNTS"  # "off": no mount namespace (host /proc, /dev/shm)
# Set by a worker whose mount namespace has its own tmpfs on /dev/shm; inherited by its
# candidate process (started by the judge, never by the candidate) so that both grant
# /dev/shm to Landlock only when it is that private mount.
ENV_PRIVATE_SHM = "TILEWRIGHT_PRIVATE_SHM"


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
    libc = libc_handle()
    if libc.unshare(ctypes.c_int(flags)) == 0:
        return None
    return last_error()


def enter_namespaces(want_net: bool) -> tuple[dict[str, Any], int | None]:
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
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))  # the shim dies: init dies: all die
        go_read, go_write = os.pipe()
        worker = os.fork()
        if worker == 0:
            os.close(write_end)
            os.close(go_write)
            prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
            message = _read_all(go_read)
            os.close(go_read)
            try:
                told = json.loads(message or b"{}")
            except ValueError:
                told = {}
            set_host_pid(told.get("host_pid") if isinstance(told.get("host_pid"), int)
                         else None)
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
    libc = libc_handle()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                           ctypes.c_ulong, ctypes.c_char_p]
    def enc(value: str | None) -> bytes | None:
        return value.encode() if value is not None else None

    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) == 0:
        return None
    return last_error()


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
    uid_map is the one line ``uid uid 1`` that ``enter_namespaces`` writes (a rootless
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
