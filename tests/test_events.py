"""The event table is complete: every kind the code writes has a TypedDict in
``sessions.events``, and every reader's handler table reads the kind it is filed under.

The emitters are found by reading the source (an AST walk over ``sessions/`` and
``tui/``), so a new kind written as a plain string, or a TypedDict built with another
kind's ``type``, fails here before it reaches a log.
"""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest

from tilewright.sessions import events as ev
from tilewright.sessions import state
from tilewright.sessions.cli import headless
from tilewright.sessions.cli import search as search_cli
from tilewright.sessions.recorded import replay
from tilewright.sessions.search import graph
from tilewright.tui.session import presenter

ROOT = Path(__file__).resolve().parents[1]
WRITERS = ("sessions", "tui")  # the packages that write or publish events


def _kind(typed: Any) -> str:
    """The one ``type`` Literal of an event TypedDict."""
    literal = get_type_hints(typed)["type"]
    assert get_origin(literal) is typing.Literal, f"{typed.__name__}.type is not a Literal"
    (kind,) = get_args(literal)
    return kind


def _members(union: Any) -> list[Any]:
    return list(get_args(union)) or [union]


PERSISTED = {_kind(t): t for t in _members(ev.Event)}
LIVE = {_kind(t): t for t in _members(ev.LiveEvent)}
TYPED = {t.__name__: t for t in (*PERSISTED.values(), *LIVE.values())}


def test_each_kind_has_one_typeddict_and_the_literal_lists_agree() -> None:
    assert len(PERSISTED) == len(_members(ev.Event)), "two TypedDicts share a kind"
    assert len(LIVE) == len(_members(ev.LiveEvent)), "two live TypedDicts share a kind"
    assert set(PERSISTED) == set(get_args(ev.EventType))
    assert set(LIVE) == set(get_args(ev.LiveType)) == ev.LIVE_TYPES
    assert not set(PERSISTED) & set(LIVE)
    for kind in ev.DELTA_TYPES:  # joined by their text
        assert kind in LIVE and "text" in get_type_hints(LIVE[kind])


# -- what the code writes ---------------------------------------------------------------


def _const(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) \
        else None


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def written_kinds(source: str, where: str) -> tuple[set[str], set[str], list[str]]:
    """(persisted kinds, live kinds, problems) in one module's source.

    Persisted: ``ev.X(type="k", ...)`` (k must be X's own kind), ``<...>log.append("k",
    ...)``, and any ``{"type": "k", ...}`` literal. Live: ``live("k", ...)`` or
    ``_live("k", ...)``. Any other call with a string ``type=`` is an event built
    without its TypedDict."""
    persisted: set[str] = set()
    live: set[str] = set()
    problems: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                kind = _const(value) if key is not None and _const(key) == "type" else None
                if kind is not None:
                    problems.append(f"{where}:{node.lineno}: event {kind!r} written as a "
                                    "plain dict; build it with its tilewright.sessions.events TypedDict")
                    persisted.add(kind)
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        first = _const(node.args[0]) if node.args else None
        for keyword in node.keywords:
            kind = _const(keyword.value) if keyword.arg == "type" else None
            if kind is None:
                continue
            typed = TYPED.get(name)
            if typed is None:
                problems.append(f"{where}:{node.lineno}: {name}(type={kind!r}) is not an "
                                "event TypedDict of tilewright.sessions.events")
            elif _kind(typed) != kind:
                problems.append(f"{where}:{node.lineno}: {name} built with type={kind!r}, "
                                f"but its kind is {_kind(typed)!r}")
            persisted.add(kind)
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        if name == "append" and first is not None and _name(receiver).endswith("log"):
            persisted.add(first)
        if name in ("live", "_live") and first is not None:
            live.add(first)
    return persisted, live, problems


def _sources() -> Iterable[tuple[str, str]]:
    for package in WRITERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.read_text(), str(path.relative_to(ROOT))


def test_every_kind_the_code_writes_has_a_typeddict_and_every_typeddict_is_written() -> None:
    persisted: set[str] = set()
    live: set[str] = set()
    problems: list[str] = []
    for source, where in _sources():
        p, lv, bad = written_kinds(source, where)
        persisted |= p
        live |= lv
        problems += bad
    assert not problems, "\n".join(problems)
    assert persisted - set(PERSISTED) == set(), "persisted kinds without a TypedDict"
    assert live - set(LIVE) == set(), "live kinds without a TypedDict"
    # The other way round: no TypedDict for a kind nothing writes (a dead row).
    assert set(PERSISTED) - persisted == set()
    assert set(LIVE) - live == set()


def test_the_scan_catches_an_untyped_kind() -> None:
    """The walk above is a real check: each way of writing an event outside the table
    is reported."""
    source = '''
log.append("search.rewind", round=2)
self.log.append("kernel.version", version=1)
self._emit(ev.Error(type="eror", message="m", where="x"))
self.writer.emit({"type": "kernel.forked", "version": 2})
Thing(type="kernel.renamed")
self._live("agent.thinking", text="...")
'''
    persisted, live, problems = written_kinds(source, "new.py")
    assert persisted - set(PERSISTED) == {"search.rewind", "eror", "kernel.forked",
                                          "kernel.renamed"}
    assert live - set(LIVE) == {"agent.thinking"}
    assert sorted(p.split(": ", 1)[0] for p in problems) == ["new.py:4", "new.py:5",
                                                             "new.py:6"]


# -- what the readers read --------------------------------------------------------------


def _event_param(handler: Callable[..., Any]) -> Any:
    """The annotation of the event parameter: the last positional one (after the
    state or the presenter)."""
    params = list(inspect.signature(handler).parameters)
    return get_type_hints(handler)[params[-1]]


TABLES = {
    "tilewright.sessions.state fold": (state._HANDLERS, PERSISTED),
    "tilewright.sessions.search.graph fold": (graph._HANDLERS, PERSISTED),
    "tilewright.sessions.recorded.replay timeline lines": (replay._DESCRIBE, PERSISTED),
    "tilewright.tui.session.presenter conversation": (presenter._CHAT, PERSISTED),
    "tilewright.tui.session.presenter live": (presenter._LIVE, LIVE),
    "tilewright.sessions.cli.headless progress": (headless._PRINTS, PERSISTED),
    "tilewright.sessions.cli.search progress": (search_cli._MILESTONES, PERSISTED),
}


@pytest.mark.parametrize("name", list(TABLES))
def test_each_handler_reads_the_event_it_is_filed_under(name: str) -> None:
    table, kinds = TABLES[name]
    assert table, f"{name}: an empty table"
    for kind, handler in table.items():
        assert kind in kinds, f"{name}: {kind!r} is not a kind of its union"
        annotation = _event_param(handler)
        handled = {_kind(t) for t in _members(annotation)}
        assert kind in handled, (f"{name}: {handler.__qualname__} is filed under {kind!r} "
                                 f"but reads {sorted(handled)}")


def test_every_persisted_kind_is_folded_by_the_session_or_the_search() -> None:
    folded = set(state._HANDLERS) | set(graph._HANDLERS)
    assert folded == set(PERSISTED)
    # The search's own kinds are the search fold's, never the session's.
    search_kinds = {k for k in PERSISTED if k.startswith("search.")}
    assert search_kinds <= set(graph._HANDLERS)
    assert not search_kinds & set(state._HANDLERS)


def test_a_timeline_line_for_every_session_kind() -> None:
    """Replay describes every kind a controller session writes; the search's kinds are
    printed by name."""
    session_kinds = {k for k in PERSISTED if not k.startswith("search.")}
    assert set(replay._DESCRIBE) == session_kinds


def test_search_progress_reads_the_typed_events(capsys: pytest.CaptureFixture[str]) -> None:
    from tilewright.kernels.judge.rank import Rank
    from tilewright.sessions.cli.search import _progress

    rank = Rank("tpu_estimate", 1.234, "v5e", "4096x4096", kernel_s=1e-3).to_json()
    for event in (ev.RunStart(type="run.start", run="r1", version=2, kind="eval", by="search"),
                  ev.RunResult(type="run.result", run="r1", version=2, status="correct",
                               correct=True, rank=rank, median_ms=0.5, result_blob=None,
                               cancelled=False),
                  ev.RunResult(type="run.result", run="r2", version=3, status="timeout",
                               correct=None, rank=None, median_ms=None, result_blob=None,
                               cancelled=True),
                  # a log written before ranks were recorded: its source and number
                  ev.RunResult(type="run.result", run="r3", version=4, status="correct",
                               correct=True, speedup=0.0123, rank_source="host_simulation",
                               median_ms=0.5, result_blob=None, cancelled=False),
                  ev.SearchRound(type="search.round", lineage=0, round=1, beam=[2, 4],
                                 repair=[], best_version=2, best_rank=rank),
                  ev.SearchEnd(type="search.end", reason="budget", best_version=2,
                               best_rank=rank, evaluations=3),
                  ev.live("agent.delta", text="ignored")):
        _progress("gelu", event)
    assert capsys.readouterr().err.splitlines() == [
        "gelu: v2 evaluating (r1)", "gelu: v2 correct est. 1.23x",
        "gelu: v4 correct host sim 0.0123", "gelu: round 1 beam v2, v4",
        "gelu: done (budget)"]


def test_a_table_files_a_handler_by_the_event_it_reads() -> None:
    """``ev.by_kind`` reads the kind off the annotation: a union files a handler under
    each of its kinds, a parameter that is no event type is refused, and so is a second
    handler for a kind already filed."""

    def both(e: ev.AutoStop | ev.SessionEnd) -> str:
        return e["type"]

    def plain(e: dict) -> str:  # type: ignore[type-arg]
        return ""

    def again(e: ev.SessionEnd) -> str:
        return ""

    assert ev.by_kind(both) == {"auto.stop": both, "session.end": both}
    with pytest.raises(TypeError, match="not an event type"):
        ev.by_kind(plain)
    with pytest.raises(TypeError, match=r"'session\.end' is read by both"):
        ev.by_kind(both, again)
