"""``sessions.opening``: the one way sessions are opened, resumed and closed.

The TUI, ``tilewright auto``, search and branches all open sessions here, so these
tests check what every front end now shares: the header (task with its overrides,
backend, evaluation options), resume from the header (not from the command line or
today's config), the chip the controller diagnoses for, and failures as ``OpenError``
with a next step. Real worker processes (TPU interpret mode on the CPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tilewright.agents import brief
from tilewright.kernels.pool import LocalExecutor
from tilewright.kernels.pool.workers import EvalOptions
from tilewright.sessions.opening import (
    OpenError,
    SessionRequest,
    create_log,
    eval_options,
    load_request_task,
    open_session,
    parse_set,
    reopen_log,
)
from tilewright.sessions.recorded.branch import branch_session
from tilewright.sessions.search import Search
from tilewright.sessions.search.graph import SearchConfig


async def test_one_header_for_every_front_end_and_resume_follows_it(tmp_path: Path) -> None:
    request = SessionRequest(task="gelu", overrides={"rows": "64"}, sessions_dir=tmp_path,
                             agent="offline", eval={"time_budget_s": 0.5})
    session = await open_session(request, {"eval": {"trials": 4}})
    try:
        header = session.log.header
        assert header["task"]["overrides"] == {"rows": "64"}
        assert Path(header["task"]["root"]).is_absolute()
        assert {s["params"]["rows"] for s in header["task"]["shapes"]} == {64}
        # explicit options over the config's [eval] over the defaults, recorded
        assert header["eval_options"]["trials"] == 4
        assert header["eval_options"]["time_budget_s"] == 0.5
        assert header["backend"]["label"] and header["backend"]["mode"] == "tpu-interpret"
        assert session.controller.chip == session.chip.key == "v5e"
        # a search over the same task writes the same task, backend and options
        search = Search.create(tmp_path, session.task, brief(session.task), session.agent,
                               LocalExecutor(workers=1), SearchConfig(),
                               eval_options=EvalOptions(**header["eval_options"]),
                               backend=session.backend)
        try:
            for key in ("task", "backend", "eval_options", "agent"):
                assert search.log.header[key] == header[key], key
        finally:
            search.close()
    finally:
        await session.close("test")
    ended = [json.loads(line) for line in (session.log.path / "events.jsonl").open()]
    assert ended[-1]["type"] == "session.end" and ended[-1]["reason"] == "test"

    # Resumed with a different config: the recorded task (overrides included) and the
    # recorded evaluation options, not today's [eval].
    resumed = await open_session(
        SessionRequest(resume=session.log.id, sessions_dir=tmp_path, agent="offline"),
        {"eval": {"trials": 9}})
    try:
        assert resumed.log.path == session.log.path
        assert resumed.task.meta.get("overrides") == {"rows": "64"}
        assert resumed.controller.state.header["eval_options"]["trials"] == 4
        # a second writer is refused while this one holds the session
        with pytest.raises(OpenError, match=r"lock|in use|another"):
            reopen_log(session.log.id, tmp_path)
    finally:
        await resumed.close("test")

    # A branch keeps the parent's task and evaluation options (written the same way).
    branch = branch_session(session.log.path, 2)
    branched = json.loads((branch / "events.jsonl").open().readline())
    assert branched["task"] == header["task"]
    assert branched["eval_options"] == header["eval_options"]
    assert branched["parent"] == {"session": session.log.id, "seq": 2}


def test_failures_are_open_errors_with_a_next_step(tmp_path: Path) -> None:
    with pytest.raises(OpenError) as missing:
        load_request_task(SessionRequest(task=str(tmp_path / "nope")))
    assert missing.value.next_step
    with pytest.raises(OpenError, match="no task"):
        load_request_task(SessionRequest())
    with pytest.raises(OpenError, match="KEY=VALUE"):
        parse_set(["rows"])
    with pytest.raises(OpenError, match="trails"):  # the config's [eval] is validated
        eval_options({"eval": {"trails": 3}})
    with pytest.raises(OpenError, match="surprise"):  # a recorded option this build lacks
        eval_options({}, recorded={"surprise": 1})
    with pytest.raises(OpenError) as unknown:
        reopen_log("no-such-session", tmp_path)
    assert "tilewright sessions" in unknown.value.next_step
    log = create_log(tmp_path, task=load_request_task(SessionRequest(task="gelu")),
                     backend={"platform": "cpu", "mode": "tpu-interpret"}, agent="offline")
    log.close()
    assert log.header["backend"]["label"]  # the label is derived when a caller omits it
    assert "eval_options" not in log.header


async def test_one_chip_setting_decides_the_judge_and_what_the_session_reasons_for(
        tmp_path: Path) -> None:
    from tilewright.sessions.opening import choose_chip

    # a flag (or a resumed session's record) over [eval] chip over [backend] chip
    assert choose_chip({"backend": {"chip": "v6e"}}).key == "v6e"
    assert choose_chip({"eval": {"chip": "v5p"}, "backend": {"chip": "v6e"}}).key == "v5p"
    assert choose_chip({"backend": {"chip": "v6e"}}, None, "v4").key == "v4"
    assert choose_chip({}).key == "v5e"  # a CPU host's target
    request = SessionRequest(task="gelu", overrides={"rows": "64"}, sessions_dir=tmp_path,
                             agent="offline")
    session = await open_session(request, {"backend": {"chip": "v6e"}})
    try:
        # the judge compiles for the chip the gauges, prompt and diagnoses are for
        assert session.chip.key == session.controller.chip == "v6e"
        assert session.log.header["eval_options"]["chip"] == "v6e"
    finally:
        await session.close("test")
