"""The Linux interface of the confinement: system call numbers and flags, ``prctl``.

Constants for all architectures with the generic syscall table; ``ctypes`` calls for
what Python 3.11 does not wrap. Standard library only (the app imports this package).
"""

from __future__ import annotations

import ctypes
import enum
import errno
import os
from typing import Any

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

# Landlock's filesystem access rights in the ABI's bit order (``LANDLOCK_ACCESS_FS_*``:
# EXECUTE is bit 0; REFER arrived with ABI 2, TRUNCATE with 3, IOCTL_DEV with 5).
FsAccess = enum.IntFlag("FsAccess", "EXECUTE WRITE_FILE READ_FILE READ_DIR REMOVE_DIR "
                        "REMOVE_FILE MAKE_CHAR MAKE_DIR MAKE_REG MAKE_SOCK MAKE_FIFO "
                        "MAKE_BLOCK MAKE_SYM REFER TRUNCATE IOCTL_DEV")
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1


def libc_handle() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def prctl(option: int, arg: int = 0) -> int:
    libc = libc_handle()
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    return int(libc.prctl(option, arg, 0, 0, 0))


def last_error() -> str:
    return os.strerror(ctypes.get_errno())


def errno_name(code: int) -> str:
    return errno.errorcode.get(code, str(code))
