"""Lessons remembered across sessions: what helped or failed, per task family and chip.

One plain JSON-lines file the user may read and edit: ``lessons.jsonl`` in the user data
dir (``platformdirs.user_data_dir("tilewright")``, or ``$TILEWRIGHT_DATA_DIR``). Each line
is ``{"text", "family", "chip", "task", "outcome", "created", "source", "config"}``
(``config``: tunables that worked, which the offline tuner tries first); ``family``,
``chip`` and ``task`` may be null, meaning "applies everywhere". ``relevant`` picks the
lessons a new session is offered (its ``AgentRequest.lessons``): the most specific and
most recent first. A line that does not parse is kept as it is and skipped with a
warning, so a hand edit never loses the other lessons.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tilewright.agents.base import VersionRow
from tilewright.kernels.judge.rank import Rank, best_of

FILENAME = "lessons.jsonl"


@dataclass(frozen=True)
class Lesson:
    text: str
    family: str | None = None
    chip: str | None = None
    task: str | None = None
    outcome: str = "note"  # helped | failed | note
    created: str = ""
    source: str = "user"  # user | agent | session
    config: dict[str, Any] | None = None  # tunables that worked, when the lesson is a tuning

    def scope(self) -> str:
        bits = [x for x in (self.task, self.family, self.chip) if x]
        return "/".join(bits) if bits else "all"


def data_dir() -> Path:
    env = os.environ.get("TILEWRIGHT_DATA_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("tilewright"))


def lessons_path() -> Path:
    return data_dir() / FILENAME


def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _parse(line: str, number: int, path: Path) -> Lesson | None:
    if not line.strip():
        return None
    try:
        data = json.loads(line)
        known = {k: data[k] for k in Lesson.__dataclass_fields__ if k in data}
        return Lesson(**known)
    except (json.JSONDecodeError, TypeError) as exc:
        warnings.warn(f"{path}:{number}: skipped a lesson that does not parse ({exc})",
                      stacklevel=3)
        return None


def list_lessons(path: Path | None = None) -> list[Lesson]:
    """Every lesson in file order (numbered from 1 by ``remove_lesson``)."""
    path = path or lessons_path()
    out = []
    for number, line in enumerate(_read_lines(path), 1):
        lesson = _parse(line, number, path)
        if lesson is not None:
            out.append(lesson)
    return out


def add_lesson(text: str, *, family: str | None = None, chip: str | None = None,
               task: str | None = None, outcome: str = "note", source: str = "user",
               path: Path | None = None, config: dict[str, Any] | None = None) -> Lesson:
    text = " ".join(text.split())
    if not text:
        raise ValueError("a lesson needs some text")
    if outcome not in ("helped", "failed", "note"):
        raise ValueError(f"outcome must be helped, failed or note, not {outcome!r}")
    path = path or lessons_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    lesson = Lesson(text, family, chip, task, outcome,
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), source, config)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(asdict(lesson), sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return lesson


def remove_lesson(number: int, path: Path | None = None) -> Lesson:
    """Remove the ``number``-th lesson (1-based, as ``list_lessons`` orders them)."""
    path = path or lessons_path()
    lines = _read_lines(path)
    seen = 0
    for index, line in enumerate(lines):
        lesson = _parse(line, index + 1, path)
        if lesson is None:
            continue
        seen += 1
        if seen == number:
            del lines[index]
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
            tmp.replace(path)
            return lesson
    raise IndexError(f"no lesson number {number} (there are {seen})")


def relevant(*, family: str | None, chip: str | None, task: str | None = None,
             limit: int = 8, path: Path | None = None) -> tuple[str, ...]:
    """Lesson texts that apply to this task/family/chip, most specific and newest first."""
    return tuple(_render(lesson) for lesson in
                 matching(family=family, chip=chip, task=task, path=path)[:limit])


def matching(*, family: str | None, chip: str | None, task: str | None = None,
             path: Path | None = None) -> list[Lesson]:
    """The lessons that apply (a lesson's unset scope fields match anything), best first."""
    scored: list[tuple[int, int, Lesson]] = []
    for order, lesson in enumerate(list_lessons(path)):
        score = 0
        for mine, theirs, weight in ((lesson.task, task, 4), (lesson.family, family, 2),
                                     (lesson.chip, chip, 1)):
            if mine is None:
                continue
            if mine != theirs:
                break
            score += weight
        else:
            scored.append((score, order, lesson))
    scored.sort(key=lambda item: (-item[0], -item[1]))
    return [lesson for _s, _o, lesson in scored]


def _render(lesson: Lesson) -> str:
    tag = {"helped": "helped", "failed": "did not help"}.get(lesson.outcome)
    where = lesson.scope()
    return f"[{where}{', ' + tag if tag else ''}] {lesson.text}"


def lesson_from_history(history: Iterable[VersionRow], *,
                        task: str, family: str | None, chip: str | None) -> Lesson | None:
    """A session's takeaway, for the controller to store at the end: the best configuration
    (by the one ordering, ``Rank.key``) and what it gained over the first ranked version,
    in ``Rank.words``. None when nothing was learned."""
    ranked = [h for h in history if h.status == "correct" and h.rank is not None and h.rank.ranked]
    if len(ranked) < 2:
        return None
    first = ranked[0]
    best = best_of(ranked, lambda h: h.rank)  # best_of: earliest on ties
    if best is None or best.rank is None or first.rank is None:
        return None
    said_first = f"{first.rank.words(short=True)} for v{first.version}"
    if best is first or not _gained(best.rank, first.rank):
        return Lesson(f"{task}: {len(ranked)} correct versions, none beat v{first.version} "
                      f"({first.rank.words(short=True)})", family, chip, task, "failed",
                      source="session")
    config = best.tunables or {}
    what = " ".join(f"{k}={v}" for k, v in config.items()) or best.summary
    return Lesson(f"{task}: best v{best.version} {what} at "
                  f"{best.rank.words(short=True)} vs {said_first}",
                  family, chip, task, "helped", source="session", config=config or None)


def _gained(best: Rank, first: Rank, margin: float = 1.02) -> bool:
    """``best`` ranks above ``first`` by more than noise (2%) on ``Rank.key``'s number:
    the kernel's time for compiler figures, the speedup or ratio otherwise; a better
    kind of number always does."""
    if not best.better_than(first):
        return False
    b, f = best.key(), first.key()
    if b[:2] != f[:2]:
        return True
    if b[2] > 0:  # a number where larger is better
        return b[2] > f[2] * margin
    return -f[2] > -b[2] * margin  # a time (negated in the key)


def remember(lesson: Lesson, path: Path | None = None) -> Lesson | None:
    """Store a lesson unless the same one (text and scope) is already there."""
    for old in list_lessons(path):
        if (old.text, old.family, old.chip, old.task) == (lesson.text, lesson.family,
                                                          lesson.chip, lesson.task):
            return None
    return add_lesson(lesson.text, family=lesson.family, chip=lesson.chip, task=lesson.task,
                      outcome=lesson.outcome, source=lesson.source, path=path,
                      config=lesson.config)
