"""The TPU compiler's v7x estimates against tokamax's v7x measurements.

tokamax (Google's kernel library) ships what its autotuner measured on TPU7x: for
flash attention and the fused linear-softmax cross-entropy loss, forward and backward,
its Pallas kernel at each config and the XLA implementation, per input spec
(``benchmarks/lib/tokamax_data.py`` reads them from the wheel). libtpu 0.0.50 (jax 0.12,
Python 3.12) estimates v7x programs in cycles; no v7x clock is published, so this
compares what a clock does not change:

- **the estimated speedup** (XLA's cycles over tokamax's kernel's, each compiled for
  ``tpu7x:2x2x1`` with tokamax's own op at the fastest measured config) against the
  **measured speedup** (XLA's measured median over the kernel's): ratio, direction;
- **the implied clock** of each program (its cycles over its measured seconds): one
  clock for all would mean the estimates are proportional to the measured times; the
  spread says how far they are from that.

Each pair is compiled in a process of its own (libtpu started with the estimate flag;
an estimator abort costs that pair only), smallest programs first, at most ``--per-op``
specs per op (compiling a large XLA attention for v7x takes minutes on a small CPU).
Every program is built from its spec as tokamax's autotuning cache reads it (abstract
arrays: the backward passes get their residuals, ``out`` and ``dout`` from the spec too).
tokamax also times its XLA normalization (forward and backward) on TPU7x, with no Pallas
TPU kernel beside it: those programs have an implied clock and no speedup.

    .venv-current/bin/python benchmarks/estimates/tokamax_v7x.py [--per-op 3] [--ops OP ...]
        [--timeout S] [--memory-mb MB] [--json OUT]
        [--report OUT]   (--report: print a run's JSON again)
        [--write]        (the run's summary into kernels/data/fidelity.json's
                          ``speedups``: what every v7x estimate shows beside its figure)

``--smoke`` compiles nothing: it says whether this libtpu estimates v7x and prints the
run kept in ``benchmarks/data/tokamax_v7x.json`` (the table in docs/EVALUATION.md):
two runs of 2026-12-07 joined by hand, their rows and ``listed`` counts put together
(its ``runs`` says how each was started): the attention and loss ops, forward and
backward, at ``--per-op 3 --timeout 600 --memory-mb 20000``, and the normalization ops
at ``--per-op 5``.

Needs jax 0.12 with libtpu 0.0.50 or newer and tokamax installed (``pip install
tokamax==0.0.12`` into the current-JAX venv).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository
sys.path.insert(0, str(ROOT / "benchmarks" / "lib"))  # helpers, not benchmarks

SHIPPED = ROOT / "benchmarks" / "data" / "tokamax_v7x.json"  # the run in docs/EVALUATION.md
# The ops compiled, in this order: tokamax's Pallas TPU kernels with their XLA
# counterparts (forward and backward), then the XLA-only normalization.
COMPILED = ("pallas_mosaic_tpu_flash_attention",
            "pallas_mosaic_tpu_linear_softmax_cross_entropy_loss",
            "pallas_mosaic_tpu_flash_attention_vjp",
            "pallas_mosaic_tpu_linear_softmax_cross_entropy_loss_vjp",
            "normalization", "normalization_vjp")

# Run in a fresh process per pair: builds the programs of the spec (abstract arrays, as
# tokamax's own autotuning cache reads its specs), compiles them for v7x, prints one JSON
# line per program. An op with no Pallas TPU kernel (normalization) has the XLA program only.
PROBE = r"""
import json, os, sys, time
import jax, pydantic
from tokamax._src import pydantic as pydantic_lib
from tilewright.kernels.worker.tpu import tpu_compile as tc
from tilewright.kernels.worker.tpu.estimates import estimate_of

op_name, spec, config = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
where, why = tc.target("v7x")
if where is None:
    print(json.dumps({"error": why})); sys.exit(0)
if "attention" in op_name:
    from tokamax._src.ops.attention import base, pallas_mosaic_tpu as fwd, pallas_mosaic_tpu_vjp as bwd
    ops = {"pallas_mosaic_tpu_flash_attention": (base.DotProductAttention, fwd.PallasMosaicTpuFlashAttention),
           "pallas_mosaic_tpu_flash_attention_vjp": (base.DotProductAttentionVjp, bwd.PallasMosaicTpuFlashAttentionVjp)}
elif "cross_entropy" in op_name:
    from tokamax._src.ops.linear_softmax_cross_entropy_loss import base, pallas_mosaic_tpu as pm
    ops = {"pallas_mosaic_tpu_linear_softmax_cross_entropy_loss": (base.LinearSoftmaxCrossEntropyLoss, pm.PallasMosaicTpuLinearSoftmaxCrossEntropyLoss),
           "pallas_mosaic_tpu_linear_softmax_cross_entropy_loss_vjp": (base.LinearSoftmaxCrossEntropyLossVjp, pm.PallasMosaicTpuLinearSoftmaxCrossEntropyLossVjp)}
else:
    from tokamax._src.ops.normalization import base
    ops = {"normalization": (base.Normalization, None), "normalization_vjp": (base.NormalizationVjp, None)}
xla_cls, pallas_cls = ops[op_name]
programs = [("xla", xla_cls())]
if pallas_cls is not None:
    cfg = pydantic.TypeAdapter(pallas_cls.config_cls).validate_python(config)
    programs.append(("pallas", pallas_cls(config=cfg)))
for name, op in programs:
    started = time.perf_counter()
    try:
        model = pydantic_lib.get_arg_spec_model(f"{type(op).__name__}Spec", op._fwd_signature)
        leaves, tree = jax.tree.flatten(dict(pydantic.TypeAdapter(model).validate_python(spec)))
        arrays = tuple(x for x in leaves if isinstance(x, jax.ShapeDtypeStruct))
        def call(*given, op=op):
            it = iter(given)
            return op(**jax.tree.unflatten(tree, [next(it) if isinstance(x, jax.ShapeDtypeStruct)
                                                  else x for x in leaves]))
        out = tc.compile_lowered(tc.lower(jax.jit(call), arrays, (), where), where)
    except Exception as exc:
        out = {"compile": "error", "message": f"{type(exc).__name__}: {exc}", "estimate": None}
    zero = []
    try:  # ops moving HBM data that the estimator priced at 0 cycles (what the judge's
        # estimates call incomplete): the program's cycles leave their work out
        if out.get("estimate"):
            missing = estimate_of(tc.read_dump(os.environ[tc.DUMP_ENV]), "v7x").get("incomplete")
            zero = list((missing or {}).get("ops") or [])
    except Exception:
        zero = ["(the estimator's records could not be read)"]
    print(json.dumps({"program": name, "compile": out["compile"],
                      "cycles": (out.get("estimate") or {}).get("cycles"), "zero_ops": zero,
                      "message": (out.get("message") or out.get("estimate_unavailable") or "")[:300],
                      "compile_s": round(time.perf_counter() - started, 1)}), flush=True)
"""


def _abort_line(stderr: str) -> str:
    """The estimator's failed check, from a process it aborted."""
    for line in stderr.splitlines():
        if "Check failed" in line or "LLO_CHECK" in line or re.match(r"F\d{4} ", line):
            return line.strip()[:300]  # (``F1207 ...``: a fatal log line of libtpu's)
    return (stderr.strip().splitlines() or ["no output"])[-1][:300]


def _rss_mb(pid: int) -> int:
    """A process's resident memory in MB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def _probe(args: list[str], env: dict[str, str], timeout: float, memory_mb: int
           ) -> tuple[str, str, int | None, str | None]:
    """(stdout, stderr, returncode, why it was stopped): the probe, killed past its
    deadline or its memory (a causal attention's XLA program for v7x took 22 GiB of a
    24 GiB host and starved everything beside it)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    started, stopped = time.monotonic(), None
    while True:
        try:
            out, err = proc.communicate(timeout=1.0)
            return out, err, proc.returncode, stopped
        except subprocess.TimeoutExpired:
            pass
        if stopped is not None:
            continue
        rss = _rss_mb(proc.pid)
        if rss > memory_mb:
            stopped = f"killed at {rss:,} MB resident (the limit: --memory-mb {memory_mb:,})"
        elif time.monotonic() - started > timeout:
            stopped = f"not finished after {timeout:.0f} s"
        if stopped is not None:
            proc.kill()


def run_pair(pair: Any, timeout: float, memory_mb: int) -> dict[str, Any]:
    from tilewright.kernels.pool.env import QUIET
    from tilewright.kernels.worker.tpu import tpu_compile

    # libtpu's own log files (/tmp/tpu_logs) grow by a GiB per estimator abort unless
    # quietened, as the judge's processes are
    env = {**QUIET, **os.environ, "JAX_PLATFORMS": "cpu"}
    with tempfile.TemporaryDirectory() as dump:
        tpu_compile.prepare_environment(env, dump)
        stdout, stderr, rc, stopped = _probe(
            [sys.executable, "-c", PROBE, pair.op, json.dumps(pair.spec),
             json.dumps(_pallas(pair).config if _pallas(pair) else {})], env, timeout, memory_mb)
    found: dict[str, Any] = {}
    for line in stdout.splitlines():
        if line.strip().startswith("{"):
            record = json.loads(line)
            if "error" in record:
                return {"error": record["error"]}
            found[record["program"]] = record
    for name in ("xla", "pallas") if _pallas(pair) else ("xla",):
        if name not in found:
            why = stopped or (f"killed by signal {-rc} (9: out of memory)"
                              if rc is not None and rc < 0 and not stderr.strip()
                              else _abort_line(stderr) if rc else stderr.strip()[:300]
                              or "no output")
            found[name] = {"program": name, "compile": "unfinished" if stopped else "aborted",
                           "cycles": None, "message": why}
    return found


def _pallas(pair: Any) -> Any:
    """The Pallas kernel's timing of a pair (None: an XLA op timed alone)."""
    return getattr(pair, "pallas", None)


def row_of(pair: Any, found: dict[str, Any]) -> dict[str, Any]:
    xla, pallas = found.get("xla") or {}, found.get("pallas") or {}
    kernel = _pallas(pair)
    row: dict[str, Any] = {
        "op": pair.op, "what": pair.what, "spec": pair.spec,
        "config": kernel.config if kernel else None,
        "measured_xla_ms": pair.xla.median_ms,
        "measured_pallas_ms": kernel.median_ms if kernel else None,
        "measured_speedup": pair.measured_speedup if kernel else None,
        "xla_cycles": xla.get("cycles"), "pallas_cycles": pallas.get("cycles"),
        "xla_note": xla.get("message") if not xla.get("cycles") else None,
        "pallas_note": pallas.get("message") if not pallas.get("cycles") else None,
        "compile_s": [xla.get("compile_s"), pallas.get("compile_s")],
        # ops moving HBM data priced at 0 cycles: such a program's cycles leave work out,
        # and its implied clock says nothing of the chip's
        "xla_zero_ops": xla.get("zero_ops") or [], "pallas_zero_ops": pallas.get("zero_ops") or [],
        "provenance": pair.provenance,
    }
    if row["xla_cycles"]:
        row["xla_implied_ghz"] = row["xla_cycles"] / (pair.xla.median_ms / 1e3) / 1e9
    if row["pallas_cycles"]:
        row["pallas_implied_ghz"] = row["pallas_cycles"] / (kernel.median_ms / 1e3) / 1e9
    if row["xla_cycles"] and row["pallas_cycles"]:
        row["estimated_speedup"] = row["xla_cycles"] / row["pallas_cycles"]
        row["ratio"] = row["estimated_speedup"] / row["measured_speedup"]
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for what in sorted({r["what"] for r in rows}):
        mine = [r for r in rows if r["what"] == what]
        ratios = [r["ratio"] for r in mine if r.get("ratio")]
        clocks = _clocks(mine)
        out[what] = {
            "pairs": sum(1 for r in mine if r.get("measured_pallas_ms")),
            "xla_only": sum(1 for r in mine if not r.get("measured_pallas_ms")),
            "both_estimated": len(ratios),
            "median_ratio": statistics.median(ratios) if ratios else None,
            "within_2x": (sum(1 for x in ratios if 0.5 <= x <= 2.0) / len(ratios)
                          if ratios else None),
            "direction_right": (sum(1 for r in mine if r.get("ratio") and (
                (r["estimated_speedup"] >= 1) == (r["measured_speedup"] >= 1)))
                / len(ratios) if ratios else None),
            "implied_ghz": ([min(clocks), statistics.median(clocks), max(clocks)]
                            if clocks else None),
            "zero_priced": _zero_priced(mine),
        }
    return out


def _clocks(rows: list[dict[str, Any]]) -> list[float]:
    """The implied clocks of the programs whose every op the estimator priced."""
    return [float(r[f"{side}_implied_ghz"]) for r in rows for side in ("xla", "pallas")
            if r.get(f"{side}_implied_ghz") and not r.get(f"{side}_zero_ops")]


def _zero_priced(rows: list[dict[str, Any]]) -> int:
    """Programs with HBM-moving ops priced at 0 cycles."""
    return sum(1 for r in rows for side in ("xla", "pallas")
               if r.get(f"{side}_cycles") and r.get(f"{side}_zero_ops"))


def speedup_record(rows: list[dict[str, Any]], listed: dict[str, int],
                   libtpu: str | None) -> dict[str, Any]:
    """What ``kernels/data/fidelity.json`` keeps of a run for v7x (``speedups.v7x``):
    over every pair, and per family, the estimated speedup over the measured one."""
    both = [r for r in rows if r.get("ratio")]
    ratios = [float(r["ratio"]) for r in both]
    clocks = _clocks(rows)
    return {
        "chip": "v7x",
        "source": ("tokamax 0.0.12's autotuner times on TPU7x (its wheel's "
                   "data/autotuning, median of the fastest config); estimated here in cycles "
                   f"by libtpu {libtpu or 'unknown'} (benchmarks/estimates/tokamax_v7x.py)"),
        "pairs": sum(1 for r in rows if r.get("measured_pallas_ms")), "estimated": len(both),
        "median_ratio": round(statistics.median(ratios), 4) if ratios else None,
        "within_2x": (round(sum(0.5 <= r <= 2 for r in ratios) / len(ratios), 3)
                      if ratios else None),
        "implied_ghz": ([round(min(clocks), 2), round(max(clocks), 2)] if clocks else None),
        "zero_priced_programs": _zero_priced(rows),
        "not_compiled": sum(listed.values()),
        "families": {what: {k: s[k] for k in ("pairs", "both_estimated", "median_ratio",
                                              "within_2x", "direction_right")}
                     for what, s in summary(rows).items()},
    }


def write_record(record: dict[str, Any]) -> Path:
    """``record`` as ``speedups.v7x`` of the shipped fidelity table."""
    table_path = ROOT / "kernels" / "data" / "fidelity.json"
    table = json.loads(table_path.read_text())
    table.setdefault("speedups", {})["v7x"] = record
    table_path.write_text(json.dumps(table, indent=2) + "\n")
    return table_path


def _spec_text(spec: dict[str, Any]) -> str:
    if "scale" in spec:  # normalization
        return f"x {spec.get('x')} axis {spec.get('axis')}"
    if "q" in spec:
        causal = " causal" if (spec.get("mask") or {}).get("is_causal") else ""
        return f"q {spec['q']} k {spec['k']}{causal}"
    return f"x {spec.get('x')} w {spec.get('w')}"


def report(rows: list[dict[str, Any]], listed: dict[str, int]) -> None:
    print("v7x (tpu7x:2x2x1, one TensorCore), tokamax 0.0.12's measurements; estimates: "
          "libtpu's static cycles (no v7x clock: compared as speedups and implied clocks)")
    for r in rows:
        est = f"{r['estimated_speedup']:.2f}x" if r.get("estimated_speedup") else "-"
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") else "-"
        notes = "; ".join(f"{k.split('_')[0]}: {r[k]}" for k in ("xla_note", "pallas_note")
                          if r.get(k))
        if r.get("measured_pallas_ms"):
            measured = (f"{r['measured_xla_ms']:.3f}/{r['measured_pallas_ms']:.3f} ms = "
                        f"{r['measured_speedup']:.2f}x  est. {est}  ratio {ratio}")
        else:  # an XLA op alone: its implied clock is all there is to compare
            ghz = f"{r['xla_implied_ghz']:.2f} GHz" if r.get("xla_implied_ghz") else "-"
            zero = r.get("xla_zero_ops") or []
            unpriced = f" ({len(zero)} ops at 0 cycles: {', '.join(zero)})" if zero else ""
            measured = (f"{r['measured_xla_ms']:.3f} ms (XLA alone)  implied clock {ghz}"
                        f"{unpriced}")
        print(f"  {r['what']:<11} {_spec_text(r['spec']):<48} measured {measured}"
              + (f"  ({notes})" if notes else ""))
    for what, s in summary(rows).items():
        med = f"{s['median_ratio']:.2f}" if s["median_ratio"] else "-"
        share = f"{s['within_2x']:.0%}" if s["within_2x"] is not None else "-"
        right = f"{s['direction_right']:.0%}" if s["direction_right"] is not None else "-"
        ghz = ("{:.2f} / {:.2f} / {:.2f} GHz".format(*s["implied_ghz"])
               if s["implied_ghz"] else "-")
        alone = f", {s['xla_only']} XLA programs alone" if s["xla_only"] else ""
        print(f"{what}: {s['pairs']} pairs run{alone}, {s['both_estimated']} estimated both ways; "
              f"median est/measured speedup {med}, within 2x {share}, direction right "
              f"{right}; implied clock min/median/max {ghz}"
              + (f" (leaving out {s['zero_priced']} programs with ops at 0 cycles)"
                 if s["zero_priced"] else ""))
    for op, count in sorted(listed.items()):
        print(f"{op}: {count} measured specs on v7x not compiled here")


def _choose(pairs: list[Any], count: int) -> list[Any]:
    """The ``count`` cheapest distinct programs: one pair per set of array shapes (and
    causality), shortest sequences and fewest rows first (an XLA attention at 16k tokens
    materialises 16 GiB of scores; its compile does not fit a small host)."""
    def key(pair: Any) -> tuple[int, int]:
        from tokamax_data import array

        first = array(pair.spec.get("q") or pair.spec.get("x") or "") or ("", (0,))
        dims = first[1]
        cost = dims[1] if "q" in pair.spec and len(dims) > 1 else dims[0]
        total = 1
        for d in dims:
            total *= d
        return cost, total

    seen, out = set(), []
    for pair in sorted(pairs, key=key):
        shapes = _spec_text(pair.spec)
        if shapes not in seen:
            seen.add(shapes)
            out.append(pair)
    return out[:count]


def _half_the_memory_mb() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            return int(meminfo.readline().split()[1]) // 2048
    except (OSError, ValueError, IndexError):
        return 8192


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-op", type=int, default=3, help="specs per op")
    parser.add_argument("--ops", nargs="+", choices=COMPILED, default=list(COMPILED),
                        help="compile these ops only (default: all)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pair")
    parser.add_argument("--memory-mb", type=int, default=_half_the_memory_mb(),
                        help="kill a probe past this resident memory (default: half the RAM)")
    parser.add_argument("--tokamax", type=Path, help="tokamax package folder (default: installed)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--report", type=Path, help="print a run's --json again (no run)")
    parser.add_argument("--write", action="store_true",
                        help="store the run's summary (or --report's) in "
                             "kernels/data/fidelity.json, beside every v7x estimate")
    parser.add_argument("--smoke", action="store_true",
                        help="print the shipped run (benchmarks/data/tokamax_v7x.json) and "
                             "whether this libtpu estimates v7x; compiles nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        from tilewright.profiling.chips import estimator_refusal

        refusal = estimator_refusal("v7x")
        print("v7x estimates here: " + ("yes (cycles)" if refusal is None else f"no: {refusal}"))
        args.report = SHIPPED
    if args.report:
        data = json.loads(args.report.read_text())
        report(data["rows"], data["listed"])
        if args.write and not args.smoke:
            record = speedup_record(data["rows"], data["listed"], data.get("libtpu"))
            print(f"wrote {write_record(record)}")
        return 0
    import tokamax_data

    from tilewright.profiling.chips import estimator_refusal

    refusal = estimator_refusal("v7x")
    if refusal:
        print(f"v7x is not estimated with this libtpu: {refusal}")
        return 2
    root = args.tokamax or tokamax_data.find()
    if root is None:
        print("tokamax is not installed (pip install tokamax==0.0.12) and no --tokamax DIR")
        return 2
    found, problems = tokamax_data.pairs(root)
    alone, more = tokamax_data.singles(root)
    found = [*found, *alone]
    for problem in [*problems, *more]:
        print(f"tokamax: {problem}")
    rows, listed, ran = [], {}, set()
    for op in args.ops:
        chosen = _choose([p for p in found if p.chip == "v7x" and p.op == op], args.per_op)
        for pair in chosen:
            ran.add(id(pair))
            started = time.perf_counter()
            row = row_of(pair, run_pair(pair, args.timeout, args.memory_mb))
            row["wall_s"] = round(time.perf_counter() - started, 1)
            rows.append(row)
            print(f"  ran {row['what']} {_spec_text(pair.spec)} in {row['wall_s']} s", flush=True)
    for pair in found:  # the specs of the ops run that were not compiled
        if pair.chip == "v7x" and pair.op in args.ops and id(pair) not in ran:
            listed[pair.op] = listed.get(pair.op, 0) + 1
    from tilewright.profiling.chips import installed_libtpu

    libtpu = installed_libtpu()
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "listed": listed, "libtpu": libtpu,
                                         "summary": summary(rows)}, indent=1, default=str))
    report(rows, listed)
    if args.write:
        print(f"wrote {write_record(speedup_record(rows, listed, libtpu))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
