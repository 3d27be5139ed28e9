"""Lessons across sessions: a plain file the user can read, edit and trim."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tilewright.agents import memory
from tilewright.agents.base import VersionRow
from tilewright.kernels.judge.rank import Rank


@pytest.fixture(autouse=True)
def _data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("TILEWRIGHT_DATA_DIR", str(tmp_path))


def test_add_list_remove_round_trip(tmp_path) -> None:
    memory.add_lesson("BLOCK_ROWS=256 beat 32 on softmax", family="rowwise", chip="cpu",
                      outcome="helped")
    memory.add_lesson("  general   advice  ")
    lessons = memory.list_lessons()
    assert [x.text for x in lessons] == ["BLOCK_ROWS=256 beat 32 on softmax", "general advice"]
    assert memory.lessons_path() == tmp_path / "lessons.jsonl"
    removed = memory.remove_lesson(1)
    assert removed.family == "rowwise"
    assert [x.text for x in memory.list_lessons()] == ["general advice"]
    with pytest.raises(IndexError, match="no lesson number 4"):
        memory.remove_lesson(4)
    with pytest.raises(ValueError):
        memory.add_lesson("   ")


def test_relevant_prefers_specific_lessons_and_skips_other_families() -> None:
    memory.add_lesson("everywhere")
    memory.add_lesson("rowwise on v5e", family="rowwise", chip="v5e")
    memory.add_lesson("matmul only", family="matmul")
    memory.add_lesson("softmax itself", task="softmax", family="rowwise", outcome="failed")
    got = memory.relevant(family="rowwise", chip="v5e", task="softmax")
    assert got[0] == "[softmax/rowwise, did not help] softmax itself"
    assert "[rowwise/v5e] rowwise on v5e" in got and "[all] everywhere" in got
    assert not any("matmul only" in x for x in got)
    assert not any("v5e" in x for x in memory.relevant(family="rowwise", chip="cpu"))


def test_a_hand_edit_that_breaks_a_line_loses_nothing_else() -> None:
    memory.add_lesson("first")
    path = memory.lessons_path()
    path.write_text(path.read_text() + "{not json\n")
    memory.add_lesson("third")
    with pytest.warns(UserWarning, match="does not parse"):
        assert [x.text for x in memory.list_lessons()] == ["first", "third"]
    with pytest.warns(UserWarning):
        memory.remove_lesson(2)
    assert "{not json" in path.read_text()


def test_lesson_from_history_names_the_best_configuration() -> None:
    def est(value: float, kernel_s: float) -> dict:
        return Rank("tpu_estimate", value, "v5e", kernel_s=kernel_s).to_json()

    history = [{"version": 1, "status": "correct", "rank": est(0.5, 3e-3),
                "tunables": {"B": 32}},
               {"version": 2, "status": "incorrect", "rank": None},
               {"version": 3, "status": "correct", "rank": est(1.5, 1e-3),
                "tunables": {"B": 256}}]
    lesson = memory.lesson_from_history([VersionRow.of(h) for h in history], task="softmax",
                                        family="rowwise", chip="cpu")
    assert lesson is not None and lesson.outcome == "helped"
    assert "B=256" in lesson.text and "est. 1.50x vs est. 0.50x for v1" in lesson.text
    memory.remember(lesson)
    assert memory.relevant(family="rowwise", chip="cpu", task="softmax")
    # The one ordering: the kernel's time ranks compiler figures (a later reference
    # estimate may change the ratio, never the order), and host simulation never
    # outranks them.
    history[2]["rank"] = est(0.4, 2e-3)
    history.append({"version": 4, "status": "correct", "tunables": {"B": 512},
                    "rank": Rank("host_simulation", 9.0).to_json()})
    lesson = memory.lesson_from_history([VersionRow.of(h) for h in history], task="softmax",
                                        family="rowwise", chip="cpu")
    assert lesson is not None and "best v3 B=256 at est. 0.40x" in lesson.text
    # Within 2% of the first's time: nothing was gained.
    history[2]["rank"] = est(0.51, 2.99e-3)
    lesson = memory.lesson_from_history([VersionRow.of(h) for h in history], task="softmax",
                                        family="rowwise", chip="cpu")
    assert lesson is not None and lesson.outcome == "failed"


def test_cli_lessons_subcommand(tmp_path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tilewright.tui.cli", "lessons", *args],
                              capture_output=True, text=True,
                              env={"TILEWRIGHT_DATA_DIR": str(tmp_path), "PATH": "/usr/bin"})

    assert cli("add", "prefer", "bf16", "--family", "matmul").returncode == 0
    out = cli("list")
    assert out.returncode == 0 and "1. [matmul] prefer bf16" in out.stdout
    assert cli("rm", "7").returncode == 1
    assert cli("rm", "x").returncode == 2
    assert cli("rm", "1").returncode == 0 and "no lessons yet" in cli().stdout
