"""What the offline templates read from a task's reference: the reference function and
the module code it needs (imports, constants, helpers), the function renamed for a kernel
module, and which kernel families its calls suggest (matmul, row-wise, elementwise,
attention). Pure ``ast``: the reference is read, never run.
"""

from __future__ import annotations

import ast

from tilewright.agents.base import TaskBrief

# The reference's function name per task layout.
REFERENCE_NAMES = {"native": "reference", "jaxbench": "workload", "maxkernel": "computation"}
FAMILIES = ("elementwise", "rowwise", "matmul", "attention", "conv", "cross_entropy",
            "gated_mlp")
FALLBACK = "whole"  # the universal fallback, tried after every family
_SKIP_FUNCTIONS = {"make_inputs", "flops", "create_inputs", "get_flops", "get_inputs",
                   "benchmark", "main"}


class TemplateError(Exception):
    """The reference does not fit the family's template; the message says why."""


def defining_source(brief: TaskBrief) -> tuple[str, str]:
    """(source, function name) of what defines the output: the function the reference
    delegates to when the brief has one (``TaskBrief.defining``: the user's function a
    ``tilewright new`` task copied, a converted benchmark's ``workload``), else the
    reference itself."""
    if brief.defining:
        return brief.defining["source"], brief.defining["function"]
    return brief.reference_source, REFERENCE_NAMES.get(brief.layout, "reference")


def reference_parts(brief: TaskBrief) -> tuple[str, ast.FunctionDef, list[str]]:
    """(imports and constants, the function that defines the output, other helper
    sources).

    Only what that function needs comes along: helpers, constants and imports whose
    names it uses (directly or through another kept helper). A baseline's
    ``benchmark()``, input builders and unused constants stay behind.
    """
    source, name = defining_source(brief)
    tree = ast.parse(source)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        raise TemplateError(f"the reference defines no `{name}` function to build a kernel from")
    # What each top-level statement defines, and the names it reads.
    items: list[tuple[ast.stmt, set[str], set[str]]] = []
    for node in tree.body:
        if node is fn or _is_docstring(node):
            continue
        if isinstance(node, ast.FunctionDef) and node.name in _SKIP_FUNCTIONS:
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            defined = {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined = {node.name}
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        else:
            continue
        items.append((node, defined, _names_read(node)))
    needed = _names_read(fn)
    kept: set[int] = set()
    changed = True
    while changed:
        changed = False
        for index, (_node, defined, reads) in enumerate(items):
            if index not in kept and defined & needed:
                kept.add(index)
                needed |= reads
                changed = True
    head, helpers = [], []
    for index, (node, _defined, _reads) in enumerate(items):
        if index not in kept:
            continue
        text = ast.get_source_segment(source, node) or ""
        if isinstance(node, ast.Import | ast.ImportFrom):
            if text not in _IMPORTS.splitlines():  # the template imports these already
                head.append(text)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            helpers.append(text)
        else:
            head.append(text)
    return "\n".join(head), fn, helpers


def _names_read(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
        {n.value.id for n in ast.walk(node)
         if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant)


def _renamed(source: str, fn: ast.FunctionDef, new_name: str) -> str:
    text = ast.get_source_segment(source, fn) or ast.unparse(fn)
    return text.replace(f"def {fn.name}(", f"def {new_name}(", 1)


def _preamble(brief: TaskBrief, title: str) -> str:
    return (f'"""{brief.name}: {title} (offline agent template).\n\n'
            "Written from the task's reference; block sizes are TUNABLES for the autotuner.\n"
            '"""\n\n')


_IMPORTS = ("import functools\n\nimport jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"
            "from jax.experimental.pallas import tpu as pltpu\n")


_MATMUL_CALLS = {"dot", "matmul", "einsum", "tensordot", "dot_general", "inner"}
_ROW_CALLS = {"sum", "max", "min", "mean", "var", "std", "logsumexp", "softmax",
              "log_softmax", "norm", "argmax", "argmin", "prod", "cumsum", "rsqrt_mean"}


def _softmax_between(order: list[tuple[int, int, str]]) -> bool:
    """Whether a softmax finishes after one product and before another (as attention's
    ``softmax(q @ k.T) @ v`` does; a logsumexp after two chained layers does not)."""
    kinds = [kind for *_, kind in sorted(order)]
    if "product" not in kinds:
        return False
    first, last = kinds.index("product"), len(kinds) - 1 - kinds[::-1].index("product")
    return "softmax" in kinds[first + 1:last]


def infer_families(brief: TaskBrief) -> tuple[str, ...]:
    """Template families to try, most likely first, then the universal fallback, then
    the remaining families: every family is tried before the offline agent gives up.

    A declared family comes first. Otherwise the reference function's AST is read: a
    softmax between two matrix products suggests attention; a matrix product (``@``,
    ``jnp.dot``, ``einsum``...) suggests matmul; a reduction or an ``axis=`` argument a
    row-wise kernel; otherwise elementwise. Families that cannot fit (a row-wise
    template for a reference that multiplies matrices) come after the fallback.
    """
    try:
        tree = ast.parse(defining_source(brief)[0])
    except SyntaxError:
        return (*FAMILIES, FALLBACK)
    matmuls = 0
    rows = softmax = conv = labels = False
    order: list[tuple[int, int, str]] = []  # where products and softmaxes finish, in order
    for node in ast.walk(tree):
        end = (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            matmuls += 1
            order.append((*end, "product"))
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                getattr(node.func, "id", "")
            matmuls += name in _MATMUL_CALLS
            if name in _MATMUL_CALLS:
                order.append((*end, "product"))
            conv |= name in ("conv_general_dilated", "conv", "conv_with_general_padding")
            softmax |= name in ("softmax", "log_softmax", "logsumexp")
            if name in ("softmax", "log_softmax", "logsumexp"):
                order.append((*end, "softmax"))
            labels |= name in ("one_hot", "take_along_axis")
            rows |= name in _ROW_CALLS or any(k.arg in ("axis", "axes") for k in node.keywords)
    if conv:
        likely = ("conv",)
    elif matmuls and softmax and labels:
        likely = ("cross_entropy", "matmul")
    elif matmuls == 3 and not softmax:
        likely = ("gated_mlp", "matmul")
    elif matmuls >= 2 and _softmax_between(order):
        likely = ("attention", "matmul")
    elif matmuls:
        likely = ("matmul",)
    elif rows:
        likely = ("rowwise",)
    else:
        likely = ("elementwise", "rowwise")
    if brief.family:
        likely = (brief.family.lower(), *(f for f in likely if f != brief.family.lower()))
    rest = tuple(f for f in FAMILIES if f not in likely)
    return (*likely, FALLBACK, *rest)


def literal_value(node: ast.AST | None) -> object:
    """The value of a literal node (a number, string, tuple of them); None for anything
    else, or no node."""
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        return None


def operand_dtypes(brief: TaskBrief) -> set[str]:
    """The dtypes of the task's operands (labels and indices aside): by the inputs a worker
    built for the brief, else by a ``dtype`` the task's shape sets; empty when unknown."""
    inputs = ((brief.production or {}).get("inputs") or next(
        (s["inputs"] for s in brief.shapes if s.get("inputs")), []))
    dtypes = {str(d) for _shape, d in inputs} - {"int32", "i32", "int64", "i64"}
    if not dtypes:
        declared = ((brief.production or {}).get("params") or {}).get("dtype")
        dtypes = {str(declared)} if declared else set()
    return dtypes
