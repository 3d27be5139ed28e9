"""How a search gets children: the agent's proposals and the search's own tuning steps.

``ChildMaker`` is owned by ``sessions.search.Search``. For each slot of the tree it
either takes one untried neighbouring value of a tunable (a tuning step, no agent
needed) or asks the agent with a request that says which child this is and which
strategies its siblings already tried, so each child can be a different, named
strategy; the whole measured history goes along (with tunables, so a tuner never
proposes a configuration twice). Every outcome is an event: ``agent.message``,
``agent.proposal`` with the slot's fields, or ``error`` with them.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tilewright.agents.base import AgentRequest, Proposal, VersionRow
from tilewright.agents.offline import tuner
from tilewright.agents.offline.templates import FALLBACK, infer_families
from tilewright.kernels.source import tunables
from tilewright.profiling.diagnose import check_with_estimates
from tilewright.sessions import events as ev
from tilewright.sessions.actions import Expand
from tilewright.sessions.agent_turn import AgentTurn
from tilewright.sessions.control.agent_request import history, rejected
from tilewright.sessions.core import Decision, SessionCore
from tilewright.sessions.log import read_json_blob
from tilewright.sessions.search.graph import SearchState
from tilewright.sessions.state import SessionState

AGENT_TIMEOUT_S = 600.0
# First kernels of a task that names no family: one per template family, in the order
# the offline agent infers from the reference (``agents.offline.templates``), for the
# first this many slots; later rounds move through the rest of that order.
ROOT_FAMILY_CANDIDATES = 3


class ChildMaker:
    """Proposing children for one search, on the search's core and its ``SearchState``
    (the fold the core's writer keeps)."""

    def __init__(self, core: SessionCore, state: SearchState) -> None:
        self.core = core
        self.state = state
        self.log = core.log
        self.brief = core.brief
        self.agent = core.agent
        self._source = core.source_of
        self._emit = core.emit

    def _slot_fields(self, action: Expand) -> dict[str, Any]:
        lineage, rnd, _parent, slot = action.slot
        return {"lineage": lineage, "round": rnd, "slot": slot}

    async def expand(self, action: Expand) -> str | None:
        """Fill the slot of an ``expand`` action; the new proposal's id, or None."""
        parent = action.slot[2]
        if action.proposer == "tuning":
            pid = self._tuning_step(action)
            if pid is not None:
                return pid
        return await self._ask_agent(action, parent)

    def _tuning_step(self, action: Expand) -> str | None:
        """The search's own child: one untried neighbouring value of one tunable."""
        parent = action.slot[2]
        source = self._source(parent)
        try:
            legal = tunables.legal_choices(source)
            current = tunables.config_of(source)
        except tunables.TunablesError:
            return None
        session = self.state.session
        # measured, or rejected (by the person or the rules): never proposed again, nor
        # the same kernel with other declared choices (a widened TUNABLES)
        known = {v.source_blob for v in session.versions.values()} | {
            p.source_blob for p in session.proposals.values()
            if p.decision == "reject" and p.source_blob}
        ran = {_digest(tunables.menu_free(self._source(n))) for n in session.versions}
        # blocks past the one measured to cover their grid axes run as the same kernel
        cover = tuner.covering([(r.tunables, r.numbers.get("grids"))
                                for r in self._history(parent) if r.tunables is not None],
                               set(current))
        names = sorted(legal)
        start = action.slot[3] % max(1, len(names))
        waiting = in_flight(session, parent, current,
                            lambda sha: self.log.get_blob(sha).decode())
        for name in names[start:] + names[:start]:
            choices = legal[name]
            if current[name] not in choices:
                continue
            at = choices.index(current[name])
            for step in (1, -1):
                if not 0 <= at + step < len(choices):
                    continue
                value = choices[at + step]
                if type(value) is int and (value > cover.get(name, value) or (
                        name in waiting and value > current[name])):
                    continue  # covered already, or a sibling's grid will say so
                new = tunables.apply(source, {name: value})
                if _digest(new) in known or _digest(tunables.menu_free(new)) in ran:
                    continue
                return self.core.propose(
                    Proposal("tuning", f"tuning step: {name} {current[name]} -> {value}",
                             "a neighbouring value of one tunable, not yet measured in "
                             "this search", tuning={name: value}),
                    role="tune", base=parent, source=new, proposer="tuning",
                    strategy=f"tune {name} {current[name]} -> {value}",
                    **self._slot_fields(action))
        return None

    def _request(self, action: Expand, parent: int | None, role: str,
                 message: str | None) -> AgentRequest:
        s = self.state.session
        source = self._source(parent) if parent is not None else None
        brief = self.brief
        _lineage, rnd, _p, slot = action.slot
        hint = None
        if parent is None and brief.family is None and self.agent.name == "offline":
            # the families the reference reads like (before the whole-array fallback):
            # each root child starts from one of those, never from an unlikely one
            families = infer_families(brief)
            likely = families[:families.index(FALLBACK)] if FALLBACK in families else families
            hint = (likely or families)[slot % len(likely or families)]
            brief = replace(brief, family=hint)
        version = s.versions.get(parent) if parent is not None else None
        last_eval = (read_json_blob(self.log.path, version.result_blob)
                     if version is not None and version.result_blob else None)
        siblings = [n for n in self.state.nodes.values()
                    if n.parent == parent and n.proposer != "root"]
        tried = [_tried(n.version, n.strategy, s.versions[n.version]) for n in siblings]
        ask = (f"Graph search, round {rnd}, child {slot + 1} of "
               f"{'the starting point' if parent is None else f'v{parent}'}. "
               "Name the optimization strategy you apply in the first words of your "
               "summary, and pick one that differs from the strategies already tried "
               "from this version.")
        if hint:
            ask += f"\nThe task names no family: write it as a {hint} kernel."
        if message:
            ask += "\n" + message
        rows = self._history(parent)
        diagnosis = self._diagnosis(action.slot[0], parent)
        if diagnosis:
            diagnosis = check_with_estimates(diagnosis, rows)
        reason = None if parent is None else (
            f"v{parent} is the version this child of the search grows from")
        return AgentRequest(role=role, task=brief, current_source=source,  # type: ignore[arg-type]
                            current_version=parent, last_eval=last_eval, user_message=ask,
                            notes=tuple(f"already tried: {t}" for t in tried),
                            history=rows, diagnosis=diagnosis,
                            best_version=self.state.best(),
                            latest_version=max(s.versions, default=None),
                            base_reason=reason, lookups=tuple(s.lookups),
                            backend=s.header.get("backend"),
                            # the chip every figure is for (the VMEM the tuner may fill)
                            chip=self._chip(s.header.get("backend")),
                            # what the person (or the rules) rejected is never asked again
                            rejected=rejected(s, lambda sha: self.log.get_blob(sha).decode()))

    def _chip(self, backend: Any) -> str:
        """The chip the search judges for: its evaluations' (``--chip``), else the TPU
        host's own, else the TPU a CPU host's interpret mode is judged against (the rule
        of ``sessions.opening.choose_chip``, which this package cannot import: opening
        imports the search)."""
        from tilewright.profiling.chips import DEFAULT_TPU, chip_for_device

        if self.core.chip:
            return self.core.chip
        backend = backend if isinstance(backend, dict) else {}
        if backend.get("platform") not in (None, "cpu") and backend.get("device_kind"):
            try:
                return chip_for_device(backend["platform"], backend["device_kind"]).name
            except KeyError:
                pass
        return DEFAULT_TPU

    def _diagnosis(self, lineage: int, parent: int | None) -> dict[str, Any] | None:
        """What the lineage's profiles found: the parent's own diagnosis, else its nearest
        diagnosed ancestor's, else the lineage's latest (never another lineage's)."""
        versions = self.state.session.versions
        cursor = parent
        while cursor is not None and cursor in versions:
            if versions[cursor].diagnosis:
                return versions[cursor].diagnosis
            cursor = versions[cursor].parent
        nodes = self.state.nodes
        for entry in reversed(self.state.session.diagnoses):
            node = nodes.get(entry.get("version"))  # type: ignore[arg-type]
            if node is not None and (node.lineage == lineage or node.version in self.state.roots):
                return entry
        return None

    def _history(self, parent: int | None) -> tuple[VersionRow, ...]:
        """Every version so far, the path from the root to ``parent`` first."""
        versions = self.state.session.versions
        path: list[int] = []
        cursor = parent
        while cursor is not None and cursor in versions:
            path.insert(0, cursor)
            cursor = versions[cursor].parent
        return history(versions, self._source, path,
                       result_of=lambda blob: read_json_blob(self.log.path, blob),
                       awaiting_result=self.state.session.awaiting_result)

    async def _ask_agent(self, action: Expand, parent: int | None,
                         message: str | None = None, role: str | None = None) -> str | None:
        role = role or action.role
        request = self._request(action, parent, role, message)
        turn = AgentTurn()
        try:
            await asyncio.wait_for(self.core.ask(request, turn, live=False), AGENT_TIMEOUT_S)
        except TimeoutError:
            turn.failure = f"the agent gave no proposal within {AGENT_TIMEOUT_S:g} s"
        problem = turn.problem()
        pid = None if problem else self.core.next_proposal_id()
        self._emit(ev.AgentMessage(type="agent.message", text=turn.text(), role=role, proposal=pid,
                                   usage=turn.usage_json()))
        fields = self._slot_fields(action)
        if problem is not None:
            self._emit(ev.Error(type="error", message=problem, where="search", parent=parent,
                                **fields))
            return None
        p = turn.proposal
        assert p is not None
        p = _onto(p, parent, self._source)
        strategy = str(p.meta.get("strategy") or p.summary)
        source = p.source
        if p.kind == "tuning" and parent is not None:
            try:
                source = tunables.apply(self._source(parent), p.tuning or {})
            except Exception as exc:
                self._emit(ev.Error(type="error", message=f"could not apply the tuning: {exc}",
                                    where="search", parent=parent, **fields))
                return None
        self.core.propose(p, role=role, base=parent, source=source or "", pid=pid,
                          proposer="agent", strategy=strategy, **fields)
        if p.kind == "plan":  # a plan is no node: approve it and ask for its kernel once
            self.core.record(pid, Decision("approve", "auto", "search: implement the plan"))
            if message is not None:
                return None
            return await self._ask_agent(action, parent, f"Implement this plan:\n{p.plan}",
                                         role="implement")
        return pid


def in_flight(session: SessionState, parent: int | None, current: dict[str, Any],
              read: Callable[[str], str]) -> set[str]:
    """The tunables ``tuner.held`` by the children of ``parent`` (at ``current``) not yet
    measured: proposals still to decide or apply, and versions whose evaluation has not
    ended (``read``: a blob's text). A rejected proposal, one that could not be applied,
    and a version whose run ended (measured, cancelled or failed) hold nothing."""
    configs = []
    for p in session.proposals.values():
        if p.base_version != parent or p.decision == "reject" or p.apply_failed \
                or not p.source_blob:
            continue
        if p.applied_version in session.versions and not session.awaiting_result(p.applied_version):
            continue
        try:
            configs.append(tunables.config_of(read(p.source_blob)))
        except (tunables.TunablesError, OSError, KeyError, UnicodeDecodeError):
            continue
    return tuner.held(current, configs)


def _onto(p: Proposal, parent: int | None, source_of: Any) -> Proposal:
    """A tuning the agent made for another version (``meta["base"]``, the best so far)
    rewritten as a change to the slot's ``parent``: a search child is always its slot's
    child, and its title names the values in the parent it is applied to."""
    base, config = p.meta.get("base"), p.meta.get("config")
    if p.kind != "tuning" or parent is None or not isinstance(base, int) or base == parent \
            or not isinstance(config, dict):
        return p
    try:
        have = tunables.config_of(source_of(parent))
    except Exception:
        return p
    changes = {k: v for k, v in config.items() if have.get(k) != v}
    full = " ".join(f"{k}={v}" for k, v in config.items())
    moves = ", ".join(f"{k} {have.get(k)} -> {v}" for k, v in changes.items())
    return replace(p, tuning=changes, summary=f"tune {moves} ({full})",
                   meta={k: v for k, v in p.meta.items() if k != "base"})


def _tried(number: int, strategy: str | None, version: Any) -> str:
    rank = version.rank
    speed = f", {rank.words(short=True)}" if rank is not None and rank.ranked else ""
    return f"v{number}: {strategy or version.summary} ({version.status or 'not run'}{speed})"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
