"""Landlock: what a confined process may read, write and reach.

``read_allowlist`` says what a worker may read (docs/SECURITY.md, "What a worker may
read": the Python installation and site-packages in use, tilewright's own packages,
system trees, a few ``/etc`` files, ``/proc``, ``/sys``, the device nodes JAX opens, the
scratch dir and the paths the caller names), ``restrict`` applies it with the writable
directories, TCP bind (and connect) denied and signals and abstract UNIX sockets scoped,
as far as the kernel's ABI (``landlock_abi``) allows. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import struct
import sys
from typing import Any

from tilewright.kernels.confinement.linux import (
    LANDLOCK_CREATE_RULESET_VERSION,
    LANDLOCK_RULE_PATH_BENEATH,
    NET_BIND_TCP,
    NET_CONNECT_TCP,
    SCOPE_ABSTRACT_UNIX_SOCKET,
    SCOPE_SIGNAL,
    SYS_LANDLOCK_ADD_RULE,
    SYS_LANDLOCK_CREATE_RULESET,
    SYS_LANDLOCK_RESTRICT_SELF,
    FsAccess,
    last_error,
    libc_handle,
)
from tilewright.kernels.confinement.namespaces import ENV_PRIVATE_SHM


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when unavailable (old kernel, not enabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = libc_handle()
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                       ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(abi))



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
    """tilewright's own code a worker imports: the package's ``__init__.py`` and its
    ``kernels`` and ``profiling`` rooms, and the package's folder itself, which import
    lists to find a room (an editable install maps the package onto a checkout whose
    root also holds .git, .env files and the like: that root is listable only, and
    only these files are read)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../kernels
    root = os.path.dirname(here)
    return [root, os.path.join(root, "__init__.py"), here, os.path.join(root, "profiling")]


def _is_checkout_root(path: str) -> bool:
    # this package, as a checkout holds it (a module of one file in older checkouts)
    return any(os.path.exists(os.path.join(path, "kernels", name))
               for name in ("confinement", "confinement.py"))


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


def restrict(abi: int, writable: list[str], readable: list[str],
              deny_connect: bool, listable: list[str] | tuple[str, ...] = ()
              ) -> dict[str, Any]:
    libc = libc_handle()
    libc.syscall.restype = ctypes.c_long
    read = FsAccess.EXECUTE | FsAccess.READ_FILE | FsAccess.READ_DIR
    write = (FsAccess.WRITE_FILE | FsAccess.REMOVE_DIR | FsAccess.REMOVE_FILE | FsAccess.MAKE_CHAR | FsAccess.MAKE_DIR
             | FsAccess.MAKE_REG | FsAccess.MAKE_SOCK | FsAccess.MAKE_FIFO | FsAccess.MAKE_BLOCK | FsAccess.MAKE_SYM)
    if abi >= 2:
        write |= FsAccess.REFER
    if abi >= 3:
        write |= FsAccess.TRUNCATE
    handled_fs = read | write | (FsAccess.IOCTL_DEV if abi >= 5 else 0)
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
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {last_error()}")
    shm_private = os.environ.get(ENV_PRIVATE_SHM) == "1"
    devices = [d for d in DEVICES if os.path.exists(d)]
    for pattern in DEVICE_GLOBS:
        devices += sorted(glob.glob(pattern))
    try:
        def allow(path: str, access: int) -> None:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    access &= FsAccess.EXECUTE | FsAccess.WRITE_FILE | FsAccess.READ_FILE | FsAccess.TRUNCATE \
                        | FsAccess.IOCTL_DEV
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access & handled_fs,
                                                               fd), 12)
                if libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                                ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), rule,
                                ctypes.c_uint32(0)) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}): {last_error()}")
            finally:
                os.close(fd)

        for path in readable:
            allow(path, read)
        for path in listable:  # names only, beneath too; no file's contents
            allow(path, FsAccess.READ_DIR)
        # /dev: its listing (runtimes enumerate accelerators), and only the device nodes
        # named above; not /dev/shm unless it is this namespace's own tmpfs (the host's
        # holds other programs' shared memory).
        if os.path.isdir("/dev"):
            allow("/dev", FsAccess.READ_DIR)
        for path in devices:
            allow(path, read | FsAccess.WRITE_FILE | FsAccess.TRUNCATE | FsAccess.IOCTL_DEV)
        if shm_private and os.path.isdir("/dev/shm"):
            allow("/dev/shm", read | write)
        for path in writable:
            allow(path, read | write)
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), f"landlock_restrict_self: {last_error()}")
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
