"""The session event log on disk: appends, blobs, torn tails, unknown events, newer
schemas, missing blobs, ids and lookup. Real files in a temporary directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tilewright.sessions import log as slog
from tilewright.sessions.log import MissingBlobError, NewerSchemaError, SessionError, SessionLog
from tilewright.sessions.state import fold


def _new(tmp_path: Path, name: str = "gelu") -> SessionLog:
    return SessionLog.create(tmp_path, task={"name": name, "root": "/x", "layout": "native"},
                             backend={"platform": "cpu"}, agent="scripted", app_version="0.1")


def _lines(log: SessionLog) -> list[str]:
    return (log.path / "events.jsonl").read_text().splitlines()


def test_header_then_one_line_per_event(tmp_path: Path) -> None:
    log = _new(tmp_path)
    blob = log.put_blob("def kernel(x):\n    return x\n")
    log.append("kernel.version", version=1, parent=None, origin="initial", proposal=None,
               source_blob=blob, summary="start", decision=None)
    log.append("user.message", text="make it faster")
    lines = _lines(log)
    header = json.loads(lines[0])
    assert header["schema"] == "tilewright.session/1"
    assert header["id"] == log.path.name and header["task"]["name"] == "gelu"
    assert header["parent"] is None and header["agent"] == "scripted"
    events = [json.loads(x) for x in lines[1:]]
    assert [e["seq"] for e in events] == [1, 2]
    assert [e["type"] for e in events] == ["kernel.version", "user.message"]
    assert all(isinstance(e["t"], float | int) and e["t"] >= 0 for e in events)
    assert (log.path / "blobs" / blob).read_text().startswith("def kernel")
    assert (log.path / "profiles").is_dir()


def test_blobs_are_content_addressed(tmp_path: Path) -> None:
    log = _new(tmp_path)
    a = log.put_blob("same")
    b = log.put_blob(b"same")
    assert a == b and len(a) == 64
    assert log.get_blob(a) == b"same"
    assert len(list((log.path / "blobs").iterdir())) == 1


def test_ids_sort_by_creation_time() -> None:
    early = slog.new_session_id("softmax", now=1_700_000_000)
    late = slog.new_session_id("gelu", now=1_700_000_100)
    assert early < late
    assert early.startswith("20231114-221320-softmax-")
    assert "/" not in slog.new_session_id("a/b c")


def test_torn_tail_is_skipped_then_cut_before_the_next_append(tmp_path: Path) -> None:
    log = _new(tmp_path)
    log.append("user.message", text="one")
    log.append("user.message", text="two")
    log.close()
    events_file = log.path / "events.jsonl"
    with open(events_file, "ab") as fh:  # what a kill -9 in the middle of a write leaves
        fh.write(b'{"seq":3,"t":1.0,"type":"user.mess')
    loaded = slog.load(log.path)
    assert [e["text"] for e in loaded.events] == ["one", "two"]
    assert loaded.torn_tail and any("torn last line" in w for w in loaded.warnings)

    reopened, _ = SessionLog.open(log.path)
    event = reopened.append("user.message", text="three")
    reopened.close()
    assert event["seq"] == 3
    again = slog.load(log.path)
    assert not again.warnings and not again.torn_tail
    assert [e["text"] for e in again.events] == ["one", "two", "three"]
    assert events_file.read_bytes().endswith(b'"text":"three"}\n')


def test_a_corrupt_line_inside_the_file_is_reported_and_the_rest_kept(tmp_path: Path) -> None:
    log = _new(tmp_path)
    log.append("user.message", text="one")
    log.close()
    with open(log.path / "events.jsonl", "ab") as fh:
        fh.write(b"not json\n")
    log2, _ = SessionLog.open(log.path)
    log2.append("user.message", text="two")
    loaded = slog.load(log.path)
    assert [e["text"] for e in loaded.events] == ["one", "two"]
    assert any(":3: skipped an unreadable line" in w for w in loaded.warnings)


def test_unknown_event_types_are_kept_and_do_not_break_the_fold(tmp_path: Path) -> None:
    log = _new(tmp_path)
    log.append("user.message", text="hi")
    log.append("future.thing", payload={"x": 1})
    log.append("marker", label="checkpoint")
    loaded = slog.load(log.path)
    assert loaded.events[1] == {**loaded.events[1], "type": "future.thing",
                                "payload": {"x": 1}}
    state = fold(loaded.header, loaded.events)
    assert state.unknown_types == {"future.thing": 1}
    assert state.last_seq == 3


def test_newer_schema_is_refused_with_both_versions_named(tmp_path: Path) -> None:
    log = _new(tmp_path)
    log.close()
    path = log.path / "events.jsonl"
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["schema"] = "tilewright.session/2"
    path.write_text(json.dumps(header) + "\n")
    with pytest.raises(NewerSchemaError) as info:
        slog.load(log.path)
    assert "tilewright.session/2" in str(info.value)
    assert "tilewright.session/1" in str(info.value)
    assert path.read_text().startswith('{"schema": "tilewright.session/2"')  # untouched


def test_not_a_session(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="not a session"):
        slog.load(tmp_path)
    (tmp_path / "events.jsonl").write_text('{"hello": 1}\n')
    with pytest.raises(SessionError, match="not a tilewright session header"):
        slog.load(tmp_path)


def test_missing_blob_is_reported_by_name(tmp_path: Path) -> None:
    log = _new(tmp_path)
    sha = log.put_blob("kernel source")
    (log.path / "blobs" / sha).unlink()
    with pytest.raises(MissingBlobError) as info:
        log.get_blob(sha)
    assert sha in str(info.value) and str(log.path) in str(info.value)
    with pytest.raises(SessionError, match="not a blob name"):
        log.get_blob("../../etc/passwd")


def test_resolve_by_path_id_or_prefix_and_list(tmp_path: Path) -> None:
    a = _new(tmp_path, "gelu")
    b = _new(tmp_path, "softmax")
    assert slog.resolve(str(a.path)) == a.path
    assert slog.resolve(b.id, tmp_path) == b.path
    assert slog.resolve(b.id[:-2], tmp_path) == b.path
    with pytest.raises(SessionError, match="no session 'nope'"):
        slog.resolve("nope", tmp_path)
    assert slog.list_session_dirs(tmp_path) == sorted([a.path, b.path])
    assert slog.list_session_dirs(tmp_path / "absent") == []


def test_closed_log_refuses_appends(tmp_path: Path) -> None:
    log = _new(tmp_path)
    log.close()
    with pytest.raises(SessionError, match="closed"):
        log.append("marker", label="x")
