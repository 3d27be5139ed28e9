"""A profile in a few plain-text lines, for an agent's prompt or a log.

``digest(profile)`` reads the ``tilewright.profile/1`` dict and says what matters to the
next kernel change: per pallas_call the grid, blocks, VMEM against its budget, HBM
traffic, intensity and every warning with its fix; the roofline bound with the dtype its
ridge is for; the top ops; the Pallas share. A trace taken in TPU interpret mode is the
host simulating the kernel (``io_callback``, ``while``, ``cond`` ops of the
interpreter): its ops and times say nothing about a TPU and are left out, as are file
paths. Whole lines only: a caller that must shorten it drops lines, never cuts one.
No rich, no JAX: any layer may call it.
"""

from __future__ import annotations

from typing import Any


def digest(profile: dict[str, Any], top: int = 5) -> str:
    if profile.get("status") != "ok":
        err = profile.get("error") or {}
        head = f"profile failed: {err.get('kind')}: {err.get('message')}"
        if not (profile.get("analysis") or {}).get("kernels"):
            return head
        lines = [head]
    else:
        lines = []
    chip = (profile.get("chip") or {}).get("label", "?")
    backend = profile.get("backend") or {}
    interpret = backend.get("mode") == "tpu-interpret"
    from tilewright.profiling.diagnose import shape_words

    where = shape_words(profile.get("shape"))
    lines.append(f"analyzed for {chip}{' ' + where if where else ''}; "
                 + ("nothing ran (static analysis)" if profile.get("wall") is None
                    and not profile.get("top_ops") else
                    f"ran on {backend.get('platform', '?')} ({backend.get('mode', '?')})"))
    for k in (profile.get("analysis") or {}).get("kernels", []):
        if k.get("analysis_error"):
            lines.append(f"kernel {k['name']}: not analyzable ({k['analysis_error']})")
            continue
        blocks = ", ".join(f"{o.get('name', o['origin'])} {_shape(o['block'])} {o['dtype']}"
                           for o in k["operands"])
        lines.append(f"kernel {k['name']}: grid {tuple(k['grid'])} ({k['steps']} steps, "
                     f"{', '.join(k['dimension_semantics'] or ['no dimension_semantics'])}); "
                     f"blocks {blocks}")
        intensity = k.get("intensity")
        lines.append(f"  VMEM {_mib(k['vmem_bytes'])} of {_mib(k['vmem_budget_bytes'])} MiB scoped"
                     f" ({_mib(k['vmem_padded_bytes'])} padded); HBM {_mib(k['bytes_total'])} MiB;"
                     f" {k['flops']:.3g} FLOP ({k['flops_source']}); intensity "
                     f"{'n/a' if intensity is None else f'{intensity:.2f}'} FLOP/B")
        for w in k.get("warnings", []):
            where = f" (line {w['line']})" if w.get("line") else ""
            lines.append(f"  {w['severity']}{where}: {w['message']} -> fix: {w['fix']}")
    roof = profile.get("roofline") or {}
    if roof:
        placed = (f"; measured at {roof['fraction']:.1%} of it" if roof.get("fraction") is not None
                  else f"; {roof['note']}" if roof.get("note") else "")
        estimate = (f"; static estimate ~{roof['estimate_ms'] * 1e3:.2f} us with per-step cost"
                    if roof.get("estimate_ms") else "")
        ridge = (f"; {roof['dtype']} ridge {roof['ridge_intensity']:.3g} FLOP/B"
                 if roof.get("ridge_intensity") and roof.get("dtype") else "")
        lines.append(f"roofline: >= {roof['bound_ms'] * 1e3:.2f} us ({roof['bound_by']}-bound"
                     f"{ridge})" + estimate + placed)
    ops = profile.get("top_ops") or []
    if interpret:
        if ops:
            lines.append("trace: the CPU interpreting the kernel (TPU interpret mode); its "
                         "ops and times say nothing about a TPU and are left out")
        return "\n".join(lines)
    if ops:
        lines.append("top ops: " + ", ".join(
            f"{o['name']} {o['self_ms']:.3f} ms self x{o['count']}" for o in ops[:top]))
    share = profile.get("pallas_share") or {}
    if share.get("value") is not None:
        lines.append(f"Pallas share: {share['value']:.0%} of {share['basis']}")
    return "\n".join(lines)


def _shape(dims: Any) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in dims or []) + ")"


def _mib(n: float | None) -> str:
    return f"{(n or 0) / 2**20:.2f}"
