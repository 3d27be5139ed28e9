"""Session reports in Markdown and HTML.

What a reader wants after a session: the task and where it ran, every decision in
order, the best speedup after each evaluation (the compounding-gains curve: a table in
Markdown, an inline SVG chart in HTML), the profile -> diagnose -> optimize chain
(each change with the diagnosis that preceded it, its gain and the cumulative gain),
the final kernel, and the diffs between the kept versions (each version that became the new best, from the first one on).
"""

from __future__ import annotations

import difflib
import html
import itertools
from typing import Any

from kernels.result import is_interpret, rank_words
from sessions.log import LoadedSession, read_text_blob
from sessions.state import SessionState


def _fmt(x: float | None) -> str:
    return f"{x:.3f}x" if x is not None else "-"


def kept_versions(state: SessionState) -> list[int]:
    """The starting version and every version that raised the best speedup."""
    kept: list[int] = []
    first = min(state.versions, default=None)
    if first is not None:
        kept.append(first)
    for point in state.best_history:
        best = point.get("best")
        if best is not None and best not in kept:
            kept.append(best)
    return kept


def _source(loaded: LoadedSession, state: SessionState, number: int) -> str:
    return read_text_blob(loaded.path, state.versions[number].source_blob)


def _diffs(loaded: LoadedSession, state: SessionState) -> list[tuple[int, int, str]]:
    kept = kept_versions(state)
    out = []
    for a, b in itertools.pairwise(kept):
        diff = difflib.unified_diff(
            _source(loaded, state, a).splitlines(keepends=True),
            _source(loaded, state, b).splitlines(keepends=True),
            fromfile=f"v{a}/kernel.py", tofile=f"v{b}/kernel.py")
        out.append((a, b, "".join(diff)))
    return out


def chain_rows(state: SessionState) -> list[dict[str, Any]]:
    """Profile -> diagnose -> optimize, iteration by iteration: for each evaluated version
    after the first, the diagnosis in force when it was made, the change, its gain over
    its parent and the cumulative gain over the first correct version (the compounding)."""
    rows: list[dict[str, Any]] = []
    first = next((p for p in state.best_history if p["speedup"] and p["status"] == "correct"),
                 None)
    seen: set[int] = set()
    for point in state.best_history:
        number = point["version"]
        v = state.versions.get(number)
        if v is None or number in seen or v.parent is None:
            continue
        seen.add(number)
        before = [d for d in state.diagnoses if int(d.get("seq", 0)) < v.seq]
        diagnosis = before[-1] if before else None
        parent = state.versions.get(v.parent)
        gain = (point["speedup"] / parent.speedup
                if point["speedup"] and parent is not None and parent.speedup else None)
        total = (point["best_speedup"] / first["speedup"]
                 if first and point["best_speedup"] else None)
        rows.append({"version": number, "parent": v.parent, "change": v.summary,
                     "diagnosis": diagnosis, "status": point["status"],
                     "speedup": point["speedup"], "gain": gain, "cumulative": total,
                     "result": f"{point['status']} {_rank(point)}"
                               if point.get("speedup") is not None else point["status"]})
    return rows


CHAIN_HEAD = ("version", "diagnosis before the change", "change", "result",
              "gain vs parent", "cumulative (best vs first)")


def _chain_cells(r: dict[str, Any]) -> list[str]:
    d = r["diagnosis"]
    said = f"{d.get('kind')} (v{d.get('version')}): {d.get('summary')}" if d else "-"
    gain = f"{r['gain']:.3f}x" if r["gain"] else "-"
    total = f"{r['cumulative']:.3f}x" if r["cumulative"] else "-"
    return [f"v{r['version']} (from v{r['parent']})", said, str(r["change"]), r["result"],
            gain, total]


def _ratio_note(state: SessionState) -> str:
    """What the gains are ratios of: the ranking number, named."""
    sources = {p.get("rank_source") for p in state.best_history}
    if "tpu_estimate" in sources:
        return ("Gains are ratios of the TPU compiler's estimated speedups (\"est.\"), "
                "not measurements.")
    if "device_time" in sources:
        return "Gains are ratios of speedups measured on the TPU."
    return ("Gains are ratios of host simulation ratios (the CPU interpreter): they say "
            "nothing about a TPU.")


def _chain_markdown(state: SessionState) -> list[str]:
    rows = chain_rows(state)
    if not rows:
        return []
    lines = ["", "## Profile → diagnose → optimize", "", _ratio_note(state), "",
             "| " + " | ".join(CHAIN_HEAD) + " |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in _chain_cells(r)) + " |")
    return lines


def _decision_rows(state: SessionState) -> list[tuple[str, ...]]:
    rows = []
    for d in state.decisions:
        prop = state.proposals.get(d.proposal or "")
        rows.append((f"{d.t:.1f}s", d.proposal or "-", prop.kind if prop else "edit",
                     (prop.summary if prop else "user edit"), d.decision, d.by, d.note or ""))
    return rows


def _final(state: SessionState) -> int | None:
    return state.best if state.best is not None else state.current


def _header(loaded: LoadedSession, state: SessionState) -> dict[str, Any]:
    h = loaded.header
    backend = h.get("backend") or {}
    return {"id": h.get("id"), "task": (h.get("task") or {}).get("name"),
            "backend": backend.get("label") or backend.get("platform") or "unknown",
            "interpret": is_interpret(backend), "agent": h.get("agent"),
            "created": h.get("created"), "versions": len(state.versions),
            "evals": state.spent.runs, "tokens": state.spent.tokens,
            "cost": state.spent.cost_text()}


def markdown(loaded: LoadedSession, state: SessionState) -> str:
    h = _header(loaded, state)
    lines = [f"# tilewright session {h['id']}", "",
             f"- Task: **{h['task']}**", f"- Backend: {h['backend']}",
             f"- Agent: {h['agent']}", f"- Started: {h['created']}",
             f"- {h['versions']} versions, {h['evals']} evaluations, {h['tokens']} tokens, "
             f"cost {h['cost']}"]
    if h["interpret"]:
        lines.append("- " + _interpret_note(state))
    final = _final(state)
    if state.best is not None:
        lines.append(f"- Best: **v{state.best}**, {_best(state)}")
    lines += ["", "## Decisions", ""]
    rows = _decision_rows(state)
    if rows:
        lines += ["| t | proposal | kind | summary | decision | by | note |",
                  "|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    else:
        lines.append("No decisions were made.")
    lines += ["", "## Best speedup per evaluation", ""]
    if state.best_history:
        lines += ["| # | version | status | speedup | best so far | flags | error |",
                  "|---|---|---|---|---|---|---|"]
        for i, p in enumerate(state.best_history, 1):
            best_v = state.versions.get(p["best"]) if p["best"] else None
            best = f"{short_rank(best_v.rank_source if best_v else None, p['best_speedup'])} " \
                   f"(v{p['best']})" if p["best"] else "-"
            flags = ", ".join(p.get("flags") or []) or "-"
            error = (p.get("error") or "-").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {i} | v{p['version']} | {p['status']} | {_rank(p)} "
                         f"| {best} | {flags} | {error} |")
    else:
        lines.append("Nothing was evaluated.")
    lines += _chain_markdown(state)
    if final is not None:
        lines += ["", f"## Final kernel (v{final})", "", "```python",
                  _source(loaded, state, final).rstrip("\n"), "```"]
    diffs = _diffs(loaded, state)
    if diffs:
        lines += ["", "## Changes between kept versions", ""]
        for a, b, diff in diffs:
            lines += [f"### v{a} → v{b}", "", "```diff", diff.rstrip("\n") or "(identical)",
                      "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def svg_chart(state: SessionState, width: int = 640, height: int = 240) -> str:
    """Best speedup after each evaluation (a step line) and each evaluation's own (dots)."""
    points = state.best_history
    if not points:
        return "<p>Nothing was evaluated.</p>"
    pad = 40
    values = [p["speedup"] for p in points if p["speedup"] is not None] + \
             [p["best_speedup"] for p in points if p["best_speedup"] is not None]
    top = max([*values, 1.0]) * 1.1
    n = len(points)

    def x(i: int) -> float:
        return pad + (width - 2 * pad) * (i / max(n - 1, 1))

    def y(v: float) -> float:
        return height - pad - (height - 2 * pad) * (v / top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="best speedup per evaluation">',
             f'<rect width="{width}" height="{height}" fill="#fff"/>',
             f'<line x1="{pad}" y1="{y(0)}" x2="{width - pad}" y2="{y(0)}" stroke="#999"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{y(0)}" stroke="#999"/>',
             f'<line x1="{pad}" y1="{y(1.0):.1f}" x2="{width - pad}" y2="{y(1.0):.1f}" '
             f'stroke="#ccc" stroke-dasharray="4 3"/>',
             f'<text x="{pad - 4}" y="{y(1.0) + 4:.1f}" font-size="10" text-anchor="end">1x</text>',
             f'<text x="{pad - 4}" y="{pad + 4}" font-size="10" text-anchor="end">'
             f'{top:.2f}x</text>']
    path, last = [], None
    for i, p in enumerate(points):
        if p["best_speedup"] is None:
            continue
        if last is not None:
            path.append(f"L{x(i):.1f},{y(last):.1f}")
        path.append(f"{'M' if not path else 'L'}{x(i):.1f},{y(p['best_speedup']):.1f}")
        last = p["best_speedup"]
    if path:
        parts.append(f'<path d="{" ".join(path)}" fill="none" stroke="#1f6feb" '
                     f'stroke-width="2"/>')
    for i, p in enumerate(points):
        if p["speedup"] is not None:
            colour = "#2da44e" if p["status"] == "correct" else "#cf222e"
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(p["speedup"]):.1f}" r="3" '
                         f'fill="{colour}"><title>v{p["version"]} {p["status"]} '
                         f'{_fmt(p["speedup"])}</title></circle>')
    parts.append(f'<text x="{width / 2}" y="{height - 8}" font-size="11" '
                 f'text-anchor="middle">evaluation</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def html_report(loaded: LoadedSession, state: SessionState) -> str:
    h = _header(loaded, state)
    e = html.escape
    rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                   for row in _decision_rows(state))
    final = _final(state)
    body = [f"<h1>tilewright session {e(str(h['id']))}</h1>",
            "<ul>", f"<li>Task: <b>{e(str(h['task']))}</b></li>",
            f"<li>Backend: {e(str(h['backend']))}</li>", f"<li>Agent: {e(str(h['agent']))}</li>",
            f"<li>Started: {e(str(h['created']))}</li>",
            f"<li>{h['versions']} versions, {h['evals']} evaluations, {h['tokens']} tokens, "
            f"cost {e(h['cost'])}</li>"]
    if h["interpret"]:
        body.append(f"<li>{e(_interpret_note(state))}</li>")
    if state.best is not None:
        body.append(f"<li>Best: <b>v{state.best}</b>, {e(_best(state))}</li>")
    body += ["</ul>", "<h2>Decisions</h2>",
             "<table><tr><th>t</th><th>proposal</th><th>kind</th><th>summary</th>"
             "<th>decision</th><th>by</th><th>note</th></tr>" + rows + "</table>"
             if rows else "<p>No decisions were made.</p>",
             "<h2>Best speedup per evaluation</h2>", svg_chart(state)]
    chain = chain_rows(state)
    if chain:
        head = "".join(f"<th>{e(c)}</th>" for c in CHAIN_HEAD)
        cells = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in _chain_cells(r))
                        + "</tr>" for r in chain)
        body += ["<h2>Profile → diagnose → optimize</h2>",
                 f"<p>{e(_ratio_note(state))}</p>",
                 f"<table><tr>{head}</tr>{cells}</table>"]
    if final is not None:
        body += [f"<h2>Final kernel (v{final})</h2>",
                 f"<pre><code>{e(_source(loaded, state, final))}</code></pre>"]
    diffs = _diffs(loaded, state)
    if diffs:
        body.append("<h2>Changes between kept versions</h2>")
        for a, b, diff in diffs:
            body += [f"<h3>v{a} → v{b}</h3>", f"<pre class=diff>{_html_diff(diff)}</pre>"]
    style = ("body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;"
             "padding:0 1em}table{border-collapse:collapse}td,th{border:1px solid #ddd;"
             "padding:2px 6px;text-align:left}pre{background:#f6f8fa;padding:8px;"
             "overflow-x:auto}.add{color:#116329}.del{color:#82071e}")
    return (f"<!doctype html>\n<html><head><meta charset='utf-8'><title>tilewright "
            f"{e(str(h['task']))}</title><style>{style}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _html_diff(diff: str) -> str:
    out = []
    for line in diff.splitlines():
        cls = "add" if line.startswith("+") and not line.startswith("+++") else \
              "del" if line.startswith("-") and not line.startswith("---") else None
        text = html.escape(line)
        out.append(f"<span class={cls}>{text}</span>" if cls else text)
    return "\n".join(out) or "(identical)"


def _rank(point: dict[str, Any]) -> str:
    """An evaluation's number in words: "est. 1.80x on v5e (TPU compiler)", on a TPU
    "1.80x measured on TPU v5 lite, est. 1.75x" (both when both exist); logs from before
    the TPU compile show the bare ratio."""
    if point.get("rank_label") and point.get("rank_source") not in (None, "none"):
        return str(point["rank_label"]).replace("|", "\\|")
    return _fmt(point.get("speedup"))


def short_rank(source: str | None, value: float | None) -> str:
    """A ranking number in few words: "est. 1.341x", "1.341x meas.", "host sim 0.0072"."""
    return rank_words(source, value, short=True)


def _best(state: Any) -> str:
    best = state.versions.get(state.best)
    if best is not None and best.rank_label and best.rank_source not in (None, "none"):
        return best.rank_label
    return _fmt(state.best_speedup)


def _interpret_note(state: Any) -> str:
    sources = {p.get("rank_source") for p in state.best_history}
    if "tpu_estimate" in sources:
        return ("Kernels are ranked by the TPU compiler's static estimate for the chip at "
                "the task's production shape (\"est.\": a prediction, not a measurement; "
                "each figure names its chip and shape); correctness was checked at the "
                "smaller check shapes in TPU interpret mode on the CPU, whose time is host "
                "simulation time and ranks nothing.")
    return "Timings are TPU interpret mode on the CPU: simulated, not TPU performance."
