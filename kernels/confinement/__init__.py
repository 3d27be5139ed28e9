"""Confinement of the worker processes that run candidate code (Linux kernel mechanisms).

Both sides use this package; it needs only the standard library (ctypes for the system
calls Python 3.11 does not wrap), so the app imports it without JAX. Its rooms:
``linux`` (system calls and their constants), ``processes`` (trees, pids across PID
namespaces), ``namespaces`` (unshare, init, private mounts) and ``landlock`` (the read
list and the ruleset); this module confines a process with them and reports it.

App side: ``protect_app()`` marks the app process non-dumpable, so no other process of
the same user (a candidate included) can read ``/proc/<app>/environ`` or its memory
without CAP_SYS_PTRACE; ``kill_tree(pid)`` stops and then kills a worker with every
process below it (``setsid`` and double-forked children included).

Worker side: ``confine(scratch)`` runs first thing in ``kernels.worker.main``, while
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

import glob
import os
import resource
import sys
from typing import Any

from tilewright.kernels.confinement.landlock import landlock_abi, read_allowlist, restrict
from tilewright.kernels.confinement.linux import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    errno_name,
    prctl,
)
from tilewright.kernels.confinement.namespaces import ENV_MOUNTS, ENV_PRIVATE_SHM, enter_namespaces
from tilewright.kernels.confinement.processes import (
    _process_table,
    descendants,
    find_in_subtree,
    host_pid,
    kill_descendants,
    kill_tree,
    local_pid,
    ns_pids,
    proc_entry,
    proc_is_own,
    protect_app,
    stop_all,
)

__all__ = [
    "ENV_DISABLE", "ENV_MOUNTS", "ENV_NETWORK", "ENV_PRIVATE_SHM", "ENV_READABLE",
    "ENV_WRITABLE", "_process_table", "confine", "descendants", "empty_private_shm",
    "errno_name", "find_in_subtree", "host_pid", "kill_descendants", "kill_tree",
    "landlock_abi", "local_pid", "ns_pids", "proc_entry", "proc_is_own", "protect_app",
    "read_allowlist", "stop_all", "summary", "tpu_host",
]

FILE_SIZE_LIMIT = 1 << 30  # 1 GiB: room for a profile, not for filling the disk
NPROC_MARGIN = 256  # tasks (threads count) a worker may add beyond its own start-up need
# On a TPU host no count fits: the worker opens the chip after it is confined, and
# libtpu then starts its runtime's threads, as does every compile process that loads
# libtpu to compile for a TPU topology. On the v5e at hand (13 cores, gVisor) a
# candidate process could not start one thread ("can't start new thread" in its trace)
# under a limit of the user's tasks + 256 + 8 per core, and again under 2,048 more.
# RLIMIT_NPROC counts every task of the user, so there the limit is left as it is and
# the worker's leftovers are killed after every request (process group, subreaper). That
# holds for every process on the host, the CPU-pinned candidate processes too (a lowered
# limit in the candidate alone still failed on the v5e: the judge's threads count).

# Environment knobs (documented in docs/SECURITY.md; ENV_MOUNTS and ENV_PRIVATE_SHM are
# the namespaces').
ENV_NETWORK = "TILEWRIGHT_CONFINE_NET"  # auto (default) | namespace | off
ENV_DISABLE = "TILEWRIGHT_CONFINE"  # "off": rlimits and descendant killing only
ENV_WRITABLE = "TILEWRIGHT_WORKER_WRITABLE"  # extra writable dirs, os.pathsep-separated
ENV_READABLE = "TILEWRIGHT_WORKER_READABLE"  # extra readable paths, os.pathsep-separated


def tpu_host() -> bool:
    """A TPU is attached (device files), or JAX was told to use one."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if "tpu" in platforms:
        return True
    if platforms and "tpu" not in platforms:
        return False
    return chip_attached()


def chip_attached() -> bool:
    """A TPU chip's device node is on this host: /dev/accel* (v4, v5e on most images) or
    /dev/vfio/N (v5e/v6e VMs, gVisor)."""
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


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
    elif tpu_host() or chip_attached():
        # chip_attached too: a candidate process is pinned to the CPU (JAX_PLATFORMS=cpu)
        # but counts against the same user's tasks as the judge that holds the chip
        _soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        report["nproc"] = None if hard == resource.RLIM_INFINITY else hard
        report["nproc_reason"] = ("TPU host: not lowered (libtpu's runtimes, the judge's "
                                  "and each compile process's, start threads no count "
                                  "foresees); leftover processes are killed after each "
                                  "request")
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
    report["no_new_privs"] = prctl(PR_SET_NO_NEW_PRIVS, 1) == 0
    prctl(PR_SET_DUMPABLE, 0)  # other candidates' workers cannot read this one either
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
            ns, _ = enter_namespaces(want_net)
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
                report["filesystem"] = restrict(abi, [scratch, *extra], paths,
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
    report["processes"] = {**_rlimits(host_uid), "subreaper": prctl(PR_SET_CHILD_SUBREAPER, 1) == 0,
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
