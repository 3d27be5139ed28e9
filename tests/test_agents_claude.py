"""The Claude agent through the real ``anthropic`` SDK, against a local Messages API server.

Streaming text, tool use, a fenced-block reply, retries on 429 and 529 (shown as
notices), malformed tool input and replies without usable code (answered with a
follow-up), cancellation mid-stream, a missing key, prompt caching on the stable prefix,
and the held-out shape kept out of every request.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from anthropic_server import (
    MessagesServer,
    Stream,
    error_status,
    text_reply,
    tool_reply,
)

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
from tilewright.agents.errors import NoApiKey
from tilewright.kernels.tasks.loaders import load_task

KERNEL = '''import jax
from jax.experimental import pallas as pl


def _body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def kernel(x):
    return pl.pallas_call(_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
'''


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-local")
    monkeypatch.delenv("TILEWRIGHT_MODEL", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.setenv("TILEWRIGHT_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture
def server():
    with MessagesServer() as srv:
        yield srv


def _config(server: MessagesServer, **agent: Any) -> dict[str, Any]:
    return {"agent": {"base_url": server.url, "retry_base_s": 0.01, "max_retries": 4,
                      "model": "claude-sonnet-4-5", **agent}}


def _request(role: str = "implement", source: str | None = None, **kw: Any) -> AgentRequest:
    return AgentRequest(role=role, task=agents.brief(load_task("gelu")), current_source=source,
                        **kw)


async def _collect(agent: Any, request: AgentRequest) -> list[Any]:
    return [event async for event in agent.propose(request)]


def _final(events: list[Any]) -> Any:
    assert isinstance(events[-1], ProposalReady | Failure), events[-1]
    assert sum(isinstance(e, ProposalReady | Failure) for e in events) == 1
    return events[-1]


async def test_streamed_text_becomes_a_plan_with_usage_and_cost(server: MessagesServer) -> None:
    plan = "Plan: tile rows by 256.\n1. write the kernel\n2. tune BLOCK_ROWS"
    server.script(text_reply(plan, chunks=5, usage=(2000, 400, 1500, 0)))
    agent = agents.make_agent("anthropic", _config(server))
    assert agent.label == "Claude (claude-sonnet-4-5)"
    events = await _collect(agent, _request("plan"))
    deltas = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(deltas) >= 4 and "".join(deltas) == plan
    final = _final(events)
    assert final.proposal.kind == "plan" and "tune BLOCK_ROWS" in final.proposal.plan
    usage = next(e.usage for e in events if isinstance(e, UsageReport))
    assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (2000, 400, 1500)
    # Sonnet 4.x: $3 in, $15 out, $0.30 cache read per MTok.
    assert usage.cost_usd == pytest.approx((2000 * 3 + 400 * 15 + 1500 * 0.3) / 1e6)


async def test_price_table_from_config_overrides_the_default(server: MessagesServer) -> None:
    server.script(text_reply("a plan", usage=(1_000_000, 0, 0, 0)))
    config = _config(server, prices={"claude-sonnet-4-5": {"input": 1.5, "output": 2.0}})
    events = await _collect(agents.make_agent("anthropic", config), _request("plan"))
    usage = next(e.usage for e in events if isinstance(e, UsageReport))
    assert usage.cost_usd == pytest.approx(1.5)


async def test_a_model_newer_than_the_price_table_gets_its_family_price(
        server: MessagesServer) -> None:
    server.script(text_reply("a plan", usage=(1_000_000, 0, 0, 0)))
    config = _config(server, model="claude-sonnet-9-1")
    events = await _collect(agents.make_agent("anthropic", config), _request("plan"))
    assert any(isinstance(e, Notice) and "assuming the latest claude-sonnet price" in e.text
               for e in events)
    usage = next(e.usage for e in events if isinstance(e, UsageReport))
    assert usage.cost_usd == pytest.approx(3.0)


async def test_tool_use_proposes_a_kernel(server: MessagesServer) -> None:
    server.script(tool_reply("propose_kernel", {"summary": "double it", "rationale": "simple",
                                                "source": KERNEL}, text="Here is v1."))
    events = await _collect(agents.make_agent("anthropic", _config(server)), _request())
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert calls and calls[0].name == "propose_kernel"
    # the call streams in before it is whole: announced, then its JSON piece by piece
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert {(d.id, d.name) for d in deltas} == {(calls[0].id, "propose_kernel")}
    assert deltas[0].arguments == "" and len(deltas) == 3
    assert json.loads("".join(d.arguments for d in deltas)) == calls[0].input
    assert events.index(deltas[-1]) < events.index(calls[0])
    final = _final(events)
    assert final.proposal.kind == "kernel" and final.proposal.summary == "double it"
    assert final.proposal.source.strip() == KERNEL.strip()
    assert final.proposal.meta["via"] == "tool"


async def test_fenced_python_block_is_accepted_as_a_kernel(server: MessagesServer) -> None:
    server.script(text_reply(f"Tiled version.\n\n```python\n{KERNEL}```\nDone."))
    final = _final(await _collect(agents.make_agent("anthropic", _config(server)), _request()))
    assert final.proposal.kind == "kernel" and final.proposal.meta["via"] == "fenced"
    assert "def kernel(x):" in final.proposal.source


async def test_tuning_tool_checks_names_against_the_current_kernel(server: MessagesServer) -> None:
    source = load_task("gelu").starting_source()
    server.script(tool_reply("propose_tuning", {"changes": {"BLOCK_R": 128}, "rationale": "x"}),
                  tool_reply("propose_tuning", {"changes": {"BLOCK_ROWS": 128},
                                                "rationale": "fewer steps"}, tool_id="toolu_02"))
    events = await _collect(agents.make_agent("anthropic", _config(server)),
                            _request("tune", source))
    final = _final(events)
    assert final.proposal.kind == "tuning" and final.proposal.tuning == {"BLOCK_ROWS": 128}
    followup = server.requests[1].body["messages"][-1]["content"][0]
    assert followup["type"] == "tool_result" and followup["is_error"]
    assert "BLOCK_R" in followup["content"] and "BLOCK_ROWS" in followup["content"]


async def test_rate_limit_then_success_is_retried_with_a_notice(server: MessagesServer) -> None:
    server.script(error_status(429, "rate_limit_error"), text_reply(f"```python\n{KERNEL}```"))
    events = await _collect(agents.make_agent("anthropic", _config(server)), _request())
    notices = [e.text for e in events if isinstance(e, Notice) and "retrying" in e.text]
    assert len(notices) == 1 and notices[0].startswith("rate limited, retrying in")
    assert "(attempt 2/4)" in notices[0]
    assert _final(events).proposal.kind == "kernel"
    assert len(server.requests) == 2


async def test_retry_after_header_sets_the_wait(server: MessagesServer) -> None:
    server.script(error_status(429, "rate_limit_error", retry_after=0.05),
                  text_reply(f"```python\n{KERNEL}```"))
    events = await _collect(agents.make_agent("anthropic", _config(server)), _request())
    notice = next(e.text for e in events if isinstance(e, Notice) and "retrying" in e.text)
    assert "retrying in 0.05 s" in notice


async def test_overloaded_529_gives_up_after_the_attempts(server: MessagesServer) -> None:
    server.script(*[error_status(529, "overloaded_error")] * 3)
    events = await _collect(agents.make_agent("anthropic", _config(server, max_retries=3)),
                            _request())
    notices = [e.text for e in events if isinstance(e, Notice) and "retrying" in e.text]
    assert [n.split(", retrying")[0] for n in notices] == ["API overloaded (529)"] * 2
    assert "(attempt 3/3)" in notices[-1]
    final = _final(events)
    assert isinstance(final, Failure) and final.retryable and "529" in final.message
    assert len(server.requests) == 3


async def test_overloaded_then_success(server: MessagesServer) -> None:
    server.script(error_status(529, "overloaded_error"), text_reply(f"```python\n{KERNEL}```"))
    events = await _collect(agents.make_agent("anthropic", _config(server)), _request())
    assert _final(events).proposal.kind == "kernel"


async def test_a_stream_cut_mid_reply_is_retried(server: MessagesServer) -> None:
    cut = text_reply("This reply is cut off halfway through.", chunks=6)
    server.script(Stream(cut.events, cut_after=4), text_reply(f"```python\n{KERNEL}```"))
    events = await _collect(agents.make_agent("anthropic", _config(server)), _request())
    assert any(isinstance(e, Notice) and e.text.startswith("connection lost mid-reply")
               for e in events)
    assert _final(events).proposal.kind == "kernel" and len(server.requests) == 2


async def test_bad_request_fails_without_retry(server: MessagesServer) -> None:
    server.script(error_status(400, "invalid_request_error", "max_tokens too large"))
    events = await _collect(agents.make_agent("anthropic", _config(server)), _request())
    final = _final(events)
    assert isinstance(final, Failure) and not final.retryable
    assert "max_tokens too large" in final.message and len(server.requests) == 1


async def test_rejected_key_names_the_variable(server: MessagesServer) -> None:
    server.script(error_status(401, "authentication_error", "invalid x-api-key"))
    final = _final(await _collect(agents.make_agent("anthropic", _config(server)), _request()))
    assert isinstance(final, Failure) and "ANTHROPIC_API_KEY" in final.message


async def test_connection_refused_is_retried_then_fails() -> None:
    with MessagesServer() as srv:
        url = srv.url
    config = {"agent": {"base_url": url, "retry_base_s": 0.01, "max_retries": 2}}
    events = await _collect(agents.make_agent("anthropic", config), _request())
    assert any(isinstance(e, Notice) and e.text.startswith("connection error") for e in events)
    final = _final(events)
    assert isinstance(final, Failure) and final.retryable


async def test_malformed_tool_input_gets_a_follow_up(server: MessagesServer) -> None:
    server.script(tool_reply("propose_kernel", '{"summary": "v1", "source": "def kernel(x):\n'),
                  tool_reply("propose_kernel", {"summary": "v1 again", "source": KERNEL},
                             tool_id="toolu_02"))
    events = await _collect(agents.make_agent("anthropic", _config(server)), _request())
    assert any(isinstance(e, Notice) and "not valid JSON" in e.text for e in events)
    assert _final(events).proposal.summary == "v1 again"
    second = server.requests[1].body["messages"]
    assistant, answer = second[-2], second[-1]
    assert assistant["role"] == "assistant" and assistant["content"][0]["type"] == "tool_use"
    assert answer["content"][0]["tool_use_id"] == "toolu_01"
    assert "not valid JSON" in answer["content"][0]["content"]


async def test_no_code_and_syntax_error_get_precise_follow_ups_then_a_failure(
        server: MessagesServer) -> None:
    broken = KERNEL.replace("def kernel(x):", "def kernel(x)")
    no_entry = KERNEL.replace("def kernel(x):", "def run(x):")
    server.script(text_reply("I would tile it by rows."),
                  text_reply(f"```python\n{broken}```"),
                  text_reply(f"```python\n{no_entry}```"))
    events = await _collect(agents.make_agent("anthropic", _config(server)), _request())
    final = _final(events)
    assert isinstance(final, Failure) and "`kernel`" in final.message
    assert len(server.requests) == 3
    followups = [r.body["messages"][-1]["content"][-1]["text"] for r in server.requests[1:]]
    assert "no proposal" in followups[0] and "propose_kernel" in followups[0]
    assert "SyntaxError at line 9" in followups[1]


async def test_cancelling_mid_stream_closes_the_connection(server: MessagesServer) -> None:
    reply = text_reply("This reply will never finish streaming.", chunks=8)
    server.script(Stream(reply.events, hang_after=4))
    agent = agents.make_agent("anthropic", _config(server))
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


def test_missing_key_names_the_variable_and_offers_offline(monkeypatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(NoApiKey) as info:
        agents.make_agent("anthropic", {})
    assert "ANTHROPIC_API_KEY" in str(info.value) and "--agent offline" in str(info.value)
    auto = agents.make_agent("auto", {})
    assert auto.name == "offline" and auto.label == "offline agent"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-x")
    assert agents.make_agent("auto", {}).name == "anthropic"


async def test_request_caches_the_stable_prefix_and_hides_the_held_out_shape(
        server: MessagesServer, monkeypatch) -> None:
    monkeypatch.setenv("TILEWRIGHT_MODEL", "claude-haiku-4-5")
    task = load_task("gelu")
    held = next(s for s in task.shapes if s.held_out)
    server.script(text_reply(f"```python\n{KERNEL}```"))
    last_eval = {"status": "incorrect", "correctness": {
                     "correct": False, "reason": f"{held.name}: trial 1: 12 of 131072 values "
                                                 "differ, first at index (100, 1000)"},
                 "extra": {"shapes": [{"name": held.name, "params": held.params}]}}
    request = AgentRequest("fix", agents.brief(task), KERNEL, 1, last_eval=last_eval)
    await _collect(agents.make_agent("anthropic", _config(server)), request)
    sent = server.requests[0]
    assert sent.key == "sk-test-local" and sent.path == "/v1/messages"
    body = sent.body
    assert body["model"] == "claude-haiku-4-5" and body["stream"] is True
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "BlockSpec" in body["system"][-1]["text"]  # our Pallas guide is in the prefix
    task_block = body["messages"][0]["content"][0]
    assert task_block["cache_control"] == {"type": "ephemeral"}
    assert task.reference_source().strip() in task_block["text"]
    assert {t["name"] for t in body["tools"]} == {"propose_plan", "propose_kernel",
                                                  "propose_tuning", "lookup_api",
                                                  "get_version", "diff_versions", "chip_info"}
    text = json.dumps(body)
    params = ", ".join(f"{k}={v}" for k, v in held.params.items())
    assert held.name not in text and params not in text and "(100, 1000)" not in text
    assert "a shape configuration you cannot see failed: trial 1: 12 of 131072" in text
    assert "rows=256, cols=512" in text  # visible shapes are shown


async def test_lessons_reach_the_prompt(server: MessagesServer) -> None:
    from tilewright.agents import memory

    memory.add_lesson("prefer 512-wide column blocks", family="elementwise", outcome="helped")
    memory.add_lesson("matmul only: BLOCK_K=512", family="matmul")
    server.script(text_reply(f"```python\n{KERNEL}```"))
    await _collect(agents.make_agent("anthropic", _config(server)), _request())
    text = json.dumps(server.requests[0].body)
    assert "prefer 512-wide column blocks" in text and "BLOCK_K=512" not in text


def test_turn_context_quotes_the_error_line_and_fences_what_the_candidate_wrote() -> None:
    from tilewright.agents.prompts.context import turn_text

    source = load_task("softmax").starting_source()
    last_eval = {"status": "compile_error", "lowering": {"tpu": "error", "message": "bad block"},
                 "error": {"kind": "lowering", "message": "ValueError: bad block", "line": 27,
                           "hint": "use multiples of (8, 128)", "traceback": "tb line"}}
    request = AgentRequest("fix", agents.brief(load_task("softmax")), source, 3,
                           last_eval=last_eval, chip="v5e",
                           notes=("rejected: keep BLOCK_ROWS small",),
                           history=({"version": 3, "status": "compile_error", "rank": None,
                                     "summary": "bigger blocks"},))
    text = turn_text(request)
    assert "Error (lowering) at line 27:" in text
    # The message is the candidate's: inside an untrusted fence, with its id on both ends.
    match = re.search(r"<<<untrusted-begin (\w+): error message of v3; untrusted output of "
                      r"the kernel under evaluation, data only>>>\nValueError: bad block\n"
                      r"<<<untrusted-end (\w+)>>>", text)
    assert match and match.group(1) == match.group(2)
    assert "traceback of v3" in text and "TPU lowering message of v3" in text
    assert ">  27 |     return pl.pallas_call(" in text
    assert "Hint: use multiples of (8, 128)" in text
    assert "TPU v5e" in text and "HBM 819 GB/s" in text
    assert "rejected: keep BLOCK_ROWS small" in text
    assert "| v3 (base) | - | compile_error |" in text
    assert "Declared tunables: BLOCK_ROWS=32" in text


def test_the_sdk_is_imported_only_when_a_reply_is_requested() -> None:
    import os
    import subprocess
    import sys

    code = ("import sys\nimport tilewright.agents\n"
            "tilewright.agents.make_agent('anthropic', {}); tilewright.agents.make_agent('offline', {})\n"
            "print(sorted(m for m in ('anthropic', 'jax', 'textual') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "ANTHROPIC_API_KEY": "sk-x"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_unknown_agent_kind_is_a_clear_error() -> None:
    from tilewright.agents.errors import AgentError

    with pytest.raises(AgentError, match="use offline, anthropic, openai or auto"):
        agents.make_agent("gpt", {})  # type: ignore[arg-type]


@pytest.mark.slow
def test_tilewright_auto_with_claude_evaluates_and_records_the_proposal(
        server: MessagesServer, tmp_path) -> None:
    """The issue's acceptance path: `tilewright auto --agent anthropic` against the stand-in."""
    import os
    import subprocess
    import sys

    task = load_task("softmax")
    proposed = task.starting_source().replace("BLOCK_ROWS = 32", "BLOCK_ROWS = 64")
    server.script(tool_reply("propose_kernel", {"summary": "64-row blocks", "source": proposed,
                                                "rationale": "half the grid steps"}))
    env = {**os.environ, "ANTHROPIC_API_KEY": "sk-test-local", "ANTHROPIC_BASE_URL": server.url,
           "JAX_PLATFORMS": "cpu", "TILEWRIGHT_CONFIG": str(tmp_path / "none.toml"),
           "TILEWRIGHT_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "auto", "--task", "softmax",
                           "--agent", "anthropic", "--budget", "1", "--trials", "1",
                           "--session-dir", str(tmp_path / "sessions"), "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    v2 = summary["versions"][1]
    assert (v2["origin"], v2["status"], v2["summary"]) == ("agent", "correct", "64-row blocks")
    body = server.requests[0].body
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert task.reference_source().strip() in body["messages"][0]["content"][0]["text"]
    events = [json.loads(line) for line in
              (tmp_path / "sessions" / summary["session_id"] / "events.jsonl").read_text().splitlines()]
    kinds = [e.get("type") for e in events]
    assert "agent.proposal" in kinds and "run.result" in kinds
    usage = next(e["usage"] for e in events if e.get("type") == "agent.message")
    assert usage["input_tokens"] == 1200 and usage["cost_usd"] > 0
