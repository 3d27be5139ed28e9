"""Graph search: the planner over folded events, beam search and parallel runs on real
workers with the offline agent, the suite command in three layouts, and resume after a
kill -9 of a real ``tilewright search``.

Shapes are tiny and evaluations short (one trial, a 0.2 s timing budget): these tests
check what the search decides and records, not how fast kernels are.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from judges import MarkedJudge

from tilewright.agents import brief, make_agent
from tilewright.kernels.judge.rank import Rank, best_of, ranked_order
from tilewright.kernels.pool import LocalExecutor
from tilewright.kernels.pool.workers import EvalOptions
from tilewright.kernels.tasks.loaders import load_task
from tilewright.sessions.log import load
from tilewright.sessions.search import Search
from tilewright.sessions.search.graph import Budget, SearchConfig, fold_search
from tilewright.sessions.search.planner import finish_reason, plan, select_beam

SUITE = Path(__file__).parent / "fixtures" / "suite"
FAST = EvalOptions(trials=1, time_budget_s=0.2, timeout_s=60.0)
CLI_FAST = ["--trials", "1", "--time-budget", "0.2"]


def _events(path: Path) -> list[dict]:
    return load(path).events


def _check_recorded_search(path: Path) -> None:
    """What every search session must show, whatever it found."""
    loaded = load(path)
    events = loaded.events
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    decisions = {e["seq"]: e for e in events if e["type"] == "user.decision"}
    proposals = {e["proposal"]: e for e in events if e["type"] == "agent.proposal"}
    versions = {}
    for e in events:
        if e["type"] == "kernel.version":
            versions[e["version"]] = e
            if e["origin"] == "initial":
                continue
            # approval in code: every search-made version cites an approving decision
            decision = decisions[e["decision"]]
            assert decision["decision"] == "approve" and decision["by"] == "auto"
            assert decision["proposal"] == e["proposal"]
            assert proposals[e["proposal"]]["base_version"] == e["parent"]
            assert e["parent"] is None or e["parent"] in versions  # parents come first
        if e["type"] == "run.start":
            assert e["version"] in versions
    state = fold_search(loaded.header, events)
    for rounds in state.rounds.values():
        for info in rounds:  # only correct nodes enter a beam, best first
            assert all(state.is_correct(v) for v in info.beam)
            # best first by the judge's one rule: the beam's head is what best_of crowns
            assert info.beam == ranked_order(info.beam, state.rank)
            assert info.beam[:1] == ([best_of(info.beam, state.rank)] if info.beam else [])
    assert events[-2]["type"] == "search.end" and events[-1]["type"] == "session.end"


async def test_beam_search_on_a_bundled_task(tmp_path) -> None:
    task = load_task("gelu", {"rows": 16, "cols": 256})
    config = SearchConfig(beam_width=2, branching=2, max_rounds=2, budget=Budget(nodes=4))
    seen: list[str] = []
    async with LocalExecutor(workers=2) as executor:
        search = Search.create(tmp_path, task, brief(task), make_agent("offline"), executor,
                               config, eval_options=FAST)
        search.subscribe(lambda e: seen.append(e["type"]))
        summary = await search.run()
        search.close()
    assert summary.reason == "budget:nodes"
    assert summary.nodes == 5  # the starting kernel and the 4 the budget allows
    assert summary.evaluations == 5
    assert summary.best_status == "correct"
    state = search.state
    assert summary.best_rank is not None and summary.best_version is not None
    assert Rank.from_json(summary.best_rank) == state.rank(summary.best_version)
    assert best_of([summary.best_version, 1], state.rank) == summary.best_version  # never worse than the root
    # the children of round 1: one from the agent (tuner), one a tuning step of the search
    first = [n for n in state.nodes.values() if n.round == 1]
    assert {n.proposer for n in first} == {"agent", "tuning"}
    assert all(n.parent == 1 for n in first)
    # live state == the state folded back from disk (no second store)
    again = fold_search(load(search.log.path).header, _events(search.log.path))
    assert again.nodes == state.nodes and again.rounds == state.rounds
    assert "search.round" in seen and seen[-1] == "session.end"
    _check_recorded_search(search.log.path)


async def test_parallel_runs_are_independent_lineages(tmp_path) -> None:
    task = load_task(SUITE / "native_scale_shift", {"rows": 16})
    config = SearchConfig(mode="runs", runs=2, branching=1, max_rounds=1, tuning_children=0,
                          budget=Budget(nodes=4))
    # The lineages are what is tested, not the worker: the in-process judge.
    async with MarkedJudge() as judge:
        search = Search.create(tmp_path, task, brief(task), make_agent("offline"), judge,
                               config, eval_options=FAST)
        summary = await search.run()
        search.close()
    state = search.state
    assert summary.reason == "complete"
    assert sorted(state.rounds) == [0, 1]
    kids = {n.lineage: n for n in state.nodes.values() if n.round == 1}
    assert sorted(kids) == [0, 1] and all(n.parent == 1 for n in kids.values())
    # the second run's tuner knew the first's child: two different configurations
    sources = {state.session.versions[n.version].source_blob for n in kids.values()}
    assert len(sources) == 2
    _check_recorded_search(search.log.path)


def test_planner_resumes_from_what_the_log_shows() -> None:
    """An interrupted log: a run.start without result, an approved proposal without its
    version, an undecided one. The planner re-runs, applies and decides them."""
    cfg = SearchConfig(beam_width=2, branching=2, budget=Budget(nodes=10),
                       profile_best=False, profile_every=None).to_json()
    blob = "0" * 64
    events = [
        {"seq": 1, "t": 0, "type": "kernel.version", "version": 1, "parent": None,
         "origin": "initial", "proposal": None, "source_blob": blob, "summary": "start"},
        {"seq": 2, "t": 0, "type": "search.start", "config": cfg, "root": 1},
        {"seq": 3, "t": 1, "type": "run.start", "run": "r1", "version": 1, "kind": "eval"},
        # a log written before ranks were recorded: the source and number that ranked
        {"seq": 4, "t": 2, "type": "run.result", "run": "r1", "version": 1,
         "status": "correct", "correct": True, "speedup": 1.0, "rank_source": "tpu_estimate",
         "rank_label": "est. 1.00x on v5e (TPU compiler)", "chip": "v5e"},
        {"seq": 5, "t": 2, "type": "search.round", "lineage": 0, "round": 0, "beam": [1],
         "repair": [], "best_version": 1, "best_speedup": 1.0},
        {"seq": 6, "t": 3, "type": "agent.proposal", "proposal": "p1", "kind": "kernel",
         "base_version": 1, "source_blob": "1" * 64, "role": "tune", "lineage": 0,
         "round": 1, "slot": 0},
        {"seq": 7, "t": 3, "type": "user.decision", "proposal": "p1", "decision": "approve",
         "by": "auto"},
        {"seq": 8, "t": 3, "type": "kernel.version", "version": 2, "parent": 1,
         "origin": "agent", "proposal": "p1", "source_blob": "1" * 64, "summary": "a",
         "decision": 7},
        {"seq": 9, "t": 4, "type": "run.start", "run": "r2", "version": 2, "kind": "eval"},
        {"seq": 10, "t": 4, "type": "agent.proposal", "proposal": "p2", "kind": "kernel",
         "base_version": 1, "source_blob": "2" * 64, "role": "tune", "lineage": 0,
         "round": 1, "slot": 1},
        {"seq": 11, "t": 4, "type": "user.decision", "proposal": "p2", "decision": "approve",
         "by": "auto"},
    ]
    state = fold_search({"schema": "tilewright.session/1"}, events)
    keys = {a.key for a in plan(state)}
    assert keys == {"evaluate:2", "apply:p2"}  # nothing new before those finish
    # once p2 is applied and both children are measured, the round closes
    state.apply({"seq": 12, "t": 5, "type": "kernel.version", "version": 3, "parent": 1,
                 "origin": "agent", "proposal": "p2", "source_blob": "2" * 64,
                 "summary": "b", "decision": 11})
    for seq, (run, version, ok, speed) in enumerate(
            [("r3", 2, False, None), ("r4", 3, True, 2.0)], start=13):
        state.apply({"seq": seq, "t": 6, "type": "run.result", "run": run, "version": version,
                     "status": "correct" if ok else "incorrect", "correct": ok,
                     "rank": _rank(speed, "correct" if ok else "incorrect")})
    assert [a.key for a in plan(state)] == ["select:0:1"]
    info = select_beam(state, 0, 1)
    assert info.beam == [3, 1]  # v2 was incorrect: it never enters the beam
    assert info.best_version == 3 and info.best_rank == state.rank(3)
    # an old log's rank (est. 1.00x, no kernel time) and a new one (est. 2.00x) compare
    assert state.rank(1) is not None and state.rank(1).legacy_label
    # a node budget already spent: no new expansions
    state.config.budget.nodes = 2
    state.apply({"seq": 15, "t": 7, "type": "search.round", **info.event_fields()})
    assert state.rounds[0][-1].best_rank == info.best_rank  # recorded as Rank JSON
    assert plan(state) == []


def _rank(speedup: float | None, status: str = "correct") -> dict:
    """A run.result's rank (Rank JSON): the TPU compiler's estimated speedup on v5e."""
    if speedup is None:
        return Rank("none", status=status).to_json()
    return Rank("tpu_estimate", speedup, "v5e", "4096x4096", kernel_s=1e-3 / speedup,
                status=status).to_json()


def test_beam_and_best_follow_rank_key_not_the_value() -> None:
    """One ordering (``Rank.key``): compiler ranks by the kernel's time (a roofline rank
    of a faster kernel above an estimate of a slower one), a host simulation ratio below
    any compiler figure whatever its value, earliest first on ties; "improved" too."""
    cfg = SearchConfig(beam_width=3, branching=3, profile_best=False,
                       profile_every=None).to_json()
    blob = "0" * 64
    # v1: est. 1.00x, its kernel 1 ms
    ranks = {2: Rank("tpu_estimate", 1.2, "v5e", kernel_s=0.8e-3).to_json(),
             3: Rank("roofline", 0.9, "v5e", kernel_s=0.5e-3).to_json(),  # the fastest
             4: Rank("host_simulation", 50.0).to_json(),
             5: Rank("roofline", 0.9, "v5e", kernel_s=0.5e-3).to_json()}  # v3's tie
    events: list[dict] = [
        {"seq": 1, "t": 0, "type": "kernel.version", "version": 1, "parent": None,
         "origin": "initial", "proposal": None, "source_blob": blob, "summary": "start"},
        {"seq": 2, "t": 0, "type": "search.start", "config": cfg, "root": 1},
        {"seq": 3, "t": 1, "type": "run.result", "run": "r1", "version": 1,
         "status": "correct", "correct": True, "rank": _rank(1.0)},
        {"seq": 4, "t": 1, "type": "search.round", "lineage": 0, "round": 0, "beam": [1],
         "repair": [], "best_version": 1, "best_rank": _rank(1.0)}]
    seq = 5
    for number, rank in ranks.items():
        pid = f"p{number}"
        events += [
            {"seq": seq, "t": 2, "type": "agent.proposal", "proposal": pid, "kind": "kernel",
             "base_version": 1, "source_blob": blob, "role": "tune", "lineage": 0,
             "round": 1, "slot": number - 2},
            {"seq": seq + 1, "t": 2, "type": "user.decision", "proposal": pid,
             "decision": "approve", "by": "auto"},
            {"seq": seq + 2, "t": 2, "type": "kernel.version", "version": number, "parent": 1,
             "origin": "agent", "proposal": pid, "source_blob": blob, "summary": pid,
             "decision": seq + 1},
            {"seq": seq + 3, "t": 3, "type": "run.result", "run": f"r{number}",
             "version": number, "status": "correct", "correct": True, "rank": rank}]
        seq += 4
    state = fold_search({"schema": "tilewright.session/1"}, events)
    info = select_beam(state, 0, 1)
    assert info.beam == [3, 5, 2]  # v1 (the slowest kernel) and v4 (host sim) left out
    assert info.best_version == 3 and state.best() == 3
    state.apply({"seq": seq, "t": 4, "type": "search.round", **info.event_fields()})
    from tilewright.sessions.search.planner import lineage_done

    assert lineage_done(state, 0) is None  # round 1 improved on round 0 (by key)


def test_planner_profiles_a_new_best_before_its_lineage_asks_again() -> None:
    """Profiles as autonomous mode takes them: the first best is profiled before the
    agent is asked for children (and while its profile runs); a failed profile is not
    retried; ``profile_every`` profiles the latest correct version after N evaluations;
    a log recorded before search profiled (no profile fields) does not start now."""
    blob = "0" * 64

    def log(**cfg) -> list[dict]:
        config = SearchConfig(beam_width=1, branching=1, tuning_children=0, **cfg).to_json()
        return [
            {"seq": 1, "t": 0, "type": "kernel.version", "version": 1, "parent": None,
             "origin": "initial", "proposal": None, "source_blob": blob, "summary": "start"},
            {"seq": 2, "t": 0, "type": "search.start", "config": config, "root": 1},
            {"seq": 3, "t": 1, "type": "run.start", "run": "r1", "version": 1, "kind": "eval"},
                {"seq": 4, "t": 2, "type": "run.result", "run": "r1", "version": 1,
             "status": "correct", "correct": True, "rank": _rank(1.0)},
            {"seq": 5, "t": 2, "type": "search.round", "lineage": 0, "round": 0, "beam": [1],
             "repair": [], "best_version": 1, "best_rank": _rank(1.0)}]

    state = fold_search({"schema": "tilewright.session/1"}, log(profile_every=None))
    assert [a.key for a in plan(state)] == ["profile:1"]  # no expansion yet
    state.apply({"seq": 6, "t": 3, "type": "run.start", "run": "r2", "version": 1,
                 "kind": "profile", "by": "search"})
    assert plan(state, {"profile:1"}) == []  # still waiting for the diagnosis
    state.apply({"seq": 7, "t": 4, "type": "profile.result", "run": "r2", "version": 1,
                 "profile_blob": None, "logdir": None, "error": "worker died"})
    assert [a.kind for a in plan(state)] == ["expand"]  # a failed profile is not retried
    # profile_every without profile_best: due only after that many evaluations
    state = fold_search({"schema": "tilewright.session/1"},
                        log(profile_best=False, profile_every=1))
    assert [a.key for a in plan(state)] == ["profile:1"]
    state = fold_search({"schema": "tilewright.session/1"},
                        log(profile_best=False, profile_every=2))
    assert [a.kind for a in plan(state)] == ["expand"]
    # an older log: its config has no profile fields
    old = log()
    for field_name in ("profile_best", "profile_every"):
        old[1]["config"].pop(field_name)
    state = fold_search({"schema": "tilewright.session/1"}, old)
    assert [a.kind for a in plan(state)] == ["expand"]


def test_a_task_error_ends_the_search() -> None:
    """The task itself failed (its reference raised, or it does not fit the worker):
    every candidate would fail alike, so nothing more is planned and the search says
    why; a candidate's own failure does not end it."""
    config = SearchConfig(beam_width=1, branching=1, tuning_children=0).to_json()
    blob = "0" * 64
    events = [
        {"seq": 1, "t": 0, "type": "kernel.version", "version": 1, "parent": None,
         "origin": "initial", "proposal": None, "source_blob": blob, "summary": "start"},
        {"seq": 2, "t": 0, "type": "search.start", "config": config, "root": 1},
        {"seq": 3, "t": 1, "type": "run.start", "run": "r1", "version": 1, "kind": "eval"},
        {"seq": 4, "t": 2, "type": "run.result", "run": "r1", "version": 1,
         "status": "crashed", "correct": False, "rank": _rank(None, "crashed"),
         "error_kind": "crashed"}]
    round0 = {"seq": 5, "t": 2, "type": "search.round", "lineage": 0, "round": 0,
              "beam": [], "repair": [1], "best_version": None, "best_rank": None}
    state = fold_search({"schema": "tilewright.session/1"}, [*events, round0])
    assert [a.kind for a in plan(state)] == ["expand"]  # the fixer gets its turn
    assert finish_reason(state) != "task_error"
    events[-1] = {**events[-1], "error_kind": "task"}
    state = fold_search({"schema": "tilewright.session/1"}, [*events, round0])
    assert plan(state) == [] and finish_reason(state) == "task_error"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tilewright.tui.cli", "search", *args]


def test_suite_resumes_after_kill_9(tmp_path) -> None:
    """Kill a real `tilewright search` mid-run, rerun the same command: it continues."""
    suite = tmp_path / "suite"
    shutil.copytree(SUITE, suite)
    sessions = tmp_path / "sessions"
    command = _cli("--suite", str(suite), "--budget", "1", "--rounds", "1",
                   "--session-dir", str(sessions), "--json", *CLI_FAST)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    lines = []
    try:
        for line in proc.stderr:  # wait until the first task's child is being evaluated
            lines.append(line)
            if ": v2 evaluating" in line:
                break
        else:
            pytest.fail("search ended before its first child was evaluated:\n" + "".join(lines))
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    first = sorted(sessions.iterdir())
    assert len(first) == 1
    before = _events(first[0])
    assert not any(e["type"] == "search.end" for e in before)

    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    assert "resuming" in done.stderr
    report = json.loads(done.stdout)
    assert report["schema"] == "tilewright.search/1"
    by_layout = {t["layout"]: t for t in report["tasks"]}
    assert set(by_layout) == {"native", "jaxbench", "maxkernel"}
    # MaxKernel brings no starting kernel: the offline agent writes first kernels (one
    # per template family, since the task names none) and the search keeps the correct
    for layout in ("native", "jaxbench", "maxkernel"):
        entry = by_layout[layout]
        assert entry["best_status"] == "correct", entry
        assert entry["evaluations"] >= 1 and Path(entry["session"]).is_dir()
    # the interrupted session was continued, not replaced
    resumed = [t for t in report["tasks"] if Path(t["session"]) == first[0]]
    assert len(resumed) == 1
    after = _events(first[0])
    assert after[:len(before)] == before
    assert any(e["type"] == "search.resume" for e in after[len(before):])
    # v2's run was cut by the kill: settled as interrupted on resume, then run again
    cut = [e for e in before if e["type"] == "run.start" and e["version"] == 2]
    assert len(cut) == 1 and not any(e["type"] == "run.result" and e["run"] == cut[0]["run"]
                                     for e in before)
    later = [e for e in after[len(before):] if e.get("version") == 2
             and e["type"] in ("run.start", "run.result") and e.get("kind") != "analysis"]
    assert later[0]["run"] == cut[0]["run"] and later[0]["interrupted"]
    assert later[-1]["type"] == "run.result" and later[-1]["status"] == "correct"
    _check_recorded_search(first[0])
    assert resumed[0]["nodes"] == 2  # the starting kernel and the budget of 1
    assert resumed[0]["evaluations"] == 2
    # rerunning a finished suite reports it without evaluating anything again
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(again.stdout)["tasks"] == report["tasks"]


def test_budgets_for_tokens_cost_and_wall_time() -> None:
    """Each budget stops new expansions; wall time counts only while a search ran."""
    from tilewright.sessions.search.planner import budget_reason

    def state_with(budget: Budget, events: list[dict]):
        cfg = SearchConfig(budget=budget).to_json()
        head = [{"seq": 1, "t": 0.0, "type": "search.start", "config": cfg, "root": None}]
        return fold_search({"schema": "tilewright.session/1"}, head + events)

    usage = {"input_tokens": 900, "output_tokens": 200, "cost_usd": 0.02}
    spoke = [{"seq": 2, "t": 1.0, "type": "agent.message", "text": "", "role": "implement",
              "proposal": None, "usage": usage}]
    assert budget_reason(state_with(Budget(tokens=1000), spoke)) == "budget:tokens"
    assert budget_reason(state_with(Budget(tokens=2000), spoke)) is None
    assert budget_reason(state_with(Budget(cost_usd=0.01), spoke)) == "budget:cost"
    # 5 s of work, a long pause (the process was dead), 5 s more after the resume
    cfg = SearchConfig(budget=Budget(wall_s=12.0)).to_json()
    timeline = [{"seq": 2, "t": 5.0, "type": "marker", "label": "work"},
                {"seq": 3, "t": 500.0, "type": "search.resume", "config": cfg},
                {"seq": 4, "t": 505.0, "type": "marker", "label": "work"}]
    state = state_with(Budget(wall_s=12.0), timeline)
    assert state.wall_spent() == 10.0
    assert budget_reason(state) is None
    assert budget_reason(state, live_wall=2.5) == "budget:wall"
    assert plan(state, live_wall=2.5) == []
    # with nothing to expand any more, no expansion: the budget stops the root writing
    assert [a.kind for a in plan(state_with(Budget(tokens=1000), spoke))] == []
    assert [a.kind for a in plan(state_with(Budget(tokens=2000), spoke))] == ["expand"]


async def test_claude_is_asked_for_a_different_strategy_per_child(tmp_path, monkeypatch) -> None:
    """The real Anthropic SDK against a local Messages API: each child's request names
    the strategies its siblings already tried; tokens are counted per task."""
    from tests.anthropic_server import MessagesServer, tool_reply

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-local")
    monkeypatch.setenv("TILEWRIGHT_DATA_DIR", str(tmp_path / "data"))
    task = load_task(SUITE / "native_scale_shift", {"rows": 16})
    start = task.starting_source()
    wide = start.replace("BLOCK_COLS = 128", "BLOCK_COLS = 256")
    tall = start.replace("BLOCK_ROWS = 8", "BLOCK_ROWS = 16")
    config = SearchConfig(beam_width=2, branching=2, max_rounds=1, tuning_children=0,
                          budget=Budget(nodes=2))
    with MessagesServer() as server:
        server.script(
            tool_reply("propose_kernel", {"summary": "wider lane tiles: BLOCK_COLS 256",
                                          "source": wide}),
            tool_reply("propose_kernel", {"summary": "taller tiles: BLOCK_ROWS 16",
                                          "source": tall}))
        agent = make_agent("anthropic", {"agent": {"base_url": server.url,
                                                   "retry_base_s": 0.01, "max_retries": 1}})
        async with MarkedJudge() as judge:  # what is asked is tested, not the worker
            search = Search.create(tmp_path, task, brief(task), agent, judge, config,
                                   eval_options=FAST)
            summary = await search.run()
            search.close()
        asked = [json.dumps(r.body) for r in server.requests]
    assert len(asked) == 2
    assert "Graph search, round 1, child 1 of v1" in asked[0]
    assert "child 2 of v1" in asked[1]
    assert "already tried: v2: wider lane tiles: BLOCK_COLS 256" in asked[1]
    assert summary.tokens > 0 and summary.evaluations == 3
    strategies = {n.strategy for n in search.state.nodes.values() if n.round == 1}
    assert strategies == {"wider lane tiles: BLOCK_COLS 256", "taller tiles: BLOCK_ROWS 16"}
    _check_recorded_search(search.log.path)


def test_suite_totals_are_the_figures_the_field_reports() -> None:
    """Correct rate over every task (unloaded ones count as failures), the geometric mean
    over correct tasks, fast_p over all tasks; the table and Markdown say what the
    speedup is and why tasks failed."""
    from tilewright.sessions.cli.search import markdown, suite_totals

    def task(name: str, status: str | None, speed: float | None, note: str | None = None,
             source: str = "tpu_estimate"):
        rank = Rank(source, speed, "v5e", "4096x4096", kernel_s=1e-3).to_json() \
            if speed is not None else None
        return {"task": name, "layout": "jaxbench", "best_status": status,
                "best_rank": rank, "best_version": 2 if status == "correct" else None,
                "start_rank": None, "evaluations": 3, "tokens": 0, "reason": "done",
                "session": "s", "note": note, "flags": [], "chip": "v5e"}

    report = {"suite": "x", "executor": "local", "agent": "offline",
              "tasks": [task("a", "correct", 2.0), task("b", "correct", 0.5),
                        task("c", "correct", 1.6),
                        # correct, but only a host-simulation ratio: no speedup to count
                        task("h", "correct", 0.01, source="host_simulation"),
                        task("d", "compile_error", None,
                             "v1 (matmul template): compile_error: lowering: boom\n"
                             "v2 (whole template): incorrect: 12 of 64 values")],
              "errors": [{"path": "e", "message": "broken"}]}
    totals = suite_totals(report)
    assert totals["tasks"] == 6 and totals["correct"] == 4
    assert totals["correct_rate"] == pytest.approx(4 / 6)
    assert totals["geomean"] == pytest.approx((2.0 * 0.5 * 1.6) ** (1 / 3))
    assert totals["counted"] == 3 and totals["counted_sources"] == {"tpu_estimate": 3}
    assert totals["host_simulation"] == 1 and totals["roofline_counted"] == 0
    assert totals["fast_1"] == pytest.approx(2 / 6) and totals["fast_1.5"] == pytest.approx(2 / 6)
    report["totals"] = totals
    text = markdown(report)
    assert "est. speedup at production shape (v5e, compiler)" in text
    assert "4/6 correct (67%)" in text and "over 3 task(s) (3 estimated)" in text
    assert "est. 2.00x at 4096x4096" in text
    assert "no TPU estimate" in text and "0.01x" not in text
    assert "v1 (matmul template): compile_error" in text and "v2 (whole template)" in text
    # A roofline rank is a lower bound: reported apart, never in the geometric mean.
    report["tasks"].append(task("r", "correct", 3.0, source="roofline"))
    totals = suite_totals(report)
    assert totals["counted"] == 3 and totals["geomean"] == pytest.approx(
        (2.0 * 0.5 * 1.6) ** (1 / 3))
    assert totals["roofline_counted"] == 1 and totals["roofline_geomean"] == pytest.approx(3.0)
    assert totals["fast_1.5"] == pytest.approx(2 / 7)  # the bound counts in no fast_p
    report["totals"] = totals
    text = markdown(report)
    assert "≥3.00x roofline at 4096x4096" in text and "lower bounds" in text


class _Recording:
    """The real offline agent, with every request it was sent kept for the test."""

    def __init__(self, agent) -> None:
        self.agent, self.requests = agent, []
        self.name, self.label = agent.name, agent.label

    def propose(self, request):
        self.requests.append(request)
        return self.agent.propose(request)


async def test_search_profiles_new_bests_and_the_next_request_carries_the_diagnosis(
        tmp_path) -> None:
    """Like autonomous mode: the starting kernel (the first best) is profiled and
    diagnosed before the agent is asked for its children, and that request carries the
    diagnosis; every profile is of a correct version that was its lineage's best."""
    task = load_task("gelu", {"rows": 16, "cols": 256})
    config = SearchConfig(beam_width=1, branching=1, max_rounds=2, tuning_children=0,
                          profile_every=None, budget=Budget(nodes=2))
    agent = _Recording(make_agent("offline"))
    async with LocalExecutor(workers=1) as executor:
        search = Search.create(tmp_path, task, brief(task), agent, executor, config,
                               eval_options=FAST)
        await search.run()
        search.close()
    events = _events(search.log.path)
    profiles = [e for e in events if e["type"] == "run.start" and e["kind"] == "profile"]
    assert profiles and profiles[0]["version"] == 1 and profiles[0]["by"] == "search"
    results = [e for e in events if e["type"] == "profile.result"]
    assert results[0]["error"] is None and results[0]["profile_blob"]
    first_ask = next(i for i, e in enumerate(events) if e["type"] == "agent.message")
    # the diagnoses came first (the static analysis's, then the profile's): the request
    # carries the latest of them
    before = [e for e in events[:first_ask] if e["type"] == "diagnosis"]
    assert before and all(e["version"] == 1 for e in before)
    diagnosis = before[-1]
    assert agent.requests[0].diagnosis is not None
    assert agent.requests[0].diagnosis["kind"] == diagnosis["kind"]
    # every request names the chip the search judges for (the tuner's VMEM is that chip's)
    assert {r.chip for r in agent.requests} == {"v5e"}  # no --chip on a CPU host: v5e
    # the offline tuner moves on it: memory-bound -> every tunable to its largest block
    assert diagnosis["kind"] in ("memory_bound", "per_step_overhead")
    first = next(e for e in events if e["type"] == "agent.proposal")
    assert "(largest legal blocks" in first["summary"] and "from the diagnosis" in \
        first["summary"]
    state = search.state
    for start in profiles:  # only correct versions, never twice
        assert state.is_correct(start["version"])
    assert len({p["version"] for p in profiles}) == len(profiles)
    # a version of the last round informs no one: it is not profiled
    assert all(state.nodes[p["version"]].round < config.max_rounds for p in profiles)
    _check_recorded_search(search.log.path)


def test_the_search_step_leaves_a_tunable_a_sibling_is_still_measuring() -> None:
    """From the 128-row kernel, a child at 64 rows not yet measured: the search's own
    step does not run 256 beside it (64's grid says whether 128 already covers the
    rows); once 64 has run, or where the sibling was rejected, the tunable is free."""
    from tilewright.sessions.search.children import in_flight

    def source(rows: int, cols: int = 128) -> str:
        return (f"BLOCK_ROWS = {rows}\nBLOCK_COLS = {cols}\nTUNABLES = "
                '{"BLOCK_ROWS": [64, 128, 256], "BLOCK_COLS": [128, 256]}\n')

    blobs = {"a" * 64: source(128), "b" * 64: source(64), "c" * 64: source(128, 256)}
    events = [
        {"seq": 1, "t": 0, "type": "kernel.version", "version": 1, "parent": None,
         "origin": "initial", "proposal": None, "source_blob": "a" * 64, "summary": "128"},
        {"seq": 2, "t": 1, "type": "agent.proposal", "proposal": "p1", "kind": "tuning",
         "base_version": 1, "source_blob": "b" * 64, "role": "tune", "summary": "64 rows",
         "tuning": {"BLOCK_ROWS": 64}},
        {"seq": 3, "t": 1, "type": "agent.proposal", "proposal": "p2", "kind": "tuning",
         "base_version": 1, "source_blob": "c" * 64, "role": "tune", "summary": "256 cols",
         "tuning": {"BLOCK_COLS": 256}},
        {"seq": 4, "t": 1, "type": "user.decision", "proposal": "p2", "decision": "reject",
         "by": "user"},
    ]
    state = fold_search({"schema": "tilewright.session/1"}, events).session
    current = {"BLOCK_ROWS": 128, "BLOCK_COLS": 128}
    assert in_flight(state, 1, current, blobs.__getitem__) == {"BLOCK_ROWS"}
    # a child that moves two tunables at once says nothing of either's cover
    assert in_flight(state, 1, {"BLOCK_ROWS": 128, "BLOCK_COLS": 256},
                     blobs.__getitem__) == set()
    assert in_flight(state, 2, current, blobs.__getitem__) == set()  # another parent
    state.apply({"seq": 5, "t": 2, "type": "user.decision", "proposal": "p1",
                 "decision": "approve", "by": "auto"})
    state.apply({"seq": 6, "t": 2, "type": "kernel.version", "version": 2, "parent": 1,
                 "origin": "tuning", "proposal": "p1", "source_blob": "b" * 64,
                 "summary": "64 rows", "decision": 5})
    state.apply({"seq": 7, "t": 3, "type": "run.start", "run": "r1", "version": 2,
                 "kind": "eval"})
    assert in_flight(state, 1, current, blobs.__getitem__) == {"BLOCK_ROWS"}  # running
    state.apply({"seq": 8, "t": 4, "type": "run.result", "run": "r1", "version": 2,
                 "status": "correct", "correct": True, "rank": _rank(1.0)})
    assert in_flight(state, 1, current, blobs.__getitem__) == set()


def test_the_search_reads_the_configs_eval_table_under_its_flags() -> None:
    """`tilewright search` takes [eval] (timeout_s, trials, time_budget_s) as `auto` does,
    the flags over it; --timeout is there (a big program's production deadline named it)."""
    import argparse

    from tilewright.sessions.cli.search import search_options

    def args(**given: object) -> argparse.Namespace:
        flags = {"trials": None, "time_budget": None, "timeout": None}
        return argparse.Namespace(**{**flags, **given})

    plain = search_options(args(), "v5e")
    assert (plain.trials, plain.time_budget_s, plain.chip) == (3, 3.0, "v5e")
    table = {"eval": {"timeout_s": 400.0, "trials": 2}}
    configured = search_options(args(config=table), None)
    assert (configured.timeout_s, configured.trials) == (400.0, 2)
    flagged = search_options(args(config=table, timeout=900.0, trials=5), "v6e")
    assert (flagged.timeout_s, flagged.trials, flagged.chip) == (900.0, 5, "v6e")
    # the flags' checks take an unset flag (the table's, or the default) as it is
    from tilewright.sessions.cli.search import _check_args

    sizes = {"budget": 4, "beam_width": 2, "branching": 2, "runs": 1, "rounds": 3,
             "address": None, "executor": "local", "suite": str(SUITE)}
    _check_args(args(**sizes))
    with pytest.raises(ValueError, match="--timeout must be more than 0"):
        _check_args(args(**sizes, timeout=0.0))
