"""The version history an agent request carries (``sessions.control.agent_request.history``)."""

from __future__ import annotations

from tilewright.kernels.judge.judgement import Judgement
from tilewright.kernels.judge.rank import Rank
from tilewright.sessions.control.agent_request import history
from tilewright.sessions.state import Version


def _version(number: int, parent: int | None, blob: str, estimate: float | None) -> Version:
    rank = Rank("tpu_estimate", estimate, "v5e", kernel_s=1e-3 / estimate) if estimate \
        else None
    return Version(number=number, parent=parent, origin="agent", proposal=None,
                   source_blob=blob, summary=f"v{number}", decision_seq=None, seq=number,
                   t=0.0, judgement=Judgement("correct", rank) if estimate else None)


SOURCES = {
    "a": "BLOCK_ROWS = 8\nTUNABLES = {'BLOCK_ROWS': [8, 16]}\n",
    "b": "BLOCK_ROWS = 16\nTUNABLES = {'BLOCK_ROWS': [8, 16]}\n",
    "broken": "def f(:\n",
}


def test_history_lists_every_version_with_its_tunables_parsed_once_per_source() -> None:
    versions = {1: _version(1, None, "a", 1.0), 2: _version(2, 1, "b", 1.5),
                3: _version(3, 1, "broken", None), 4: _version(4, 2, "b", 1.4)}
    reads: list[int] = []

    def source_of(number: int) -> str:
        reads.append(number)
        return SOURCES[versions[number].source_blob]

    plain = history(versions, source_of)
    assert [h.version for h in plain] == [1, 2, 3, 4]
    # what ranks each version, the judge's Rank (None before an evaluation)
    assert [h.rank for h in plain] == [versions[n].rank for n in (1, 2, 3, 4)]
    assert plain[2].rank is None
    assert [h.tunables for h in plain] == [
        {"BLOCK_ROWS": 8}, {"BLOCK_ROWS": 16}, None, {"BLOCK_ROWS": 16}]
    assert plain[0].on_path is None
    reads.clear()
    graph = history(versions, source_of, path=[1, 2, 4])
    assert reads == []  # every source was parsed by the first call
    assert [(h.version, h.on_path, h.parent) for h in graph] == [
        (1, True, None), (2, True, 1), (4, True, 2), (3, False, 1)]
    graph[0].tunables["BLOCK_ROWS"] = 99  # a request's copy, not the cache
    assert history(versions, source_of)[0].tunables == {"BLOCK_ROWS": 8}
