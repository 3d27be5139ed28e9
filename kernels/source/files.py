"""Reading a kernel source file safely: ``read_kernel_file``.

A kernel file is text that will be shown, stored in a session and sent to a model. A
file that is a symlink leading out of its task (or session) directory, or that is
larger than ``KERNEL_SIZE_LIMIT``, is refused with a message that says which and what
to do: a task downloaded from elsewhere must not turn ``kernel.py`` into a way of
reading ``/etc/shadow`` or of sending 50 MB to a model. App side, no JAX.
"""

from __future__ import annotations

import os
from pathlib import Path

KERNEL_SIZE_LIMIT = 512 * 1024  # far beyond any hand- or model-written kernel


class KernelFileError(ValueError):
    """A kernel file that must not be read; the message says why and what to do."""


def read_kernel_file(path: Path | str, roots: tuple[Path | str, ...] = (),
                     limit: int = KERNEL_SIZE_LIMIT) -> str:
    """The text of ``path``. A symlink (anywhere along the path) must resolve inside one
    of ``roots`` (default: the directory that holds the file as named); the file must
    be a regular file of at most ``limit`` bytes and UTF-8."""
    path = Path(path).expanduser()
    given = Path(os.path.abspath(path))
    real = path.resolve()
    if real != given:
        allowed = [Path(r).resolve() for r in roots] or [given.parent.resolve()]
        if not any(real == r or r in real.parents for r in allowed):
            where = ", ".join(str(r) for r in allowed)
            raise KernelFileError(
                f"{path} is a symlink to {real}, outside {where}; refusing to read it "
                "(copy the kernel into the task or pass the real file with --kernel)")
    try:
        st = real.stat()
    except OSError as exc:
        raise KernelFileError(f"cannot read kernel {path}: {exc.strerror or exc}") from None
    if not real.is_file():
        raise KernelFileError(f"{path} is not a regular file; pass a Python source file")
    if st.st_size > limit:
        raise KernelFileError(
            f"{path} is {st.st_size / 1024:.0f} KiB; a kernel file may be at most "
            f"{limit // 1024} KiB (is it really a kernel? generated data belongs elsewhere)")
    try:
        with open(real, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise KernelFileError(f"cannot read kernel {path}: {exc.strerror or exc}") from None
    if len(data) > limit:  # grew after stat
        raise KernelFileError(f"{path} is larger than {limit // 1024} KiB")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise KernelFileError(f"{path} is not UTF-8 text; a kernel is a Python source "
                              "file") from None
