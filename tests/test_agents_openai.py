"""The OpenAI-compatible agent through the real ``openai`` SDK, against a local server.

A stand-in for vLLM / Ollama / Gemini's endpoint on 127.0.0.1 (``openai_server``):
streamed text, tool-call arguments split across chunks, a model without tools answering
in a fenced block, 429 then success, 500s until the retries run out, malformed chunks,
a cut stream, cancellation, keys and key-less local servers, unknown prices; then the
whole path: the TUI opened with ``--agent openai``, ``tilewright auto --agent openai``,
and the recorded session replayed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai_server import ChatServer, Stream, error_status, text_reply, tool_reply
from waiting import until

from tilewright import agents
from tilewright.agents.base import (
    AgentRequest,
    Failure,
    Notice,
    ProposalReady,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    UsageReport,
)
from tilewright.agents.errors import AgentError
from tilewright.kernels.tasks.loaders import load_task

ROOT = Path(__file__).resolve().parent.parent

KERNEL = '''import jax
from jax.experimental import pallas as pl


def _body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def kernel(x):
    return pl.pallas_call(_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
'''


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "GEMINI_API_KEY", "TILEWRIGHT_MODEL",
                 "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TILEWRIGHT_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture
def server():
    with ChatServer() as srv:
        yield srv


def _config(server: ChatServer, **agent: Any) -> dict[str, Any]:
    return {"agent": {"base_url": server.url, "retry_base_s": 0.01, "max_retries": 4,
                      "model": "gpt-4.1", **agent}}


def _request(role: str = "implement", source: str | None = None, **kw: Any) -> AgentRequest:
    return AgentRequest(role=role, task=agents.brief(load_task("gelu")), current_source=source,
                        **kw)


async def _collect(config: dict[str, Any], request: AgentRequest) -> list[Any]:
    agent = agents.make_agent("openai", config)
    return [event async for event in agent.propose(request)]


def _final(events: list[Any]) -> Any:
    assert isinstance(events[-1], ProposalReady | Failure), events[-1]
    assert sum(isinstance(e, ProposalReady | Failure) for e in events) == 1
    return events[-1]


def _retries(events: list[Any]) -> list[str]:
    return [e.text for e in events if isinstance(e, Notice) and "retrying" in e.text]


async def test_streamed_text_is_a_plan_with_usage_cost_and_the_request_in_chat_form(
        server: ChatServer) -> None:
    plan = "Plan: tile rows by 256.\n1. write the kernel\n2. tune BLOCK_ROWS"
    server.script(text_reply(plan, chunks=5, usage=(3000, 400, 1000)))
    events = await _collect(_config(server), _request("plan"))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) >= 4 and "".join(deltas) == plan
    final = _final(events)
    assert final.proposal.kind == "plan" and "tune BLOCK_ROWS" in final.proposal.plan
    usage = next(e.usage for e in events if isinstance(e, UsageReport))
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (2000, 400, 1000)
    # gpt-4.1: $2 in, $8 out, $0.50 cached in, per MTok.
    assert usage.cost_known and usage.cost_usd == pytest.approx(
        (2000 * 2 + 400 * 8 + 1000 * 0.5) / 1e6)
    sent = server.requests[0]
    body = sent.body
    assert sent.path == "/v1/chat/completions" and sent.key == "not-needed"  # key-less
    assert body["model"] == "gpt-4.1" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "BlockSpec" in body["messages"][0]["content"]  # the shared Pallas guide
    assert isinstance(body["messages"][1]["content"], str)  # plain strings: local servers
    assert load_task("gelu").reference_source().strip() in body["messages"][1]["content"]
    assert {t["function"]["name"] for t in body["tools"]} >= {"propose_plan", "propose_kernel",
                                                              "propose_tuning"}
    kernel_tool = next(t for t in body["tools"] if t["function"]["name"] == "propose_kernel")
    assert kernel_tool["type"] == "function"
    assert kernel_tool["function"]["parameters"]["required"] == ["summary", "source"]


async def test_tool_call_arguments_split_across_chunks_propose_a_kernel(
        server: ChatServer) -> None:
    server.script(tool_reply("propose_kernel", {"summary": "double it", "rationale": "simple",
                                                "source": KERNEL}, text="Here is v1.", split=7))
    events = await _collect(_config(server), _request())
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [(c.name, c.id) for c in calls] == [("propose_kernel", "call_01")]
    final = _final(events)
    assert final.proposal.kind == "kernel" and final.proposal.summary == "double it"
    assert final.proposal.source.strip() == KERNEL.strip() and final.proposal.meta["via"] == "tool"


async def test_a_tool_call_streams_in_before_the_reply_completes(server: ChatServer) -> None:
    """The server stops after the call's argument chunks, before its last chunk: the
    call has already arrived piece by piece (same id as the whole call that follows);
    the whole call and the proposal come only once the reply ends."""
    arguments = {"summary": "double it", "rationale": "simple", "source": KERNEL}
    reply = tool_reply("propose_kernel", arguments, split=6)
    last = next(n for n, c in enumerate(reply.chunks)
                if isinstance(c, dict) and c["choices"] and c["choices"][0]["finish_reason"])
    server.script(Stream(reply.chunks, hang_after=last))
    agent = agents.make_agent("openai", _config(server))
    seen: list[Any] = []

    async def consume() -> None:
        async for event in agent.propose(_request()):
            seen.append(event)

    task = asyncio.create_task(consume())
    try:
        await until(lambda: "".join(e.arguments for e in seen if isinstance(e, ToolCallDelta))
                    == json.dumps(arguments), "every piece of the arguments", 20)
        deltas = [e for e in seen if isinstance(e, ToolCallDelta)]
        assert {(d.id, d.name) for d in deltas} == {("call_01", "propose_kernel")}
        assert len(deltas) == 6
        assert not any(isinstance(e, ToolCall | ProposalReady) for e in seen)  # still streaming
    finally:
        server.release.set()
    await asyncio.wait_for(task, timeout=30)
    calls = [e for e in seen if isinstance(e, ToolCall)]
    assert [(c.name, c.id) for c in calls] == [("propose_kernel", "call_01")]
    assert _final(seen).proposal.summary == "double it"


async def test_a_model_without_tools_is_asked_again_without_them_and_answers_fenced(
        server: ChatServer) -> None:
    server.script(error_status(400, "registry.ollama.ai/library/gemma3:4b does not support "
                                    "tools", kind="invalid_request_error"),
                  text_reply(f"Doubling.\n\n```python\n{KERNEL}```\n", model="gemma3:4b"),
                  text_reply(f"Again.\n\n```python\n{KERNEL}```\n", model="gemma3:4b"))
    config = _config(server, model="gemma3:4b")
    agent = agents.make_agent("openai", config)
    events = [e async for e in agent.propose(_request())]
    assert any(isinstance(e, Notice) and "does not take tools" in e.text for e in events)
    final = _final(events)
    assert final.proposal.kind == "kernel" and final.proposal.meta["via"] == "fenced"
    assert "tools" in server.requests[0].body and "tools" not in server.requests[1].body
    [e async for e in agent.propose(_request())]  # remembered: no refused request again
    assert len(server.requests) == 3 and "tools" not in server.requests[2].body


async def test_tools_false_in_the_config_sends_none(server: ChatServer) -> None:
    server.script(text_reply(f"```python\n{KERNEL}```"))
    final = _final(await _collect(_config(server, tools=False), _request()))
    assert final.proposal.meta["via"] == "fenced" and "tools" not in server.requests[0].body


async def test_rate_limit_then_success_is_retried_with_the_claude_notice(
        server: ChatServer) -> None:
    server.script(error_status(429, "Rate limit reached", kind="rate_limit_exceeded",
                               retry_after=0.05),
                  tool_reply("propose_kernel", {"summary": "v1", "source": KERNEL}))
    events = await _collect(_config(server), _request())
    assert _retries(events) == ["rate limited, retrying in 0.05 s (attempt 2/4)"]
    assert _final(events).proposal.kind == "kernel" and len(server.requests) == 2


async def test_server_errors_until_the_retries_run_out_fail_retryably(
        server: ChatServer) -> None:
    server.script(*[error_status(500, "internal error")] * 3)
    events = await _collect(_config(server, max_retries=3), _request())
    notices = _retries(events)
    assert [n.split(", retrying")[0] for n in notices] == ["server error (500)"] * 2
    assert "(attempt 3/3)" in notices[-1]
    final = _final(events)
    assert isinstance(final, Failure) and final.retryable
    assert final.message.startswith("server error (500); gave up after 3 attempts")
    assert len(server.requests) == 3


async def test_malformed_chunks_are_skipped_with_a_warning(server: ChatServer) -> None:
    reply = text_reply(f"```python\n{KERNEL}```", chunks=3)
    reply.chunks.insert(2, '{"choices": [{"index": 0, "delta": {"content": "x"')
    reply.chunks.insert(3, "<html>502 Bad Gateway</html>")
    server.script(reply)
    events = await _collect(_config(server), _request())
    skipped = [e.text for e in events if isinstance(e, Notice) and "malformed chunk" in e.text]
    assert len(skipped) == 1 and "not JSON" in skipped[0]  # said once per reply
    assert _final(events).proposal.kind == "kernel"


async def test_malformed_tool_arguments_are_answered_in_a_tool_message(
        server: ChatServer) -> None:
    server.script(tool_reply("propose_kernel", '{"summary": "v1", "source": "def kernel(x):\n'),
                  tool_reply("propose_kernel", {"summary": "v1 again", "source": KERNEL},
                             call_id="call_02"))
    events = await _collect(_config(server), _request())
    assert any(isinstance(e, Notice) and "not valid JSON" in e.text for e in events)
    assert _final(events).proposal.summary == "v1 again"
    second = server.requests[1].body["messages"]
    assistant, answer = second[-2], second[-1]
    assert assistant["role"] == "assistant"
    assert assistant["tool_calls"][0]["id"] == "call_01"
    assert answer == {"role": "tool", "tool_call_id": "call_01",
                      "content": answer["content"]} and "not valid JSON" in answer["content"]


async def test_a_stream_cut_mid_reply_is_retried(server: ChatServer) -> None:
    cut = text_reply("This reply is cut off halfway through.", chunks=6)
    server.script(Stream(cut.chunks, cut_after=3), text_reply(f"```python\n{KERNEL}```"))
    events = await _collect(_config(server), _request())
    assert any(isinstance(e, Notice) and e.text.startswith("connection lost mid-reply")
               for e in events)
    assert _final(events).proposal.kind == "kernel" and len(server.requests) == 2


async def test_cancelling_mid_stream_closes_the_connection(server: ChatServer) -> None:
    reply = text_reply("This reply will never finish streaming.", chunks=8)
    server.script(Stream(reply.chunks, hang_after=4))
    agent = agents.make_agent("openai", _config(server))
    first = asyncio.Event()
    seen: list[Any] = []

    async def consume() -> None:
        async for event in agent.propose(_request()):
            seen.append(event)
            if isinstance(event, TextDelta):
                first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), timeout=30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(server.disconnected.wait, 20)
    assert not any(isinstance(e, ProposalReady | Failure) for e in seen)


async def test_an_unknown_model_costs_unknown_and_a_config_price_counts_it(
        server: ChatServer) -> None:
    server.script(text_reply("a plan", usage=(1_000_000, 0, 0)),
                  text_reply("a plan", usage=(1_000_000, 0, 0)))
    events = await _collect(_config(server, model="qwen3-coder:30b"), _request("plan"))
    assert any(isinstance(e, Notice) and "cost shows as unknown" in e.text for e in events)
    usage = next(e.usage for e in events if isinstance(e, UsageReport))
    assert usage.cost_known is False and usage.input_tokens == 1_000_000
    priced = _config(server, model="qwen3-coder:30b",
                     prices={"qwen3-coder": {"input": 0.5, "output": 1.0}})
    usage = next(e.usage for e in await _collect(priced, _request("plan"))
                 if isinstance(e, UsageReport))
    assert usage.cost_known and usage.cost_usd == pytest.approx(0.5)


async def test_a_key_is_sent_as_bearer_and_a_rejected_one_names_the_variable(
        monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    with ChatServer(key="sk-other") as srv:
        final = _final(await _collect(_config(srv), _request()))
        assert srv.requests[0].key == "sk-local-test"
    assert isinstance(final, Failure) and not final.retryable
    assert "401" in final.message and "OPENAI_API_KEY" in final.message
    assert "sk-local-test" not in final.message


def test_missing_key_and_missing_server_are_one_line_naming_what_to_set(monkeypatch) -> None:
    with pytest.raises(AgentError) as info:
        agents.make_agent("openai", {})  # OpenAI's own endpoint needs a key
    message = str(info.value)
    assert "OPENAI_API_KEY" in message and "--agent offline" in message and "\n" not in message
    gemini = {"agent": {"base_url": "https://generativelanguage.googleapis.com/v1beta/openai/"}}
    with pytest.raises(AgentError, match="GEMINI_API_KEY or OPENAI_API_KEY"):
        agents.make_agent("openai", gemini)
    with ChatServer() as srv:
        url = srv.url  # closed on leaving: nothing listens there any more
    with pytest.raises(AgentError) as info:
        agents.make_agent("openai", {"agent": {"base_url": url}})
    message = str(info.value)
    assert url in message and "OPENAI_BASE_URL" in message and "--agent offline" in message


def test_auto_follows_the_configured_provider(monkeypatch, server: ChatServer) -> None:
    openai_cfg = {"agent": {"provider": "openai", "model": "gpt-4.1"}}
    assert agents.make_agent("auto", openai_cfg).name == "offline"  # no key for OpenAI
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    assert agents.make_agent("auto", openai_cfg).label == "gpt-4.1"
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)  # key-less local server
    agent = agents.make_agent("auto", openai_cfg)
    assert agent.name == "openai" and agent.label == "gpt-4.1 at 127.0.0.1"
    assert agents.describe_agent(None, openai_cfg) == {
        "kind": "auto", "provider": "openai", "model": "gpt-4.1", "endpoint": server.url,
        "key": "none (key-less local server)"}
    with pytest.raises(AgentError, match="use anthropic or openai"):
        agents.make_agent("auto", {"agent": {"provider": "gemini"}})


def test_the_sdk_is_imported_only_when_a_reply_is_requested(server: ChatServer) -> None:
    code = ("import sys\nimport tilewright.agents\n"
            f"tilewright.agents.make_agent('openai', {{'agent': {{'base_url': {server.url!r}}}}})\n"
            "print(sorted(m for m in ('openai', 'anthropic', 'jax', 'textual') "
            "if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_config_shows_the_effective_provider_model_and_endpoint_never_the_key(
        tmp_path: Path, server: ChatServer) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[agent]\nprovider = "openai"\nmodel = "qwen3"\n'
                      f'base_url = "{server.url}"\n')
    env = {"TILEWRIGHT_CONFIG": str(config), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "OPENAI_API_KEY": "sk-secret-value"}
    out = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "config"], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "sk-secret-value" not in out.stdout
    assert "# agent in effect: openai, model qwen3, endpoint " + server.url in out.stdout
    assert "# key: from OPENAI_API_KEY" in out.stdout
    import tomllib

    tomllib.loads(out.stdout)  # still a valid config file


# -- the whole path: TUI, headless auto, replay ------------------------------------------

def _proposed(task_name: str = "gelu") -> str:
    source = load_task(task_name).starting_source()
    assert "BLOCK_ROWS = 64" in source
    return source.replace("BLOCK_ROWS = 64", "BLOCK_ROWS = 128")


@pytest.mark.slow
async def test_the_tui_opened_with_agent_openai_streams_applies_and_evaluates(
        tmp_path, monkeypatch, server: ChatServer) -> None:
    """Through the real launch path (open_live: make_agent, worker pool, session log)."""
    from tilewright.tui.app import TilewrightApp
    from tilewright.tui.launch import LaunchOptions, open_live
    from tilewright.tui.screens.modals import ErrorModal
    from tilewright.tui.widgets.chat import ChatPane

    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    server.script(tool_reply("propose_kernel", {"summary": "taller blocks",
                                                "rationale": "fewer grid steps",
                                                "source": _proposed()},
                             text="Fewer, taller blocks.", split=5))
    config = {"agent": {"retry_base_s": 0.01, "max_retries": 2, "model": "gpt-4.1"},
              "eval": {"trials": 1, "time_budget_s": 0.05}}
    options = LaunchOptions(task="gelu", session_dir=str(tmp_path), agent="openai")
    now = [1000.0]
    app = TilewrightApp(config, lambda: open_live(options, config), clock=lambda: now[0])
    async with app.run_test(size=(140, 40)) as pilot:
        await app.workers.wait_for_complete()
        await until(lambda: app.link is not None or isinstance(app.screen, ErrorModal),
                    "the session to open")
        assert not isinstance(app.screen, ErrorModal), app.screen.message
        await app.link.wait_idle()
        assert app.link.agent_label == "gpt-4.1 at 127.0.0.1"
        await pilot.press("ctrl+r")
        await app.workers.wait_for_complete()
        await app.link.wait_idle()
        for _ in range(3):
            await pilot.pause()
        assert app.link.state.pending == "p1"
        chat = app.workbench.query_one(ChatPane)
        chat.flush()
        assert "propose_kernel" in chat.transcript() or any(
            "propose_kernel" in str(c.title) for c in chat.query("Collapsible"))
        now[0] += 1
        await pilot.press("ctrl+y")
        await app.workers.wait_for_complete()
        await app.link.wait_idle()
        for _ in range(3):
            await pilot.pause()
        assert app.link.state.versions[2].status == "correct"
        assert app.link.state.spent.tokens > 0
        assert "tools" in server.requests[0].body and server.requests[0].body["stream"]
        await app.action_quit()


async def test_the_chat_shows_a_tool_call_while_it_streams(tmp_path, monkeypatch,
                                                          server: ChatServer) -> None:
    """The TUI with ``--agent openai``: a message typed into the chat is answered with a
    proposing tool call whose reply stops before its last chunk; the chat already shows
    the call (its arguments so far) while the agent is still replying, and the proposal
    then fills in that same entry."""
    from tilewright.tui.app import TilewrightApp
    from tilewright.tui.launch import LaunchOptions, open_live
    from tilewright.tui.screens.modals import ErrorModal
    from tilewright.tui.widgets.chat import ChatPane

    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    arguments = {"summary": "taller blocks", "rationale": "fewer grid steps",
                 "source": _proposed()}
    reply = tool_reply("propose_kernel", arguments, text="Fewer, taller blocks.", split=5)
    last = next(n for n, c in enumerate(reply.chunks)
                if isinstance(c, dict) and c["choices"] and c["choices"][0]["finish_reason"])
    server.script(Stream(reply.chunks, hang_after=last))
    config = {"agent": {"retry_base_s": 0.01, "max_retries": 2, "model": "gpt-4.1"},
              "controller": {"record_lessons": False}}
    options = LaunchOptions(task="gelu", session_dir=str(tmp_path), agent="openai")
    app = TilewrightApp(config, lambda: open_live(options, config))
    try:
        async with app.run_test(size=(140, 40)) as pilot:
            await app.workers.wait_for_complete()
            await until(lambda: app.link is not None or isinstance(app.screen, ErrorModal),
                        "the session to open")
            assert not isinstance(app.screen, ErrorModal), app.screen.message
            await app.link.wait_idle()
            chat = app.workbench.query_one(ChatPane)
            chat.query_one("#chat-input").focus()
            await pilot.press(*"make it faster", "enter")
            full = len(json.dumps(arguments))
            want = f"tool: propose_kernel (streaming · {full} chars)"

            def streamed() -> str:
                chat.flush()
                return next((t for t in (str(c.title) for c in chat.query("Collapsible"))
                             if "propose_kernel" in t), "")

            await until(lambda: streamed() == want, f"the title {want!r}", timeout=20)
            assert app.link.busy == "agent" and app.link.state.pending is None
            server.release.set()
            await app.link.wait_idle()
            for _ in range(3):
                await pilot.pause()
            assert app.link.state.pending == "p1"
            titles = [str(c.title) for c in chat.query("Collapsible")]
            assert titles == ["tool: propose_kernel (p1: taller blocks)"], titles
            await app.action_quit()
    finally:
        server.release.set()


@pytest.mark.slow
def test_tilewright_auto_with_agent_openai_evaluates_records_and_replays(
        server: ChatServer, tmp_path) -> None:
    """The issue's acceptance path: `tilewright auto --agent openai` against the stand-in,
    then `tilewright replay --headless` shows what it proposed."""
    server.script(tool_reply("propose_kernel", {"summary": "128-row blocks",
                                                "source": _proposed(),
                                                "rationale": "half the grid steps"},
                             split=4))
    env = {**os.environ, "OPENAI_BASE_URL": server.url, "JAX_PLATFORMS": "cpu",
           "TILEWRIGHT_CONFIG": str(tmp_path / "none.toml"),
           "TILEWRIGHT_DATA_DIR": str(tmp_path / "data")}
    env.pop("OPENAI_API_KEY", None)
    sessions = tmp_path / "sessions"
    proc = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "auto", "--task", "gelu",
                           "--agent", "openai", "--budget", "1", "--trials", "1",
                           "--session-dir", str(sessions), "--json"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    v2 = summary["versions"][1]
    assert (v2["origin"], v2["status"], v2["summary"]) == ("agent", "correct", "128-row blocks")
    assert "gpt-4.1 at 127.0.0.1" in proc.stderr
    body = server.requests[0].body
    assert body["stream"] is True and "propose_kernel" in json.dumps(body["tools"])
    log = sessions / summary["session_id"] / "events.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert "agent.proposal" in [e.get("type") for e in events]
    usage = next(e["usage"] for e in events if e.get("type") == "agent.message")
    assert usage["input_tokens"] == 1500 - 1024 and usage["cost_usd"] > 0
    replay = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "replay", summary["session_id"],
                             "--session-dir", str(sessions), "--headless"],
                            capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert replay.returncode == 0, replay.stderr
    assert "128-row blocks" in replay.stdout


def test_a_session_with_an_unpriced_model_shows_its_cost_as_unknown() -> None:
    from dataclasses import asdict

    from tilewright.agents.base import Usage
    from tilewright.agents.providers.provider import add_usage
    from tilewright.sessions.state import fold

    priced = Usage(input_tokens=10, cost_usd=0.25)
    unpriced = Usage(input_tokens=10, cost_known=False)
    assert add_usage(priced, unpriced).cost_known is False

    def message(seq: int, usage: Usage) -> dict[str, Any]:
        return {"seq": seq, "t": float(seq), "type": "agent.message", "text": "",
                "usage": asdict(usage)}

    assert fold({}, [message(1, priced)]).spent.cost_text() == "$0.2500"
    assert fold({}, [message(1, unpriced)]).spent.cost_text() == "unknown"
    both = fold({}, [message(1, priced), message(2, unpriced)]).spent
    assert both.cost_text(2) == "$0.25 + unknown" and both.tokens == 20


def test_auto_without_a_server_or_key_says_what_to_set_and_offers_offline(tmp_path) -> None:
    with ChatServer() as srv:
        url = srv.url  # nothing listens there once closed
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "GEMINI_"))}
    for extra, names in (({"OPENAI_BASE_URL": url}, (url, "OPENAI_BASE_URL")),
                         ({}, ("OPENAI_API_KEY",))):
        proc = subprocess.run(
            [sys.executable, "-m", "tilewright.tui.cli", "auto", "--task", "gelu", "--agent", "openai",
             "--session-dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
            env={**base, **extra, "TILEWRIGHT_CONFIG": str(tmp_path / "none.toml")},
            timeout=120)
        assert proc.returncode == 2, proc.stderr
        first = proc.stderr.splitlines()[0]
        assert all(n in first for n in names) and "--agent offline" in first, proc.stderr
    assert not list(tmp_path.iterdir())  # no session was started


async def test_the_tui_offers_the_offline_agent_when_no_server_listens(tmp_path,
                                                                      monkeypatch) -> None:
    from tilewright.tui.app import TilewrightApp
    from tilewright.tui.launch import LaunchOptions, open_live
    from tilewright.tui.screens.modals import ErrorModal

    with ChatServer() as srv:
        url = srv.url
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    options = LaunchOptions(task="gelu", session_dir=str(tmp_path), agent="openai")
    app = TilewrightApp({}, lambda: open_live(options, {}))
    async with app.run_test(size=(120, 30)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        modal = app.screen
        assert isinstance(modal, ErrorModal)
        assert url in modal.message and "OPENAI_BASE_URL" in modal.message
        assert modal.choices == {"o": "open it with the offline agent"}
        assert "start the server" in modal.next_step
