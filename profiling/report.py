"""The profile JSON rendered for a kernel author (``tilewright profile`` without ``--json``).

Reads only the ``tilewright.profile/1`` dict: backend and target chip; per kernel the
grid, operand blocks, a VMEM bar against the scoped and physical limits, flops and
intensity, and warnings with their fixes; the roofline placement; the top ops; the
timeline summary and where the raw trace lives. Rich only; no JAX.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tilewright.profiling.chips import backend_is_interpret

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def print_report(profile: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(highlight=False)
    _header(console, profile)
    if profile.get("status") != "ok":
        err = profile.get("error") or {}
        where = f" (kernel line {err['line']})" if err.get("line") else ""
        console.print(f"[bold red]error[/] {escape(str(err.get('kind')))}{where}: "
                      f"{escape(str(err.get('message')))}")
        if err.get("hint"):
            console.print(f"[dim]hint:[/] {escape(err['hint'])}")
        if not (profile.get("analysis") or {}).get("kernels"):
            return
        console.print("[dim]static analysis (taken before the run failed):[/]")
    chip = profile.get("chip") or {}
    ridge = (profile.get("roofline") or {}).get("ridge_intensity")
    for kernel in (profile.get("analysis") or {}).get("kernels", []):
        _kernel(console, kernel, ridge)
    if not (profile.get("analysis") or {}).get("kernels"):
        console.print("[yellow]no pallas_call found in this candidate[/] (nothing to analyze "
                      "statically; the trace below is all XLA)")
    if profile.get("status") != "ok":
        return
    _roofline(console, profile.get("roofline") or {}, chip)
    _ops(console, profile)
    _timeline(console, profile)


def _header(console: Console, p: dict[str, Any]) -> None:
    backend = p.get("backend") or {}
    parts = [escape(str(p.get("task", ""))), escape(str(p.get("kernel", "")))]
    if backend:
        platform = str(backend.get("platform", "?")).upper()
        kind = str(backend.get("device_kind", ""))
        if backend_is_interpret(backend):
            label = f"{platform} (TPU interpret)"
        else:
            label = kind if kind.upper().startswith(platform) else f"{platform} {kind}".strip()
        parts.append(f"run on [bold]{escape(label)}[/]")
    if p.get("chip"):
        parts.append(f"analyzed for [bold]{escape(p['chip'].get('label', '?'))}[/]")
    shape = p.get("shape") or {}
    if shape:
        parts.append(f"shape {escape(shape.get('name', ''))} {escape(_params(shape.get('params')))}")
    if p.get("duration_s"):
        parts.append(f"{p['duration_s']:.1f} s")
    status = "[bold green]PROFILE[/]" if p.get("status") == "ok" else "[bold red]PROFILE FAILED[/]"
    console.print(f"{status}  " + " · ".join(x for x in parts if x))


def _kernel(console: Console, k: dict[str, Any], ridge: float | None) -> None:
    sem = k.get("dimension_semantics")
    calls = f" · runs {k['calls']}x per call" if k.get("calls", 1) > 1 else ""
    console.print()
    steps = k["steps"]
    console.print(f"[bold]kernel {escape(k['name'])}[/]  grid {tuple(k['grid'])} = "
                  f"{steps if steps is not None else '?'} step{'' if steps == 1 else 's'}"
                  + (f" · {escape(', '.join(sem))}" if sem else " · no dimension_semantics")
                  + calls + f"  [dim]{escape(k.get('source', ''))}[/]")
    if k.get("analysis_error"):
        console.print(f"  [yellow]static analysis could not read this call:[/] "
                      f"{escape(k['analysis_error'])}")
        return
    table = Table(box=None, pad_edge=False, header_style="dim")
    for col in ("operand", "array", "block", "space", "fetches", "HBM", "VMEM", "(8,128)"):
        table.add_column(col, overflow="fold",
                         justify="right" if col in ("fetches", "HBM", "VMEM") else "left")
    for o in k["operands"]:
        al = o["alignment"]
        mark = "[green]✓[/]" if al["ok"] else f"[red]✗ → {_shape(al['suggest'])}[/]"
        bytes_total = "?" if o["bytes_total"] is None else _bytes(o["bytes_total"])
        factor = o.get("traffic_factor")
        if factor and abs(factor - 1) > 0.01 and o.get("bytes_kind") == "exact":
            bytes_total += f" ({factor:.2g}x)"  # the array moved more (or less) than once
        if o.get("bytes_kind") == "estimate":
            bytes_total = "~" + bytes_total
        elif not o.get("bytes_exact", True):
            bytes_total = "≤" + bytes_total
        role = "in" if o["role"] == "input" else "out"
        table.add_row(escape(f"{role} {o.get('name', o['origin'])}"),
                      f"{_dtype(o['dtype'])}{_shape(o['shape'])}",
                      _shape(o["block"]), o["memory_space"], str(o["fetches"] or "-"), bytes_total,
                      _bytes(o["vmem_bytes"]) + (f" {o['buffers']}x" if o["buffers"] else ""), mark)
    for s in k.get("scratch", []):
        table.add_row("scratch", f"{_dtype(s['dtype'])}{_shape(s['shape'])}", "", s["memory_space"], "",
                      "", _bytes(s["bytes"]), "")
    console.print(table)
    console.print("  VMEM " + _bar(k["vmem_bytes"], k["vmem_budget_bytes"], k["vmem_physical_bytes"])
                  + (f" · {_bytes(k['vmem_padded_bytes'])} padded to tiles"
                     if k.get("vmem_padded_bytes", 0) > k["vmem_bytes"] else ""))
    intensity = k.get("intensity")
    console.print(f"  HBM traffic {_bytes(k['bytes_total'])} ({_bytes(k['bytes_per_step'] or 0)}/step)"
                  f" · {_num(k['flops'])} FLOP ({k['flops_source']}) · intensity "
                  f"{'n/a' if intensity is None else f'{intensity:.2f}'} FLOP/B"
                  + (f" (ridge {ridge:.0f})" if ridge else ""))
    for d in k.get("dots", []):
        shaped = not [x for x in d["problems"] if not x.startswith("f32")]
        mark = (f"[green]fills the {d['mxu_width']}-wide MXU[/]" if shaped
                else f"[yellow]leaves the {d['mxu_width']}-wide MXU part-empty[/]")
        if d["lhs_dtype"] == "float32" or d["rhs_dtype"] == "float32":
            mark += " · f32 operands (multi-pass)"
        console.print(f"  dot ({d['m']}, {d['k']}) x ({d['k']}, {d['n']}) {_dtype(d['lhs_dtype'])}"
                      f" -> {_dtype(d['out_dtype'])}: {mark}")
    for note in k.get("notes", []):
        console.print(f"  [dim]note: {escape(note)}[/]")
    for w in k.get("warnings", []):
        style = SEVERITY_STYLE.get(w["severity"], "")
        console.print(f"  [{style}]{w['severity']}[/] {escape(w['message'])}")
        console.print(f"      [dim]fix:[/] {escape(w['fix'])}")
    if not k.get("warnings"):
        console.print("  [green]no warnings[/]")


def _roofline(console: Console, r: dict[str, Any], chip: dict[str, Any]) -> None:
    if not r:
        return
    console.print()
    est = " (f32 peak estimated)" if r.get("peak_estimated") else ""
    console.print(f"[bold]roofline on {escape(chip.get('label', r.get('chip', '?')))}[/]{est}: "
                  f"no kernel beats {_ms(r['bound_ms'])} ({r['bound_by']}-bound: "
                  f"{_num(r['flops'] or 0)} FLOP, {_bytes(r['bytes'] or 0)} compulsory traffic)")
    if r.get("kernel_bound_ms") and r.get("kernel_bytes") and r["kernel_bytes"] > (r["bytes"] or 0) * 1.01:
        console.print(f"  this kernel's blocking moves {_bytes(r['kernel_bytes'])}: "
                      f"at best {_ms(r['kernel_bound_ms'])}")
    if r.get("estimate_ms"):
        console.print(f"  static estimate: ≈{_ms(r['estimate_ms'])} (the blocking's bound + "
                      f"{_ms(r['step_overhead_ms'])} of ~0.35 us per grid step; an estimate, "
                      "not a measurement)")
    if r.get("fraction") is not None:
        frac = r["fraction"]
        shown = f"{frac:.1%}" if frac < 0.1 else f"{frac:.0%}"
        console.print(f"  measured {_ms(r['measured_ms'])}: [bold]{shown}[/] of roofline "
                      "(bound / measured)")
    elif r.get("note"):
        console.print(f"  [yellow]{escape(r['note'])}[/]")


def _ops(console: Console, p: dict[str, Any]) -> None:
    ops = p.get("top_ops") or []
    if not ops:
        return
    console.print()
    source = (p.get("timeline") or {}).get("source")
    title = "top device ops" if source == "device" else "top XLA ops on host threads (by family)"
    table = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="dim")
    for col in ("op", "self ms", "total ms", "count", "share"):
        table.add_column(col, justify="left" if col == "op" else "right", no_wrap=True)
    for op in ops[:10]:
        table.add_row(escape(op["name"]), f"{op['self_ms']:.3f}", f"{op['total_ms']:.3f}",
                      str(op["count"]), f"{op['share']:.1%}")
    console.print(table)
    if source != "device" and backend_is_interpret(p.get("backend")):
        console.print("  [dim]interpret mode: io_callback ops are the TPU simulator "
                      "(DMA, VMEM, semaphores), not the kernel's own compute[/]")


def _timeline(console: Console, p: dict[str, Any]) -> None:
    tl = p.get("timeline")
    console.print()
    if not tl:
        reason = ("static analysis only: nothing was run" if p.get("wall") is None
                  else p.get("convert_error") or "the profiler wrote no trace")
        console.print(f"[yellow]no timeline[/]: {escape(str(reason))}")
        if p.get("logdir"):
            console.print(f"  raw trace kept: {escape(p['logdir'])}")
        return
    span = tl.get("span_us") or [0, 0]
    measured = tl.get("measured_us") or span
    events = sum(t["events"] for t in tl["tracks"])
    console.print(f"[bold]timeline[/] ({tl['source']}): {len(tl['tracks'])} tracks, {events:,} "
                  f"events, span {_ms((span[1] - span[0]) / 1e3)}, measured "
                  f"{_ms((measured[1] - measured[0]) / 1e3)}")
    for t in tl["tracks"][:8]:
        console.print(f"  [dim]{t['kind']:<14}[/] {escape(t['name'])}: {t['events']:,} events")
    per = p.get("per_iteration") or {}
    if per.get("mean_ms") is not None:
        console.print(f"  per iteration: {_ms(per['median_ms'])} median over {per['count']} "
                      f"({escape(per['basis'])})")
    share = p.get("pallas_share") or {}
    if share.get("value") is not None:
        console.print(f"  Pallas share: [bold]{share['value']:.1%}[/] of {escape(share['basis'])}")
    elif share.get("reason"):
        console.print(f"  Pallas share: n/a — {escape(share['reason'])}")
    if p.get("logdir"):
        perfetto = f"; ui.perfetto.dev: {escape(p['perfetto'])}" if p.get("perfetto") else ""
        console.print(f"  raw trace: {escape(p['logdir'])}  [dim](open with: xprof --logdir "
                      f"{escape(p['logdir'])}{perfetto})[/]")
        if tl.get("chrome_trace"):
            console.print(f"  timeline export: [dim]{escape(tl['chrome_trace'])}[/]")


def _dtype(name: str) -> str:
    short = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "i32", "int8": "i8"}
    return short.get(name, name)


def _bar(used: float, budget: float, physical: float, width: int = 24) -> str:
    frac = used / budget if budget else 0.0
    filled = min(width, round(frac * width))
    style = "red" if used > physical else "yellow" if used > budget else "green"
    bar = f"[{style}]" + "█" * filled + "[/]" + "░" * (width - filled)
    return (f"{bar} {_bytes(used)} / {_bytes(budget)} scoped ({frac:.0%}) · "
            f"{_bytes(physical)} physical")


def _shape(dims: Any) -> str:
    if dims is None:
        return "?"
    return "(" + ", ".join("None" if d is None else str(d) for d in dims) + ")"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _num(n: float) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


def _ms(ms: float | None) -> str:
    if ms is None:
        return "n/a"
    if ms < 0.001:
        return f"{ms * 1e6:.0f} ns"
    if ms < 1:
        return f"{ms * 1e3:.2f} us"
    return f"{ms:.3f} ms" if ms < 1000 else f"{ms / 1e3:.2f} s"


def _params(params: dict[str, Any] | None) -> str:
    if not params:
        return ""
    return "(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")"
