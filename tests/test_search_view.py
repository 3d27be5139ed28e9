"""The search view on the real Textual app: a recorded search read-only, and a live
human-in-the-loop search (the offline agent, judged in-process: the keys are what is
tested) approved, rejected and pruned from the keyboard."""

from __future__ import annotations

import asyncio
from pathlib import Path

from judges import MarkedJudge
from textual.app import App
from textual.widgets import Static, Tree

from tilewright.agents import brief, make_agent
from tilewright.kernels.judge.rank import Rank
from tilewright.kernels.pool.workers import EvalOptions
from tilewright.kernels.tasks.loaders import load_task
from tilewright.sessions.log import SessionLog, load
from tilewright.sessions.search import Search
from tilewright.sessions.search.graph import Budget, SearchConfig
from tilewright.tui.screens.search_view import SearchScreen
from tilewright.tui.widgets.footer import KeyFooter

SUITE = Path(__file__).parent / "fixtures" / "suite"


class Host(App):
    def __init__(self, screen: SearchScreen) -> None:
        super().__init__()
        self._search_screen = screen

    def on_mount(self) -> None:
        self.push_screen(self._search_screen)


def waiter(search: Search):
    """``await until(predicate)``: returns once ``predicate()`` holds, woken by each
    event the search writes (never a sleep)."""
    changed = asyncio.Event()
    search.subscribe(lambda _e: changed.set())

    async def until(predicate) -> None:
        while not predicate():
            changed.clear()
            await asyncio.wait_for(changed.wait(), 60)

    return until


def _estimate(speedup: float | None, status: str = "correct") -> dict:
    """A run.result's rank (kernels.judge.rank.Rank as JSON): the TPU compiler's estimate."""
    if speedup is None:
        return Rank("none", status=status).to_json()
    return Rank("tpu_estimate", speedup, "v5e", "4096x4096", kernel_s=1e-3 / speedup,
                estimate=speedup, status=status).to_json()


def _recorded_session(tmp_path: Path) -> Path:
    """A small finished search written through the real session log."""
    log = SessionLog.create(tmp_path, task={"name": "toy", "root": "/nowhere",
                                            "layout": "native"},
                            backend=None, agent="offline", app_version="test")
    cfg = SearchConfig(beam_width=1, branching=2, max_rounds=1).to_json()
    src = [log.put_blob(f"def kernel(x):\n    return x * {i}\n") for i in (1, 2, 3)]
    bad = log.put_json_blob({"status": "incorrect", "error": {"message": "max_abs_diff 3.0"}})
    log.append("kernel.version", version=1, parent=None, origin="initial", proposal=None,
               source_blob=src[0], summary="starting kernel", decision=None)
    log.append("search.start", config=cfg, root=1)
    log.append("run.result", run="r1", version=1, status="correct", correct=True,
               rank=_estimate(1.0), median_ms=2.0, result_blob=None)
    log.append("search.round", lineage=0, round=0, beam=[1], repair=[], best_version=1,
               best_rank=_estimate(1.0))
    for n, (pid, status, speed) in enumerate([("p1", "correct", 1.5),
                                              ("p2", "incorrect", None)], start=2):
        log.append("agent.proposal", proposal=pid, kind="kernel", summary=f"try {n}",
                   base_version=1, source_blob=src[n - 1], role="tune", lineage=0, round=1,
                   slot=n - 2, strategy=f"strategy {n}", proposer="agent")
        d = log.append("user.decision", proposal=pid, decision="approve", by="auto")
        log.append("kernel.version", version=n, parent=1, origin="agent", proposal=pid,
                   source_blob=src[n - 1], summary=f"try {n}", decision=d["seq"])
        log.append("run.result", run=f"r{n}", version=n, status=status,
                   correct=status == "correct", rank=_estimate(speed, status),
                   median_ms=None, result_blob=bad if status != "correct" else None)
    log.append("search.round", lineage=0, round=1, beam=[2], repair=[], best_version=2,
               best_rank=_estimate(1.5))
    log.append("search.end", reason="complete", best_version=2, best_rank=_estimate(1.5))
    log.close()
    return log.path


async def test_recorded_search_shows_the_tree_and_details(tmp_path) -> None:
    path = _recorded_session(tmp_path)
    screen = SearchScreen(session=path)
    async with Host(screen).run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        tree = screen.query_one("#search-tree", Tree)
        root = tree.root.children[0]
        assert str(root.label).startswith("✓ v1 est. 1.00x")
        labels = [str(c.label) for c in root.children]
        assert labels[0].startswith("✓ v2 est. 1.50x [beam, best] · strategy 2")
        assert labels[1].startswith("✗ v3 · strategy 3")
        summary = str(screen.query_one("#search-summary", Static).render())
        assert "3 nodes" in summary and "best v2 est. 1.50x" in summary and "complete" in summary
        await pilot.press("down", "down")  # v1 -> v2 -> v3
        assert screen.selected == 3
        detail = str(screen.query_one("#search-detail", Static).render())
        assert "incorrect" in detail and "max_abs_diff 3.0" in detail
        assert "return x * 3" in str(screen.query_one("#search-source", Static).render())
        await pilot.press("p")  # read-only: nothing happens but a warning
        assert not any(e["type"] == "search.prune" for e in load(path).events)


async def test_human_in_the_loop_approve_reject_prune(tmp_path) -> None:
    task = load_task(SUITE / "native_scale_shift", {"rows": 16})
    config = SearchConfig(beam_width=1, branching=2, max_rounds=1, max_attempts=1,
                          approval="user", budget=Budget(nodes=4))
    async with MarkedJudge() as executor:
        search = Search.create(tmp_path, task, brief(task), make_agent("offline"), executor,
                               config, eval_options=EvalOptions(trials=1, time_budget_s=0.2))
        until = waiter(search)

        screen = SearchScreen(search=search)
        async with Host(screen).run_test(size=(120, 36)) as pilot:
            job = asyncio.ensure_future(search.run())
            await until(lambda: search.awaiting() == ["p1"])
            await pilot.pause()
            pending = str(screen.query_one("#search-pending", Static).render())
            assert "p1 from v1" in pending
            # The workbench's approve and reject keys, named as the keymap says them.
            assert "ctrl+y approve · ctrl+n reject" in pending
            footer = [item.description for item in screen.query_one(KeyFooter).items]
            assert {"Approve", "Reject", "Prune branch", "Next pending"} <= set(footer)
            await pilot.press("ctrl+y")  # approve the agent's child
            await until(lambda: 2 in search.state.session.versions
                        and search.state.session.versions[2].status is not None)
            await until(lambda: search.awaiting() == ["p2"])
            await pilot.pause()
            tree = screen.query_one("#search-tree", Tree)
            tree.select_node(screen.tree_nodes[2])
            await pilot.pause()
            assert screen.selected == 2
            await pilot.press("p")  # prune v2: it may not enter the beam
            await pilot.press("ctrl+n")  # reject the second child
            summary = await asyncio.wait_for(job, 60)
            await pilot.pause()
            assert "pruned" in str(screen.tree_nodes[2].label)
    events = load(search.log.path).events
    decisions = [(e["proposal"], e["decision"], e["by"]) for e in events
                 if e["type"] == "user.decision"]
    assert decisions == [("p1", "approve", "user"), ("p2", "reject", "user")]
    assert [e["version"] for e in events if e["type"] == "search.prune"] == [2]
    last_round = [e for e in events if e["type"] == "search.round"][-1]
    assert last_round["beam"] == [1]  # the pruned branch never enters the beam
    assert summary.reason == "complete" and summary.nodes == 2


async def test_review_app_hosts_a_recorded_search_and_escape_quits(tmp_path) -> None:
    from tilewright.tui.review import ReviewApp

    path = _recorded_session(tmp_path)
    app = ReviewApp(SearchScreen(session=path))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, SearchScreen)
        assert len(app.screen.tree_nodes) == 3
        await pilot.press("escape")
        await pilot.pause()
    assert app.return_code == 0  # the app exited with its screen


def test_review_needs_a_session_or_a_task() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "review"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "either a SESSION" in proc.stderr


async def test_a_child_the_person_rejected_is_not_proposed_again(tmp_path) -> None:
    """Review (human-in-the-loop search): the next child of the same version is asked
    with the rejected proposal in its request, so the offline agent proposes another."""
    task = load_task(SUITE / "native_scale_shift", {"rows": 16})
    # one child of v1, two attempts at it: the second is asked after the first's rejection
    config = SearchConfig(beam_width=1, branching=1, max_rounds=1, max_attempts=2,
                          approval="user", budget=Budget(nodes=3))
    async with MarkedJudge() as executor:
        search = Search.create(tmp_path, task, brief(task), make_agent("offline"), executor,
                               config, eval_options=EvalOptions(trials=1, time_budget_s=0.2))
        until = waiter(search)

        job = asyncio.ensure_future(search.run())
        await until(lambda: search.awaiting() == ["p1"])
        search.reject("p1")
        await until(lambda: search.awaiting() == ["p2"])
        search.reject("p2")
        await asyncio.wait_for(job, 60)
    proposals = {e["proposal"]: e for e in load(search.log.path).events
                 if e["type"] == "agent.proposal"}
    first, second = proposals["p1"], proposals["p2"]
    assert (first.get("tuning"), first.get("source_blob"), first["summary"]) != \
        (second.get("tuning"), second.get("source_blob"), second["summary"])
