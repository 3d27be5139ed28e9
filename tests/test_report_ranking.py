"""`tilewright report` words each evaluation's number by where it comes from.

The session is the recorded TUI fixture (a real gelu session on a CPU host, evaluated
by real workers with the TPU compiler for v5e): every correct evaluation is ranked by
the TPU compiler's estimate, which the report must call an estimate.
"""

from __future__ import annotations

from pathlib import Path

from tilewright.sessions.log import load
from tilewright.sessions.recorded.report import html_report, markdown
from tilewright.sessions.state import fold

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "session_gelu"


def test_report_calls_the_estimate_an_estimate() -> None:
    loaded = load(FIXTURE)
    state = fold(loaded.header, loaded.events)
    results = [e for e in loaded.events if e["type"] == "run.result" and e.get("correct")]
    assert results and all(e["rank_source"] == "tpu_estimate" for e in results)
    text = markdown(loaded, state)
    for event in results:
        assert f"| {event['rank_label']} |" in text  # per evaluation, in full words
    best = state.versions[state.best]
    assert best.rank is not None and best.rank.source == "tpu_estimate"  # a log's legacy rank
    assert f"- Best: **v{state.best}**, est. {best.rank.value:.2f}x on v5e (TPU compiler)" in text
    assert "static estimate" in text and "not a measurement" in text
    assert "est. " in html_report(loaded, state)


def _session(tmp_path: Path) -> Path:
    """A session written through the real log with today's ranks: v1 the TPU compiler's
    estimate, v2 a faster kernel ranked against XLA's roofline (the reference had no
    estimate), v3 ranked by host simulation only (the compiler gave nothing)."""
    from tilewright.kernels.judge.rank import Rank
    from tilewright.sessions.log import SessionLog

    fidelity = {"class": "memory_bound", "chip": "v5e", "median_ratio": 0.93,
                "within_2x": 0.9, "rows": 12}
    ranks = {1: Rank("tpu_estimate", 1.0, "v5e", "4096x4096", kernel_s=1e-3,
                     kernel_cycles=1_500_000, clock_hz=1.5e9, reference_s=1e-3,
                     basis="compiler", estimate=1.0, fidelity=fidelity, status="correct"),
             2: Rank("roofline", 0.9, "v5e", "4096x4096", kernel_s=0.8e-3,
                     kernel_cycles=1_200_000, clock_hz=1.5e9, reference_s=0.72e-3,
                     fidelity=fidelity, status="correct",
                     why_none="no estimate for the XLA reference"),
             3: Rank("host_simulation", 0.02, "v5e", status="correct")}
    log = SessionLog.create(tmp_path, task={"name": "toy", "root": "/nowhere",
                                            "layout": "native"},
                            backend={"platform": "cpu", "mode": "tpu-interpret",
                                     "label": "CPU (TPU interpret)"},
                            agent="offline", app_version="test")
    for n, rank in ranks.items():
        decision = None
        if n > 1:
            log.append("agent.proposal", proposal=f"p{n}", kind="kernel", summary=f"try {n}",
                       base_version=n - 1, source_blob=None, role="tune")
            decision = log.append("user.decision", proposal=f"p{n}", decision="approve",
                                  by="auto")["seq"]
        log.append("kernel.version", version=n, parent=n - 1 if n > 1 else None,
                   origin="initial" if n == 1 else "agent",
                   proposal=f"p{n}" if n > 1 else None,
                   source_blob=log.put_blob(f"def kernel(x):\n    return x * {n}\n"),
                   summary=f"try {n}", decision=decision)
        log.append("run.start", run=f"r{n}", version=n, kind="eval", by="auto")
        log.append("run.result", run=f"r{n}", version=n, status="correct", correct=True,
                   rank=rank.to_json(), chip="v5e", median_ms=1.0, result_blob=None,
                   cancelled=False)
    log.close()
    return log.path


def test_report_words_todays_ranks_with_their_trust_and_gains(tmp_path: Path) -> None:
    loaded = load(_session(tmp_path))
    state = fold(loaded.header, loaded.events)
    assert state.best == 2  # the faster kernel; host simulation never outranks a compiler
    text = markdown(loaded, state)
    best = state.best_rank
    assert best is not None and f"- Best: **v2**, {best.words()}; trust: " \
        f"{best.trust_words()}" in text
    assert "| est. 1.00x on v5e at 4096x4096 (TPU compiler); trust: memory-bound v5e" in text
    assert "| host sim. ratio 0.02 (CPU interpreter, not TPU performance) |" in text
    assert "| ≥0.90x roofline (v2) |" in text  # best so far, in short words
    chain = text.split("## Profile → diagnose → optimize", 1)[1].split("\n## ", 1)[0]
    v2 = next(line for line in chain.splitlines() if line.startswith("| v2 (from v1)"))
    assert "| 1.25x | 1.25x |" in v2  # by the kernel's time: 1 ms -> 0.8 ms (one formatter)
    v3 = next(line for line in chain.splitlines() if line.startswith("| v3 (from v2)"))
    assert v3.endswith("| - | 1.25x |")  # no gain across kinds of number
    page = html_report(loaded, state)
    assert "≥0.90x roofline" in page and "host sim 0.02" in page


def test_best_among_estimates_and_roofline_bounds_says_they_are_mixed(tmp_path: Path) -> None:
    from tilewright.tui.widgets.status import StatusBar, StatusInfo

    loaded = load(_session(tmp_path))
    state = fold(loaded.header, loaded.events)
    assert state.mixed_ranks is not None and "roofline" in state.mixed_ranks
    info = StatusInfo(task="toy", best_version=state.best, best_rank=state.best_rank,
                      best_note=state.mixed_ranks)
    line = StatusBar.compose_line(info, 0).plain
    assert "best v2" in line and "est. and roofline" in line
    assert "est. + roofline mixed" in StatusBar.compose_line(info, 5).plain


def test_a_revert_clears_the_problems_of_the_version_reverted_from(tmp_path: Path) -> None:
    from tilewright.sessions.log import SessionLog
    from tilewright.tui.session.view import BlobCache, SessionView

    log = SessionLog.create(tmp_path, task={"name": "toy", "root": "/nowhere",
                                            "layout": "native"},
                            backend={"platform": "cpu", "mode": "tpu-interpret"},
                            agent="offline", app_version="test")
    for n in (1, 2):
        log.append("kernel.version", version=n, parent=n - 1 or None,
                   origin="initial" if n == 1 else "user-edit", proposal=None,
                   source_blob=log.put_blob(f"def kernel(x):\n    return x * {n}\n"),
                   summary=f"v{n}", decision=None)
    log.append("error", where="apply", message="v2 could not be evaluated: worker gone")
    path = log.path
    loaded = load(path)
    state = fold(loaded.header, loaded.events)
    view = SessionView(state, BlobCache(lambda sha: None))
    assert any("worker gone" in p.message for p in view.problems())
    log.append("kernel.checkout", version=1, by="user")
    log.close()
    loaded = load(path)
    state = fold(loaded.header, loaded.events)
    assert state.current == 1
    assert not any("worker gone" in p.message
                   for p in SessionView(state, BlobCache(lambda sha: None)).problems())


def test_the_report_chart_has_its_legend_and_ticks_and_scaled_is_explained(
        tmp_path: Path) -> None:
    from tilewright.sessions.recorded.report import SCALED_WORDS, svg_chart

    loaded = load(_session(tmp_path))
    state = fold(loaded.header, loaded.events)
    chart = svg_chart(state)
    assert "best ranking number so far" in chart and "this evaluation" in chart
    assert all(f">v{n}</text>" in chart for n in (1, 2, 3))  # an x tick per evaluation
    page = html_report(loaded, state)
    assert "extrapolated" in page and SCALED_WORDS.split(":")[0].strip('"') in page


def test_a_result_toast_on_a_narrow_screen_is_one_short_line() -> None:
    from tilewright.kernels.judge.rank import Rank
    from tilewright.tui.session.presenter import describe_result

    rank = Rank("tpu_estimate", 0.35, "v5e", "8192x8192", kernel_s=1e-3, status="correct",
                fidelity={"class": "memory_bound", "chip": "v6e", "median_ratio": 0.81,
                          "within_2x": 1.0, "rows": 4})
    event = {"type": "run.result", "version": 1, "status": "correct", "correct": True,
             "rank": rank.to_json()}
    wide, _ = describe_result(event)
    narrow, _ = describe_result(event, narrow=True)
    assert "trust:" in wide and "8192x8192" in wide
    assert narrow == "v1 correct · est. 0.35x"


def test_the_best_kept_while_folding_is_the_one_rule_over_every_version(tmp_path: Path) -> None:
    """Folding keeps "best" incrementally (benchmarks/host_speed/session_scale.py on a 2-core host:
    10,000 events fold in 0.27 s, 1.8 s with a full pass per result); after every event
    it is what ``best_of`` says over all crownable versions: ties to the earliest (a version re-measured equal to the best
    takes it back if it came first), a best re-measured lower gives way."""
    import random

    from tilewright.kernels.judge.rank import Rank, best_of
    from tilewright.sessions.log import SessionLog

    log = SessionLog.create(tmp_path, task={"name": "toy", "root": "/nowhere",
                                            "layout": "native"},
                            backend={"platform": "cpu", "mode": "tpu-interpret",
                                     "label": "CPU (TPU interpret)"},
                            agent="offline", app_version="test")
    for n in range(1, 6):
        log.append("kernel.version", version=n, parent=n - 1 if n > 1 else None,
                   origin="initial" if n == 1 else "agent", proposal=None,
                   source_blob=log.put_blob(f"def kernel(x):\n    return x * {n}\n"),
                   summary=f"v{n}", decision=None)
    rng = random.Random(5)
    for run in range(80):
        n = rng.randint(1, 5)
        status = rng.choice(["correct", "correct", "correct", "incorrect"])
        # times within ESTIMATE_TIE of each other (the least VMEM wins) and apart
        rank = Rank("tpu_estimate", 1.0, "v5e", "4096",
                    kernel_s=rng.choice([1e-3, 0.995e-3, 0.989e-3, 1.02e-3, 2e-3]),
                    vmem_bytes=rng.choice([None, 30 << 20, 50 << 20, 60 << 20]),
                    status=status) if status == "correct" else Rank("none", status=status)
        log.append("run.start", run=f"r{run}", version=n, kind="eval", by="auto")
        log.append("run.result", run=f"r{run}", version=n, status=status,
                   correct=status == "correct", rank=rank.to_json(), chip="v5e",
                   median_ms=1.0, result_blob=None, cancelled=False)
    log.close()
    loaded = load(log.path)
    results = [i for i, e in enumerate(loaded.events) if e["type"] == "run.result"]
    for end in results:
        state = fold(loaded.header, loaded.events[:end + 1])
        want = best_of([v for v in state.versions.values() if v.crownable], lambda v: v.rank)
        assert state.best == (want.number if want else None), end


def test_the_status_bar_says_when_the_tie_rule_crowned_the_best(tmp_path: Path) -> None:
    """Two tilings estimated 0.5% apart: the lighter is crowned, and the status bar says
    why (whole at full width, in a few words when narrow)."""
    from tilewright.kernels.judge.rank import Rank
    from tilewright.sessions.log import SessionLog
    from tilewright.tui.session.view import BlobCache, SessionView
    from tilewright.tui.widgets.status import StatusBar

    log = SessionLog.create(tmp_path, task={"name": "toy", "root": "/nowhere",
                                            "layout": "native"},
                            backend={"platform": "cpu", "mode": "tpu-interpret"},
                            agent="offline", app_version="test")
    mib = 1 << 20
    for n, kernel_s, vmem in ((1, 2.9e-3, 52 * mib), (2, 2.914e-3, 32 * mib)):
        log.append("kernel.version", version=n, parent=n - 1 or None,
                   origin="initial" if n == 1 else "tuning", proposal=None,
                   source_blob=log.put_blob(f"def kernel(x):\n    return x * {n}\n"),
                   summary=f"v{n}", decision=None)
        rank = Rank("tpu_estimate", 1.1, "v5e", "4096", kernel_s=kernel_s, vmem_bytes=vmem,
                    status="correct")
        log.append("run.start", run=f"r{n}", version=n, kind="eval", by="auto")
        log.append("run.result", run=f"r{n}", version=n, status="correct", correct=True,
                   rank=rank.to_json(), chip="v5e", median_ms=1.0, result_blob=None,
                   cancelled=False)
    log.close()
    loaded = load(log.path)
    state = fold(loaded.header, loaded.events)
    assert state.best == 2 and state.best_tie is not None
    assert state.best_tie.startswith("v1's estimate is 0.48% faster")
    info = SessionView(state, BlobCache(log.path)).status("idle", "v5e")
    assert "asking less VMEM wins (32 MiB against 52 MiB" in StatusBar.compose_line(info, 0).plain
    assert "a tie within 1%: less VMEM" in StatusBar.compose_line(info, 5).plain
