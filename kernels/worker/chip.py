"""The one-holder rule: on a TPU host the judge (the worker) alone opens the chip.

libtpu admits one process per chip: while one process holds it, a second one that
initialises the TPU backend fails after about 2 s with ``Unable to initialize backend
'tpu': ABORTED: Internal error when accessing libtpu multi-process lockfile`` (also with
``ALLOW_MULTIPLE_LIBTPU_LOAD=1``), and JAX does not fall back to the CPU. So every
process the judge starts (its zygote, the candidate processes, the compile processes)
runs JAX on the CPU (``pin_to_cpu``, ``CHILD_PLATFORMS``), and candidate programs reach
the chip as exported programs the judge runs (``kernels.worker.evaluation.exported``).

When the judge itself cannot open the chip because someone else holds it (another
tilewright, a notebook, a training job), ``busy_error`` says so and names the holders
where /proc lets us see them (``holders``), instead of letting the failure look like
anything else. No JAX is imported here.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

# What the judge's children are given: they never open an accelerator.
CHILD_PLATFORMS = "cpu"
LOCKFILE = "/tmp/libtpu_lockfile"
# The device nodes a process holding a TPU chip has open: /dev/accel* (v4, v5e on most
# images) or /dev/vfio/N (v5e/v6e VMs, gVisor); and libtpu's lockfile.
CHIP_PATHS = ("/dev/accel", "/dev/vfio/")
_BUSY_TEXT = re.compile(r"libtpu multi-process lockfile|TPU (is )?already in use|"
                        r"libtpu\.so already in use|held by another process|"
                        r"Couldn't open device: /dev/(accel|vfio)", re.IGNORECASE)


class ChipBusyError(RuntimeError):
    """The chip is held by another process; ``holders`` names them where visible."""

    def __init__(self, message: str, holders: list[Holder]) -> None:
        super().__init__(message)
        self.holders = holders


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str  # its command line, or "" where /proc does not show it
    what: str  # the device node or lockfile it has open

    def words(self) -> str:
        said = f" ({self.command[:120]})" if self.command else ""
        return f"pid {self.pid}{said}, holding {self.what}"


def pin_to_cpu() -> None:
    """This process (no backend started yet) and every process it starts run JAX on the
    CPU: the judge's zygote calls it right after it is forked from the worker."""
    os.environ["JAX_PLATFORMS"] = CHILD_PLATFORMS
    import sys

    jax = sys.modules.get("jax")
    if jax is not None:  # imported with the worker's platforms: reset before any backend
        jax.config.update("jax_platforms", CHILD_PLATFORMS)


def is_busy_message(text: str) -> bool:
    """Whether a backend failure's text says the chip is held by another process."""
    return bool(_BUSY_TEXT.search(text or ""))


def _command(pid: int, proc: str) -> str:
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def holders(proc: str = "/proc", paths: tuple[str, ...] = (*CHIP_PATHS, LOCKFILE),
            exclude: tuple[int, ...] = ()) -> list[Holder]:
    """Processes with a chip's device node (or libtpu's lockfile) open, found through
    /proc/PID/fd. Processes of other users cannot be read without privileges; they are
    not listed (``busy_error`` says so)."""
    found: list[Holder] = []
    me = os.getpid()
    for entry in glob.glob(f"{proc}/[0-9]*"):
        pid = int(os.path.basename(entry))
        if pid == me or pid in exclude:
            continue
        try:
            fds = os.listdir(f"{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{entry}/fd/{fd}")
            except OSError:
                continue
            if any(target.startswith(p) for p in paths):
                found.append(Holder(pid, _command(pid, proc), target))
                break
    return found


def quiet_failure() -> str | None:
    """Why the TPU backend failed in this process when JAX fell back to the CPU without a
    word: with ``JAX_PLATFORMS`` unset, JAX tries the TPU, records its failure (libtpu's
    lockfile message when the chip is held) and opens the CPU instead, so a judge on a
    TPU host would judge in the interpreter, slowly, unasked. None when the backend is
    the TPU, no TPU was tried, or none is attached (a laptop with libtpu installed)."""
    import jax
    from jax._src import xla_bridge

    from tilewright.kernels.confinement import chip_attached

    if jax.default_backend() == "tpu" or not chip_attached():
        return None
    errors = getattr(xla_bridge, "_backend_errors", {}) or {}
    return errors.get("tpu")


def busy_error(exc: BaseException | str, platform: str = "TPU") -> ChipBusyError:
    """The error a judge gives when it cannot open its chip because it is held."""
    text = str(exc)
    found = holders()
    if found:
        who = "; ".join(h.words() for h in found[:4])
        named = f"it is held by {who}"
    else:
        named = ("the holder is not visible from here (a process of another user, or in "
                 "another container)")
    lockfile = (f"; if no process holds it, a stale lockfile may remain: {LOCKFILE}"
                if os.path.exists(LOCKFILE) and not found else "")
    message = (f"the {platform} chip is busy: {named}{lockfile}. libtpu lets one process "
               "hold a chip, and tilewright's judge needs it to itself: end that process "
               "(or its notebook kernel), or run tilewright with JAX_PLATFORMS=cpu to "
               f"judge on the CPU (TPU interpret mode). libtpu said: {text.strip()[:300]}")
    return ChipBusyError(message, found)
