"""Session reports in Markdown and HTML.

What a reader wants after a session: the task and where it ran, every decision in
order, the best rank after each evaluation (``kernels.judge.rank.Rank``, in its own words:
the compounding-gains curve, a table in Markdown, an inline SVG chart in HTML), the profile -> diagnose -> optimize chain
(each change with the diagnosis that preceded it, its gain and the cumulative gain),
the final kernel, and the diffs between the kept versions (each version that became the new best, from the first one on).
"""

from __future__ import annotations

import difflib
import html
import itertools
from typing import Any

from tilewright.kernels.judge.rank import Rank, times
from tilewright.kernels.judge.result import is_interpret
from tilewright.sessions.log import LoadedSession, read_text_blob
from tilewright.sessions.state import SessionState


def _fmt(x: float | None) -> str:
    return times(x)


def _ranked(rank: Rank | None) -> Rank | None:
    """The rank, when it ranks at all (a correct, undisqualified result with a number)."""
    return rank if rank is not None and rank.ranked and rank.value is not None else None


def gain(new: Rank | None, old: Rank | None) -> float | None:
    """How many times better ``new`` is than ``old``, where the two say the same kind of
    thing: the compiler's figures by the kernel's time at the production shape (the
    reference is the same for both; the ratio of their values where a log has no
    kernel times), measured speedups or host simulation ratios by their values. None
    across kinds (a host ratio against an estimate means nothing)."""
    if new is None or old is None or not new.ranked or not old.ranked:
        return None
    if new.compiler and old.compiler:
        if new.kernel_s and old.kernel_s:
            return old.kernel_s / new.kernel_s
        if new.source == old.source and new.value and old.value:
            return new.value / old.value
        return None
    if new.source == old.source and new.value and old.value:
        return new.value / old.value
    return None


def kept_versions(state: SessionState) -> list[int]:
    """The starting version and every version that raised the best rank."""
    kept: list[int] = []
    first = min(state.versions, default=None)
    if first is not None:
        kept.append(first)
    for point in state.best_history:
        best = point.best
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
    first = next((_ranked(p.judgement.rank) for p in state.best_history
                  if p.judgement.correct and _ranked(p.judgement.rank)), None)
    seen: set[int] = set()
    for point in state.best_history:
        number = point.version
        v = state.versions.get(number)
        if v is None or number in seen or v.parent is None:
            continue
        seen.add(number)
        before = [d for d in state.diagnoses if int(d.get("seq", 0)) < v.seq]
        diagnosis = before[-1] if before else None
        parent = state.versions.get(v.parent)
        rank = _ranked(point.judgement.rank)
        status = point.judgement.status
        rows.append({"version": number, "parent": v.parent, "change": v.summary,
                     "diagnosis": diagnosis, "status": status, "rank": rank,
                     "gain": gain(rank, parent.rank if parent is not None else None),
                     "cumulative": gain(_ranked(point.best_rank), first),
                     "result": f"{status} {_rank(point.judgement.rank)}"
                               if rank is not None else status})
    return rows


CHAIN_HEAD = ("version", "diagnosis before the change", "change", "result",
              "gain vs parent", "cumulative (best vs first)")


def _chain_cells(r: dict[str, Any]) -> list[str]:
    d = r["diagnosis"]
    said = f"{d.get('kind')} (v{d.get('version')}): {d.get('summary')}" if d else "-"
    gain = times(r["gain"]) if r["gain"] else "-"
    total = times(r["cumulative"]) if r["cumulative"] else "-"
    return [f"v{r['version']} (from v{r['parent']})", said, str(r["change"]), r["result"],
            gain, total]


def _sources(state: SessionState) -> set[str]:
    return {r.source for p in state.best_history if (r := _ranked(p.judgement.rank))}


def _ratio_note(state: SessionState) -> str:
    """What the gains are ratios of: the ranking number, named."""
    sources = _sources(state)
    if sources & {"tpu_estimate", "roofline"}:
        return ("Gains are ratios of the kernel's time at the production shape as the TPU "
                "compiler estimates it (\"est.\", \"≥ roofline\"), not measurements; "
                "none across kinds of number.")
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
    lines += ["", "## Best rank per evaluation", ""]
    if state.best_history:
        lines += ["| # | version | status | rank | best so far | flags | error |",
                  "|---|---|---|---|---|---|---|"]
        for i, p in enumerate(state.best_history, 1):
            best_rank, judged = p.best_rank, p.judgement
            best = f"{best_rank.words(short=True) if best_rank else '-'} (v{p.best})" \
                if p.best else "-"
            flags = ", ".join(judged.flags) or "-"
            error = (judged.error or "-").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {i} | v{p.version} | {judged.status} | {_rank(judged.rank)} "
                         f"| {best} | {flags} | {error} |")
    else:
        lines.append("Nothing was evaluated.")
    if "scaled" in "\n".join(lines):
        lines += ["", SCALED_WORDS]
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
    """The best rank's value after each evaluation (a step line) and each evaluation's
    own (dots, titled in the rank's words)."""
    points = state.best_history
    if not points:
        return "<p>Nothing was evaluated.</p>"
    pad = 40
    ranks = [_ranked(p.judgement.rank) for p in points]
    own = [r.value if r is not None else None for r in ranks]
    best = [r.value if (r := _ranked(p.best_rank)) else None for p in points]
    values = [v for v in own + best if v is not None]
    top = max([*values, 1.0]) * 1.1
    n = len(points)

    def x(i: int) -> float:
        return pad + (width - 2 * pad) * (i / max(n - 1, 1))

    def y(v: float) -> float:
        return height - pad - (height - 2 * pad) * (v / top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="best rank per evaluation">',
             f'<rect width="{width}" height="{height}" fill="#fff"/>',
             f'<line x1="{pad}" y1="{y(0)}" x2="{width - pad}" y2="{y(0)}" stroke="#999"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{y(0)}" stroke="#999"/>',
             f'<line x1="{pad}" y1="{y(1.0):.1f}" x2="{width - pad}" y2="{y(1.0):.1f}" '
             f'stroke="#ccc" stroke-dasharray="4 3"/>',
             f'<text x="{pad - 4}" y="{y(1.0) + 4:.1f}" font-size="10" text-anchor="end">1x</text>',
             f'<text x="{pad - 4}" y="{pad + 4}" font-size="10" text-anchor="end">'
             f'{times(top)}</text>']
    path, last = [], None
    for i, value in enumerate(best):
        if value is None:
            continue
        if last is not None:
            path.append(f"L{x(i):.1f},{y(last):.1f}")
        path.append(f"{'M' if not path else 'L'}{x(i):.1f},{y(value):.1f}")
        last = value
    if path:
        parts.append(f'<path d="{" ".join(path)}" fill="none" stroke="#1f6feb" '
                     f'stroke-width="2"/>')
    for i, (p, rank) in enumerate(zip(points, ranks, strict=True)):
        if rank is not None and rank.value is not None:
            colour = "#2da44e" if p.judgement.correct else "#cf222e"
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(rank.value):.1f}" r="3" '
                         f'fill="{colour}"><title>v{p.version} {p.judgement.status} '
                         f'{html.escape(rank.words(short=True))}</title></circle>')
    # x ticks: each evaluation's version, at most about ten labels
    step = max(1, -(-n // 10))
    for i in range(0, n, step):
        parts.append(f'<line x1="{x(i):.1f}" y1="{y(0)}" x2="{x(i):.1f}" y2="{y(0) + 4}" '
                     f'stroke="#999"/>')
        parts.append(f'<text x="{x(i):.1f}" y="{y(0) + 15}" font-size="9" '
                     f'text-anchor="middle">v{points[i].version}</text>')
    parts.append(f'<text x="{width / 2}" y="{height - 4}" font-size="11" '
                 f'text-anchor="middle">evaluation (the version evaluated)</text>')
    # legend: what the line and the dots are
    lx = width - pad - 170
    parts += [f'<line x1="{lx}" y1="{pad - 22}" x2="{lx + 18}" y2="{pad - 22}" '
              f'stroke="#1f6feb" stroke-width="2"/>',
              f'<text x="{lx + 22}" y="{pad - 19}" font-size="10">best ranking number so far</text>',
              f'<circle cx="{lx + 9}" cy="{pad - 9}" r="3" fill="#2da44e"/>',
              f'<text x="{lx + 22}" y="{pad - 6}" font-size="10">this evaluation (red: not correct)</text>']
    parts.append("</svg>")
    return "\n".join(parts)


SCALED_WORDS = ("\"scaled\": a figure the TPU compiler's estimator could not give whole "
                "(too costly at the production shape) was worked out at smaller sizes of the "
                "program (a shortened grid, or fewer rows of the reference) and extrapolated "
                "to the production shape; the detail of each estimate says from which sizes.")


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
             "<h2>Best rank per evaluation</h2>", svg_chart(state),
             f"<p><small>{e(SCALED_WORDS)}</small></p>"]
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


def _rank(rank: Rank | None) -> str:
    """An evaluation's number in words (``Rank.words``): "est. 1.80x on v5e at 4096x4096
    (TPU compiler)", on a TPU "1.80x measured on TPU v5 lite ..., est. 1.75x", beside a
    compiler figure how far it is trusted; "-" for one that ranks nothing."""
    if rank is None or not rank.decided:
        return "-"
    return _with_trust(rank).replace("|", "\\|")


def _with_trust(rank: Rank) -> str:
    trust = rank.trust_words()
    return f"{rank.words()}; trust: {trust}" if trust else rank.words()


def _best(state: Any) -> str:
    rank = state.best_rank
    return _with_trust(rank) if rank is not None else "-"


def _interpret_note(state: Any) -> str:
    sources = _sources(state)
    if sources & {"tpu_estimate", "roofline"}:
        return ("Kernels are ranked by the TPU compiler's static estimate of their time on "
                "the chip at the task's production shape (\"est.\": against the XLA "
                "reference's estimate; \"≥ roofline\": against the reference's roofline, a "
                "lower bound; a prediction, not a measurement; each figure names its chip "
                "and shape); correctness was checked at the smaller check shapes in TPU "
                "interpret mode on the CPU, whose time is host simulation time and ranks "
                "nothing.")
    return "Timings are TPU interpret mode on the CPU: simulated, not TPU performance."
