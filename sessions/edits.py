"""What a person's edit changed, in one line for History, replay and reports.

An edited proposal becomes a version whose summary says what the person did, not
what the agent had proposed: the tunables they moved (``BLOCK_ROWS 512 -> 256``), and
the lines they changed, by function (``3 lines in _body``).
"""

from __future__ import annotations

import ast
import difflib


def describe_edit(before: str, after: str) -> str:
    """"BLOCK_ROWS 512 -> 256; 2 lines changed in _body" (or "no change")."""
    if before == after:
        return "no change to the proposal"
    parts = []
    try:
        from tilewright.kernels.source import tunables

        old, new = tunables.config_of(before), tunables.config_of(after)
        moved = [f"{k} {old[k]!r} -> {new[k]!r}" for k in new if k in old and old[k] != new[k]]
        parts += moved
    except Exception:  # an edit that does not parse still has lines
        moved = []
    old_lines, new_lines = before.splitlines(), after.splitlines()
    changed: list[int] = []  # lines of ``after`` that differ (1-based), or where text went
    removed = added = 0
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        removed += i2 - i1
        added += j2 - j1
        changed += list(range(j1 + 1, j2 + 1)) or [j1 + 1]
    tunable_lines = _assignment_lines(after, [m.split()[0] for m in moved])
    rest = [line for line in changed if line not in tunable_lines]
    where = _functions_at(after, rest)
    count = max(added, removed) - (len(changed) - len(rest) if added == removed else 0)
    if count > 0:
        place = f" in {', '.join(where)}".replace(" in module level", " at module level") \
            if where else ""
        parts.append(f"{count} line{'s' if count != 1 else ''} changed{place}"
                     if added == removed else f"+{added} -{removed} lines{place}")
    return "; ".join(parts) or "whitespace only"


def _functions_at(source: str, lines: list[int]) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    spans = [(n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(tree)
             if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    found: list[str] = []
    for line in lines:
        inner = [s for s in spans if s[0] <= line <= s[1]]
        name = min(inner, key=lambda s: s[1] - s[0])[2] if inner else "module level"
        if name not in found:
            found.append(name)
    return found[:3]


def _assignment_lines(source: str, names: list[str]) -> set[int]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {node.lineno for node in tree.body if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id in names for t in node.targets)}
