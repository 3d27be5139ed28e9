"""Rule-based fixes for the failures everyone hits, as source transforms.

Each rule reads the last evaluation (``EvalResult.to_json()``) and the current source and
returns a ``Fix`` (a tuning change or a whole new source, with its reason) or None:

- TPU misalignment (a block whose last two dims are not multiples of (8, 128)): the
  offending tunable moves to the nearest legal choice.
- VMEM overflow: the largest block tunable steps down to the next smaller legal choice.
- Missing accumulator initialisation (NaN / wrong output, and a scratch ref that is
  ``+=``-accumulated but never zeroed under ``pl.when(program_id(k) == 0)``): the init is
  inserted at the top of the kernel body, in the reduction axis the kernel declares.
- Float32 products at the chip's default precision (incorrect on a TPU, float32 inputs,
  products in the kernel bodies without ``precision=``): a TPU runs such a product as one
  bf16 pass (about three significant digits); every product gets ``precision=HIGHEST``.
- The TPU compiler failing on 16-bit floats (it aborts on some packed bf16 layouts, e.g.
  a bf16 (1, n) row broadcast): every block the kernel bodies read is widened to float32
  (16-bit floats only) and every store is cast back to its ref's dtype.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from tilewright.kernels.source import tunables
from tilewright.profiling.chips import misaligned

_ALIGN_MSG = re.compile(r"divisible by 8 and 128|\(8, ?128\)")
_BLOCK_SHAPE = re.compile(r"block shape \(([^)]*(?:\([^)]*\)[^)]*)*)\), array shape \(([^)]*)\)")
_VMEM_MSG = re.compile(r"vmem|scoped memory|resource.?exhausted|exceeds.*memory", re.IGNORECASE)


@dataclass(frozen=True)
class Fix:
    # misalignment | vmem_limit | vmem | accumulator_init | dot_precision | half_precision
    rule: str
    summary: str
    rationale: str
    tuning: dict[str, Any] | None = None
    source: str | None = None


def _error_text(result: dict[str, Any]) -> str:
    error = result.get("error") or {}
    lowering = result.get("lowering") or {}
    corr = result.get("correctness") or {}
    return "\n".join(str(x) for x in (error.get("message"), lowering.get("message"),
                                       corr.get("reason")) if x)


def suggest_fix(source: str, result: dict[str, Any]) -> Fix | None:
    """The first rule that recognises the failure, or None."""
    for rule in (fix_misalignment, fix_vmem_limit, fix_vmem, fix_accumulator_init,
                 fix_dot_precision, fix_half_precision):
        fix = rule(source, result)
        if fix is not None:
            return fix
    return None


def _parse_block_error(text: str) -> list[tuple[int, int, int]]:
    """(block, array_dim, alignment) for each offending dim of the first bad BlockSpec."""
    match = _BLOCK_SHAPE.search(text)
    if not match:
        return []
    blocks = [int(n) for n in re.findall(r"block_size=(\d+)", match.group(1))] or \
        [int(n) for n in re.findall(r"\d+", match.group(1))]
    dims = [int(n) for n in re.findall(r"\d+", match.group(2))]
    return [(block, dim, unit) for _axis, block, dim, unit in misaligned(blocks, dims)]


def fix_misalignment(source: str, result: dict[str, Any]) -> Fix | None:
    text = _error_text(result)
    if not _ALIGN_MSG.search(text):
        return None
    declared = _declared(source)
    if not declared:
        return None
    changes, reasons = {}, []
    for block, dim, align in _parse_block_error(text):
        for name, (current, choices) in declared.items():
            if name in changes or not isinstance(current, int):
                continue
            if current == block or min(current, dim) == block:
                new = tunables.nearest_legal(name, block, choices, align, (dim,))
                if new is not None and new != current:
                    changes[name] = new
                    reasons.append(f"{name}={current} gives a block dim of {block} against an "
                                   f"array dim of {dim}, which is neither a multiple of {align} "
                                   f"nor the whole dim; {new} is the nearest legal choice")
                break
    if not changes:
        # The message did not say which block: fix every declared value that is misaligned.
        aligns = tunables.alignment(source)
        for name, (current, choices) in declared.items():
            align = aligns[name]
            if isinstance(current, int) and align > 1 and current % align:
                new = tunables.nearest_legal(name, current, choices, align)
                if new is not None:
                    changes[name] = new
                    reasons.append(f"{name}={current} is not a multiple of {align}; "
                                   f"{new} is the nearest legal choice")
    if not changes:
        return None
    return Fix("misalignment", "fix TPU alignment: " + ", ".join(
        f"{k}={v}" for k, v in changes.items()),
        "TPU lowering rejected a block: the last two dims of every block must be multiples of "
        "(8, 128) or equal the array's dims. " + "; ".join(reasons) + ".", tuning=changes)


_SCOPED = re.compile(r"Scoped allocation with size ([\d.]+)([KMG])\w* and limit ([\d.]+)([KMG])")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
# a literal limit: 100663296, 100_663_296, 96 * 2**20 (then a comma or the call's end)
_LIMIT_ARG = re.compile(r"vmem_limit_bytes\s*=\s*(?:\d+\s*\*\s*2\s*\*\*\s*\d+|\d[\d_]*)"
                        r"(?=\s*[,)])")
# The share of a core's VMEM a kernel asks for when its blocks outgrow the default scoped
# limit: room for the tuner's larger blocks without asking again, and for Mosaic's own
# internal scratch beside the kernel's.
VMEM_SHARE = 0.75


def fix_vmem_limit(source: str, result: dict[str, Any]) -> Fix | None:
    """A kernel refused for scoped VMEM whose blocks would fit the core's VMEM: ask for
    more (``vmem_limit_bytes``, VMEM_SHARE of the core's capacity) instead of shrinking
    the blocks. The default scoped limit (16 MiB on v5e, 32 MiB on v6e) is a fraction of
    the 128 MiB a v5e/v6e core has, and MXU-sized f32 blocks with double buffering need
    more than 16 MiB (1024-cubed: 28 MiB; on the v5e, 2026-12-06). The limit goes into the
    kernel's ``pltpu.CompilerParams``; a kernel without one is left to ``fix_vmem``."""
    text = _error_text(result)
    found = _SCOPED.search(text)
    if result.get("status") == "correct" or not found:
        return None
    need = float(found.group(1)) * _UNITS[found.group(2)]
    limit = float(found.group(3)) * _UNITS[found.group(4)]
    tpu = result.get("tpu") or {}
    capacity = tpu.get("vmem_capacity_bytes")
    if not capacity:
        return None
    ask = int(capacity * VMEM_SHARE) // 2**20 * 2**20
    if need >= ask or limit >= ask or source.count("CompilerParams(") != 1:
        return None
    mib = ask // 2**20
    current = _LIMIT_ARG.search(source)
    if current is None and "vmem_limit_bytes" in source:  # computed by the kernel itself
        return None
    if current is not None:
        edited = source[:current.start()] + f"vmem_limit_bytes={mib} * 2**20" + \
            source[current.end():]
    else:
        at = source.index("CompilerParams(") + len("CompilerParams(")
        edited = source[:at] + f"vmem_limit_bytes={mib} * 2**20, " + source[at:]
    if edited == source:
        return None
    chip = tpu.get("chip") or "this chip"
    return Fix("vmem_limit", f"raise vmem_limit_bytes to {mib} MiB (blocks need "
               f"{need / 2**20:.1f} MiB, the scoped limit is {limit / 2**20:.0f} MiB)",
               f"The compiler refused the kernel for scoped VMEM ({_first_line(text)}): its "
               f"blocks need {need / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB limit in "
               f"force, but a {chip} core has {capacity / 2**20:.0f} MiB. Larger blocks are "
               f"what makes a TPU kernel fast (fewer grid steps, less re-reading from HBM), "
               f"so the kernel asks for {mib} MiB (pltpu.CompilerParams(vmem_limit_bytes=...)) "
               "instead of shrinking them.", source=edited)


def fix_vmem(source: str, result: dict[str, Any]) -> Fix | None:
    text = _error_text(result)
    if result.get("status") == "correct" or not _VMEM_MSG.search(text):
        return None
    declared = {k: v for k, v in _declared(source).items() if isinstance(v[0], int)}
    if not declared:
        return None
    aligns = tunables.alignment(source)
    # Halve the biggest block first: it dominates the footprint.
    for name, (current, choices) in sorted(declared.items(), key=lambda kv: -kv[1][0]):
        smaller = [c for c in choices if isinstance(c, int) and c < current
                   and tunables.is_legal(name, c, aligns[name])]
        if smaller:
            new = max(smaller)
            return Fix("vmem", f"shrink {name} {current} -> {new} to fit VMEM",
                       f"The kernel ran out of VMEM ({_first_line(text)}). Blocks are double-"
                       f"buffered, so the footprint is about 2 x the sum of the in/out blocks "
                       f"plus scratch; {name} is the largest block dimension, and {new} roughly "
                       "halves the footprint while staying (8, 128)-aligned.",
                       tuning={name: new})
    return None


def fix_accumulator_init(source: str, result: dict[str, Any]) -> Fix | None:
    if result.get("status") != "incorrect":
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    axis = _reduction_axis(tree)
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        refs = _accumulated_refs(fn) - _initialised_refs(fn)
        if not refs:
            continue
        ref = sorted(refs)[0]
        first = fn.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and len(fn.body) > 1:
            first = fn.body[1]  # keep the docstring first
        indent = " " * first.col_offset
        init = (f"{indent}@pl.when(pl.program_id({axis}) == 0)\n"
                f"{indent}def _init_{ref}():\n"
                f"{indent}    {ref}[...] = jnp.zeros_like({ref})\n\n")
        lines = source.splitlines(keepends=True)
        at = (first.decorator_list[0].lineno if getattr(first, "decorator_list", None)
              else first.lineno) - 1
        new_source = "".join(lines[:at]) + init + "".join(lines[at:])
        return Fix("accumulator_init", f"zero {ref} at the first step of grid axis {axis}",
                   f"`{fn.name}` accumulates into `{ref}` with `+=` but never initialises it, so "
                   f"the first reduction step adds to whatever the scratch buffer held (NaN in "
                   f"interpret mode, garbage on a TPU). Zeroing it under "
                   f"`pl.when(pl.program_id({axis}) == 0)` (the reduction axis) fixes that.",
                   source=new_source)
    return None


_HALF_MSG = re.compile(r"bf16|f16|bfloat16|float16|packed", re.IGNORECASE)
_WIDEN = '''

def _widen(block):
    """16-bit float blocks are computed in float32 (the TPU compiler fails on some packed
    bf16 layouts); other dtypes pass through."""
    return block.astype(jnp.float32) if block.dtype in (jnp.bfloat16, jnp.float16) else block
'''


_PRODUCTS = {"dot", "dot_general", "matmul", "einsum"}


def fix_dot_precision(source: str, result: dict[str, Any]) -> Fix | None:
    """Incorrect on a TPU with float32 inputs, and the kernel bodies' products name no
    precision: each gets ``precision=jax.lax.Precision.HIGHEST`` (Mosaic's full float32
    contraction; the default is one bf16 pass). Interpret mode on a CPU computes float32
    products exactly, so a kernel correct there can be off by this rounding on the chip."""
    if result.get("status") != "incorrect" \
            or (result.get("backend") or {}).get("platform") != "tpu":
        return None
    shapes = [str(s) for s in (result.get("tpu") or {}).get("input_shapes") or []]
    floats = [s for s in shapes if s[:1] in "fb"]
    if not floats or any(not s.startswith("f32[") for s in floats):
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    bodies = [fn for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
              and any(a.arg.endswith("_ref") for a in fn.args.args)]
    inserts = sorted({starts[node.end_lineno - 1] + node.end_col_offset - 1
                      for fn in bodies for node in ast.walk(fn)
                      if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and node.func.attr in _PRODUCTS
                      and not any(k.arg == "precision" for k in node.keywords)},
                     reverse=True)
    if not inserts or not re.search(r"^import jax$", source, re.M):
        return None
    new = source
    for closing in inserts:  # the call's ")": a keyword goes in just before it
        head = new[:closing].rstrip()
        sep = " " if head.endswith(",") else ", "
        new = head + sep + "precision=jax.lax.Precision.HIGHEST" + new[closing:]
    corr = result.get("correctness") or {}
    return Fix("dot_precision", "run the kernel's products at full float32 precision",
               "Incorrect on the TPU with float32 inputs "
               f"(max abs diff {corr.get('max_abs_diff')}), and the kernel's products name "
               "no precision: the chip runs a float32 product at its default precision as "
               "one bf16 pass, about three significant digits. Each product now asks for "
               "precision=HIGHEST (Mosaic's float32 contraction), as a float32 reference "
               "written with full precision computes.", source=new)


def fix_half_precision(source: str, result: dict[str, Any]) -> Fix | None:
    """16-bit floats the TPU compiler fails on: a compile error, or (the kernel compiles)
    its estimator aborting on them, which leaves the kernel without a ranking number."""
    error = result.get("error") or {}
    why = str((result.get("tpu") or {}).get("estimate_unavailable") or "")
    refused = error.get("kind") == "tpu_compile" and _HALF_MSG.search(_error_text(result))
    unestimated = "aborted" in why and _HALF_MSG.search(why)
    if not refused and not unestimated:
        return None
    if "_widen(" in source or not re.search(r"^import jax\.numpy as jnp$", source, re.M):
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    # (offset, order, text): insertions; at one offset the lower order goes in first,
    # so an outer "(" ends up before an inner "_widen(" and an inner ")" before an outer
    # ").astype(...)".
    edits: list[tuple[int, int, str]] = []
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def at(lineno: int, col: int) -> int:
        return starts[lineno - 1] + col

    bodies = [fn for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
              and any(a.arg.endswith("_ref") for a in fn.args.args)]
    for fn in bodies:
        for node in ast.walk(fn):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                    and isinstance(node.value, ast.Name) and node.value.id.endswith("_ref"):
                edits.append((at(node.lineno, node.col_offset), 1, "_widen("))
                edits.append((at(node.end_lineno, node.end_col_offset), 1, ")"))
            elif isinstance(node, ast.Assign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                ref = next((t.value.id for t in targets if isinstance(t, ast.Subscript)
                            and isinstance(t.value, ast.Name) and t.value.id.endswith("_ref")),
                           None)
                if ref is not None:
                    value = node.value
                    edits.append((at(value.lineno, value.col_offset), 2, "("))
                    edits.append((at(value.end_lineno, value.end_col_offset), 0,
                                  f").astype({ref}.dtype)"))
    if not edits:
        return None
    new = source
    for offset, _order, text in sorted(edits, key=lambda e: (-e[0], e[1])):
        new = new[:offset] + text + new[offset:]
    # The helper goes after the imports (before the first definition).
    first = next(n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef
                                                     | ast.Assign | ast.AnnAssign)) \
        if any(isinstance(n, ast.FunctionDef) for n in tree.body) else None
    if first is None:
        return None
    line = (first.decorator_list[0].lineno if getattr(first, "decorator_list", None)
            else first.lineno)
    cut = len("".join(new.splitlines(keepends=True)[:line - 1]))
    new = new[:cut] + _WIDEN.lstrip("\n") + "\n\n" + new[cut:]
    return Fix("half_precision", "compute the kernel in float32 (16-bit floats widened)",
               "The TPU compiler failed on 16-bit floats in the kernel "
               f"({_first_line(_error_text(result) or why)}). Every block the kernel reads is "
               "widened to float32 (bf16/f16 only) and every store cast back to its ref's "
               "dtype: the vector unit computes in f32 on v4/v5e anyway.",
               source=new)


def _accumulated_refs(fn: ast.FunctionDef) -> set[str]:
    params = {a.arg for a in fn.args.args} | ({fn.args.vararg.arg} if fn.args.vararg else set())
    found = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Subscript):
            base = node.target.value
            if isinstance(base, ast.Name) and (base.id in params or base.id.endswith("_ref")):
                found.add(base.id)
    return found


def _initialised_refs(fn: ast.FunctionDef) -> set[str]:
    """Refs assigned (plain ``=``) anywhere in the body, e.g. inside a pl.when init."""
    found = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                    found.add(target.value.id)
    return found


def _reduction_axis(tree: ast.Module) -> int:
    """The grid axis marked "arbitrary" (the last one), else the highest program_id used."""
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "dimension_semantics":
            try:
                sem = ast.literal_eval(node.value)
            except ValueError:
                continue
            arbitrary = [i for i, s in enumerate(sem) if str(s).lower() == "arbitrary"]
            if arbitrary:
                return arbitrary[-1]
    ids = [n.args[0].value for n in ast.walk(tree)
           if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "program_id"
           and n.args and isinstance(n.args[0], ast.Constant)]
    return max(ids) if ids else 0


def _declared(source: str) -> dict[str, tuple[Any, list[Any]]]:
    try:
        return tunables.read(source)
    except tunables.TunablesError:
        return {}


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:200]
