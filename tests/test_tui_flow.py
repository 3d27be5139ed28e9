"""The workbench driven with Pilot against the real controller.

Every test runs the real ``TilewrightApp`` with a real ``sessions`` controller over a
session log in ``tmp_path`` on the bundled ``gelu`` task, and the scripted agent
(determinism: the test knows which proposal comes). Where what the worker says is what
the test is about (a compile error's line, a profile, the estimate's words, the chip
check) one real ``WorkerPool`` shared by the module judges (TPU interpret mode on the
CPU, one trial, short timing); where the test is about keys, decisions and the screen,
the in-process ``MarkedJudge`` does (every kernel correct), and the test takes
milliseconds instead of a worker's seconds.
The app's clock is a ``FakeClock`` so the approval prompt's half-second guard is
tested without sleeping.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
from anthropic_server import MessagesServer, tool_reply
from judges import MarkedJudge
from scripted_agent import ScriptedAgent, kernel, tuning
from tui_apps import CHIP, FakeClock, kinds, make_app, persisted, settle

from tilewright import agents
from tilewright.kernels.judge.rank import Rank
from tilewright.kernels.pool.workers import EvalOptions, WorkerPool
from tilewright.kernels.tasks.loaders import load_task
from tilewright.sessions.evaluator import PoolEvaluator
from tilewright.tui.app import TilewrightApp
from tilewright.tui.format import rank_at_length
from tilewright.tui.launch import start_session
from tilewright.tui.screens.modals import ErrorModal
from tilewright.tui.widgets.chat import ChatPane
from tilewright.tui.widgets.history import HistoryPane
from tilewright.tui.widgets.problems import ProblemsPane
from tilewright.tui.widgets.source import SourcePane
from tilewright.tui.widgets.status import ActivityLine, ApprovalBar, StatusBar

pytestmark = pytest.mark.asyncio(loop_scope="module")

@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool():
    async with WorkerPool() as p:
        yield p


@pytest.fixture
def judge() -> MarkedJudge:
    return MarkedJudge()


@pytest.fixture(scope="module")
def gelu():
    return load_task("gelu")


def faster(source: str, rows: int = 128) -> str:
    return source.replace("BLOCK_ROWS = 64", f"BLOCK_ROWS = {rows}")


async def test_run_then_approve_respects_the_half_second_guard(tmp_path, gelu, judge):
    agent = ScriptedAgent([kernel(faster(gelu.starting_source()), "taller row blocks")],
                          text="Taller blocks halve the grid steps.")
    clock = FakeClock()
    app = make_app(tmp_path, gelu, agent, judge, clock)
    rings: list[int] = []
    app.bell = lambda: rings.append(1)  # the terminal bell: a decision is awaited
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        screen = app.workbench
        assert screen.query_one(SourcePane).version == 1 and not rings
        await pilot.press("ctrl+r")  # run v1; the agent is then asked for a proposal
        await settle(app, pilot)
        assert app.link.state.pending == "p1" and rings == [1]
        bar = screen.query_one(ApprovalBar)
        assert bar.has_class("-pending") and "taller row blocks" in str(bar.render())
        source = screen.query_one(SourcePane)
        assert source.proposal == "p1" and source.shown == "diff" and source.editor.read_only
        # Type-ahead right after the prompt appears is ignored ...
        await pilot.press("ctrl+y")
        await settle(app, pilot)
        assert "user.decision" not in kinds(app)
        # ... and honoured half a second later.
        clock.now += 0.6
        await pilot.press("ctrl+y")
        await settle(app, pilot)
        decisions = [e for e in persisted(app) if e["type"] == "user.decision"]
        assert decisions[0]["decision"] == "approve" and decisions[0]["by"] == "user"
        assert app.link.state.versions[2].status == "correct"
        history = screen.query_one(HistoryPane)
        assert [r.version for r in history.rows] == [1, 2]
        assert history.rows[-1].current and history.rows[-1].status == "correct"
        status = screen.query_one(StatusBar).info
        assert status.iteration == 1 and status.best_version in (1, 2)
        assert status.tokens == 300  # two scripted replies of 100 in + 50 out
        chat = screen.query_one(ChatPane)
        chat.flush()
        assert "Taller blocks" in chat.transcript()
        await app.action_quit()


async def test_reject_with_a_note_reaches_the_agent(tmp_path, gelu, judge):
    start = gelu.starting_source()
    agent = ScriptedAgent([kernel(faster(start), "first try"), kernel(faster(start, 256),
                                                                      "second try")])
    clock = FakeClock()
    app = make_app(tmp_path, gelu, agent, judge, clock)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        clock.now += 1
        await pilot.press("ctrl+n")
        await pilot.pause()
        await pilot.press(*"keep rows at 64", "enter")
        await settle(app, pilot)
        decision = next(e for e in persisted(app) if e["type"] == "user.decision")
        assert decision["decision"] == "reject" and decision["note"] == "keep rows at 64"
        assert any("keep rows at 64" in n for n in agent.requests[-1].notes)
        assert app.link.state.pending == "p2"
        await app.action_quit()


async def test_edit_the_proposal_before_it_runs(tmp_path, gelu, judge):
    start = gelu.starting_source()
    agent = ScriptedAgent([kernel(faster(start), "taller blocks")])
    clock = FakeClock()
    app = make_app(tmp_path, gelu, agent, judge, clock)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        clock.now += 1
        await pilot.press("f2")  # the proposal becomes editable
        await pilot.pause()
        source = app.workbench.query_one(SourcePane)
        assert source.editing and not source.editor.read_only
        edited = faster(start, 32)
        source.editor.load_text(edited)
        await pilot.press("f2")  # submit: an edit decision, then the edited source runs
        await settle(app, pilot)
        decision = next(e for e in persisted(app) if e["type"] == "user.decision")
        assert decision["decision"] == "edit"
        version = app.link.state.versions[2]
        assert version.origin == "user-edit" and version.status == "correct"
        assert "BLOCK_ROWS = 32" in app.link.read_blob(version.source_blob).decode()
        await app.action_quit()


async def test_problems_pane_shows_a_compile_error_and_jumps_to_its_line(tmp_path, gelu,
                                                                         pool):
    broken = gelu.starting_source().replace("def gelu_kernel(x_ref, o_ref):",
                                            "def gelu_kernel(x_ref, o_ref)")
    agent = ScriptedAgent([kernel(broken, "broken on purpose")])
    clock = FakeClock()
    app = make_app(tmp_path, gelu, agent, pool, clock,
                   config={"controller": {"auto_fix_attempts": 0}})
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        clock.now += 1
        await pilot.press("ctrl+y")
        await settle(app, pilot)
        screen = app.workbench
        problems = screen.query_one(ProblemsPane).problems
        assert problems and problems[0].severity == "error" and problems[0].line
        line = problems[0].line
        table = screen.query_one("#problems-table")
        table.focus()
        await pilot.press("enter")
        await pilot.pause()
        editor = screen.query_one(SourcePane).editor
        assert editor.cursor_location[0] == line - 1 and editor.has_focus
        await app.action_quit()


async def test_ctrl_t_profiles_the_version_in_a_worker(tmp_path, gelu, pool):
    app = make_app(tmp_path, gelu, ScriptedAgent([]), pool,
                   config={"controller": {"propose_after_run": False}})
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+t")  # profile v1
        await settle(app, pilot)
        (profiled,) = [e for e in persisted(app) if e["type"] == "profile.result"]
        assert profiled["version"] == 1, profiled
        await app.action_quit()


async def test_autonomous_on_and_off(tmp_path, gelu, judge):
    # What the keys and the budget do, not what the worker says: the in-process judge.
    agent = ScriptedAgent([tuning("rows 128", BLOCK_ROWS=128), tuning("rows 256", BLOCK_ROWS=256),
                           tuning("cols 512", BLOCK_COLS=512)])
    app = make_app(tmp_path, gelu, agent, judge, config={
        "budgets": {"iterations": 2}, "controller": {"propose_after_run": False}})
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+g")  # autonomous: runs v1, then two tuned versions
        await settle(app, pilot)
        events = persisted(app)
        auto = [e for e in events if e["type"] == "user.decision" and e["by"] == "auto"]
        assert len(auto) == 2
        assert any(e["type"] == "auto.stop" and e["reason"] == "budget:iterations"
                   for e in events)
        assert app.link.state.mode == "step"
        assert app.workbench.query_one(StatusBar).info.mode == "step"
        seen = len(persisted(app))
        judge.gate = asyncio.Event()  # the next run waits: autonomous mode is seen on, then off
        await pilot.press("ctrl+g")  # on again ...
        await pilot.pause()
        assert app.link.state.mode == "auto"
        await pilot.press("ctrl+g")  # ... and off
        judge.gate.set()
        await settle(app, pilot)
        assert app.link.state.mode == "step"
        assert [e["mode"] for e in persisted(app)[seen:] if e["type"] == "mode.change"] == \
            ["auto", "step"]
        await app.action_quit()


async def test_cancel_needs_two_presses(tmp_path, gelu, judge):
    hold = asyncio.Event()
    agent = ScriptedAgent([kernel(gelu.starting_source())], hold=hold)
    clock = FakeClock()
    app = make_app(tmp_path, gelu, agent, judge, clock)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        app.workbench.query_one("#chat-input").focus()
        await pilot.press(*"make it faster", "enter")
        await agent.started.wait()
        await pilot.pause()
        assert app.link.busy == "agent"
        activity = app.workbench.query_one(ActivityLine)
        assert activity.display and "is replying" in str(activity.render())
        assert "F8/alt+x twice cancels" in str(activity.render())
        await pilot.press("f8")
        await pilot.pause()
        assert app.link.busy == "agent"  # one press only arms the cancel
        clock.now += 0.5
        await pilot.press("f8")
        await settle(app, pilot)
        assert app.link.busy is None and agent.closed == 1
        assert any(e["type"] == "agent.message" and e.get("cancelled")
                   for e in persisted(app))
        await app.action_quit()


async def test_claude_through_the_real_sdk_against_a_local_server(tmp_path, gelu, judge,
                                                                  monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-local")
    monkeypatch.setenv("TILEWRIGHT_DATA_DIR", str(tmp_path / "data"))
    source = faster(gelu.starting_source())
    with MessagesServer() as server:
        server.script(tool_reply("propose_kernel", {"summary": "taller blocks",
                                                    "rationale": "fewer grid steps",
                                                    "source": source},
                                 text="Fewer, taller blocks."))
        config = {"agent": {"base_url": server.url, "retry_base_s": 0.01, "max_retries": 1,
                            "model": "claude-sonnet-4-5"}}
        agent = agents.make_agent("anthropic", config)
        clock = FakeClock()
        app = make_app(tmp_path, gelu, agent, judge, clock, config=config)
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("ctrl+r")
            await settle(app, pilot)
            screen = app.workbench
            assert app.link.state.pending == "p1"
            assert screen.query_one(SourcePane).proposal == "p1"
            chat = screen.query_one(ChatPane)
            chat.flush()
            # One entry for the tool call: seen live, then filled in by the proposal.
            titles = [str(c.title) for c in chat.query("Collapsible")]
            assert len(titles) == 1 and "propose_kernel" in titles[0] \
                and "p1: taller blocks" in titles[0], titles
            assert "Claude" in str(chat.border_title)
            clock.now += 1
            await pilot.press("ctrl+y")
            await settle(app, pilot)
            assert app.link.state.versions[2].status == "correct"
            assert screen.query_one(StatusBar).info.tokens > 0
            assert server.requests and server.requests[0].key == "sk-test-local"
            await app.action_quit()


async def test_a_plan_is_shown_in_full_and_approving_it_asks_the_implementer(tmp_path, gelu,
                                                                             judge):
    from scripted_agent import plan

    agent = ScriptedAgent([plan("1. tile rows by 128\n2. fuse the tanh", "two steps"),
                           kernel(faster(gelu.starting_source()), "rows 128")])
    clock = FakeClock()
    app = make_app(tmp_path, gelu, agent, judge, clock,
                   config={"controller": {"propose_after_run": False}})
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        app.workbench.query_one("#chat-input").focus()
        await pilot.press(*"plan first", "enter")
        await settle(app, pilot)
        chat = app.workbench.query_one(ChatPane)
        chat.flush()
        assert "fuse the tanh" in chat.transcript()
        assert app.workbench.query_one(SourcePane).proposal is None  # nothing to diff
        clock.now += 1
        await pilot.press("ctrl+y")
        await settle(app, pilot)
        assert agent.requests[-1].role == "implement"
        assert any("tile rows by 128" in n for n in agent.requests[-1].notes)
        assert app.link.state.pending == "p2"
        await app.action_quit()


async def test_full_collections_wait_for_a_quiet_keyboard(tmp_path, gelu, judge, monkeypatch):
    import gc
    import time

    from tilewright.tui import app as app_module

    before = gc.get_threshold()
    full: list[int] = []

    def count_full(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    monkeypatch.setattr(app_module, "FULL_GC_AFTER_YOUNG", 0)  # due whenever quiet
    app = make_app(tmp_path, gelu, ScriptedAgent([]), judge)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        assert gc.get_threshold()[2] == app_module.FULL_GC_NEVER  # none on its own
        gc.callbacks.append(count_full)
        try:
            await pilot.press("f6")
            app._collect_when_quiet()
            assert full == []  # a key a moment ago: not now
            app.last_key_at = time.monotonic() - app_module.FULL_GC_QUIET_S
            app._collect_when_quiet()
            assert full == [1]
            full.clear()
            app.last_key_at = time.monotonic()  # typing, but overdue: collect anyway
            app._full_gc_at -= app_module.FULL_GC_MAX_WAIT_S
            app._collect_when_quiet()
            assert full == [1]
        finally:
            gc.callbacks.remove(count_full)
        await app.action_quit()
    assert gc.get_threshold() == before


async def test_a_missing_key_offers_to_open_with_the_offline_agent(tmp_path, gelu, judge):
    from tilewright.tui.launch import LaunchError

    evaluator = PoolEvaluator(judge, EvalOptions(trials=1, time_budget_s=0.05, timeout_s=120))
    asked: list[str | None] = []

    async def opener(agent: str | None = None):
        asked.append(agent)
        if agent != "offline":  # what open_live says for --agent anthropic without a key
            raise LaunchError("No Anthropic API key: set ANTHROPIC_API_KEY",
                              "run with --agent offline", offline_fallback=True)
        link = await start_session(gelu, agents.make_agent("offline", {}), evaluator, {},
                                   sessions_dir=tmp_path, backend=None, chip=CHIP)
        return link, CHIP

    app = TilewrightApp({}, opener, clock=FakeClock())
    async with app.run_test(size=(140, 40)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ErrorModal) and modal.choices == {
            "o": "open it with the offline agent"}
        assert app.workbench.query_one(ActivityLine).busy is None  # no spinner behind it
        await pilot.press("o")
        await settle(app, pilot)
        assert asked == [None, "offline"]
        assert app.link.agent_label == "offline agent"
        assert app.link.state.header["agent"] == "offline agent"  # the session it opened
        await app.action_quit()


async def test_streamed_text_is_coalesced_into_fewer_messages_in_order(tmp_path, gelu, judge):
    words = " ".join(f"w{i}" for i in range(300))
    agent = ScriptedAgent([kernel(faster(gelu.starting_source()))], text=words)
    app = make_app(tmp_path, gelu, agent, judge)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        published: list[str] = []
        app.link.subscribe(lambda e: published.append(e["text"])
                           if e.get("type") == "agent.delta" else None)
        presenter = app.workbench.presenter
        delivered: list[str] = []
        live = presenter.live

        def counted(event):
            if event.get("type") == "agent.delta":
                delivered.append(event["text"])
            live(event)

        presenter.live = counted
        app.link.send_message("go")
        await settle(app, pilot)
        assert "".join(published) == words
        assert "".join(delivered) == words  # nothing lost, nothing reordered
        assert len(delivered) < len(published)
        chat = app.workbench.query_one(ChatPane)
        chat.flush()
        assert words in chat.transcript()
        await app.action_quit()


async def test_status_and_history_word_the_estimate_and_the_palette_checks_chips(
        tmp_path, gelu, pool):
    """Off-TPU the ranking number is the TPU compiler's estimate for v5e: the status bar,
    History and Problems say "est. ... on v5e at 8192x8192 (TPU compiler...)", the compile verdict and
    VMEM of v5e's limit; never "speedup". The chip check compiles v1 for two chips."""
    app = make_app(tmp_path, gelu, ScriptedAgent([]), pool)
    # Wide enough for the status bar's full wording (narrower ones shorten it).
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        screen = app.workbench
        run = [e for e in persisted(app) if e["type"] == "run.result"][-1]
        rank = Rank.from_json(run["rank"])
        assert rank.source == "tpu_estimate" and run["chip"] == "v5e"
        assert run["tpu_compile"] == "ok" and run["vmem_limit_bytes"] == 16 * 2**20
        # For the production shape (8192x8192), not the check shape that ran.
        said = f"est. {rank.value:.2f}x on v5e at 8192x8192 (TPU compiler"
        assert rank.words().startswith(said) and rank.shape == "8192x8192"
        bar = str(screen.query_one(StatusBar).render())
        # The chip is said once, by the backend ("CPU interp→v5e").
        assert "CPU interp→v5e" in bar
        assert f"best v1: est. {rank.value:.2f}x at 8192x8192 (TPU compiler" in bar
        assert "compile ok (VMEM " in bar and "/16.0 MiB)" in bar
        assert "speedup" not in bar
        history = screen.query_one(HistoryPane)
        table = screen.query_one("#history-table")
        cells = [str(c) for c in table.get_row_at(0)]
        assert cells[3] == f"est. {rank.value:.2f}x" and cells[4].startswith("v5e ✓ ")
        # In full, with how far such estimates hold where that is known (Rank.trust_words).
        assert history.border_subtitle == f"v1: {rank_at_length(rank)}"
        problems = screen.query_one(ProblemsPane)
        assert str(problems.border_subtitle).startswith("v5e: compiles · VMEM ")
        # The whole line under the border when it fits, else wrapped below the table.
        below = problems.query_one("#problems-tpu")
        whole = str(below.render()) if below.display else str(problems.border_subtitle)
        assert whole.startswith("v5e: compiles · VMEM ") and \
            whole.endswith(rank_at_length(rank))

        screen.check_chips(1, ["v5e", "v6e"])
        await app.workers.wait_for_complete()
        await pilot.pause()
        chat = screen.query_one(ChatPane)
        chat.flush()
        text = "\n".join(str(n.render()) for n in chat.query(".notice"))
        assert "v1 on TPU chips:" in text
        assert "v5e accepted · VMEM " in text and "est. " in text and "on v6e at 8192x8192 (TPU compiler" in text
        # Nothing recorded: the check answers a question, it does not rank v1.
        assert [e["type"] for e in persisted(app)].count("run.result") == 1
        await app.action_quit()
