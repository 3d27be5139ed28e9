"""The session's answers to the agent's read-only tools (``agents.tools``).

``SessionTools`` reads the session core's folded state and its log (versions,
evaluations, profile digests, diffs), the chip table, and asks the judge's worker for
``lookup_api`` (the worker imports the JAX that runs the kernels; the app process never
imports JAX). Nothing here changes the session, so no decision is needed. A tool that
cannot answer says why in its output, for the model to read.
"""

from __future__ import annotations

import difflib
import json
from typing import TYPE_CHECKING, Any

from tilewright.agents.prompts.untrusted import defuse
from tilewright.sessions.control.agent_request import agent_result
from tilewright.sessions.log import read_json_blob

if TYPE_CHECKING:
    from tilewright.sessions.core import SessionCore


class SessionTools:
    def __init__(self, core: SessionCore) -> None:
        self.core = core

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        handler = getattr(self, f"_{name}", None)
        if handler is None or name.startswith("_"):
            return f"there is no read-only tool {name!r}", True
        try:
            return await handler(**arguments)
        except TypeError as exc:  # wrong or missing arguments: the model can correct that
            return f"{name}: bad arguments ({exc})", True

    # -- the tools --------------------------------------------------------------------

    async def _lookup_api(self, name: str) -> tuple[str, bool]:
        try:
            found = await self.core.judge.lookup_api(str(name))
        except Exception as exc:
            return f"lookup_api({name!r}) failed in the worker: {exc}", True
        return format_api(found), bool(found.get("error"))

    async def _get_version(self, version: int) -> tuple[str, bool]:
        state, log = self.core.session, self.core.log
        v = state.versions.get(int(version))
        if v is None:
            return self._no_version(version), True
        parts = [f"v{v.number} ({v.origin}, parent {f'v{v.parent}' if v.parent else '-'}): "
                 f"{v.summary}", f"status: {v.status or 'not evaluated'}"
                 + (f", ranked by {v.rank.words()}" if v.rank and v.rank.ranked else ""),
                 "```python\n" + defuse(log.get_blob(v.source_blob).decode().rstrip())
                 + "\n```"]
        from tilewright.agents.prompts.context import diagnosis_text, eval_text, profile_text

        if v.result_blob:
            result = agent_result(log.path, v.result_blob)
            visible = {shape["name"] for shape in self.core.brief.shapes}
            parts.append(eval_text(result, None, visible, version=v.number))
        if v.profile_blob:
            parts.append(profile_text(read_json_blob(log.path, v.profile_blob)))
        if v.diagnosis:
            parts.append(diagnosis_text(v.diagnosis, v.number))
        return "\n\n".join(p for p in parts if p), False

    async def _diff_versions(self, old: int, new: int) -> tuple[str, bool]:
        state, log = self.core.session, self.core.log
        for n in (old, new):
            if int(n) not in state.versions:
                return self._no_version(n), True
        a, b = (log.get_blob(state.versions[int(n)].source_blob).decode() for n in (old, new))
        diff = "".join(difflib.unified_diff(a.splitlines(keepends=True),
                                            b.splitlines(keepends=True),
                                            fromfile=f"v{old}/kernel.py",
                                            tofile=f"v{new}/kernel.py"))
        return defuse(diff) or f"v{old} and v{new} have the same source", False

    async def _chip_info(self, chip: str | None = None) -> tuple[str, bool]:
        from tilewright.agents.prompts.context import chip_text

        return chip_text(chip or self.core.chip), False

    def _no_version(self, number: Any) -> str:
        known = ", ".join(f"v{n}" for n in self.core.session.versions) or "none yet"
        return f"there is no version {number} (versions: {known})"


def format_api(found: dict[str, Any]) -> str:
    """The worker's ``lookup_api`` answer as text for the model."""
    if found.get("error"):
        near = found.get("suggestions") or []
        return found["error"] + (f"; did you mean: {', '.join(near)}" if near else "")
    head = f"{found['resolved']} ({found['kind']}) in JAX {found.get('jax_version')}"
    sig = found.get("signature")
    lines = [head, f"signature: {found['resolved'].rsplit('.', 1)[-1]}{sig}" if sig else ""]
    if found.get("fields"):
        lines.append("fields: " + json.dumps(found["fields"]))
    lines.append(found.get("doc") or "(no docstring)")
    members = found.get("members") or []
    if members:  # enum members, a class's methods and properties, a module's names
        label = {"enum": "members", "class": "members", "module": "names"}.get(
            found.get("kind"), "members")
        lines.append(f"{label}:\n" + "\n".join(f"  {m}" for m in members))
    return "\n".join(x for x in lines if x)
