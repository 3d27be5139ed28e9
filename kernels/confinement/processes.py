"""Processes across PID namespaces: the trees the app and the worker kill, and the pids
each side names.

App side: ``protect_app()`` marks the app process non-dumpable, so no other process of
the same user (a candidate included) can read ``/proc/<app>/environ`` or its memory
without CAP_SYS_PTRACE; ``kill_tree(pid)`` stops and then kills a worker with every
process below it (``setsid`` and double-forked children included). Worker side:
``kill_descendants`` after every request. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable

from tilewright.kernels.confinement.linux import PR_SET_DUMPABLE, last_error, prctl

# -- app side ----------------------------------------------------------------------------

_APP_PROTECTED: str | None = None


def protect_app() -> str:
    """Mark this (the app's) process non-dumpable, once. Returns a one-line status."""
    global _APP_PROTECTED
    if _APP_PROTECTED is not None:
        return _APP_PROTECTED
    if not sys.platform.startswith("linux"):
        _APP_PROTECTED = "unprotected (not Linux)"
    elif prctl(PR_SET_DUMPABLE, 0) == 0:
        _APP_PROTECTED = "non-dumpable"
    else:
        _APP_PROTECTED = f"dumpable (prctl failed: {last_error()})"
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
    seen: list[int] = []
    if include_root:
        with contextlib.suppress(OSError):
            os.kill(root, signal.SIGSTOP)
            seen.append(root)
    seen = stop_all(lambda: descendants(root), rounds, seen)
    for pid in seen:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return len(seen)


def stop_all(scan: Callable[[], Iterable[int]], rounds: int,
             stopped: list[int] | None = None) -> list[int]:
    """SIGSTOP every pid ``scan()`` finds, and scan again until it finds nothing new (a
    fork between a scan and the stop adds children), at most ``rounds`` times; returns
    every pid stopped (``stopped`` first)."""
    found = list(stopped or [])
    for _ in range(rounds):
        new = [p for p in scan() if p not in found]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
            found.append(pid)
    return found


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


def set_host_pid(pid: int | None) -> None:
    """Record the serving process's pid as the app names it (told by the namespace's
    init while /proc still showed the host's numbers)."""
    global _HOST_PID
    _HOST_PID = pid


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
