"""The judge's channel to its candidate process, and every reply parsed once into types.

Everything the candidate process says is untrusted: it runs candidate code, which can
rewrite the process's own harness in memory. So a reply is parsed here, once, into a
frozen dataclass whose fields are what the judge relies on (a ``bool`` is a bool, a
line an ``int`` or None, every string bounded, every list of the kind expected); the
rest of the judge reads only those. A reply that does not answer its request, a
malformed one, or a failure the process may not report kills the process (kind
``protocol``, reported as ``crashed``) and a fresh one starts warming up.

``CandidateChannel`` holds one evaluation's side of the conversation: the deadline, the
memory limit, the ``extra.candidate_process`` facts (``pid``, ``killed``,
``restarted``, ``lowering_checked``), processes the candidate left behind, and whether
the process must be replaced afterwards. A request that ends the evaluation raises
``kernels.worker.errors.Stopped`` with the status and error it decided; a candidate
process the TPU compiler aborted raises ``CompilerAborted`` (``kernels.worker.tpu.verdict``
words that as the compile error it is).

Worker-side (the judge).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NoReturn

import numpy as np

from tilewright.kernels.judge.process_failure import FAILURE_HINTS
from tilewright.kernels.judge.result import EvalError
from tilewright.kernels.worker.candidate import judge, wire
from tilewright.kernels.worker.errors import Stopped
from tilewright.kernels.worker.evaluation.compare import Host
from tilewright.kernels.worker.evaluation.exported import ExportedPrograms

TEXT_LIMIT = 64 * 1024  # any string the candidate process reports
LIST_LIMIT = 50  # lines, names and descriptions kept from one report
EXPORT_LIMIT = 256 << 20  # one check shape's exported program (StableHLO, constants)
# What the candidate process may report as an evaluation's failure (anything else: a
# protocol violation).
EVAL_FAILURES = {
    "compile_error": frozenset({"syntax", "missing_entry", "trace", "lowering", "exit"}),
    "runtime_error": frozenset({"import", "exit", "runtime"}),
    "rejected": frozenset({"harness_tampering", "platform_dependent", "interpret_param"}),
}
PRODUCTION_PROGRAMS = ("full", "scaled0", "scaled1")


def text(value: Any, limit: int = TEXT_LIMIT) -> str | None:
    """A string the candidate process reported, bounded; anything else is None."""
    return value[-limit:] if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _strings(value: Any, limit: int = LIST_LIMIT) -> tuple[str, ...]:
    return tuple(text(v) or "" for v in value[:limit] if isinstance(v, str)) \
        if isinstance(value, list) else ()


# -- what the candidate process reports ---------------------------------------------------

@dataclass(frozen=True)
class CandidateError:
    """A failure the candidate's code caused, as the process reported it: a status of
    the contract and an error ``kind`` that status allows."""

    status: str
    kind: str
    message: str
    line: int | None
    traceback: str | None
    hint: str | None

    @classmethod
    def parse(cls, reply: dict[str, Any],
              allowed: dict[str, frozenset[str]] = EVAL_FAILURES) -> CandidateError | None:
        """The failure in ``reply`` (``{ok: false, status, error}``); None when it is not
        one the process may report (the caller treats that as a protocol violation)."""
        status = reply.get("status")
        error = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        kind = error.get("kind")
        if not isinstance(status, str) or status not in allowed or kind not in allowed[status]:
            return None
        return cls(status, kind, text(error.get("message")) or kind, _int(error.get("line")),
                   text(error.get("traceback")), text(error.get("hint")))

    def eval_error(self, line: int | None = None) -> EvalError:
        return EvalError(kind=self.kind, message=self.message,
                         line=self.line if self.line is not None else line,
                         traceback=self.traceback, hint=self.hint)


@dataclass(frozen=True)
class Lowering:
    """The TPU lowering at one check shape: ok, skipped (with why) or error."""

    tpu: Literal["ok", "skipped", "error"]
    message: str | None

    @classmethod
    def parse(cls, value: Any) -> Lowering | None:
        if not isinstance(value, dict) or value.get("tpu") not in ("ok", "skipped", "error"):
            return None
        return cls(value["tpu"], text(value.get("message")))


@dataclass(frozen=True)
class PrepareFacts:
    """What tracing and lowering a check shape told the candidate process (``prepare``):
    its word on the jaxpr (Pallas or not, where, work outside the kernels, the body's
    structure, the output tree) and the TPU lowering's StableHLO text, which the judge
    checks itself (``kernels.worker.evaluation.integrity.check_lowering``)."""

    claims_pallas: bool
    pallas_lines: tuple[int, ...]
    outside_compute: tuple[str, ...]
    out_tree: str
    hlo_text: str | None
    lowering: Lowering | None
    lowering_error: EvalError | None
    structure: list[Any] | None
    # kernels whose grid has no step at this shape: "name: grid (0, 8) for blocks ..."
    empty_grids: tuple[str, ...] = ()

    @classmethod
    def parse(cls, reply: dict[str, Any]) -> PrepareFacts:
        lines = reply.get("pallas_lines")
        error = reply.get("lowering_error") if isinstance(reply.get("lowering_error"),
                                                          dict) else {}
        lowering = Lowering.parse(reply.get("lowering"))
        return cls(
            claims_pallas=reply.get("pallas_call") is True,
            pallas_lines=tuple(x for x in lines if _int(x) is not None)[:LIST_LIMIT]
            if isinstance(lines, list) else (),
            outside_compute=tuple(x for x in reply.get("outside_compute") or []
                                  if isinstance(x, str)),
            out_tree=text(reply.get("out_tree")) or "",
            hlo_text=reply.get("hlo_text") if isinstance(reply.get("hlo_text"), str) else None,
            lowering=lowering,
            lowering_error=EvalError(
                kind="lowering",
                message=text(error.get("message")) or (lowering.message if lowering else None)
                or "lowering failed", line=_int(error.get("line")),
                traceback=text(error.get("traceback")), hint=text(error.get("hint")))
            if lowering is not None and lowering.tpu == "error" else None,
            structure=reply["structure"] if isinstance(reply.get("structure"), list) else None,
            empty_grids=tuple(text(x) or "" for x in reply.get("empty_grids") or []
                              if isinstance(x, str))[:LIST_LIMIT])


@dataclass(frozen=True)
class ProductionReply:
    """The candidate's program at the production shape (``production``): its word on
    the jaxpr and the plans of its kernels' grids, and the exported programs, sliced
    from the blob by the sizes it reported (checked against the blob)."""

    pallas_call: bool
    structure: list[Any] | None
    plans: list[dict[str, Any]]
    out_shapes: Any
    export_errors: tuple[str, ...]
    unavailable: str | None
    programs: dict[str, bytes]
    outside_compute: tuple[str, ...] = ()  # work outside the kernels at production
    # kernel index -> the values its loop bounds were pinned to (``pinned<index>``: a
    # program of that kernel alone, bounds read from the production inputs)
    pinned: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # ``programs.fingerprint`` of the production trace, as the candidate process says
    program: str | None = None

    @classmethod
    def parse(cls, reply: dict[str, Any], blob: bytes,
              identity: bool = False) -> ProductionReply | str:
        """The reply, or what is wrong with it (a protocol violation). ``identity``: a
        reply to a trace-only request, which carries no programs."""
        common = dict(
            pallas_call=reply.get("pallas_call") is True,
            structure=reply["structure"] if isinstance(reply.get("structure"), list) else None,
            plans=[p for p in reply.get("plans") or [] if isinstance(p, dict)],
            out_shapes=reply.get("out_shapes"),
            export_errors=_strings(reply.get("export_errors")),
            outside_compute=_strings(reply.get("outside_compute"), LIST_LIMIT),
            program=reply["program"][:64] if isinstance(reply.get("program"), str) else None)
        if isinstance(reply.get("unavailable"), str):  # e.g. host callbacks, off-TPU
            return cls(**common, unavailable=reply["unavailable"][:2000], programs={})
        if identity:
            return cls(**common, unavailable=None, programs={}) if not blob \
                else "programs in a reply to a trace-only request"
        listed = reply.get("programs")
        if not isinstance(listed, list):
            return "a production reply without programs"
        programs: dict[str, bytes] = {}
        offset = 0
        for item in listed:
            if (not isinstance(item, list) or len(item) != 2
                    or not isinstance(item[0], str)
                    or (item[0] not in PRODUCTION_PROGRAMS
                        and not re.fullmatch(r"pinned\d{1,3}(_\d{1,6})?", item[0]))
                    or _int(item[1]) is None or item[1] < 0):
                return "a malformed production program list"
            programs[item[0]] = blob[offset:offset + item[1]]
            offset += item[1]
        if offset != len(blob) or "full" not in programs:
            return "production programs that do not match their sizes"
        if ("scaled0" in programs) != ("scaled1" in programs):  # one short grid: no scaling
            programs.pop("scaled0", None)
            programs.pop("scaled1", None)
        said = reply.get("pinned") if isinstance(reply.get("pinned"), dict) else {}
        pinned = {str(k)[:4]: _strings(v, 16) for k, v in list(said.items())[:16]
                  if isinstance(v, list) and any(p == f"pinned{k}" or p.startswith(f"pinned{k}_")
                                                 for p in programs)}
        return cls(**common, unavailable=None, programs=programs, pinned=pinned)


@dataclass(frozen=True)
class CheckVerdict:
    """The TPU compiler's verdict at one check shape (a TPU host compiles what runs)."""

    config: str | None
    compile: str | None
    message: str | None

    @classmethod
    def parse_all(cls, reply: dict[str, Any]) -> list[CheckVerdict]:
        return [cls(text(v.get("config")), text(v.get("compile")), text(v.get("message")))
                for v in reply.get("verdicts") or [] if isinstance(v, dict)]


@dataclass(frozen=True)
class FinishReport:
    """What the candidate left in its process (``finish``): ``jax.config`` options it
    changed (and whether they were put back), threads still running, modules changed."""

    config_changed: tuple[str, ...]
    restored: bool
    threads: tuple[str, ...]  # their names (or "native thread <tid> (<comm>)")
    tampered: bool

    @classmethod
    def parse(cls, reply: dict[str, Any]) -> FinishReport:
        threads = reply.get("threads")
        return cls(config_changed=_strings(reply.get("config_changed"), 20),
                   restored=reply.get("restored") is True,  # unsaid: not put back
                   threads=_strings(threads, 20) if isinstance(threads, list)
                   else (("unnamed",) if threads else ()),
                   tampered=bool(reply.get("tampered")))

    @property
    def untrustworthy(self) -> bool:
        """The process may not serve another candidate."""
        return bool(self.threads) or self.tampered or (bool(self.config_changed)
                                                        and not self.restored)


class CompilerAborted(Exception):
    """The TPU compiler aborted the candidate process while compiling the kernel (a
    failed internal check, not the kernel's own run); ``fatal`` is its fatal log line."""

    def __init__(self, fatal: str) -> None:
        super().__init__(fatal)
        self.fatal = fatal


# -- the channel ---------------------------------------------------------------------------

class CandidateChannel:
    """One evaluation's requests to this judge's candidate process
    (``kernels.worker.candidate.judge.process()``), each answered once."""

    def __init__(self, deadline: float, memory_limit_mb: int) -> None:
        self.deadline = deadline
        self.memory_limit_mb = memory_limit_mb
        self.info: dict[str, Any] = {"pid": None, "restarted": False,
                                     "lowering_checked": False}
        self.leftovers = 0  # processes the candidate forked, killed after each request
        self.recycle = False  # replace the process once this evaluation is done
        self.pallas_line: int | None = None  # the one pallas_call, where a kernel failed
        # The route of a host with a chip: the candidate exports each check shape's
        # program and the judge runs it on its own device (kernels.worker.evaluation.exported).
        self.runner: ExportedPrograms | None = None

    def request(self, op: str, header: dict[str, Any], blob: bytes = b"",
                max_blob: int = 1 << 20) -> tuple[dict[str, Any], bytes]:
        """One round trip. A killed process (timeout, crash, exit, memory, a forged or
        malformed reply) raises ``Stopped`` with that status; an error the candidate's
        code raised raises ``Stopped`` with the status the process names."""
        proc = judge.process()
        proc.memory_limit_mb = self.memory_limit_mb
        self.info["pid"] = proc.pid
        try:
            reply, data = proc.request(op, header, blob, self.deadline, max_blob)
        except judge.CandidateFailure as failure:
            self.info.update(killed=failure.kind, restarted=True)
            proc.start()  # a fresh one warms up for the next evaluation
            if failure.kind == "crashed" and failure.compiler:
                raise CompilerAborted(failure.fatal or failure.message) from None
            kind = "crashed" if failure.kind == "protocol" else failure.kind
            raise Stopped("timeout" if kind == "timeout" else "crashed", EvalError(
                kind=kind, message=failure.message, hint=FAILURE_HINTS.get(kind))) from None
        self.info["pid"] = proc.pid
        self.leftovers += _int(reply.get("leftover_processes")) or 0
        if reply.get("ok") is True:
            return reply, data
        failure = CandidateError.parse(reply)
        if failure is None:
            self.violation(f"an unknown failure {reply.get('status')!r}/"
                           f"{(reply.get('error') or {}).get('kind')!r}")
        flags: tuple[str, ...] = ()
        if failure.kind == "harness_tampering":
            flags, self.recycle = ("harness_tampering",), True
        elif failure.status == "rejected":  # platform_dependent, interpret_param
            flags = (failure.kind,)
        line = self.pallas_line if failure.kind == "runtime" else None  # inside a kernel
        raise Stopped(failure.status, failure.eval_error(line), flags=flags)

    def violation(self, what: str) -> NoReturn:
        """The process broke the protocol: killed, replaced, and the evaluation crashed."""
        proc = judge.process()
        proc.kill()
        proc.start()
        self.info.update(killed="protocol", restarted=True)
        raise Stopped("crashed", EvalError(
            kind="crashed", message=f"the candidate process sent {what}; it was killed and "
            "replaced", hint=FAILURE_HINTS["crashed"]))

    # -- the requests of an evaluation ------------------------------------------------------

    def load(self, spec: dict[str, Any], filename: str, source: str, *, interpret: bool,
             chip: str, lowering: bool, check_compile: bool,
             export_for: str | None = None) -> None:
        """``export_for``: the platform the judge runs the candidate's programs on
        itself (the exported route, ``runner``); None: the candidate process runs them."""
        self.runner = ExportedPrograms(export_for) if export_for else None
        self.info["route"] = "exported" if export_for else "candidate_process"
        self.request("load", {"spec": spec, "filename": filename, "interpret": interpret,
                              "chip": chip, "lowering": lowering,
                              "check_compile": check_compile and not export_for,
                              "export_for": export_for}, source.encode())

    def prepare(self, config: str, dyn: tuple, static: tuple,
                expected: Host | None = None) -> PrepareFacts:
        """Trace and lower at ``config`` in the candidate process; on the exported route
        also take its program, check it and compile it here (``ExportedPrograms.adopt``):
        the integrity checks then read that program's own text."""
        reply, data = self.request("prepare", {"config": config},
                                   judge.pickled(dyn, static, shapes_only=self.runner is not None),
                                   max_blob=EXPORT_LIMIT if self.runner else 1 << 20)
        facts = PrepareFacts.parse(reply)
        self.pallas_line = facts.pallas_lines[0] if len(facts.pallas_lines) == 1 else None
        if self.runner is not None and facts.lowering_error is None:
            if not data:
                self.violation("no exported program for the judge to run")
            limit = max_blob(expected) // 2 if expected is not None else 0
            program = self.runner.adopt(config, data, dyn, self.pallas_line, limit)
            if self.runner.platform == "tpu":  # what runs is what is read
                facts = replace(facts, hlo_text=program.text)
        if facts.hlo_text is not None:
            self.info["lowering_checked"] = True
        return facts

    def run(self, config: str, dyn: tuple, static: tuple, expected: Host,
            tree: str | None) -> Host:
        """One trial's outputs, as untrusted data: allowlisted dtypes, exact sizes, at
        most twice the reference's size (on the exported route: run here)."""
        if self.runner is not None:
            return self.runner.run(config, dyn, expected, tree, self.pallas_line)
        return self._outputs(*self.request("run", {"config": config},
                                           judge.pickled(dyn, static), max_blob(expected)),
                             expected, tree)

    def call(self, config: str, dyn: tuple, static: tuple) -> float:
        """A timed call on inputs staged just before it: the judge's clock around the
        round trip of ``call`` (never the candidate's own word). The exported route is
        timed on the judge's device instead (``evaluation.on_chip``)."""
        self.request("stage", {"config": config}, judge.pickled(dyn, static))
        started = time.perf_counter()
        self.request("call", {})
        return time.perf_counter() - started

    def fetch(self, expected: Host, tree: str | None) -> Host:
        """The last timed call's outputs."""
        return self._outputs(*self.request("fetch", {}, b"", max_blob(expected)), expected,
                             tree)

    def production(self, spec: dict[str, Any], chip: str, where: str,
                   signature: bytes, identity: bool = False) -> ProductionReply:
        """The candidate's program at the production shape; with ``identity``, traced
        only (its facts and ``program``, nothing exported)."""
        header = {"spec": spec, "chip": chip, "where": where, **({"identity": True}
                                                                 if identity else {})}
        reply, blob = self.request("production", header, signature, max_blob=1 << 30)
        found = ProductionReply.parse(reply, blob, identity)
        if isinstance(found, str):
            self.violation(found)
        return found

    def retrace(self) -> tuple[str | None, str | None]:
        """The production program's fingerprint as first traced, and as traced again now
        (after the check shapes): ``(first, again)``; (None, None) when there was no
        production trace or no process to ask."""
        if not judge.process().ready:
            return None, None
        reply, _ = self.request("retrace", {})
        first, again = reply.get("first"), reply.get("again")
        return (first if isinstance(first, str) else None,
                again if isinstance(again, str) else None)

    def verdicts(self) -> list[CheckVerdict] | None:
        """The check shapes' TPU compiles (a TPU host); None when the process is gone."""
        if not judge.process().ready:
            return None
        reply, _ = self.request("verdicts", {})
        return CheckVerdict.parse_all(reply)

    def finish(self) -> FinishReport | None:
        """Put back what the candidate changed in its process and say what it left; the
        process is replaced when it cannot serve another candidate (or ``recycle``).
        None when there was no process to ask."""
        proc = judge.process()
        if proc.proc is None or not proc.ready:
            return None
        try:
            reply, _ = proc.request("finish", {}, b"", max(self.deadline,
                                                            time.monotonic() + 5.0))
        except judge.CandidateFailure:
            proc.start()
            return None
        report = FinishReport.parse(reply)
        if report.untrustworthy:
            self.recycle = True
        if self.recycle:
            judge.recycle_candidate("the candidate left it untrustworthy")
            self.info["restarted"] = True
        judge.prepare_spare()  # the next candidate's process warms up meanwhile
        return report

    def _outputs(self, reply: dict[str, Any], data: bytes, expected: Host,
                 tree: str | None) -> Host:
        try:
            leaves = wire.unpack_arrays(reply.get("arrays"), data)
        except wire.ProtocolError as exc:
            self.violation(f"malformed outputs ({exc})")
        dtype = leaves[0].dtype if leaves else None
        return Host([np.asarray(leaf).astype(np.float32) for leaf in leaves],
                    tree or expected.tree, dtype)


def max_blob(expected: Host) -> int:
    """Outputs may be at most this large: twice the reference's, in float64, plus 1 MiB."""
    return 2 * sum(int(leaf.size) * 8 for leaf in expected.leaves) + (1 << 20)
