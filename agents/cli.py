"""``tilewright lessons [list|add TEXT|rm N|edit|path]``: the agents' memory, for the user.

Lessons are what agents are reminded of in later sessions (``agents.memory``). ``list``
numbers them; ``rm N`` removes one by that number; ``add`` takes optional ``--family``,
``--chip``, ``--task`` and ``--outcome``; ``edit`` opens the file in ``$VISUAL`` /
``$EDITOR``; ``path`` prints where the file lives. App side: no JAX, no anthropic.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

from tilewright.kernels.cli import subcommand


def register(sub: argparse._SubParsersAction) -> None:
    parser = subcommand(
        sub, "lessons", "list, add, remove or edit what agents remember across sessions", run)
    parser.add_argument("action", nargs="?", default="list",
                        choices=("list", "add", "rm", "edit", "path"))
    parser.add_argument("args", nargs="*", help="add: the lesson text; rm: its number")
    parser.add_argument("--family", help="task family it applies to (e.g. rowwise)")
    parser.add_argument("--chip", help="chip it applies to (e.g. v5e, cpu)")
    parser.add_argument("--task", help="task it applies to")
    parser.add_argument("--outcome", default="note", choices=("helped", "failed", "note"))


def run(args: argparse.Namespace) -> int:
    """Lessons learned across sessions, offered to agents in later sessions (per task family
    and chip). Stored as JSON lines in the user data dir (override with
    TILEWRIGHT_DATA_DIR)."""
    from tilewright.agents import memory

    path = memory.lessons_path()
    if args.action == "path":
        print(path)
        return 0
    if args.action == "list":
        lessons = memory.list_lessons(path)
        if not lessons:
            print(f"no lessons yet ({path}); add one with: tilewright lessons add TEXT")
            return 0
        for number, lesson in enumerate(lessons, 1):
            tag = "" if lesson.outcome == "note" else f" ({lesson.outcome})"
            print(f"{number:3d}. [{lesson.scope()}]{tag} {lesson.text}")
        return 0
    if args.action == "add":
        text = " ".join(args.args)
        try:
            lesson = memory.add_lesson(text, family=args.family, chip=args.chip, task=args.task,
                                       outcome=args.outcome, path=path)
        except ValueError as exc:
            print(f"tilewright lessons add: {exc}", file=sys.stderr)
            return 2
        print(f"added [{lesson.scope()}] {lesson.text}")
        return 0
    if args.action == "rm":
        if len(args.args) != 1 or not args.args[0].isdigit():
            print("usage: tilewright lessons rm N   (N from `tilewright lessons list`)",
                  file=sys.stderr)
            return 2
        try:
            lesson = memory.remove_lesson(int(args.args[0]), path)
        except IndexError as exc:
            print(f"tilewright lessons rm: {exc}", file=sys.stderr)
            return 1
        print(f"removed: {lesson.text}")
        return 0
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(exist_ok=True)
    try:
        return subprocess.call([*shlex.split(editor), str(path)])
    except FileNotFoundError:
        print(f"editor {editor!r} not found; set $EDITOR, or edit {path} directly",
              file=sys.stderr)
        return 1
