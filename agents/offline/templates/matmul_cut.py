"""The product inside a matmul task's reference, read with ``ast``: which two of its
arguments it multiplies (``x @ w``, ``jnp.dot``, ``jnp.matmul``, a two-operand
``einsum``, a plain ``dot_general``; the rhs possibly transposed), at what precision,
and which of the sizes the reference hard-codes stand for the product's own. The matmul
template cuts that product out and fuses what is left of the reference as its epilogue.
"""

from __future__ import annotations

import ast

from tilewright.agents.base import TaskBrief
from tilewright.agents.offline.reference_reading import literal_value


class CutMatmul(ast.NodeTransformer):
    """Replaces the first ``a @ b`` / ``jnp.dot(a, b)`` / ``jnp.matmul(a, b)`` with ``_acc``;
    ``b`` may be transposed (``w.T``, ``jnp.transpose(w)``: a weight stored (n, k), as
    torch-style linear layers keep it)."""

    def __init__(self) -> None:
        self.operands: tuple[str, str] | None = None
        self.transposed = False
        # the reference's ``precision=`` on its product (``lax.Precision.HIGHEST``), kept
        self.precision: str | None = None

    @staticmethod
    def _untransposed(node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and node.attr == "T" and isinstance(node.value,
                                                                              ast.Name):
            return node.value.id
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", "")) == "transpose" and len(node.args) == 1 \
                and isinstance(node.args[0], ast.Name) and not node.keywords:
            return node.args[0].id
        return None

    def _cut(self, left: ast.AST, right: ast.AST, node: ast.AST) -> ast.AST:
        if self.operands is None and isinstance(left, ast.Name):
            if isinstance(right, ast.Name):
                self.operands = (left.id, right.id)
            elif self._untransposed(right):
                self.operands = (left.id, self._untransposed(right) or "")
                self.transposed = True
            else:
                return self.generic_visit(node)
            return ast.copy_location(ast.Name("_acc", ast.Load()), node)
        return self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        if isinstance(node.op, ast.MatMult):
            return self._cut(node.left, node.right, node)
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        left = right = None
        if name in ("dot", "matmul") and len(node.args) >= 2:
            left, right = node.args[0], node.args[1]
        elif name == "einsum" and len(node.args) == 3 and all(
                isinstance(a, ast.Name) for a in node.args[1:]):
            form = einsum_form(literal_value(node.args[0]))
            if form is not None:
                left, right = node.args[1], node.args[2]
                if form == "transposed":
                    right = ast.Attribute(right, "T", ast.Load())
        elif name == "dot_general" and len(node.args) >= 2:
            numbers = node.args[2] if len(node.args) > 2 else next(
                (k.value for k in node.keywords if k.arg == "dimension_numbers"), None)
            contract = literal_value(numbers)
            if contract == (((1,), (0,)), ((), ())):  # x @ w
                left, right = node.args[0], node.args[1]
            elif contract == (((1,), (1,)), ((), ())) and isinstance(node.args[1], ast.Name):
                # x @ w.T with w stored (n, k): the transposed form _cut knows
                left, right = node.args[0], ast.Attribute(node.args[1], "T", ast.Load())
        if left is None or right is None or self.operands is not None:
            return self.generic_visit(node)
        cut = self._cut(left, right, node)
        if self.operands is not None:  # this is the product cut out: keep its precision
            precision = next((k.value for k in node.keywords if k.arg == "precision"), None)
            self.precision = ast.unparse(precision) if precision is not None else None
        return cut


def einsum_form(spec: object) -> str | None:
    """What the matmul template can do with an einsum of two operands: ``plain`` for a
    product over the lhs's last axis by a (k, n) or batched (g, k, n) rhs
    (``'bsd,df->bsf'``, ``'gmk,gkn->gmn'``), ``transposed`` for a (n, k) rhs
    (``'mk,nk->mn'``); None for anything else."""
    if not isinstance(spec, str) or "->" not in spec or "." in spec:
        return None
    inputs, out = "".join(spec.split()).split("->")
    if inputs.count(",") != 1:
        return None
    a, b = inputs.split(",")
    shared = set(a) & set(b) - set(out)
    if len(shared) != 1 or len(set(a)) != len(a) or len(set(b)) != len(b):
        return None
    c = shared.pop()
    if not a or a[-1] != c:
        return None
    if len(b) == 2 and b[0] == c and out == a[:-1] + b[1]:
        return "plain"
    if len(b) == 2 and b[1] == c and out == a[:-1] + b[0]:
        return "transposed"
    if len(b) == 3 == len(a) and b[0] == a[0] == out[0] and b[1] == c \
            and out == a[:-1] + b[2]:
        return "plain"  # batched: (g, m, k) by (g, k, n)
    return None


def sizes_as_written(brief: TaskBrief, fn: ast.FunctionDef) -> tuple[ast.FunctionDef, list[str]]:
    """``fn`` (read from the brief's reference, whose hard-coded sizes ``--set`` rewrote for
    the check shapes) with each rewritten number replaced by ``_size(check, production)``,
    and the sizes replaced (``"4096"``). Unchanged without rewrites, or when the reference
    as written is not in the brief or its function does not line up node for node."""
    written = (brief.production or {}).get("reference_source")
    if not brief.literal_rewrites or not written or brief.defining:
        return fn, []
    try:
        tree = ast.parse(written)
    except SyntaxError:
        return fn, []
    twin = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                 and n.name == fn.name), None)
    if twin is None:
        return fn, []
    ours, theirs = list(ast.walk(fn)), list(ast.walk(twin))
    if len(ours) != len(theirs) or any(type(a) is not type(b) for a, b in zip(ours, theirs, strict=True)):
        return fn, []
    changed = {id(a): b.value for a, b in zip(ours, theirs, strict=True) if isinstance(a, ast.Constant)
               and type(a.value) in (int, float) and a.value != b.value}
    if not changed:
        return fn, []
    sized: list[str] = []

    class _Restore(ast.NodeTransformer):
        def visit_Constant(self, node: ast.Constant) -> ast.AST:
            if id(node) not in changed:
                return node
            sized.append(repr(changed[id(node)]))
            call = ast.Call(ast.Name("_size", ast.Load()),
                            [ast.Constant(node.value), ast.Constant(changed[id(node)])], [])
            return ast.copy_location(call, node)

    fn = _Restore().visit(fn)
    ast.fix_missing_locations(fn)
    return fn, sorted(set(sized), key=sized.index)


def split_chain(fn: ast.FunctionDef, params: list[str], first: CutMatmul
                ) -> tuple[ast.FunctionDef, ast.FunctionDef, str] | None:
    """A second product in the epilogue (an MLP: ``h = act(x @ w1 + b1)``, then
    ``h @ w2 + b2`` and what follows), as two epilogues and the second weight: the
    statements before the statement holding the second product, returning its lhs
    ``h``; and that statement, the product cut to ``_acc``, with the rest. None where the
    epilogue holds no such product, where it is not of the same form as the first (both
    transposed or neither, the same precision), or where the second part reads anything
    of the first but the product (a residual of ``h``, a size taken from it)."""
    for at, stmt in enumerate(fn.body):
        if not any(isinstance(n, ast.BinOp | ast.Call) for n in ast.walk(stmt)):
            continue
        cut = CutMatmul()
        cut_stmt = cut.visit(_copy(stmt))
        if cut.operands is None:
            continue
        h, w2 = cut.operands
        before = fn.body[:at]
        assigned = {t.id for s in before for t in ast.walk(s)
                    if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        if (h not in assigned or w2 not in params or w2 in assigned
                or cut.transposed != first.transposed or cut.precision != first.precision
                or not isinstance(cut_stmt, ast.Assign | ast.Return)):
            return None
        second = [cut_stmt, *fn.body[at + 1:]]
        if _reads_before_writing(second) & (assigned | set(first.operands or ())):
            return None  # reads a value of the first part
        one = _epilogue_fn("_epilogue", [*before, ast.Return(ast.Name(h, ast.Load()))],
                           params, exclude=set(first.operands or ()))
        two = _epilogue_fn("_epilogue_2", second, params, exclude={w2})
        return one, two, w2
    return None


def _copy(node: ast.stmt) -> ast.stmt:
    return ast.parse(ast.unparse(node)).body[0]


def _reads_before_writing(body: list[ast.stmt]) -> set[str]:
    """Names ``body`` loads before it assigns them (its free names), statement by
    statement (the value of an assignment is read before its targets are written)."""
    written: set[str] = set()
    free: set[str] = set()
    for stmt in body:
        loads = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
                 and isinstance(n.ctx, ast.Load)}
        free |= loads - written
        written |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Store)}
    return free


def _epilogue_fn(name: str, body: list[ast.stmt], params: list[str], exclude: set[str]
                 ) -> ast.FunctionDef:
    """``def name(_acc, <the reference's arguments the body reads>): body``."""
    free = _reads_before_writing(body)
    args = [ast.arg("_acc")] + [ast.arg(p) for p in params if p in free and p not in exclude]
    fn = ast.FunctionDef(name=name, args=ast.arguments(posonlyargs=[], args=args, kwonlyargs=[],
                                                       kw_defaults=[], defaults=[]),
                         body=body, decorator_list=[], returns=None, type_params=[])
    return ast.fix_missing_locations(fn)


# Calls in an epilogue that may combine a row's columns: reductions, normalizations, a
# reshape (a group norm's), a softmax. Read from the reference's text, so a name, not a
# proof: the kernel's own trace (_mixing) decides which axes a block must hold whole.
_MIXING_CALLS = {"sum", "mean", "var", "std", "max", "min", "amax", "amin", "prod",
                 "logsumexp", "softmax", "log_softmax", "reshape", "norm", "argmax",
                 "argmin", "cumsum", "standardize", "layer_norm", "group_norm", "sort",
                 "top_k"}


def may_mix_columns(fn: ast.FunctionDef) -> bool:
    """Whether the epilogue calls something that may combine the columns of a row: a
    reduction not along axis 0 alone (a batch norm's column statistics mix rows, not
    columns), a reshape, a softmax."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in _MIXING_CALLS:
            continue
        axis = next((k.value for k in node.keywords if k.arg == "axis"), None)
        if axis is not None and literal_axes(axis) == (0,):
            continue
        return True
    return False


def literal_axes(node: ast.expr) -> tuple[int, ...] | None:
    """An ``axis=`` argument written as a literal int or tuple of ints, else None."""
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return None
    if isinstance(value, int):
        return (value,)
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return value
    return None


# A row reduction an online pass over column blocks can carry: (name as called, kind)
_ROW_REDUCTIONS = {"sum": "sum", "mean": "mean", "max": "max", "amax": "max", "min": "min",
                   "amin": "min", "logsumexp": "logsumexp"}
_REDUCING_MODULES = ("jnp", "jax.numpy", "np", "jax.scipy.special", "jax.nn")


def split_row_reduction(fn: ast.FunctionDef
                        ) -> tuple[ast.FunctionDef, str, ast.FunctionDef] | None:
    """An epilogue that reduces each row once, ``jnp.sum(EXPR, axis=1, keepdims=True)``
    (or mean, max, min, logsumexp; axis 1 or -1) in one of its statements, taken apart:
    the statements before that one returning EXPR (``_epilogue_pre(_acc, ...)``, a
    tile's values), the reduction's kind, and that statement with the reduction read
    as ``_red`` plus the ones after it (``_epilogue_post(_red, ...)``, on the reduced
    column). Both take the epilogue's own arguments. None where no statement holds one
    such reduction, where the rest reads a value of what came before it (then only
    whole rows can hold it), or where the part before calls something that may mix the
    columns (``may_mix_columns``: 13p's log_softmax before its sum, which no ROW_REDUCTION
    switch could carry). The kernel checks the rest when it is traced: that the part
    before mixes no columns (a pooling of tile-aligned windows aside)."""
    params = [a.arg for a in fn.args.args[1:]]
    for at, stmt in enumerate(fn.body):
        found = [node for node in ast.walk(stmt) if _row_reduction(node)]
        if not found:
            continue
        if len(found) > 1:
            return None
        call = found[0]
        before = fn.body[:at]
        assigned = {n.id for s in before for n in ast.walk(s)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        post_body = [_Replace(call).visit(_copy(stmt)), *(_copy(s) for s in fn.body[at + 1:])]
        if _reads_before_writing(post_body) & assigned or not isinstance(post_body[-1],
                                                                         ast.Return):
            return None
        pre = _function("_epilogue_pre", "_acc", params,
                        [*(_copy(s) for s in before), ast.Return(call.args[0])])
        if may_mix_columns(pre):
            return None  # (a softmax before a cross entropy's sum: _online would refuse it)
        post = _function("_epilogue_post", "_red", params, post_body)
        return pre, _ROW_REDUCTIONS[call.func.attr], post
    return None


class _Replace(ast.NodeTransformer):
    """The one reduction call (matched by its text) read as ``_red``."""

    def __init__(self, call: ast.Call) -> None:
        self.text = ast.unparse(call)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if ast.unparse(node) == self.text:
            return ast.copy_location(ast.Name("_red", ast.Load()), node)
        return self.generic_visit(node)


def _row_reduction(node: ast.AST) -> bool:
    """Whether ``node`` is ``<module>.<reduction>(EXPR, axis=1|-1[, keepdims=...])``
    (without ``keepdims`` the reduced column is read as the kernel's (rows, 1) one: the
    same values, and ``_online`` checks that the rest makes as many, 49k's row max)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr not in _ROW_REDUCTIONS \
            or ast.unparse(func.value) not in _REDUCING_MODULES or len(node.args) not in (1, 2):
        return False
    keywords = {k.arg: k.value for k in node.keywords}
    axis = node.args[1] if len(node.args) == 2 else keywords.pop("axis", None)
    keepdims = keywords.pop("keepdims", ast.Constant(False))
    return (axis is not None and literal_axes(axis) in ((1,), (-1,)) and not keywords
            and isinstance(keepdims, ast.Constant) and keepdims.value in (True, False))


def _function(name: str, first: str, params: list[str], body: list[ast.stmt]) -> ast.FunctionDef:
    args = [ast.arg(first)] + [ast.arg(p) for p in params]
    fn = ast.FunctionDef(name=name, args=ast.arguments(posonlyargs=[], args=args, kwonlyargs=[],
                                                       kw_defaults=[], defaults=[]),
                         body=body, decorator_list=[], returns=None, type_params=[])
    return ast.fix_missing_locations(fn)
