"""Turning an exception into the contract's ``error``: kind, message, the candidate's
line when it is the candidate's fault, traceback text, and a friendlier hint for the
Pallas mistakes everyone makes (index_map arity, block rank, TPU (8, 128) alignment,
out-of-bounds blocks). Pure Python: no JAX import needed.
"""

from __future__ import annotations

import re
import traceback as tb_module
from types import TracebackType
from typing import Any

from tilewright.kernels.judge.result import EvalError

TRACEBACK_LIMIT = 12_000


class Stopped(Exception):
    """An evaluation decided before its last step: its ``status`` and ``error`` (an
    ``EvalError``), and what else the step that decided it found: integrity ``flags``,
    the ``lowering`` section, the ``tpu`` section. Raised by the step that knows (the
    candidate channel, the TPU verdict, the pipeline's own checks) and applied to the
    result in one place, ``kernels.worker.evaluation.evaluate.Evaluation.run``."""

    def __init__(self, status: str, error: EvalError, *, flags: tuple[str, ...] = (),
                 lowering: dict[str, Any] | None = None,
                 tpu: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status}: {error.message}")
        self.status = status
        self.error = error
        self.flags = flags
        self.lowering = lowering
        self.tpu = tpu

HINTS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"divisible by 8 and 128|\(8, ?128\)"),
     "On TPU the last two dimensions of a block must be divisible by 8 and 128 (float32; "
     "16 and 128 for bfloat16) or equal the full array dimensions. Interpret mode on a CPU "
     "accepts other shapes, real TPUs do not. Pick block sizes like (8, 128), (128, 128), "
     "(256, 512), or use the whole dimension."),
    (re.compile(r"<lambda>\(\) (takes \d+ positional arguments? but \d+ (were|was) given"
                r"|missing \d+ required positional argument)"),
     "An index_map receives one integer per grid dimension (plus any scalar-prefetch "
     "refs), in grid order. With grid=(m, n) write `lambda i, j: (...)`; with a 1-D grid, "
     "`lambda i: (...)`. Check that every BlockSpec's index_map matches the grid's rank."),
    (re.compile(r"Index map function .* must return \d+ values"),
     "An index_map returns one block index per array dimension: a 2-D block_shape needs "
     "`lambda i: (i, 0)`, not `lambda i: i` or a 3-tuple. Use None in block_shape (or "
     "pl.Squeezed) for a dimension you index with a single element."),
    (re.compile(r"(block_shape|Block shape|BlockSpec).*(rank|must have the same number|"
                r"dimensions)", re.IGNORECASE),
     "block_shape needs one entry per dimension of the array it tiles; the index_map must "
     "return as many indices as block_shape has entries."),
    (re.compile(r"Out-of-bounds block index|out of bounds", re.IGNORECASE),
     "A BlockSpec's index_map pointed past the end of the array. Block indices count "
     "blocks, not elements: for a dimension of size N and block size b the index must stay "
     "below N // b (use pl.cdiv for the grid and mask the ragged tail, or pad the input). "
     "On a real TPU this reads garbage silently; interpret mode catches it."),
    (re.compile(r"Only interpret mode is supported on CPU backend"),
     "Do not pass interpret=... yourself: the harness runs kernels in TPU interpret mode "
     "on a CPU host and natively on a TPU."),
    (re.compile(r"Unsupported TPU device kind"),
     "This API needs a TPU device context; on a CPU host run it under an abstract TPU "
     "mesh or avoid it (e.g. pltpu.emit_pipeline)."),
    (re.compile(r"Cannot lower|not implemented|Unimplemented primitive|"
                r"Unsupported (lowering|primitive)", re.IGNORECASE),
     "Mosaic (the TPU kernel compiler) cannot lower an operation used inside the kernel "
     "body; rewrite it with supported ops (elementwise math, dots, reductions along the "
     "last axes) or move it outside the pallas_call."),
]


def hint_for(message: str) -> str | None:
    for pattern, hint in HINTS:
        if pattern.search(message):
            return hint
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def candidate_line(exc: BaseException, filename: str) -> int | None:
    """Innermost line of ``filename`` in the exception's traceback (or its causes), or a
    ``filename:LINE`` mention in a message (JAX names the kernel's source location)."""
    if isinstance(exc, SyntaxError) and exc.filename == filename and exc.lineno:
        return exc.lineno
    for link in _chain(exc):
        line = None
        tb: TracebackType | None = link.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == filename:
                line = tb.tb_lineno
            tb = tb.tb_next
        if line is not None:
            return line
    mention = re.search(re.escape(filename) + r":(\d+)", str(exc))
    return int(mention.group(1)) if mention else None


def short_message(exc: BaseException) -> str:
    """``Type: message``, unwrapping XLA's callback wrapper to the real Python error."""
    text = str(exc).strip()
    if "CpuCallback error" in text or text.startswith("INTERNAL:"):
        # The interesting error is the last "SomeError: ..." line of the embedded traceback.
        lines = [ln for ln in text.splitlines() if re.match(r"^\w+(Error|Exception): ", ln)]
        if lines:
            return lines[-1]
    first = text.splitlines()[0] if text else ""
    if len(text.splitlines()) > 1 and len(text) < 2000:
        first = text
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def format_traceback(exc: BaseException) -> str:
    text = "".join(tb_module.format_exception(exc))
    if len(text) > TRACEBACK_LIMIT:
        text = "[...]\n" + text[-TRACEBACK_LIMIT:]
    return text


def task_failure(exc: BaseException | None, message: str, hint: str | None = None
                 ) -> Stopped:
    """The task's own code failed (loading it, building inputs, the reference): not the
    candidate's fault. ``runtime_error`` of kind ``task``, at the task file's line when
    ``exc`` is a ``TaskError`` that names one."""
    from tilewright.kernels.tasks.task import TaskError

    error = describe(exc, "task", "") if exc is not None else {
        "kind": "task", "message": message, "line": None, "traceback": None, "hint": hint}
    error["message"] = message
    if hint:
        error["hint"] = hint
    error["line"] = exc.line if isinstance(exc, TaskError) else None
    error["file"] = exc.path if isinstance(exc, TaskError) else None
    return Stopped("runtime_error", EvalError(**error))


def describe(exc: BaseException, kind: str, filename: str) -> dict[str, Any]:
    """The contract's error object for ``exc`` raised while doing ``kind`` of work."""
    message = short_message(exc)
    if isinstance(exc, SystemExit):
        message = f"the candidate called sys.exit({exc.code!r})"
    return {
        "kind": kind,
        "message": message,
        "line": candidate_line(exc, filename),
        "traceback": format_traceback(exc),
        "hint": hint_for(str(exc)),
    }


def held_out_scrubber(task: Any) -> Any:
    """A function replacing, in any text, every size of ``task``'s held-out configurations
    that no visible configuration has (``rows=384`` -> ``rows=<held-out size>``); None when
    nothing is held out. A candidate that remembers the shapes it was called with can
    quote them later (a retrace, a profile in the same process): what the agent reads is
    passed through it."""
    import re

    held = [c for c in task.shapes if c.held_out]
    visible = {v for c in task.shapes if not c.held_out for v in c.params.values()
               if isinstance(v, int)}
    secret = {v for c in held for v in c.params.values()
              if isinstance(v, int) and not isinstance(v, bool) and v not in visible and v > 1}
    if not secret:
        return None
    pattern = re.compile(r"(?<![\w.])(" + "|".join(str(v) for v in sorted(secret))
                         + r")(?![\w.])")

    def scrub(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        return pattern.sub("<held-out size>", text)

    return scrub
