"""One evaluation of a candidate, inside the judge: the ``eval`` and ``estimate`` ops.

This module is the pipeline; each room of the work is a module of its own:
``kernels.worker.candidate.channel`` (requests to the candidate process, its untrusted replies
parsed once into types), ``kernels.worker.tpu.verdict`` (the TPU compile and estimate at
the production shape, and what a refusal means), ``kernels.worker.evaluation.timing`` (the timed
calls and the baseline), ``kernels.worker.evaluation.integrity`` (the facts the judge checks
itself, the flags) and ``kernels.worker.evaluation.compare`` (when an output is correct).

The order is part of the contract (docs/EVALUATION.md, "The steps, in order"):

1. Load the task runtime (cached per task in a warm worker) and pick the shape
   configurations meant for this host (small ones on CPU, all on hardware).
2. Compute the reference outputs for every configuration and trial, with fresh random
   keys, *before* the candidate's code is loaded: it cannot influence them.
3. Load the candidate in the candidate process (syntax error, import failure or
   missing entry point -> compile_error / runtime_error), and have it export its
   program at the production shape, compiled in the background while the trials run.
4. Per configuration: trace (``no_pallas_call`` from the lowering -> rejected when the
   task requires Pallas) and lower for TPU (``lowering_platforms=("tpu",)``, lowered,
   not compiled) -> compile_error on failure, even where interpret mode would run it.
5. Run every trial (TPU interpret mode on a CPU host, native on a TPU), compare in
   float32; the first trial runs twice (``nondeterministic``).
6. Join the production compiles (a refusal there is a compile error), then time
   candidate and reference the same way on one configuration.

A step that decides the evaluation early raises ``kernels.worker.errors.Stopped`` with
its status and error; ``Evaluation.run`` is the one place that applies it to the result.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

import numpy as np

from tilewright.kernels.judge.options import MIN_TRIALS, EvalOptions
from tilewright.kernels.judge.result import (
    ESTIMATE_SCHEMA,
    Backend,
    EvalError,
    EvalResult,
)
from tilewright.kernels.tasks.task import ShapeConfig, Task, TaskError
from tilewright.kernels.worker import ops
from tilewright.kernels.worker.backend import backend_info
from tilewright.kernels.worker.candidate import judge
from tilewright.kernels.worker.candidate.channel import (
    CandidateChannel,
    CompilerAborted,
    PrepareFacts,
)
from tilewright.kernels.worker.errors import (
    Stopped,
    short_message,
    task_failure,
)
from tilewright.kernels.worker.evaluation import held_out, integrity, on_chip, timed
from tilewright.kernels.worker.evaluation.compare import (
    AS_WRITTEN,
    PRECISE,
    Host,
    effective_atol,
    finite_or_none,
    judge_output,
    precise_reference,
    to_host,
)
from tilewright.kernels.worker.execution import (
    execution_mode,
    jitted_reference,
    reset_interpret_state,
    task_runtime,
)
from tilewright.kernels.worker.ops import op
from tilewright.kernels.worker.tpu import tpu_compile, verdict
from tilewright.kernels.worker.tpu.production_run import ProductionRun
from tilewright.profiling.chips import DEFAULT_TPU, backend_is_interpret

KEEP_INPUT_BYTES = 256 << 20  # trial inputs kept between the reference and candidate passes


@op("estimate")
def estimate_request(payload: dict[str, Any]) -> dict[str, Any]:
    """The ``estimate`` op: ``{task, source, filename, options}`` -> the production-shape
    verdict and estimate without any correctness check: ``{schema, status (ok |
    compile_error | runtime_error | timeout | crashed | rejected), tpu, error,
    duration_s}``."""
    options = {**(payload.get("options") or {}), "check": False, "timing": False,
               "lowering": True}
    result = Evaluation(payload["task"], payload["source"],
                        payload.get("filename") or "kernel.py", options).run().to_json()
    status = "ok" if result["status"] == "correct" else result["status"]
    if options.get("identity_only"):  # which program it is, nothing compiled (EvalOptions)
        return {"schema": ESTIMATE_SCHEMA, "status": status, "tpu": None,
                "program": (result.get("extra") or {}).get("program"),
                "error": result.get("error"), "duration_s": result.get("duration_s")}
    if (result.get("extra") or {}).get("measured") is not None and result.get("tpu"):
        # a TPU host: the production program measured on the chip, beside the estimate
        result["tpu"]["measured"] = result["extra"]["measured"]
    return {"schema": ESTIMATE_SCHEMA, "status": status, "tpu": result.get("tpu"),
            "error": result.get("error"), "backend": result.get("backend"),
            "integrity": result.get("integrity"), "duration_s": result.get("duration_s"),
            "phases": (result.get("extra") or {}).get("phases")}


@op("eval")
def evaluate_request(payload: dict[str, Any]) -> dict[str, Any]:
    """The ``eval`` op: ``{task, source, filename, options}`` -> EvalResult JSON."""
    return Evaluation(payload["task"], payload["source"], payload.get("filename") or "kernel.py",
                      payload.get("options") or {}).run().to_json()


class Evaluation:
    """One candidate judged against one task. ``options`` is the request's JSON: the
    fields of ``kernels.judge.options.EvalOptions`` (its defaults for what is not given),
    ``memory_limit_mb`` of the worker, and ``check: false`` for the ``estimate`` op."""

    def __init__(self, spec: dict[str, Any], source: str, filename: str,
                 options: dict[str, Any]) -> None:
        self.spec = spec
        self.task = Task.from_spec(spec)
        self.source = source
        self.filename = filename
        self.options = EvalOptions.from_json(options)
        # Never fewer than MIN_TRIALS: one trial cannot tell a stale cache from a kernel.
        self.trials = max(int(self.options.trials), MIN_TRIALS)
        # False: no correctness check at all, only the production verdict and estimate
        # (the ``estimate`` op: ``tilewright estimate``, benchmarks)
        self.check = bool(options.get("check", True))
        # The ``estimate`` op on a TPU host also measures the production program on the
        # chip, beside the estimate (``measure: false`` skips that)
        self.measure = bool(options.get("measure", True))
        # ``estimate`` with ``identity_only``: the production trace's fingerprint, then stop
        self.identity = bool(self.options.identity_only) and not self.check
        self.backend = backend_info()
        self.interpret = backend_is_interpret(self.backend)
        self.chip = str(self.options.chip or _own_chip(self.backend) or DEFAULT_TPU)
        self.result = EvalResult(status="correct", backend=None)
        self.phases: dict[str, float] = {}
        self.began = time.perf_counter()
        self.at_shape: str | None = None  # the check shape being judged, for progress
        self.flags: list[str] = []
        self.outside_compute: list[str] = []  # work found outside every pallas_call
        # The candidate runs in another process (kernels.worker.candidate.judge); this one judges.
        timeout_s = float(self.options.timeout_s)
        margin = min(max(0.15 * timeout_s, 0.3), 5.0)  # answer before the app kills us
        self.phase_window_s = timeout_s - margin  # each phase's: renewed as one finishes
        self.channel = CandidateChannel(
            time.monotonic() + self.phase_window_s,
            int(options.get("memory_limit_mb") or judge.DEFAULT_MEMORY_MB))
        self.production: ProductionRun | None = None  # the production-shape verdict
        self.native_checked = False  # a TPU host compiled the check shapes for itself
        # The platform the judge runs the candidate's exported programs on (a TPU host:
        # only the judge may open the chip); None: the candidate process runs them.
        self.export_for = on_chip.export_platform(self.backend, self.options.route)
        self.check_structures: list[Any] = []  # what the kernels compute, per check shape
        self.shape_details: list[dict[str, Any]] = []
        self.out_trees: dict[str, str] = {}  # the outputs' structure, per check shape
        # Per configuration and trial, the reference computed in f32 from the same inputs
        # where the written one is low precision (bf16, f16): ``compare.judge_output``.
        self.precise: dict[str, list[Host | None]] = {}
        self._kept_inputs: dict[tuple[str, int], tuple[tuple, tuple]] = {}
        self._kept_bytes = 0

    # -- driver ----------------------------------------------------------------------

    def run(self) -> EvalResult:
        started = time.perf_counter()
        result = self.result
        result.backend = Backend(**self.backend)
        try:
            self._steps()
        except Stopped as stop:
            self._apply(stop)
        except CompilerAborted as abort:
            self._apply(verdict.compiler_abort(self.chip, abort.fatal, self._kernel_line()))
        production = self.production
        if result.tpu is None and production is not None \
                and (production.job is not None or production.unavailable):
            # stopped early: still say what the production program compiled to
            result.tpu, flags = verdict.production_verdict(
                production, self.check_structures, self.chip, None, apply=False)
            self.flags += flags
        pump = judge.process().stderr
        if pump is not None and pump.held:  # printed during held-out configurations
            self.result.extra.setdefault("held_out", {})["output"] = bytes(pump.held).decode(
                errors="replace")[-4000:]
        self._finish_candidate()
        self.channel.info["started"] = judge.process().started
        result.extra["candidate_process"] = self.channel.info
        result.integrity = {"flags": sorted(set(self.flags))}
        result.note_leftovers(self.channel.leftovers)
        if self.outside_compute:
            result.integrity["outside_compute"] = self.outside_compute[:20]
        result.extra.update(shapes=self.shape_details, phases=self.phases,
                            interpret=self.interpret)
        held_out.scrub(self)
        result.duration_s = time.perf_counter() - started
        return result

    def _apply(self, stop: Stopped) -> None:
        """The one place an early decision meets the result."""
        self.result.status = stop.status
        self.result.error = stop.error
        self.flags += stop.flags
        if stop.lowering is not None:
            self.result.lowering = stop.lowering
        if stop.tpu is not None:
            self.result.tpu = stop.tpu

    def _phase(self, name: str, since: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - since
        # The deadline bounds each phase, so it starts again here; the app renews its own
        # as it hears this, and a request killed at its deadline is reported with how far
        # it got (on the v5e a gelu at 8192x8192 ran past 120 s in all, saying nothing)
        self.channel.deadline = max(self.channel.deadline,
                                    time.monotonic() + self.phase_window_s)
        ops.progress({"kind": "phase", "phase": name, "shape": self.at_shape,
                      "at_s": round(time.perf_counter() - self.began, 2),
                      "phases": {k: round(v, 2) for k, v in self.phases.items()}})

    def _count(self, name: str, since: float) -> None:
        """Time inside a phase (where it goes: inputs, comparisons), no deadline renewed."""
        self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - since

    def _kernel_line(self) -> int | None:
        """The one pallas_call's line, where a failure names no line of its own."""
        return self.channel.pallas_line

    def _steps(self) -> None:
        # 1. the task and the shapes for this host
        t = time.perf_counter()
        try:
            runtime = task_runtime(self.spec)
            configs = self._configs(runtime) if self.check else []
        except Stopped:
            raise
        except Exception as exc:  # the task's fault, not the candidate's
            if not isinstance(exc, TaskError):
                exc = _task_error(exc, self.task.reference_path, "loading the task failed")
            raise task_failure(exc, str(exc)) from exc
        self._phase("runtime_s", t)

        # 2. references first, with fresh keys the candidate cannot predict
        t = time.perf_counter()
        seeds = {c.name: [int.from_bytes(os.urandom(4), "little") for _ in range(self.trials)]
                 for c in configs}
        references = self._references(runtime, configs, seeds)
        self._phase("reference_s", t)

        # 3. the candidate, in a process of its own: one no other candidate has run in
        t = time.perf_counter()
        proc = judge.assign(self.source)
        if proc.stderr is not None:
            proc.stderr.release()  # a new evaluation: its visible part is the agent's
        self.channel.load(self.spec, self.filename, self.source, interpret=self.interpret,
                          chip=self.chip, lowering=self.options.lowering,
                          check_compile=self._native(),  # what runs on a TPU host
                          export_for=self.export_for)
        self._phase("load_s", t)

        # 3b. its program at the production shape, compiled while the trials run
        if self.options.lowering:
            t = time.perf_counter()
            # on the chip it runs on, the chip's compiler gives the verdict and the
            # chip's clock the ranking: no estimate is made (``estimate`` makes one)
            chip_runner = self.channel.runner if self.check and self._native() \
                and not self.options.estimate_on_tpu else None
            self.production = ProductionRun(self.task, self.chip, self.channel,
                                            self.channel.deadline,
                                            self.options.compile_memory_mb,
                                            on_chip=chip_runner)
            self.production.start(identity=self.identity)
            self._phase("production_export_s", t)
            if self.identity:
                reply = self.production.reply
                self.result.extra["program"] = reply.program if reply is not None else None
                return
        if not self.check:  # the ``estimate`` op: the production verdict and estimate only
            t = time.perf_counter()
            self._tpu_verdict(apply=True)
            self._phase("tpu_wait_s", t)
            if self.export_for == "tpu" and self.measure:  # and measured on the chip
                t = time.perf_counter()
                found = on_chip.at_production(self.production, self.channel.runner,
                                              self._kernel_line(), self.options.iters,
                                              self.options.time_budget_s)
                self.result.extra["measured"] = (
                    on_chip.measured_json(found) if isinstance(found, on_chip.Measured)
                    else {"unavailable": found})
                self._phase("measure_s", t)
            return

        # 4 + 5. trace, lower, run, compare: configuration by configuration, the held-out
        # ones last (from their first on, nothing the candidate says reaches the agent)
        for config in sorted(configs, key=lambda c: c.held_out):
            self.at_shape = config.name
            if config.held_out:
                held_out.withhold()
            try:
                self.shape_details.append(self._check_config(
                    runtime, config, seeds[config.name], references[config.name]))
            except Stopped as stop:
                if config.held_out:
                    raise held_out.without_words(self, stop) from None
                raise
            if config.held_out:
                held_out.hide_details(self, self.shape_details[-1])
        all_correct = self._correctness()
        t = time.perf_counter()
        # Joins the background compiles; a refusal at the production shape stops here. A
        # kernel wrong at the check shapes is reported wrong first: that is what to fix.
        self._tpu_verdict(apply=all_correct)
        self._phase("tpu_wait_s", t)
        if not all_correct:
            self.result.status = "incorrect"
            return

        # 6. timing
        if self.options.timing:
            t = time.perf_counter()
            timed.time_kernel(self, runtime, configs, seeds, references)
            self._phase("timing_s", t)

    # -- steps -----------------------------------------------------------------------

    def _configs(self, runtime: Any) -> list[ShapeConfig]:
        platform = self.backend["platform"]
        all_configs = list(runtime.configs())
        host = list(replace(self.task, shapes=tuple(all_configs)).shapes_for(platform))
        wanted = self.options.shapes
        if wanted:
            known = {c.name for c in all_configs}
            unknown = [n for n in wanted if n not in known]
            if unknown:
                raise task_failure(None, f"unknown shape configuration(s) {unknown}; the "
                                   f"task has {sorted(known)}")
            host = [c for c in all_configs if c.name in wanted]
        if not host:
            sizes = ", ".join(f"{c.name} ({c.size})" for c in all_configs)
            raise task_failure(None, f"no shape configuration is meant for a {platform} "
                               f"host (the task has: {sizes}); add a small one or shrink one "
                               "with --set", hint="On a CPU host only configurations "
                               "marked size='small' run (TPU interpret mode is slow).")
        return host

    def _references(self, runtime: Any, configs: list[ShapeConfig],
                    seeds: dict[str, list[int]]) -> dict[str, list[Host]]:
        references: dict[str, list[Host]] = {}
        try:
            for config in configs:
                references[config.name] = []
                self.precise[config.name] = []
                for seed in seeds[config.name]:
                    dyn, static = self._inputs(runtime, config, seed)
                    fn = jitted_reference(runtime, len(dyn), len(static))
                    # same mode as the candidate: a reference may itself use Pallas
                    with execution_mode(self.interpret):
                        expected = to_host(fn(*dyn, *static))
                    references[config.name].append(expected)
                    self.precise[config.name].append(
                        precise_reference(fn, dyn, static, expected, self.interpret))
        except Exception as exc:
            if self.interpret:
                reset_interpret_state()
            if not isinstance(exc, TaskError):  # the reference itself failed
                exc = _task_error(exc, self.task.reference_path, "the reference failed")
            raise task_failure(exc, str(exc)) from exc
        return references

    def _check_config(self, runtime: Any, config: ShapeConfig,
                      seeds: list[int], references: list[Host]) -> dict[str, Any]:
        atol, rtol = runtime.tolerance(config, references[0].dtype)
        detail: dict[str, Any] = {
            "name": config.name, "held_out": config.held_out, "trials": 0,
            "atol": atol, "rtol": rtol, "correct": False, "reason": None,
            "max_abs_diff": None, "max_rel_diff": None,
        }
        if not config.held_out:
            detail["params"] = config.params
        dyn, static = self._inputs(runtime, config, seeds[0])

        t = time.perf_counter()
        facts = self.channel.prepare(config.name, dyn, static, references[0])
        self._judge_facts(config, facts, dyn, references[0])
        self._phase("trace_lower_s", t)

        t = time.perf_counter()
        worst_abs, worst_rel = 0.0, 0.0
        detail["atol_effective"] = effective_atol(references[0], atol)
        tree = self.out_trees.get(config.name)
        precise = self.precise.get(config.name) or [None] * len(references)
        bases: set[str] = set()
        for trial, (seed, expected) in enumerate(zip(seeds, references, strict=True)):
            if trial:
                dyn, static = self._inputs(runtime, config, seed)
            started = time.perf_counter()
            out = self.channel.run(config.name, dyn, static, expected, tree)
            self._phase("kernel_run_s", started)
            if trial == 0:
                again = self.channel.run(config.name, dyn, static, expected, tree)
                if not integrity.outputs_identical(out.leaves, again.leaves):
                    self.flags.append("nondeterministic")
            if integrity.is_degenerate(expected.leaves):  # every trial: the same flags each run
                self.flags.append("degenerate_reference")
            started = time.perf_counter()
            found, basis = judge_output(out, expected, precise[trial], atol, rtol)
            self._count("compare_s", started)
            bases.add(basis)
            detail["trials"] = trial + 1
            if found.max_abs_diff is not None:
                worst_abs = max(worst_abs, found.max_abs_diff)
                worst_rel = max(worst_rel, found.max_rel_diff or 0.0)
            if not found.close:
                known = found.max_abs_diff is not None
                detail.update(reason=f"trial {trial + 1}: {found.reason}",
                              max_abs_diff=finite_or_none(worst_abs) if known else None,
                              max_rel_diff=finite_or_none(worst_rel) if known else None)
                self._phase("trials_s", t)
                return detail
        detail.update(correct=True, max_abs_diff=finite_or_none(worst_abs),
                      max_rel_diff=finite_or_none(worst_rel),
                      judged_against=PRECISE if PRECISE in bases else AS_WRITTEN)
        self._phase("trials_s", t)
        return detail

    def _judge_facts(self, config: ShapeConfig, facts: PrepareFacts, dyn: tuple,
                     expected: Host) -> None:
        """Decide from what the candidate process reported, checking what can be checked:
        the TPU lowering's StableHLO text is read here (``integrity.check_lowering``) for
        the Pallas custom call and for compute outside it; the jaxpr-derived facts are
        the candidate process's word (docs/SECURITY.md says what remains trusted)."""
        self.out_trees[config.name] = facts.out_tree
        if facts.empty_grids:  # floor-divided blocks larger than the arrays: no step
            raise Stopped("incorrect", EvalError(
                kind="empty_grid",
                message=f"at the check shape {config.name} the kernel divides the shape into "
                        f"zero blocks, so it computes nothing: {'; '.join(facts.empty_grids)}",
                line=self._kernel_line(), traceback=None,
                hint="A block larger than the array gives a grid of 0 steps (rows // BLOCK): "
                     "clamp blocks to the array (min(BLOCK, rows)) or use pl.cdiv, or check "
                     "at shapes at least one block large (tilewright new fits them to the "
                     "kernel's blocks; --set KEY=VALUE)."))
        sizes = [int(np.prod(getattr(a, "shape", ()))) for a in dyn]
        sizes += [int(leaf.size) for leaf in expected.leaves]
        found = integrity.check_lowering(facts.hlo_text, facts.claims_pallas,
                                         facts.outside_compute, max(sizes, default=0))
        if found.contradicted:
            self.channel.recycle = True
            raise Stopped("rejected", EvalError(
                kind="harness_tampering", message="the candidate process's report "
                "contradicts its TPU lowering (pallas_call "
                f"{'claimed' if facts.claims_pallas else 'denied'}, the lowered program "
                f"{'has' if found.has_pallas else 'has no'} Pallas kernel)"),
                flags=("harness_tampering",))
        if not found.has_pallas:
            self.flags.append("no_pallas_call")
            if self.task.require_pallas:
                raise Stopped("rejected", EvalError(
                    kind="no_pallas_call", message="the candidate contains no pallas_call, "
                    "and this task requires a Pallas kernel",
                    hint="Write the computation as a pl.pallas_call kernel; a plain "
                         "jax.numpy rewrite is not accepted for this task."))
        elif found.outside:  # the work is done by XLA around the kernel, not by the kernel
            self.flags.append("compute_outside_kernel")
            self.outside_compute = sorted({*self.outside_compute, *found.outside})
        lowering = facts.lowering
        if lowering is not None:
            section = {"tpu": lowering.tpu, "message": lowering.message}
            if facts.lowering_error is not None:
                raise Stopped("compile_error", facts.lowering_error,
                              lowering={**section, "shape": config.name})
            self.result.lowering = section
            if self._native() and self.export_for is None:  # compiled at this shape too
                self.native_checked = True
        if facts.structure is not None:
            self.check_structures.append(facts.structure)

    def _correctness(self) -> bool:
        """The ``correctness`` section over every configuration; whether all passed."""
        details = self.shape_details
        failed = [d for d in details if not d["correct"]]
        abs_diffs = [d["max_abs_diff"] for d in details if d["max_abs_diff"] is not None]
        rel_diffs = [d["max_rel_diff"] for d in details if d["max_rel_diff"] is not None]
        self.result.correctness = {
            "correct": not failed, "trials": self.trials,
            # null when a failing shape has no number to give (NaN output, wrong shape)
            "max_abs_diff": max(abs_diffs) if abs_diffs and not any(
                d["max_abs_diff"] is None for d in failed) else None,
            "max_rel_diff": max(rel_diffs) if rel_diffs else None,
            "atol": details[0]["atol"], "rtol": details[0]["rtol"],
            "reason": f"{failed[0]['name']}: {failed[0]['reason']}" if failed else None,
        }
        # The absolute tolerance as enforced (capped at 5% of max|ref|), visible shapes.
        judged = [d.get("judged_against") for d in details if d.get("judged_against")]
        self.result.correctness["judged_against"] = PRECISE if PRECISE in judged \
            else AS_WRITTEN
        caps = [d["atol_effective"] for d in details
                if not d["held_out"] and d.get("atol_effective") is not None]
        if caps:
            self.result.correctness["atol_effective"] = min(caps)
        return not failed

    def _tpu_verdict(self, apply: bool) -> None:
        """The ``tpu`` section: the compile and estimate at the production shape
        (``kernels.worker.tpu.production_run``, joined by ``kernels.worker.tpu.verdict``).
        With ``apply``, a refusal by the TPU compiler there, or at a check shape on a TPU
        host, stops the evaluation as a compile_error naming the compiler's message."""
        line = self._kernel_line()
        if self.native_checked and apply:
            verdict.check_shape_refusal(self.channel.verdicts(), self.chip, line)
        # the production program traced once more, the same way, after the check shapes
        retraced = self.channel.retrace() if apply and self.production is not None \
            and self.production.reply is not None else (None, None)
        section, flags = verdict.production_verdict(self.production, self.check_structures,
                                                    self.chip, line, apply, retraced)
        self.result.tpu = section
        self.flags += flags

    # -- helpers ---------------------------------------------------------------------

    def _inputs(self, runtime: Any, config: ShapeConfig, seed: int) -> tuple[tuple, tuple]:
        """Inputs for one trial. Kept from the reference pass while they are small (the
        candidate never saw them: it was loaded later); rebuilt from the same key when
        keeping them all would cost too much memory (TPU-sized configurations)."""
        import jax

        key = (config.name, seed)
        if key in self._kept_inputs:
            return self._kept_inputs[key]
        started = time.perf_counter()
        inputs = runtime.make_inputs(config, jax.random.PRNGKey(seed))
        self._count("inputs_s", started)
        size = sum(int(getattr(a, "nbytes", 0)) for a in inputs[0])
        if self._kept_bytes + size <= KEEP_INPUT_BYTES:
            self._kept_inputs[key] = inputs
            self._kept_bytes += size
        return inputs

    def _native(self) -> bool:
        where, _ = tpu_compile.target(self.chip) if self.options.lowering else (None, None)
        return where is not None and where.native

    def _finish_candidate(self) -> None:
        """Put back what the candidate changed in its process; the channel decides
        whether the process stays warm for the next evaluation."""
        report = self.channel.finish()
        if report is None:
            return
        if report.config_changed:
            self.flags.append("jax_config_changed")
            self.result.extra["jax_config_changed"] = list(report.config_changed)
        if report.threads:
            self.flags.append("background_threads")  # they would run on during the next timing
            self.result.extra["threads_left"] = list(report.threads)[:10]


def _own_chip(backend: dict[str, Any]) -> str | None:
    """On a TPU host: the device's own chip (its device time ranks kernels)."""
    if backend.get("platform") != "tpu":
        return None
    from tilewright.profiling.chips import chip_for_device

    try:
        return chip_for_device("tpu", backend.get("device_kind") or "").name
    except KeyError:
        return None


def _task_error(exc: BaseException, path: Any, what: str) -> TaskError:
    """``exc`` raised by the task's own code, as a TaskError at the task file's line."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == str(path):
            line = tb.tb_lineno
        tb = tb.tb_next
    error = TaskError(path, f"{what}: {short_message(exc)}", line=line)
    error.__cause__ = exc
    return error
