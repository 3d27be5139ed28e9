"""The candidate process: ``python -m tilewright.kernels.worker.candidate.main --fd N --scratch DIR``.

Started by the judge (the worker, ``kernels.worker.candidate.judge``), confined the same way
(``kernels.confinement.confine``: its own nested namespaces and Landlock domain, so it
can reach neither the judge's memory nor the app's socket, which it never inherits).
It is the only process that imports or runs candidate code. It never sees reference
outputs or the seeds of other trials: it gets inputs and returns outputs.

What is checked is what runs: per configuration the candidate's entry is traced ONCE
(``jax.jit(entry).trace``); the TPU lowering (sent to the judge as StableHLO text), the
TPU compile (verdict and estimate) and the executable used for every trial and timed
call are all built from that one jaxpr (``jaxpr_as_fun``), so the candidate's Python
(stack sniffing included) runs at trace time only. A ``pure_callback`` still runs
Python at call time: its outputs are checked, timed calls included.

The production shape (``production``): the candidate is loaded again under the task's
production runtime (a JAXBench CONFIG as written), traced once from abstract inputs
and exported for TPU, whole and with shortened grids (``kernels.worker.candidate.production``);
the judge has those programs compiled elsewhere (``kernels.worker.tpu.estimates``).

Ops (judge -> candidate; one at a time, each answered once, ``id`` echoed):
``load`` ``production`` ``prepare`` ``run`` ``stage`` ``call`` ``fetch`` ``verdicts``
``finish`` ``profile`` ``ping``. A failure is ``{ok: false, status, error}`` with the
contract's error object.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import time
from typing import Any

from tilewright.kernels import confinement
from tilewright.kernels.worker.candidate import wire
from tilewright.kernels.worker.candidate.programs import (
    empty_grids,
    exported_program,
    fingerprint,
    interpreted,
    trace,
)
from tilewright.profiling.chips import DEFAULT_TPU

HLO_TEXT_LIMIT = 8 << 20  # the TPU lowering's text sent to the judge
_CROSS_PLATFORM_CALLBACK = "is different from the lowering platform"
# jax 0.12's words for the same (a host callback lowered for a TPU that is not here)
_CALLBACK_NEEDS_DEVICES = "require devices to be present during lowering"


def _host_callback_refusal(message: str) -> bool:
    """The lowering failed because the program calls back to the host and no TPU is
    here: not the kernel's fault (``skipped``/``unavailable``, never a compile error)."""
    return _CROSS_PLATFORM_CALLBACK in message or _CALLBACK_NEEDS_DEVICES in message


class _Failure(Exception):
    def __init__(self, status: str, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.status = status
        self.error = error


class Server:
    """State of one evaluation in this process (dropped by ``finish``)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.runtime: Any = None
        self.entry: Any = None
        self.snapshot: Any = None
        self.filename = "kernel.py"
        self.interpret = False
        self.chip: str | None = None
        self.lowering = True
        self.check_compile = False  # compile the check shapes too (a TPU host: what runs)
        # The judge runs the program itself (a host with a chip, which only the judge may
        # open): each check shape's program is exported for this platform, not run here.
        self.export_for: str | None = None
        self.programs: dict[str, dict[str, Any]] = {}
        self.source = ""
        self.structures: dict[str, list[list[str]]] = {}
        self.jobs: list[tuple[str, Any]] = []
        self.staged: tuple[str, list[Any]] | None = None
        self.last: Any = None
        # (function, arguments, chip, fingerprint) of the production trace, for ``retrace``
        self.production_trace: tuple[Any, tuple[Any, ...], str | None, str] | None = None

    # -- helpers -----------------------------------------------------------------------
    def _describe(self, exc: BaseException, kind: str) -> dict[str, Any]:
        from tilewright.kernels.worker import errors

        return errors.describe(exc, kind, self.filename)

    def _check_tampering(self) -> None:
        changed = self.snapshot.changed() if self.snapshot is not None else []
        if changed:
            shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
            raise _Failure("rejected", {
                "kind": "harness_tampering", "line": None, "traceback": None, "hint": None,
                "message": "the candidate replaced attributes of modules the harness relies "
                           f"on: {shown}", "changed": changed[:50]})

    def _args(self, blob: bytes) -> tuple[list[Any], tuple]:
        dyn, static = pickle.loads(blob)  # from the judge: trusted direction
        import jax

        return jax.tree.leaves(dyn), tuple(static)

    # -- ops -----------------------------------------------------------------------------
    def load(self, header: dict[str, Any], blob: bytes) -> dict[str, Any]:
        from tilewright.kernels.worker.evaluation import integrity
        from tilewright.kernels.worker.execution import task_runtime
        from tilewright.kernels.worker.runtime import MissingEntryPoint

        self.reset()
        self.filename = header.get("filename") or "kernel.py"
        self.interpret = bool(header.get("interpret"))
        self.chip = header.get("chip")
        self.lowering = bool(header.get("lowering", True))
        self.check_compile = bool(header.get("check_compile", False))
        self.export_for = header.get("export_for") or None
        self.runtime = task_runtime(header["spec"])  # the task's code: not the candidate's
        if self.lowering and self.check_compile:
            from tilewright.kernels.worker.tpu import tpu_compile

            tpu_compile.start()  # before the snapshot: its thread is not the candidate's
        from tilewright.kernels.worker import pallas_compat

        pallas_compat.install()  # older Pallas names: the harness's aliases, before the snapshot
        self.snapshot = integrity.ModuleSnapshot()
        source = blob.decode()
        self.source = source
        try:
            with integrity.candidate_code():
                self.entry = self.runtime.load_candidate(source, self.filename)
        except SyntaxError as exc:
            error = self._describe(exc, "syntax")
            error["message"] = f"SyntaxError: {exc.msg} (line {exc.lineno})"
            raise _Failure("compile_error", error) from None
        except MissingEntryPoint as exc:
            error = self._describe(exc, "missing_entry")
            error["message"] = str(exc)
            entry = self.runtime.task.entry
            error["hint"] = (f"Define `def {entry}(*inputs)` at module level; it receives "
                             "the task's inputs and returns the output.")
            raise _Failure("compile_error", error) from None
        except BaseException as exc:  # import-time failure, sys.exit included
            kind = "exit" if isinstance(exc, SystemExit) else "import"
            raise _Failure("runtime_error", self._describe(exc, kind)) from None
        self._check_tampering()
        return {}

    def prepare(self, header: dict[str, Any], blob: bytes) -> dict[str, Any]:
        """Trace once; facts from the jaxpr; the TPU lowering's text; the TPU compile
        (in the background); the executable every trial and timed call will run."""
        import jax
        from jax.extend.core import jaxpr_as_fun

        from tilewright.kernels.worker import errors
        from tilewright.kernels.worker.evaluation import integrity
        from tilewright.kernels.worker.execution import (
            compile_lowered,
            execution_mode,
            reset_interpret_state,
        )
        from tilewright.kernels.worker.tpu import tpu_compile

        name = header["config"]
        dyn, static = pickle.loads(blob)  # from the judge: trusted direction
        flat = jax.tree.leaves(dyn)
        static_argnums = tuple(range(len(dyn), len(dyn) + len(static))) or None
        fn = jax.jit(self.entry, static_argnums=static_argnums)
        try:
            traced = trace(fn, (*dyn, *static), self.chip if self.lowering else None)
        except BaseException as exc:
            kind = "exit" if isinstance(exc, SystemExit) else "trace"
            raise _Failure("compile_error", self._describe(exc, kind)) from None
        self._check_tampering()
        closed = traced.jaxpr
        from tilewright.kernels.worker.evaluation import refusals

        refused = refusals.program_refusal(closed, self.filename)  # estimated == run
        if refused is not None:
            raise _Failure("rejected", refused)
        from tilewright.kernels.worker.candidate.production import structure

        facts: dict[str, Any] = {
            "empty_grids": empty_grids(closed),
            "structure": structure(closed),
            "pallas_call": integrity.contains_pallas_call(closed),
            "pallas_lines": integrity.pallas_call_lines(closed, self.filename),
            "outside_compute": integrity.outside_compute(closed, self.filename),
            "out_tree": str(jax.tree.structure(traced.out_info)),
            "lowering": None, "hlo_text": None,
        }
        # From here on no candidate Python runs: the jaxpr is re-bound, not re-traced.
        program = jax.jit(jaxpr_as_fun(closed))
        if self.lowering:
            try:
                with tpu_compile.abstract_device(self.chip):
                    lowered = program.trace(*flat).lower(lowering_platforms=("tpu",))
                facts["hlo_text"] = lowered.as_text()[:HLO_TEXT_LIMIT]
                facts["lowering"] = {"tpu": "ok", "message": None}
            except Exception as exc:
                message = errors.short_message(exc)
                if _host_callback_refusal(message) and self.interpret:
                    facts["lowering"] = {"tpu": "skipped", "message": "host callbacks cannot "
                                         "be lowered for TPU without a TPU: " + message}
                else:
                    facts["lowering"] = {"tpu": "error", "message": message, "shape": name}
                    facts["lowering_error"] = self._describe(exc, "lowering")
                    return facts
            else:
                if self.check_compile:
                    self._submit(name, program, flat)
        if self.export_for:  # the judge runs it on its own device: the program, exported
            try:
                data = exported_program(closed, flat, self.export_for, self.chip)
            except BaseException as exc:
                kind = "exit" if isinstance(exc, SystemExit) else "lowering"
                error = self._describe(exc, kind)
                error["message"] = (f"exporting the kernel for {self.export_for.upper()} at "
                                    f"{name} failed: {error['message']}")
                raise _Failure("compile_error", error) from None
            return facts, data
        if self.interpret:  # the same jaxpr, its pallas_calls interpreted
            program = jax.jit(interpreted(closed))
        try:
            with execution_mode(self.interpret):
                compiled = compile_lowered(program.lower(*flat), self.interpret)
        except BaseException as exc:
            if self.interpret:
                reset_interpret_state()
            kind = "exit" if isinstance(exc, SystemExit) else "runtime"
            raise _Failure("runtime_error", self._describe(exc, kind)) from None
        self.programs[name] = {"compiled": compiled}
        return facts

    def production(self, header: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        """Trace at the production shape (abstract inputs: nothing allocated) and export
        the program for TPU, whole and with shortened grids. The reply lists the
        programs (their bytes, in order, are the blob) and what the judge needs to know
        about them: the kernels and their grids, the structure of their bodies."""
        import jax

        from tilewright.kernels.worker import errors
        from tilewright.kernels.worker.candidate import pinned as pinning
        from tilewright.kernels.worker.candidate import production as prod
        from tilewright.kernels.worker.execution import task_runtime

        where = header.get("where") or "at the production shape"
        chip = header.get("chip") or self.chip or DEFAULT_TPU
        runtime = task_runtime(header["spec"])  # the task's code at the production size
        try:
            entry = runtime.load_candidate(self.source, self.filename)
        except BaseException as exc:
            kind = "exit" if isinstance(exc, SystemExit) else "import"
            raise _Failure("runtime_error", self._describe(exc, kind)) from None
        self._check_tampering()
        shapes, static, *rest = pickle.loads(blob)  # from the judge: trusted direction
        known = rest[0] if rest else {}  # small integer inputs' production values
        avals = [jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in shapes]
        static_argnums = tuple(range(len(avals), len(avals) + len(static))) or None
        fn = jax.jit(entry, static_argnums=static_argnums)
        try:
            traced = trace(fn, (*avals, *static), chip)
        except BaseException as exc:
            kind = "exit" if isinstance(exc, SystemExit) else "trace"
            error = self._describe(exc, kind)
            error["message"] = f"{where}: {error['message']}"
            raise _Failure("compile_error", error) from None
        self._check_tampering()
        closed = traced.jaxpr
        # Traced again after the check shapes (``retrace``): a program that depends on
        # when or from where it is traced is not the program that was checked.
        self.production_trace = (fn, (*avals, *static), chip, fingerprint(closed))
        from tilewright.kernels.worker.evaluation import integrity, refusals

        refused = refusals.program_refusal(closed, self.filename)  # estimated == run
        if refused is not None:
            raise _Failure("rejected", refused)
        plans = prod.plan(closed)
        facts: dict[str, Any] = {
            # the program's identity: another version that traces to it is the same
            # program (``EvalOptions.identity_only``)
            "program": self.production_trace[3],
            "pallas_call": integrity.contains_pallas_call(closed),
            # the work outside the kernels of the program that will run (not only of the
            # checked ones)
            "outside_compute": integrity.outside_compute(closed, self.filename),
            "structure": prod.structure(closed),
            "plans": [p.to_json() for p in plans],
            "out_shapes": [[list(a.shape), str(a.dtype)]
                           for a in jax.tree.leaves(traced.out_info)],
        }
        if header.get("identity"):  # the ``identity`` op: which program, nothing exported
            facts["programs"] = []
            return facts, b""
        # From here on no candidate Python runs: the jaxpr is re-bound, not re-traced.
        variants = {"full": prod.variant(closed, plans, None)}
        if prod.any_scaled(plans):
            variants["scaled0"] = prod.variant(closed, plans, 0)
            variants["scaled1"] = prod.variant(closed, plans, 1)
        flat = [v.aval for v in closed.jaxpr.invars]
        pinned: dict[str, Any] = {}
        try:  # loops of run-time length: their bounds from the production inputs' values
            found = pinning.pinned_programs(closed, plans, known)
        except Exception as exc:  # cannot pin: the kernel is estimated as it is
            found = {}
            facts["pin_error"] = errors.short_message(exc)[:300]
        for key, (program, avals, values) in found.items():
            try:
                data = prod.export(program, avals, chip)
            except Exception as exc:
                facts["pin_error"] = errors.short_message(exc)[:300]
                continue
            pinned[key] = (data, values)
        chunks: list[bytes] = []
        names: list[list[Any]] = []
        for key, program in variants.items():
            try:
                data = prod.export(program, [jax.ShapeDtypeStruct(a.shape, a.dtype)
                                             for a in flat], chip)
            except Exception as exc:
                message = errors.short_message(exc)
                if _host_callback_refusal(message):  # not a refusal: no TPU here
                    facts["unavailable"] = ("host callbacks cannot be compiled for TPU "
                                            "without a TPU: " + message)
                    facts["programs"] = []
                    return facts, b""
                if key != "full":  # the whole program lowered: a short grid must too
                    facts.setdefault("export_errors", []).append(
                        f"{key}: {errors.short_message(exc)}")
                    continue
                error = self._describe(exc, "lowering")
                error["message"] = f"{where}: {error['message']}"
                raise _Failure("compile_error", error) from None
            names.append([key, len(data)])
            chunks.append(data)
        if len(chunks) == 2:  # one short grid is not enough to scale: use the whole one
            names, chunks = names[:1], chunks[:1]
        for key, (data, _values) in pinned.items():
            names.append([key, len(data)])
            chunks.append(data)
        facts["pinned"] = {key[len("pinned"):].split("_")[0]: values
                           for key, (_d, values) in pinned.items()}
        facts["programs"] = names
        return facts, b"".join(chunks)

    def _submit(self, name: str, program: Any, flat: list[Any]) -> None:
        from tilewright.kernels.worker.tpu import tpu_compile

        where, why = tpu_compile.target(self.chip or DEFAULT_TPU)
        if where is None:
            self.jobs.append((name, why))
            return
        try:
            lowered = tpu_compile.lower(program, tuple(flat), (), where)
        except Exception as exc:
            self.jobs.append((name, exc))
            return
        job = tpu_compile.submit(lowered, where)
        if where.native:
            job.result()  # the dump directory must not see the trials' own compiles
        self.jobs.append((name, job))

    def _execute(self, name: str, flat: list[Any]) -> list[Any]:
        import jax

        from tilewright.kernels.worker.execution import execution_mode, reset_interpret_state

        compiled = self.programs[name]["compiled"]
        try:
            with execution_mode(self.interpret):
                out = jax.block_until_ready(compiled(*flat))
        except BaseException as exc:
            if self.interpret:
                reset_interpret_state()
            kind = "exit" if isinstance(exc, SystemExit) else "runtime"
            raise _Failure("runtime_error", self._describe(exc, kind)) from None
        self._check_tampering()
        return list(out)

    def run(self, header: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        flat, _ = self._args(blob)
        meta, data = wire.pack_arrays(self._execute(header["config"], flat))
        return {"arrays": meta}, data

    def stage(self, header: dict[str, Any], blob: bytes) -> dict[str, Any]:
        import jax

        flat, _ = self._args(blob)
        self.staged = (header["config"], [jax.block_until_ready(jax.device_put(a))
                                          for a in flat])
        self.last = None
        return {}

    def call(self, header: dict[str, Any], blob: bytes) -> dict[str, Any]:
        if self.staged is None:
            raise _Failure("runtime_error", {"kind": "runtime", "message": "nothing staged",
                                             "line": None, "traceback": None, "hint": None})
        name, flat = self.staged
        self.staged = None  # every timed call gets inputs of its own
        self.last = self._execute(name, flat)
        return {}

    def fetch(self, header: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        meta, data = wire.pack_arrays(self.last or [])
        return {"arrays": meta}, data

    def verdicts(self, header: dict[str, Any], blob: bytes) -> dict[str, Any]:
        from tilewright.kernels.worker import errors

        found = []
        for name, job in self.jobs:
            if isinstance(job, str):
                item = {"compile": "unavailable", "message": job}
            elif isinstance(job, BaseException):
                message = errors.short_message(job)
                unavailable = _host_callback_refusal(message) or "callback" in message
                item = {"compile": "unavailable" if unavailable else "error",
                        "kind": "lowering", "message": message}
            else:
                item = job.result()
            found.append({"config": name, **item})
        return {"verdicts": found}

    def retrace(self, header: dict[str, Any], blob: bytes) -> dict[str, Any]:
        """Trace the production shape once more, the same way, after the check shapes were
        traced and run: the two programs' fingerprints (they differ only for a candidate
        whose program depends on the trace's context: its order, its caller, a count)."""
        if self.production_trace is None:
            return {"first": None, "again": None}
        fn, args, chip, first = self.production_trace
        import jax

        # Every trace cache emptied (the candidate's own inner jits too): its Python runs
        # again, as it would in the user's process. The executables already built for the
        # check shapes are kept by this process, not by those caches.
        jax.clear_caches()
        try:
            again = fingerprint(trace(fn, args, chip).jaxpr)
        except BaseException as exc:
            again = f"raised {type(exc).__name__}"
        self._check_tampering()
        return {"first": first, "again": again}

    def finish(self, header: dict[str, Any], blob: bytes) -> dict[str, Any]:
        """Put back jax.config, report threads and tampering, drop the evaluation."""
        report: dict[str, Any] = {"config_changed": [], "restored": True, "threads": [],
                                  "tampered": []}
        if self.snapshot is not None:
            report["tampered"] = self.snapshot.changed()[:50]
            report["threads"] = self.snapshot.new_threads()[:20]
            report["config_changed"], report["restored"] = self.snapshot.restore_config()
        self.reset()
        return report

    def profile(self, header: dict[str, Any], blob: bytes) -> dict[str, Any]:
        """The profile op's candidate half (``kernels.worker.candidate.profile``): the loaded
        candidate analyzed and run under the profiler here, never in the judge."""
        from tilewright.kernels.worker.candidate import profile as profile_op

        try:
            reply = profile_op.run_in_candidate(self.entry, header, blob)
        except profile_op.CandidateFault as fault:
            raise _Failure(fault.status, self._describe(fault.exc, fault.kind)) from None
        self._check_tampering()
        return reply

    def ping(self, header: dict[str, Any], blob: bytes) -> dict[str, Any]:
        return {}


def serve(sock: socket.socket) -> None:
    server = Server()
    wire.send(sock, {"type": "ready", "pid": os.getpid()})
    while True:
        try:
            header, blob = wire.recv(sock)
        except (wire.ChannelClosed, OSError, wire.ProtocolError):
            return
        op = str(header.get("op"))
        reply: dict[str, Any] = {"id": header.get("id"), "ok": True}
        data = b""
        started = time.perf_counter()
        try:
            handler = getattr(server, op) if op in OPS else None
            if handler is None:
                raise _Failure("crashed", {"kind": "crashed", "message": f"unknown op {op!r}",
                                           "line": None, "traceback": None, "hint": None})
            out = handler(header, blob)
            if isinstance(out, tuple):
                out, data = out
            reply.update(out)
        except _Failure as failure:
            reply.update(ok=False, status=failure.status, error=failure.error)
        except BaseException as exc:  # a harness bug: say so, keep serving
            reply.update(ok=False, status="runtime_error",
                         error=server._describe(exc, "runtime"))
        reply["handler_s"] = time.perf_counter() - started
        try:  # whatever the candidate forked ends with the request that started it
            reply["leftover_processes"] = confinement.kill_descendants()
        except OSError:
            reply["leftover_processes"] = None
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            wire.send(sock, reply, data)
        except OSError:
            os._exit(0)  # the judge is gone


OPS = ("load", "production", "prepare", "run", "stage", "call", "fetch", "verdicts",
       "retrace", "finish", "profile", "ping")


def main(argv: list[str] | None = None) -> int:
    from tilewright.kernels.worker.startup import child_main

    return child_main(argv, "python -m tilewright.kernels.worker.candidate.main", serve, confine=True,
                      warm=True)


if __name__ == "__main__":
    sys.exit(main())
