"""`tilewright report` words each evaluation's number by where it comes from.

The session is the recorded TUI fixture (a real gelu session on a CPU host, evaluated
by real workers with the TPU compiler for v5e): every correct evaluation is ranked by
the TPU compiler's estimate, which the report must call an estimate.
"""

from __future__ import annotations

from pathlib import Path

from sessions.log import load
from sessions.report import html_report, markdown
from sessions.state import fold

FIXTURE = Path(__file__).resolve().parent / "snapshots" / "session_gelu"


def test_report_calls_the_estimate_an_estimate() -> None:
    loaded = load(FIXTURE)
    state = fold(loaded.header, loaded.events)
    results = [e for e in loaded.events if e["type"] == "run.result" and e.get("correct")]
    assert results and all(e["rank_source"] == "tpu_estimate" for e in results)
    text = markdown(loaded, state)
    for event in results:
        assert f"| {event['rank_label']} |" in text  # per evaluation, in full words
    best = state.versions[state.best]
    assert f"- Best: **v{state.best}**, est. {best.speedup:.2f}x on v5e (TPU compiler)" in text
    assert "static estimate" in text and "not a measurement" in text
    assert "est. " in html_report(loaded, state)
