"""What the panes show, read from a folded ``sessions.state.SessionState``.

The screen hands every pane plain data derived here, so live work, resume and replay
render through one path: fold the events, then ``SessionView(state, blobs)``. Blob
reads (sources, eval and profile JSON) are cached by sha: they never change.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tilewright.kernels.judge.result import is_interpret
from tilewright.kernels.source.printable import printable_fields, visible
from tilewright.sessions.state import TIE_WORDS, proposal_base
from tilewright.tui import problems as problem_rows
from tilewright.tui.problems import Problem
from tilewright.tui.widgets.history import VersionRow
from tilewright.tui.widgets.status import StatusInfo

if TYPE_CHECKING:
    from tilewright.sessions.state import SessionState

BlobReader = Callable[[str], bytes]


class BlobCache:
    """sha -> bytes, remembered; a missing blob reads as None (shown, never raised)."""

    def __init__(self, read: BlobReader) -> None:
        self._read = read
        self._cache: dict[str, bytes | None] = {}
        self._parsed: dict[str, Any] = {}

    def raw(self, sha: str | None) -> bytes | None:
        if not sha:
            return None
        if sha not in self._cache:
            try:
                self._cache[sha] = self._read(sha)
            except Exception:  # a missing or unreadable blob: the pane says so
                self._cache[sha] = None
        return self._cache[sha]

    def text(self, sha: str | None) -> str | None:
        """The blob as text to show: its control characters drawn, never sent
        (``kernels.source.printable.visible``)."""
        raw = self.raw(sha)
        return visible(raw.decode(errors="replace")) if raw is not None else None

    def json(self, sha: str | None) -> Any:
        """Parsed once per sha: the same object every time (panes compare identity)."""
        if not sha:
            return None
        if sha not in self._parsed:
            raw = self.raw(sha)
            try:
                self._parsed[sha] = printable_fields(json.loads(raw)) \
                    if raw is not None else None
            except ValueError:
                self._parsed[sha] = None
        return self._parsed[sha]


class SessionView:
    def __init__(self, state: SessionState, blobs: BlobCache) -> None:
        self.state = state
        self.blobs = blobs

    # -- status bar -------------------------------------------------------------------
    def status(self, worker: str, chip: str | None) -> StatusInfo:
        s = self.state
        header = s.header or {}
        backend = header.get("backend") or {}
        label = backend.get("label") or _backend_label(backend)
        best = s.best
        mixed, tie = s.mixed_ranks, s.best_tie
        return StatusInfo(
            task=(header.get("task") or {}).get("name", "task"), backend=label, chip=chip,
            mode=s.mode, iteration=s.spent.iterations, best_version=best,
            best_rank=s.best_rank, best_note=mixed or tie,
            best_note_short="est. + roofline mixed" if mixed else (
                TIE_WORDS if tie else None),
            tokens=s.spent.tokens,
            cost_usd=s.spent.cost_usd,
            cost_known=not s.spent.cost_unknown,
            worker=worker, confinement=self._confinement(), **self._compile_status())

    def _compile_status(self) -> dict[str, Any]:
        """The current version's TPU compile."""
        s = self.state
        current = s.versions.get(s.current) if s.current is not None else None
        out: dict[str, Any] = {}
        if current is not None and current.status is not None:
            out.update(tpu_chip=current.chip, tpu_compile=current.tpu_compile,
                       vmem_bytes=current.vmem_bytes,
                       vmem_limit_bytes=current.vmem_limit_bytes)
        return out

    def _confinement(self) -> str | None:
        """The sandbox level of the latest evaluation (its eval JSON says why)."""
        for v in reversed(list(self.state.versions.values())):
            data = self.blobs.json(v.result_blob) if v.result_blob else None
            if isinstance(data, dict) and isinstance(data.get("confinement"), dict):
                return str(data["confinement"].get("level") or "") or None
        return None

    # -- sources ----------------------------------------------------------------------
    def current_source(self) -> str:
        s = self.state
        if s.current is None:
            return ""
        return self.version_source(s.current) or ""

    def version_source(self, number: int) -> str | None:
        version = self.state.versions.get(number)
        return self.blobs.text(version.source_blob) if version else None

    def pending(self) -> dict[str, Any] | None:
        """The proposal awaiting a decision, with its source when it is a kernel."""
        prop = self.state.pending_proposal
        if prop is None:
            return None
        s = self.state
        # The version it applies to (the one the controller makes its version from): its
        # diff is drawn against that version's source.
        base = proposal_base(s, prop)
        base_source = (self.version_source(base) or "") if base is not None else ""
        source = self.blobs.text(prop.source_blob)
        if prop.kind == "tuning" and source is None and prop.tuning:
            source = _tuned(base_source, prop.tuning)
        return {"id": prop.id, "kind": prop.kind, "summary": prop.summary,
                "rationale": prop.rationale, "plan": prop.plan, "tuning": prop.tuning,
                "source": source, "role": prop.role, "base": base,
                "base_source": base_source}

    # -- history, problems, profile ---------------------------------------------------
    def history(self) -> list[VersionRow]:
        s = self.state
        best = s.best
        return [VersionRow(v.number, v.origin, v.summary, v.status, v.rank,
                           current=v.number == s.current, best=v.number == best, chip=v.chip,
                           tpu_compile=v.tpu_compile, vmem_bytes=v.vmem_bytes,
                           vmem_limit_bytes=v.vmem_limit_bytes)
                for v in s.versions.values()]

    def eval_result(self, number: int | None) -> dict[str, Any] | None:
        version = self.state.versions.get(number) if number is not None else None
        return self.blobs.json(version.result_blob) if version else None

    def profile(self, number: int | None) -> tuple[int | None, dict[str, Any] | None]:
        """The profile of a version, else of the newest profiled version."""
        s = self.state
        candidates = [s.versions[number]] if number in s.versions else []
        candidates += sorted(s.versions.values(), key=lambda v: -v.number)
        for version in candidates:
            if version.profile_blob:
                return version.number, self.blobs.json(version.profile_blob)
        return None, None

    def tpu_summary(self) -> str:
        """The current version's TPU compile in one line (``tui.problems.tpu_summary``)."""
        return problem_rows.tpu_summary(self.eval_result(self.state.current))

    def problems(self) -> list[Problem]:
        s = self.state
        out: list[Problem] = []
        result = self.eval_result(s.current)
        if result:
            out += problem_rows.from_eval(result, s.current)
        number, profile = self.profile(s.current)
        if profile and number == s.current:
            out += problem_rows.from_profile(profile, number)
        # a session error stays until another version is made current (a revert clears
        # what belonged to the version reverted from)
        for err in [e for e in s.errors if int(e.get("seq") or 0) > s.current_since][-5:]:
            out.append(Problem("error", err.get("where") or "session",
                               str(err.get("message") or "error")))
        return out


def _backend_label(backend: dict[str, Any]) -> str:
    if not backend:
        return "backend?"
    platform = str(backend.get("platform", "?")).upper()
    if is_interpret(backend):
        return f"{platform} (TPU interpret)"
    return f"{platform} {backend.get('device_kind', '')}".strip()


def _tuned(source: str, tuning: dict[str, Any]) -> str | None:
    """What a tuning proposal would make of the current source (None if it cannot
    apply: the controller reports why when it is approved)."""
    from tilewright.kernels.source import (
        tunables,  # a pure text rewrite (no JAX), allowed by the contract
    )

    try:
        return tunables.apply(source, tuning)
    except Exception:
        return None
