"""The chat as a conversation, in the real app (Pilot): a question typed into the chat is
answered through the real ``anthropic`` SDK against the local Messages API server, with
a read-only tool call shown as a collapsible entry; ``/plan`` and ``/explain`` parse
into controller commands; F2 edits a pending plan and the edit approves it."""

from __future__ import annotations

import pytest
import pytest_asyncio
from anthropic_server import MessagesServer, text_reply, tool_reply
from scripted_agent import ScriptedAgent, kernel, plan
from textual.widgets import TextArea
from tui_apps import FakeClock, kinds, make_app, persisted, settle

from tilewright import agents
from tilewright.kernels.pool.workers import WorkerPool
from tilewright.kernels.tasks.loaders import load_task
from tilewright.tui.screens.modals import PlanEditor
from tilewright.tui.screens.workbench import slash_command
from tilewright.tui.widgets.chat import ChatPane

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool():
    async with WorkerPool() as p:
        yield p


async def test_a_question_typed_into_the_chat_is_answered(tmp_path, pool, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-local")
    gelu = load_task("gelu")
    with MessagesServer() as server:
        server.script(tool_reply("lookup_api", {"name": "pl.BlockSpec"}, text="Checking."),
                      text_reply("It is bound by per-step overhead."))
        config = {"agent": {"base_url": server.url, "retry_base_s": 0.01, "max_retries": 1,
                            "model": "claude-sonnet-4-5"},
                  "controller": {"record_lessons": False}}
        agent = agents.make_agent("anthropic", config)
        app = make_app(tmp_path, gelu, agent, pool, FakeClock(), config=config)
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(app, pilot)
            chat = app.workbench.query_one(ChatPane)
            chat.query_one("#chat-input").focus()
            await pilot.press(*"why is v1 slow?", "enter")
            await settle(app, pilot)
            chat.flush()
            await pilot.pause()
            assert "It is bound by per-step overhead." in chat.transcript()
            labels = [str(w.content) for w in chat.query(".agent-label")]
            assert any(label.endswith("· answer") for label in labels), labels
            titles = [str(c.title) for c in chat.query("Collapsible")]
            assert titles == ["tool: lookup_api (read-only)"], titles
            assert "error" not in kinds(app) and "agent.proposal" not in kinds(app)
            answer = [e for e in persisted(app) if e["type"] == "agent.message"][-1]
            assert answer["answer"] is True
            await app.action_quit()


async def test_slash_commands_parse_into_controller_commands() -> None:
    assert slash_command("why?") is None
    assert slash_command("/plan") == ("request_plan", None)
    assert slash_command("/plan fuse the epilogue") == ("request_plan", "fuse the epilogue")
    assert slash_command("/explain") == ("explain", None, None)
    assert slash_command("/explain v3") == ("explain", 3, None)
    assert slash_command("/explain v3 why slower?") == ("explain", 3, "why slower?")
    assert slash_command("/explain why slower?") == ("explain", None, "why slower?")
    assert slash_command("/frobnicate")[0] == "unknown"


async def test_f2_on_a_pending_plan_edits_it_and_the_edit_approves_it(tmp_path, pool):
    """F2 on a plan opens an editor; submitting records the edited plan as the approving
    decision, and the implementer is then asked for step 1 of the edited plan. Escape
    leaves the plan pending."""
    gelu = load_task("gelu")
    agent = ScriptedAgent([plan("1. bigger tiles\n2. fuse the epilogue\n3. tune"),
                           kernel(gelu.starting_source().replace("BLOCK_ROWS = 64",
                                                                 "BLOCK_ROWS = 128"),
                                  "bigger tiles")])
    clock = FakeClock()
    app = make_app(tmp_path, gelu, agent, pool, clock,
                   config={"controller": {"record_lessons": False}})
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        chat = app.workbench.query_one(ChatPane)
        chat.query_one("#chat-input").focus()
        await pilot.press(*"/plan make it faster", "enter")
        await settle(app, pilot)
        assert agent.requests[-1].role == "plan"
        assert app.link.state.pending == "p1"
        clock.now += 0.6  # past the approval guard
        await pilot.press("f2")
        await pilot.pause()
        editor = app.screen
        assert isinstance(editor, PlanEditor)
        assert editor.query_one(TextArea).text == "1. bigger tiles\n2. fuse the epilogue\n3. tune"
        await pilot.press("escape")  # back: nothing decided
        await pilot.pause()
        assert not isinstance(app.screen, PlanEditor) and app.link.state.pending == "p1"
        assert "user.decision" not in kinds(app)
        await pilot.press("f2")
        await pilot.pause()
        area = app.screen.query_one(TextArea)
        area.text = "1. bigger tiles only"
        await pilot.press("ctrl+y")  # the approve key submits the edited plan
        await settle(app, pilot)
        decisions = [e for e in persisted(app) if e["type"] == "user.decision"]
        assert len(decisions) == 1
        assert decisions[0]["decision"] == "approve" and decisions[0]["by"] == "user"
        assert decisions[0]["plan"] == "1. bigger tiles only"
        implement = agent.requests[-1]
        assert implement.role == "implement"
        assert any("step 1 of 1" in n and "bigger tiles only" in n for n in implement.notes)
        assert app.link.state.pending == "p2"
        await app.action_quit()
