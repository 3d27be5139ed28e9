"""The chat as a conversation, in the real app (Pilot): a question typed into the chat is
answered through the real ``anthropic`` SDK against the local Messages API server, with
a read-only tool call shown as a collapsible entry; ``/plan`` and ``/explain`` parse
into controller commands."""

from __future__ import annotations

import pytest
import pytest_asyncio
from anthropic_server import MessagesServer, text_reply, tool_reply
from test_tui_flow import FakeClock, kinds, make_app, persisted, settle

import agents
from kernels.loaders import load_task
from kernels.workers import WorkerPool
from tui.screens.workbench import slash_command
from tui.widgets.chat import ChatPane

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
