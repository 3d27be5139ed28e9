"""The candidate's production-shape verdict and estimate, on the judge's side.

``kernels.worker.candidate.production`` (in the candidate process) exports the candidate's
program at the production shape: once whole, and, when a grid is too long for the
estimator, twice more with every ``pallas_call``'s grid shortened. This module sends
those programs to the judge's compile processes (``kernels.worker.tpu.compile_pool``) and
turns the answers into the kernel's figures:

- **verdict**: the whole program compiled *without* the estimate flag (about a second
  at any size): a scoped-VMEM overflow or a Mosaic refusal at the production shape
  is the kernel's compile error. A program estimated whole is the estimator's first:
  its compile, when quick and clean, is the verdict too (``HEDGE_S``);
- **estimate**: the estimator's cycles per HLO op, each record multiplied by the
  identical ops it stands for (``num_equivalent_hlos``), the kernels' records scaled
  from the two short grids to the production grid (``scale``: linear in the repeats of
  the inner sweep, the fixed cost kept), the ops outside the kernels as compiled (they
  run at full size in every variant). A scaled figure says so (``method: "scaled"``
  and how);
- ops the estimator prices at 0 cycles although they move HBM data (``REMOTE`` DMA
  types) make an estimate ``incomplete``, with those ops named.

The compiles themselves, each in a process with a memory limit and a deadline behind a
disk cache and host-wide slots, are ``kernels.worker.tpu.compile_pool``'s; the XLA
reference's figures, worked out once per task and chip, are ``kernels.worker.tpu.reference``'s.

Worker-side (the judge).
"""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tilewright.kernels.worker.tpu import compile_pool, tpu_compile

# -- reading the estimator's records --------------------------------------------------------

def split_records(records: list[dict[str, Any]], kernels_by_op: dict[str, int] | None = None
                  ) -> tuple[dict[int, int], list[dict[str, Any]]]:
    """(cycles per kernel index, the other ops with their totals). ``kernels_by_op`` maps
    the compiled program's HLO op names to the renamed kernels (``tw_pallas_<i>``)."""
    from tilewright.kernels.worker.tpu.compiler import kernel_ops

    kernels: dict[int, int] = {}
    others: list[dict[str, Any]] = []
    for record in records:
        total = int(record["cycles"]) * int(record.get("count") or 1)
        owner = (kernels_by_op or {}).get(record["name"])
        if owner is None:
            owner = next(iter(kernel_ops(f'%{record["name"]} = x custom_call_target='
                                         f'"tpu_custom_call" {record["name"]}').values()),
                         None)
        if owner is not None:
            kernels[owner] = kernels.get(owner, 0) + total
        else:
            others.append({**record, "total": total})
    return kernels, others


def scale(c1: int, c2: int, u1: int, u2: int, full: int) -> tuple[int, str]:
    """A kernel's cycles at ``full`` repeats from ``c1`` at ``u1`` and ``c2`` at ``u2``:
    ``c1 + (c2 - c1) / (u2 - u1) * (full - u1)`` (a fixed cost plus a cost per repeat);
    when the two do not grow (``c2 <= c1``), proportional to the repeats of the longer."""
    if u2 > u1 and c2 > c1:
        per = (c2 - c1) / (u2 - u1)
        return round(c1 + per * (full - u1)), "linear"
    return round(c2 * full / max(u2, 1)), "proportional"


def _incomplete(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    zero = [r for r in records if r.get("dma") in ("remote", "local_and_remote")
            and int(r["cycles"]) == 0]
    if not zero:
        return None
    moved = sum(int(r.get("bytes") or 0) * int(r.get("count") or 1)
                for r in records if r.get("dma"))
    unpriced = sum(int(r.get("bytes") or 0) * int(r.get("count") or 1) for r in zero)
    return {"ops": sorted({r["name"] for r in zero})[:20], "count": len(zero),
            "bytes": unpriced or None,
            # of the bytes every DMA op of the program moves (None: sizes not read)
            "share_of_dma_bytes": round(unpriced / moved, 3) if moved else None,
            "why": "the estimator prices these HBM-moving ops (DMA type REMOTE) at 0 cycles"}


def estimate_of(records: list[dict[str, Any]], chip: str, method: str = "full",
                detail: str | None = None, kernel_cycles: dict[int, int] | None = None,
                names: dict[int, str] | None = None,
                kernels_by_op: dict[str, int] | None = None) -> dict[str, Any]:
    """``{cycles, seconds, source, chip, method, detail, ops, incomplete}``."""
    kernels, others = split_records(records, kernels_by_op)
    if kernel_cycles is not None:
        kernels = kernel_cycles
    ops = [{"name": (names or {}).get(i, f"kernel {i}"), "kind": "pallas", "cycles": c}
           for i, c in sorted(kernels.items())]
    ops += [{"name": r["name"], "kind": "xla", "cycles": r["total"], "count": r["count"]}
            for r in sorted(others, key=lambda r: -r["total"])]
    cycles = sum(kernels.values()) + sum(r["total"] for r in others)
    found = tpu_compile.estimate(cycles, chip)
    found.update(method=method, detail=detail, ops=ops[:40], incomplete=_incomplete(records))
    return found


# -- the candidate's production estimate -----------------------------------------------------

def candidate_estimate(programs: dict[str, bytes], plans: list[dict[str, Any]], chip: str,
                       deadline: float, memory_mb: int,
                       on_verdict: Any = None,
                       pinned_counts: dict[int, int] | None = None) -> dict[str, Any]:
    """The verdict and the estimate of the candidate's production program:
    ``{verdict: <compiler answer>, estimate: {...} | None, unavailable: reason | None,
    cached: bool}``; ``on_verdict(answer)`` as soon as the verdict is known.

    A kernel whose loops run a number of times read at run time comes with a program of
    its own (``pinned<index>``: the kernel alone, those bounds fixed to what the
    production inputs make them): its cycles replace the kernel's in the program's
    estimate, or, where the estimator gives the whole program no figure (it aborts on
    XLA's scatter/gather bookkeeping on v5e), are the estimate, the XLA ops outside the
    kernel said to be unpriced."""
    out = _program_estimate(programs, plans, chip, deadline, memory_mb, on_verdict)
    pinned: dict[int, dict[int | None, bytes]] = {}
    for key, blob in programs.items():
        if key.startswith("pinned"):
            index, _, short = key[len("pinned"):].partition("_")
            pinned.setdefault(int(index), {})[int(short) if short else None] = blob
    if not pinned or out["verdict"].get("compile") != "ok" or out.get("refusal") \
            or not estimates_possible(chip)[0]:
        return out
    comp = compile_pool.compilers()
    names = {p["index"]: p["name"] for p in plans}
    full_counts = pinned_counts or {}
    cycles: dict[int, int] = {}
    why, scaled = [], []
    for index, blobs in sorted(pinned.items()):
        got: dict[int | None, int] = {}
        longer = "not run"
        for short, blob in sorted(blobs.items(), key=lambda kv: kv[0] or 0):
            answer = comp.compile(blob, chip, "estimate", deadline, memory_mb)
            if answer.get("compile") != "ok" or answer.get("records") is None:
                if short is None or not got:  # (a longer short one: scaled from shorter)
                    why.append(f"{names.get(index, index)}"
                               f"{f' at {short}' if short else ''}: {why_no_records(answer)}")
                else:
                    longer = why_no_records(answer)
                break
            kernels, _others = split_records(answer["records"], answer.get("kernels"))
            got[short] = int(kernels.get(index) or 0)
        full = full_counts.get(index)
        if got.get(None):
            cycles[index] = got[None]
        elif len(got) >= 2 and full:  # the two longest the estimator could price
            (u1, c1), (u2, c2) = sorted((k, v) for k, v in got.items() if k is not None)[-2:]
            cycles[index], how = scale(c1, c2, u1, u2, full)
            scaled.append(f"{names.get(index, index)}: at {u1} and {u2} of {full} ({how})")
        elif len(got) == 1 and full and next(iter(got)) and next(iter(got.values())):
            # the longer one needed more than the estimator's memory: proportional to the
            # shorter (its fixed cost counted once per repeat: a little high)
            (u1, c1), = got.items()
            cycles[index] = round(c1 * full / u1)
            scaled.append(f"{names.get(index, index)}: at {u1} of {full}, proportional (the "
                          f"longer estimate: {longer[:120]})")
    if not cycles:
        if why and out.get("estimate") is None:
            out["unavailable"] = (out.get("unavailable") or "no estimate") + \
                "; with its loop bounds pinned: " + "; ".join(why)
        return out
    pinned_names = {names.get(i, f"kernel {i}") for i in cycles}
    base = out.get("estimate")
    note = ("loop bounds read at run time pinned to the production inputs' values, the "
            f"kernel estimated alone ({', '.join(sorted(pinned_names))})"
            + (f"; shortened and scaled: {'; '.join(scaled)}" if scaled else ""))
    if base is not None:
        ops = [dict(op) for op in base.get("ops") or []]
        total = int(base["cycles"])
        for op in ops:
            if op.get("kind") == "pallas" and op.get("name") in pinned_names:
                index = next(i for i in cycles if names.get(i, f"kernel {i}") == op["name"])
                total += cycles[index] - int(op.get("cycles") or 0)
                op["cycles"] = cycles[index]
        found = tpu_compile.estimate(total, chip)
        found.update(method="pinned", ops=ops, incomplete=base.get("incomplete"),
                     detail="; ".join(x for x in (note, base.get("detail")) if x),
                     pinned=sorted(cycles))
    else:
        unpriced = out.get("unavailable") or "no figure"
        ops = [{"name": names.get(i, f"kernel {i}"), "kind": "pallas", "cycles": c}
               for i, c in sorted(cycles.items())]
        found = tpu_compile.estimate(sum(cycles.values()), chip)
        found.update(method="pinned", ops=ops, incomplete=None, pinned=sorted(cycles),
                     detail=f"{note}; the XLA ops outside the kernel are not priced (the "
                            f"whole program: {unpriced[:300]})",
                     outside_unpriced=unpriced[:500])
        out["unavailable"] = None
    out["estimate"] = found
    return out


def pinned_counts(pinned: dict[str, Any]) -> dict[int, int]:
    """Kernel index -> the one count its loops were pinned to (what a shortened pinned
    program is scaled to), from a production reply's ``pinned``."""
    import json

    out = {}
    for key, values in (pinned or {}).items():
        if not str(key).isdigit() or len(values or ()) != 1:
            continue
        try:
            value = json.loads(values[0])
        except (ValueError, TypeError):
            continue
        while isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out[int(key)] = value
    return out


# How long the verdict waits for the estimator's compile of the whole program before the
# verdict compiler compiles it too. Most production programs of a grid within the
# estimator's budget are estimated in under half a second (for v5e: median 0.46 s, 90%
# within 2.3 s, over a test run's 208 compiles on 2 busy cores): then the one compile answers
# both, and the verdict compiler's (median 0.22 s, and its process's start, about 0.6 s
# of CPU) is not made. A longer one (big XLA ops beside the kernel) gets the verdict at
# most this much later than alone, well within the 3 s a verdict aims for.
# ``TILEWRIGHT_VERDICT_WAIT_S`` sets it (0: the verdict compiler always compiles too).
HEDGE_S = 1.0
HEDGE_ENV = "TILEWRIGHT_VERDICT_WAIT_S"


@functools.cache
def _early() -> ThreadPoolExecutor:
    """The thread the estimator's compile of a whole program runs in, beside the verdict's."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="tw-estimate")


def _hedge_s() -> float:
    try:
        return max(float(os.environ.get(HEDGE_ENV, HEDGE_S)), 0.0)
    except ValueError:
        return HEDGE_S


def _whole_estimate(comp: compile_pool.Compilers, blob: bytes, chip: str, deadline: float,
                    memory_mb: int) -> tuple[Future[dict[str, Any]] | None,
                                             dict[str, Any] | None]:
    """Start the estimator on the whole program, without waiting for a host slot: (its
    answer to come, the answer if it came within ``HEDGE_S`` and says the program
    compiles). (None, None): no slot was free; the verdict compiler goes first."""
    early = _early().submit(comp.compile, blob, chip, "estimate", deadline, memory_mb,
                            wait_for_slot=False)
    try:
        answer = early.result(timeout=max(min(_hedge_s(), deadline - time.monotonic()), 0.0))
    except TimeoutError:
        return early, None
    if answer.get("why") == "busy":
        return None, None
    if answer.get("compile") == "ok" and answer.get("records") is not None:
        return early, answer
    # anything else (an error, an abort, no records) is for the verdict compiler to judge
    # too: the estimator's failures are not the kernel's, its memory refusal is (below)
    return early, None


def _program_estimate(programs: dict[str, bytes], plans: list[dict[str, Any]], chip: str,
                      deadline: float, memory_mb: int,
                      on_verdict: Any = None) -> dict[str, Any]:
    """The verdict and the estimate of the production program as traced (whole, or its
    grids shortened and scaled). A program estimated whole is compiled by the estimator
    first: when it answers within ``HEDGE_S`` that it compiles, that one compile is the
    verdict too (``verdict["by"]``: ``estimator``); else the verdict compiler judges it
    (``verdict``) while the estimator goes on."""
    comp = compile_pool.compilers()
    want, reason = estimates_possible(chip)
    unpriceable = [p["unpriceable"] for p in plans if p.get("unpriceable")]
    # kernels whose work differs along the grid: shortened otherwise, or compiled whole
    whole = "; ".join(f"{p['name']}: {p['uneven']}" for p in plans if p.get("uneven"))
    names = {p["index"]: p["name"] for p in plans}
    early: Future[dict[str, Any]] | None = None
    answer: dict[str, Any] | None = None  # the estimator's, when it is the verdict too
    if want and not unpriceable and "scaled0" not in programs:
        early, answer = _whole_estimate(comp, programs["full"], chip, deadline, memory_mb)
    if answer is not None:
        verdict = {**{k: v for k, v in answer.items() if k != "records"}, "by": "estimator"}
    else:
        verdict = {**comp.compile(programs["full"], chip, "verdict", deadline, memory_mb),
                   "by": "verdict"}
    if on_verdict is not None:
        on_verdict(verdict)
    out: dict[str, Any] = {"verdict": verdict, "estimate": None, "unavailable": None}
    if verdict.get("compile") != "ok":
        return out
    if not want:
        out["unavailable"] = reason
        return out
    if unpriceable:  # a shortened grid would misprice it, the whole one is too long
        out["unavailable"] = "not estimated: " + "; ".join(unpriceable)
        return out
    if "scaled0" not in programs:  # every grid within the budget: the program itself
        if answer is None:
            answer = early.result() if early is not None else comp.compile(
                programs["full"], chip, "estimate", deadline, memory_mb)
        if answer.get("compile") != "ok" or answer.get("records") is None:
            out["unavailable"] = why_no_records(answer)
            out["refusal"] = refusal(answer)
            return out
        out["estimate"] = estimate_of(answer["records"], chip, detail=whole or None,
                                      names=names, kernels_by_op=answer.get("kernels"))
        out["cached"] = bool(answer.get("cached"))
        return out
    answers = []
    for key in ("scaled0", "scaled1"):
        answer = comp.compile(programs[key], chip, "estimate", deadline, memory_mb)
        if answer.get("compile") != "ok" or answer.get("records") is None:
            out["unavailable"] = why_no_records(answer)
            out["refusal"] = refusal(answer)
            return out
        answers.append(answer)
    (k1, _), (k2, _) = (split_records(a["records"], a.get("kernels")) for a in answers)
    kernels: dict[int, int] = {}
    details = []
    for plan in plans:
        i = plan["index"]
        if plan.get("axis") is None:
            kernels[i] = k2.get(i, 0)
            continue
        u1, u2 = plan["units"]
        kernels[i], how = scale(k1.get(i, 0), k2.get(i, 0), u1, u2, plan["units_full"])
        details.append(f"{plan['name']}: {u1} and {u2} of {plan['units_full']} repeats of "
                       f"{plan['steps'] // plan['units_full']} grid steps ({how})")
    detail = ("kernel cycles scaled from shortened grids to the production grid "
              f"({'; '.join(details)})" + (f"; {whole}" if whole else ""))
    out["estimate"] = estimate_of(answers[1]["records"], chip, "scaled", detail, kernels, names,
                                  answers[1].get("kernels"))
    out["cached"] = all(a.get("cached") for a in answers)
    return out


def refusal(answer: dict[str, Any]) -> dict[str, Any] | None:
    """A memory refusal by the estimator's compile of the same program (its kernels' blocks
    unchanged): the program does not fit the chip's VMEM, which the verdict compile does
    not always say (a kernel that raised its own vmem_limit_bytes to 100 MiB: "ok" there,
    "Used 166.46M of 128.00M vmem" here, XLA's temporaries counted). It is the kernel's
    compile error. Other failures of the estimate cost the estimate only."""
    if answer.get("compile") != "error" or answer.get("kind") != "vmem":
        return None
    return answer


def estimates_possible(chip: str) -> tuple[bool, str | None]:
    if chip not in tpu_compile.ESTIMATE_CHIPS:
        from tilewright.profiling.chips import estimator_refusal

        return False, (f"no estimate for {chip}: {estimator_refusal(chip)} (estimates: "
                       f"{', '.join(tpu_compile.ESTIMATE_CHIPS)}; `tilewright chips` lists "
                       "what each chip gets)")
    state = tpu_compile.libtpu_path()
    if state is None:
        return False, tpu_compile.STATE_REASONS["no_libtpu"]
    if os.environ.get(tpu_compile.DISABLE_ENV, "1") == "0":
        return False, tpu_compile.STATE_REASONS["disabled"]
    if not tpu_compile.flag_supported(state):
        return False, tpu_compile.STATE_REASONS["flag_missing"]
    return True, None


def why_no_records(answer: dict[str, Any]) -> str:
    if answer.get("compile") == "ok":
        return "the TPU compiler wrote no static estimate for this program"
    return answer.get("message") or "the estimate compile failed"
