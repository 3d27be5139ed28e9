"""How a process that ran kernel work died, in words: one vocabulary for both walls.

Two processes can be killed under a candidate: the worker (the judge, seen from the app,
``kernels.pool.process``) and the candidate process (seen from the judge,
``kernels.worker.candidate.judge``). Both name a death by a signal the same way
(``signal_death``) and give the same next step per failure kind (``FAILURE_HINTS``), so
an error reads alike whichever wall held. Pure standard library: the app and the worker
import it.
"""

from __future__ import annotations

import signal

# What to try next, per ``error.kind`` of a killed process.
FAILURE_HINTS = {
    "timeout": "Look for a loop that never ends, or raise --timeout for big shapes in "
               "interpret mode (one interpreted call can take seconds on a CPU).",
    "crashed": "The process died in native code; the captured stderr may say where.",
    "exited": "Kernels must not call os._exit/sys.exit; return the output instead.",
    "memory": "Check the sizes the kernel allocates (scratch shapes, intermediate arrays).",
    "start": "Not the kernel: the judge's candidate process could not start before any "
             "kernel was loaded. Its captured stderr says why; evaluate again once that is "
             "fixed.",
}

_SIGNAL_MEANING = {
    "SIGABRT": "aborted (os.abort, a failed assertion in native code)",
    "SIGSEGV": "segmentation fault", "SIGBUS": "bus error",
    "SIGKILL": "killed (possibly by the system's out-of-memory killer)",
    "SIGFPE": "floating-point exception",
}


def signal_death(code: int) -> str:
    """``SIGSEGV, segmentation fault``: the signal behind a negative exit status and
    what it usually means."""
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"{name}, {_SIGNAL_MEANING.get(name, 'killed by a signal')}"


def exited(code: int | None, who: str) -> str:
    """The message for ``who`` (a process) that exited with ``code`` mid-request."""
    return (f"{who} exited with code {code} during the request (os._exit or sys.exit "
            "outside the harness)")
