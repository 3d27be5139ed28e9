"""A version of a session as a module the user drops into their code, and a pytest file
that checks it against the task's reference (``tilewright export``, the History key,
the palette).

The module is the version's source with

- a header saying what it is: task, session and version, the chip and shape its number
  is for and what that number is ("est. 1.34x on v5e (TPU compiler)": an estimate, not a
  measurement), where it was checked correct, and how to replay the session;
- the offline templates' generic plumbing taken out where the task does not need it:
  ``_split_static`` / ``_merge`` (static Python arguments threaded around the
  ``pallas_call``) and ``_widen`` (16-bit blocks computed in float32). Each
  simplification is kept only if the simplified module is judged correct again (and
  the TPU compiler still accepts it), else the next milder one is tried, down to the
  version as it ran;
- for a task made by ``tilewright new`` from the user's function, an alias under that
  function's name (``fused_ln = kernel``).

The pytest file carries the task's reference (for a task made from the user's
function, that imports the user's own module) and checks the kernel on the task's
small shapes with fresh keys, in TPU interpret mode off-TPU. Native tasks only: the
benchmark layouts have no shape parameters a test could pass.
"""

from __future__ import annotations

import ast
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilewright.kernels.errors import Advised
from tilewright.kernels.judge.result import EvalResult
from tilewright.kernels.source.printable import comments_printable, one_line
from tilewright.sessions.log import LoadedSession, read_text_blob
from tilewright.sessions.state import SessionState

Evaluate = Callable[[str], Awaitable[EvalResult]]
PLUMBING = ("_split_static", "_merge", "_widen")


class ExportError(Advised, ValueError):
    """Why a version cannot be exported, and what to do instead."""


@dataclass
class Exported:
    version: int
    module: str  # the module's text
    test: str | None  # the pytest file's text (None: not asked for, or not possible)
    simplified: list[str] = field(default_factory=list)  # what plumbing was taken out
    verified: str = "not checked"  # how the written module was checked
    notes: list[str] = field(default_factory=list)


def pick_version(state: SessionState, which: str | int | None) -> int:
    """``best`` (default), ``current``, ``vN`` or ``N`` -> a version number."""
    if which in (None, "best"):
        if state.best is None:
            raise ExportError("this session has no correct version to export",
                              "export one by number (tilewright export SESSION vN), or "
                              "open the session and get one correct first")
        return state.best
    if which == "current":
        if state.current is None:
            raise ExportError("this session has no version yet")
        return state.current
    text = str(which).lstrip("v")
    if not text.isdigit() or int(text) not in state.versions:
        known = ", ".join(f"v{n}" for n in state.versions) or "none"
        raise ExportError(f"no version {which!r} in this session",
                          f"versions: {known}; or best, current")
    return int(text)


# -- taking the plumbing out ------------------------------------------------------------

def simplify(source: str, drop: tuple[str, ...]) -> str | None:
    """``source`` without the named plumbing (``static`` threading for ``_split_static``
    and ``_merge``; ``_widen`` calls). None when the source does not have that shape
    (a user's own kernel) or the result would not stand on its own. One rewrite at a
    time, the source parsed again after each, so nested ones compose."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    if not set(drop) & defined:
        return None
    static = "_split_static" in drop and "_merge" in drop
    destatic = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                and n.args.args and n.args.args[0].arg == "static"} if static else set()
    text = source
    for _ in range(500):  # each rewrite removes one site: a template has a few dozen
        edit = _next_edit(text, drop, static, destatic)
        if edit is None:
            break
        text = edit
    else:
        return None
    # Drop the helpers nothing uses any more.
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    unused = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in PLUMBING
              and n.name not in used]
    lines = text.splitlines(keepends=True)
    for node in sorted(unused, key=lambda n: n.lineno, reverse=True):
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        end = node.end_lineno or node.lineno
        while end < len(lines) and not lines[end].strip():
            end += 1  # the blank lines after it
        del lines[start:end]
    text = "".join(lines)
    try:
        final = ast.parse(text)
    except SyntaxError:
        return None
    if static and any(isinstance(n, ast.Name) and n.id == "static" for n in ast.walk(final)):
        return None  # `static` is still read somewhere: the template has another shape
    return text if text != source else None


def _next_edit(text: str, drop: tuple[str, ...], static: bool, destatic: set[str]
               ) -> str | None:
    """``text`` with the first applicable rewrite made, or None when none applies."""
    tree = ast.parse(text)

    def seg(node: ast.AST) -> str:
        return ast.get_source_segment(text, node) or ""

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None)
            if static and name == "_merge" and len(node.args) == 2:
                return _replace(text, node, seg(node.args[1]))
            if "_widen" in drop and name == "_widen" and len(node.args) == 1:
                return _replace(text, node, seg(node.args[0]))
            if static and name in destatic and node.args \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id == "static":
                rest = [seg(a) for a in node.args[1:]] + [seg(k) for k in node.keywords]
                return _replace(text, node, f"{seg(node.func)}({', '.join(rest)})")
            if static and isinstance(node.func, ast.Attribute) and node.func.attr == "partial" \
                    and len(node.args) == 2 and isinstance(node.args[1], ast.Name) \
                    and node.args[1].id == "static" and not node.keywords:
                return _replace(text, node, seg(node.args[0]))
        if static and isinstance(node, ast.Lambda) and node.args.vararg is not None \
                and not node.args.args and isinstance(node.body, ast.Call) \
                and isinstance(node.body.func, ast.Name) and len(node.body.args) == 1 \
                and not node.body.keywords and isinstance(node.body.args[0], ast.Starred) \
                and isinstance(node.body.args[0].value, ast.Name) \
                and node.body.args[0].value.id == node.args.vararg.arg:
            return _replace(text, node, node.body.func.id)  # lambda *a: f(*a) -> f
        if not static:
            continue
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and getattr(node.value.func, "id", None) == "_split_static" \
                and isinstance(node.targets[0], ast.Tuple) and len(node.targets[0].elts) == 2:
            return _replace(text, node, f"{seg(node.targets[0].elts[1])} = "
                                        f"{seg(node.value.args[0])}")
        if isinstance(node, ast.FunctionDef) and node.name in destatic:
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "partial" \
                        and deco.args and seg(deco.args[0]) == "jax.jit" \
                        and len(deco.keywords) == 1 and deco.keywords[0].arg == "static_argnums" \
                        and seg(deco.keywords[0].value) == "0":
                    return _replace(text, deco, "jax.jit")
            if node.args.args and node.args.args[0].arg == "static":
                first = node.args.args[0]
                start, end = _span(text, first)
                tail = text[end:]
                stripped = tail.lstrip()
                if stripped.startswith(","):
                    end += len(tail) - len(stripped) + 1
                    end += len(text[end:]) - len(text[end:].lstrip(" "))
                return text[:start] + text[end:]
    return None


def _span(text: str, node: ast.AST) -> tuple[int, int]:
    """A node's [start, end) in ``text`` (ast columns are UTF-8 byte offsets)."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def at(lineno: int, col: int) -> int:
        return starts[lineno - 1] + len(lines[lineno - 1].encode()[:col].decode(errors="ignore"))

    return at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)  # type: ignore[arg-type]


def _replace(text: str, node: ast.AST, new: str) -> str:
    start, end = _span(text, node)
    return text[:start] + new + text[end:]


# -- the module and its test ---------------------------------------------------------

def source_function(task: Any) -> tuple[str, str, dict[str, str]] | None:
    """(module, function, bound keywords) when the task was made by ``tilewright new``
    from the user's function (reference.py's ``SOURCE_FUNCTION``)."""
    if task is None or task.layout != "native":
        return None
    try:
        tree = ast.parse(task.reference_path.read_text())
    except (OSError, SyntaxError):
        return None
    origin = None
    bound: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id ==
                                                "SOURCE_FUNCTION" for t in node.targets):
            try:
                origin = ast.literal_eval(node.value)
            except ValueError:
                return None
        if isinstance(node, ast.FunctionDef) and node.name == "reference":
            for call in ast.walk(node):
                if isinstance(call, ast.Call):
                    bound.update({k.arg: ast.unparse(k.value) for k in call.keywords if k.arg})
    if not isinstance(origin, str) or ":" not in origin:
        return None
    module, function = origin.split(":", 1)
    return module, function, bound


def header(loaded: LoadedSession, state: SessionState, number: int, task: Any,
           result: dict[str, Any] | None) -> str:
    """The comment block at the top of the exported module."""
    h = loaded.header
    v = state.versions[number]
    name = (h.get("task") or {}).get("name") or "task"
    lines = [f"{name}: v{number} of tilewright session {h.get('id')} ({v.origin}: "
             f"{v.summary})"]
    if task is not None and task.description:
        lines.append(f"Task: {' '.join(task.description.split())[:300]}")
    tpu = (result or {}).get("tpu") or {}
    shape = tpu.get("shape") or ((result or {}).get("timing") or {}).get("shape")
    rank = v.rank
    if rank is not None and rank.decided:
        where = f" (chip {v.chip}" + (f", shape {shape}" if shape else "") + ")" if v.chip \
            else ""
        kind = {"tpu_estimate": "the TPU compiler's static estimate against the XLA "
                                "reference, not a measurement",
                "roofline": "the TPU compiler's estimate of the kernel against the XLA "
                            "reference's roofline: a lower bound, not a measurement",
                "device_time": "measured on a TPU against the XLA reference",
                "host_simulation": "the CPU interpreter's time ratio: not TPU performance"
                }.get(rank.source, "")
        lines.append(f"Number: {rank.words()}{where}" + (f"; {kind}" if kind else ""))
        time = rank.time_words()
        if time:  # the compiler's cycles and the time they make, side by side
            own = rank.kernel_cycles / rank.clock_hz if rank.kernel_cycles and rank.clock_hz \
                else None
            if rank.kernel_s and own and rank.kernel_s > own * 1.001:
                time += f" (its memory floor, {_ms(rank.kernel_s)}, ranks it)"
            ref = "the XLA reference's roofline" if rank.is_roofline \
                else "the XLA reference's estimate"
            said = f"; {ref} {_ms(rank.reference_s)}" if rank.reference_s else ""
            # the reference's time the number divides: its estimate, or its memory floor
            # where that is larger (said, so the arithmetic adds up)
            used = rank.value * rank.kernel_s if rank.is_estimate \
                and rank.value and rank.kernel_s else None
            if said and used and used > rank.reference_s * 1.001:
                said += f" (its memory floor, {_ms(used)}, ranks it)"
            if said and used:
                said += f"; {_ms(used)} / {_ms(rank.kernel_s)} = {rank.value:.2f}x"
            lines.append(f"Kernel: {time}{said}")
        trust = rank.trust_words()
        if trust:
            lines.append(f"Trust: {trust}")
    shapes = [s for s in ((result or {}).get("extra") or {}).get("shapes") or []
              if not s.get("held_out")]
    if v.status:
        checked = ", ".join(f"{s['name']} {s.get('params') or ''}".strip() for s in shapes)
        trials = shapes[0].get("trials") if shapes else None
        lines.append(f"Checked: {v.status}" + (f" on {checked}" if checked else "")
                     + (f", {trials} trials each" if trials else "")
                     + (", plus a held-out shape" if any(
                         s.get("held_out") for s in ((result or {}).get("extra") or {})
                         .get("shapes") or []) else ""))
    backend = (h.get("backend") or {}).get("label")
    if backend:
        lines.append(f"Judged on: {backend}")
    lines.append(f"Replay: tilewright replay {h.get('id')}")
    # One comment line each, whatever a summary or a task's description holds: a newline
    # or a carriage return in one would end the comment and start a statement.
    return "".join(f"# {one_line(line)}\n" for line in lines) + "\n"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _strip_docstring(tree: ast.Module, text: str) -> str:
    lines = text.splitlines(keepends=True)
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(
            getattr(tree.body[0], "value", None), ast.Constant) and isinstance(
            tree.body[0].value.value, str):
        del lines[:tree.body[0].end_lineno]
    return "".join(lines).lstrip("\n")


def test_text(task: Any, module: str, entry: str) -> str:
    """A pytest file that checks ``module.entry`` against the task's reference on its
    small shapes (fresh keys, the task's tolerances)."""
    if task is None or task.layout != "native":
        layout = task.layout if task is not None else "unknown"
        raise ExportError(f"a test file needs a native task (this one is {layout}): its "
                          "shapes are what the test passes to make_inputs",
                          "convert the task with `tilewright new NAME --from TASK_DIR`, or "
                          "export without --test")
    try:
        reference = task.reference_path.read_text()
        tree = ast.parse(reference)
    except (OSError, SyntaxError) as exc:
        raise ExportError(f"cannot read the task's reference {task.reference_path}: {exc}") from exc
    shapes = [s for s in task.shapes if not s.held_out and s.size == "small"] or \
        [s for s in task.shapes if not s.held_out]
    rows = []
    for s in shapes:
        atol = s.atol if s.atol is not None else task.atol
        rtol = s.rtol if s.rtol is not None else task.rtol
        rows.append(f"    ({s.name!r}, {s.params!r}, {atol!r}, {rtol!r}),")
    body = _strip_docstring(tree, reference)
    return (
        f"# Checks {module}.{entry} against the {one_line(task.name)} task's reference\n"
        "# (written by `tilewright export`). Off-TPU the kernel runs in Pallas' TPU\n"
        "# interpret mode.\n\n"
        "import contextlib\n\nimport jax\nimport numpy as np\nimport pytest\n\n"
        f"from {module} import {entry} as candidate\n\n"
        f"# -- the task's reference ({task.reference_path.name}) ------------------------\n\n"
        + body.rstrip("\n") + "\n\n\n"
        "# -- the check ------------------------------------------------------------------\n\n"
        "SHAPES = [  # (name, make_inputs parameters, atol, rtol)\n" + "\n".join(rows) + "\n]\n\n\n"
        "def _mode():\n"
        "    if jax.default_backend() == 'tpu':\n"
        "        return contextlib.nullcontext()\n"
        "    from jax.experimental.pallas import tpu as pltpu\n\n"
        "    return pltpu.force_tpu_interpret_mode()\n\n\n"
        "@pytest.mark.parametrize('seed', [0, 1, 2])\n"
        "@pytest.mark.parametrize('name, params, atol, rtol', SHAPES, ids=[s[0] for s in SHAPES])\n"
        "def test_kernel_matches_the_reference(name, params, atol, rtol, seed):\n"
        "    inputs = make_inputs(jax.random.PRNGKey(seed), **params)\n"
        "    expected = reference(*inputs)\n"
        "    with _mode():\n"
        "        got = jax.block_until_ready(candidate(*inputs))\n"
        "    got_leaves, expected_leaves = jax.tree.leaves(got), jax.tree.leaves(expected)\n"
        "    assert len(got_leaves) == len(expected_leaves)\n"
        "    for g, e in zip(got_leaves, expected_leaves):\n"
        "        assert g.shape == e.shape and g.dtype == e.dtype\n"
        "        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(e, np.float32),\n"
        "                                   atol=atol, rtol=rtol)\n"
    )


async def export(loaded: LoadedSession, state: SessionState, which: str | int | None,
                 module_name: str, *, task: Any = None, evaluate: Evaluate | None = None,
                 with_test: bool = False) -> Exported:
    """The exported module (and test) for a version. ``evaluate`` judges a candidate
    source as the session does; without it nothing is simplified (an unchecked
    simplification is never written)."""
    number = pick_version(state, which)
    v = state.versions[number]
    try:  # what a terminal would obey, or a line break a reader misses, written plainly
        source = comments_printable(read_text_blob(loaded.path, v.source_blob))
    except ValueError as exc:
        raise ExportError(f"v{number}'s source cannot be written as it is: {exc}",
                          "edit the kernel in the workbench (or pick another version) and "
                          "export again") from exc
    from tilewright.sessions.log import read_json_blob

    result = read_json_blob(loaded.path, v.result_blob) if v.result_blob else None
    entry = task.entry if task is not None else "kernel"
    out = Exported(number, source, None)
    body = source
    if evaluate is not None:
        for drop in (PLUMBING, ("_split_static", "_merge"), ("_widen",)):
            candidate = simplify(source, drop)
            if candidate is None:
                continue
            judged = await evaluate(candidate)
            compile_ok = (judged.tpu or {}).get("compile") in (None, "ok", "unavailable")
            if judged.correct and compile_ok:
                body = candidate
                out.simplified = [d for d in drop if d not in candidate]
                out.verified = f"the simplified module was judged {judged.status} again"
                break
        else:
            out.verified = "as it ran in the session" if v.status else "never evaluated"
    elif v.status:
        out.verified = "as it ran in the session"
    if not v.correct:
        out.notes.append(f"v{number} is not correct ({v.status or 'never evaluated'})")
    alias = ""
    body = inline_task_modules(body, task)
    origin = source_function(task)
    if origin is not None:
        module, function, bound = origin
        if function != entry:
            if function in _top_level_names(body):
                body = rename(body, function, f"_{function}_math")  # the math, not the kernel
            fixed = f" with {', '.join(f'{k}={val}' for k, val in bound.items())} fixed" \
                if bound else ""
            alias = (f"\n\n# A drop-in for {module}.{function}{fixed}: the same arrays in, "
                     "the same result out.\n"
                     f"{function} = {entry}\n")
    out.module = header(loaded, state, number, task, result) + body.rstrip("\n") + "\n" + alias
    if with_test:
        out.test = test_text(task, module_name, entry)
    return out


COPIED_MARK = "# Copied by `tilewright new`"


def inline_task_modules(source: str, task: Any) -> str:
    """Imports of the modules ``tilewright new`` copied into the task (the user's
    function and what it needs) replaced by their code, so the exported module stands
    alone: in the user's code it may replace the very function it was made from, and
    importing that module back would be circular."""
    if task is None:
        return source
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    lines = source.splitlines(keepends=True)
    for node in sorted(tree.body, key=lambda n: n.lineno, reverse=True):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        path = Path(task.root) / f"{node.module}.py"
        try:
            text = path.read_text()
        except OSError:
            continue
        if not text.startswith(COPIED_MARK):
            continue  # a module of the task's own, not a copy of the user's code
        body_lines = text.splitlines(keepends=True)
        while body_lines and body_lines[0].startswith("#"):
            body_lines.pop(0)  # the copy's own header
        present = {ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)}
        kept_lines = []
        for line in body_lines:  # imports the module has already are not repeated
            stripped = line.strip()
            if stripped.startswith(("import ", "from ")) and stripped in present:
                continue
            kept_lines.append(line)
        code = "".join(kept_lines).lstrip("\n")
        wanted = {a.name for a in node.names}
        renames = {a.name: a.asname for a in node.names if a.asname}
        for old, new in renames.items():
            code = rename(code, old, new)
        block = (f"# From {node.module}.py, the reference's math (inlined: "
                 f"{', '.join(sorted(wanted))}).\n" + code.rstrip("\n") + "\n")
        lines[node.lineno - 1:node.end_lineno] = [block]
    return "".join(lines)


def _top_level_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def rename(source: str, old: str, new: str) -> str:
    """Every use of the name ``old`` (not attributes, not keyword arguments) as ``new``."""
    import io
    import tokenize

    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    lines = source.splitlines(keepends=True)
    edits = []
    for i, tok in enumerate(tokens):
        if tok.type != tokenize.NAME or tok.string != old:
            continue
        before = next((t for t in reversed(tokens[:i]) if t.type not in (
            tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT,
            tokenize.DEDENT)), None)
        after = next((t for t in tokens[i + 1:] if t.type not in (tokenize.NL,
                                                                   tokenize.COMMENT)), None)
        if before is not None and before.string == ".":
            continue  # module.old: an attribute
        if after is not None and after.string == "=" and before is not None \
                and before.string in ("(", ","):
            continue  # f(old=...): a keyword argument
        edits.append(tok.start)
    for row, col in sorted(edits, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[col + len(old):]
    return "".join(lines)


def write(exported: Exported, path: Path, test_path: Path | None) -> list[Path]:
    """Write the module (and its test); refuses to overwrite the test's own module."""
    path.write_text(exported.module)
    written = [path]
    if exported.test is not None and test_path is not None:
        test_path.write_text(exported.test)
        written.append(test_path)
    return written
