"""The held-out shape configurations of an ``Evaluation``
(``kernels.worker.evaluation.evaluate``): run last, and nothing of them reaches the
agent. From the first one on, what the candidate prints is the person's
(``withhold``); a failure there is told without the candidate's words
(``without_words``) and a mismatch without its counts (``hide_details``); every held-out
size no visible configuration has is scrubbed from what the agent reads (``scrub``).
The person's copy of each stays in ``extra.held_out``.

Worker-side (the judge).
"""

from __future__ import annotations

from typing import Any

from tilewright.kernels.judge.result import EvalError
from tilewright.kernels.worker.candidate import judge
from tilewright.kernels.worker.candidate.channel import Stopped
from tilewright.kernels.worker.errors import held_out_scrubber

# ``ev`` below is the ``Evaluation`` (``evaluate``, which imports this module: typed Any so
# that the room keeps no import circle)
Evaluation = Any


def scrub(ev: Evaluation) -> None:
    """No held-out size in what the agent reads: a candidate that remembers the
    shapes it was called with can quote them in any later error (a timed call, the
    retrace), not only at the held-out configuration. Every size of a held-out
    configuration that no visible one has is replaced in the error, the correctness
    reason and the shape details (the person's copy stays in ``extra.held_out``)."""
    scrubber = held_out_scrubber(ev.task)
    if scrubber is None:
        return
    found: list[str] = []

    def scrub(text: Any) -> Any:
        cleaned = scrubber(text)
        if cleaned != text:
            found.append(text)
        return cleaned

    error = ev.result.error
    if error is not None:
        error.message = scrub(error.message)
        error.traceback = scrub(error.traceback)
        error.hint = scrub(error.hint)
    correctness = ev.result.correctness or {}
    if "reason" in correctness:
        correctness["reason"] = scrub(correctness["reason"])
    for detail in ev.shape_details:
        detail["reason"] = scrub(detail.get("reason"))
    if found:
        ev.result.extra.setdefault("held_out", {})["scrubbed"] = found[:5]


def withhold() -> None:
    """What the candidate prints from now on is the person's, not the agent's."""
    proc = judge.process()
    if proc.stderr is not None:
        proc.stderr.hold()

def without_words(ev: Evaluation, stop: Stopped) -> Stopped:
    """A failure at a held-out configuration, said without what the candidate said
    there (its message can name the shape it was traced at): the kind of failure and
    the kernel's line stay; the whole text is kept for the person
    (``extra.held_out``)."""
    error = stop.error
    if error is not None:
        ev.result.extra.setdefault("held_out", {})["error"] = {
            "kind": error.kind, "message": error.message, "traceback": error.traceback}
        stop.error = EvalError(
            kind=error.kind, message=f"the kernel failed at a held-out shape "
            f"configuration ({error.kind}); what it said there is withheld from the "
            "agent (the person sees it in the evaluation's held-out detail)",
            line=error.line, traceback=None, hint=error.hint)
    return stop

def hide_details(ev: Evaluation, detail: dict[str, Any]) -> None:
    """A held-out configuration's correctness reason, without numbers: the counts in
    a mismatch message ("NaN in 65536 of 65536 values") tell its size."""
    reason = detail.get("reason")
    if reason:
        ev.result.extra.setdefault("held_out", {})["reason"] = reason
        kind = ("non-finite values" if "NaN" in reason or "inf" in reason.lower() else
                "wrong output structure or shape" if "shape" in reason or "tree" in reason
                else "wrong values")
        detail["reason"] = f"a held-out check failed: {kind}"
