"""What of a reference's code after its convolution the conv kernel can take in: the
statements that follow it on the same variable and are elementwise with per-channel (or
scalar) operands (with the temporaries they use, a mish's ``softplus_x``), the layout
changes between them, and then either a closing mean over the two spatial axes (a global
average pool) or a norm: statistics over the image (an instance norm) or over the batch
and the image (a training-mode batch norm), each channel's mean and variance, and the
elementwise steps that use them. The template takes them only when nothing on the whole
output is left after them. Pure ``ast``: the reference is read, never run.

The operands are checked again when the kernel is traced (``_per_channel`` in the kernel
text): one that turns out not to be per channel makes the kernel run the statements as
written, after an unfused convolution.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

from tilewright.agents.offline.reference_reading import literal_value

# Elementwise functions an epilogue may call (by their last name: jax.nn.relu, jnp.tanh).
ELEMENTWISE = frozenset({
    "relu", "relu6", "gelu", "silu", "swish", "sigmoid", "tanh", "softplus", "exp", "log",
    "log1p", "expm1", "maximum", "minimum", "clip", "abs", "sqrt", "rsqrt", "square",
    "leaky_relu", "elu", "celu", "selu", "hard_tanh", "hard_sigmoid", "hard_swish", "erf",
    "sin", "cos", "negative", "reciprocal", "multiply", "add", "subtract", "divide"})

# A norm's statistics, as the second kernel's epilogue names them (per channel, float32)
MEAN, VAR = "_mean", "_var"


@dataclass
class Steps:
    """Elementwise steps on ``v`` and what they read besides it."""

    steps: list[ast.expr] = field(default_factory=list)  # each step's new value of ``v``
    params: list[ast.expr] = field(default_factory=list)  # operands computed outside
    channel_axes: list[int] = field(default_factory=list)  # each param's channel axis
    transposes: list[tuple[int, ...]] = field(default_factory=list)  # in order


@dataclass
class Tail(Steps):
    """The part of the reference the kernel takes in after ``conv`` (statement index)."""

    conv: int = 0  # index of ``v = _conv(...)`` in the function body
    name: str = ""  # ``v``
    end: int = 0  # index of the first statement left as written
    # A closing mean over H and W: (keepdims, the layout of ``v`` it is taken in)
    mean: tuple[bool, str] | None = None
    layout: str = ""  # the layout of ``v`` after the fused part (without a mean)
    temps: list[str] = field(default_factory=list)  # names the fused statements define
    # A norm after the steps: the axes its statistics reduce ("HW": each image's, an
    # instance norm; "NHW": the batch's, a batch norm) and the steps that use them (with
    # MEAN and VAR standing for the statistics)
    norm: str | None = None
    post: Steps = field(default_factory=Steps)
    # The statements among these that read nothing of ``v`` (an epsilon, a norm's
    # weight reshaped): they run before the kernel.
    hoisted: list[int] = field(default_factory=list)

    def fused(self) -> bool:
        return bool(self.steps or self.mean or self.norm)


def _last_name(fn: ast.expr) -> str:
    return fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")


def _reads(node: ast.AST, names: str | set[str] | dict[str, object]) -> bool:
    names = {names} if isinstance(names, str) else names
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


class _Rewrite(ast.NodeTransformer):
    """``v`` becomes ``_v`` and each name of ``known`` its expression (a temporary's, in
    terms of ``_v``; a statistic's MEAN or VAR); each operand that reads neither becomes
    ``{prefix}N`` (kept in ``params``); anything that reads them other than elementwise
    arithmetic and the functions above makes the step unfusable (``ok`` False)."""

    def __init__(self, name: str, first: int, known: dict[str, ast.expr] | None = None,
                 prefix: str = "_p") -> None:
        self.name, self.first, self.prefix = name, first, prefix
        self.known = known or {}
        self.params: list[ast.expr] = []
        self.ok = True

    def _param(self, node: ast.expr) -> ast.expr:
        self.params.append(node)
        return ast.Name(f"{self.prefix}{self.first + len(self.params) - 1}", ast.Load())

    def visit(self, node: ast.AST) -> ast.AST:  # type: ignore[override]
        if isinstance(node, ast.expr) and not isinstance(node, ast.Constant) \
                and not _reads(node, {self.name, *self.known}):
            return self._param(node)
        if isinstance(node, ast.Name):
            if node.id in self.known:
                return copy.deepcopy(self.known[node.id])
            return ast.Name("_v", ast.Load())
        if isinstance(node, ast.Constant):
            return node
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult
                                                       | ast.Div | ast.Pow):
            return ast.BinOp(self.visit(node.left), node.op, self.visit(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            return ast.UnaryOp(node.op, self.visit(node.operand))
        if isinstance(node, ast.Call) and _last_name(node.func) in ELEMENTWISE and all(
                literal_value(k.value) is not None or isinstance(k.value, ast.Constant)
                for k in node.keywords) and not any(isinstance(a, ast.Starred)
                                                     for a in node.args):
            return ast.Call(node.func, [self.visit(a) for a in node.args], node.keywords)
        self.ok = False
        return node


def _assigned(stmt: ast.stmt) -> str | None:
    """The one name ``stmt`` assigns (``name = ...``), else None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
            and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def _transpose(value: ast.expr, name: str) -> tuple[int, ...] | None:
    """``jnp.transpose(name, perm)`` of a 4-D ``name``: its permutation."""
    if isinstance(value, ast.Call) and _last_name(value.func) == "transpose" \
            and len(value.args) == 2 and isinstance(value.args[0], ast.Name) \
            and value.args[0].id == name:
        perm = literal_value(value.args[1])
        if isinstance(perm, tuple | list) and sorted(perm) == [0, 1, 2, 3]:
            return tuple(perm)
    return None


def _over(call: ast.Call, axes: list[str]) -> str | None:
    """The axes (letters of ``axes``, in NHWC order) a keepdims reduction takes, else
    None."""
    found = {k.arg: literal_value(k.value) for k in call.keywords}
    if set(found) - {"axis", "keepdims", "ddof"} or not found.get("keepdims") \
            or found.get("ddof", 0) != 0:
        return None
    over = found.get("axis", literal_value(call.args[1]) if len(call.args) > 1 else None)
    over = (over,) if isinstance(over, int) else over
    if not (isinstance(over, tuple | list) and all(isinstance(a, int) and -4 <= a < 4
                                                   for a in over)):
        return None
    letters = {axes[a % 4] for a in over}
    return "".join(a for a in "NHWC" if a in letters)


def _statistic(value: ast.expr, name: str, axes: list[str],
               stats: dict[str, ast.expr], over: dict[str, str]) -> tuple[str, str] | None:
    """(MEAN or VAR, the axes) when ``value`` is a mean of ``v``, its variance
    (``jnp.var(v)``), or a mean of its squared deviation from a mean already read
    (``(v - mean) ** 2``, ``jnp.square(v - mean)``); else None."""
    if not (isinstance(value, ast.Call) and value.args
            and _last_name(value.func) in ("mean", "var")):
        return None
    axes_of = _over(value, axes)
    arg = value.args[0]
    if axes_of is None:
        return None
    if isinstance(arg, ast.Name) and arg.id == name:
        return (MEAN if _last_name(value.func) == "mean" else VAR), axes_of
    if _last_name(value.func) != "mean":
        return None
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Pow) \
            and literal_value(arg.right) == 2:
        inner = arg.left
    elif isinstance(arg, ast.Call) and _last_name(arg.func) == "square" and len(arg.args) == 1:
        inner = arg.args[0]
    else:
        return None
    if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Sub) \
            and isinstance(inner.left, ast.Name) and inner.left.id == name \
            and isinstance(inner.right, ast.Name) and inner.right.id in stats \
            and isinstance(stats[inner.right.id], ast.Name) \
            and stats[inner.right.id].id == MEAN and over[inner.right.id] == axes_of:  # type: ignore[attr-defined]
        return VAR, axes_of
    return None


def _movable(body: list[ast.stmt], conv: int, index: int, target: str) -> bool:
    """Whether ``body[index]`` (assigning ``target``) can run before the convolution's
    statement: nothing from that statement up to it reads ``target`` (the convolution's
    own weight may have the name a norm's weight takes later)."""
    return not any(_reads(stmt, target) for stmt in body[conv:index])


def _step(stmt_value: ast.expr, name: str, known: dict[str, ast.expr], steps: Steps,
          axes: list[str], prefix: str) -> ast.expr | None:
    """``stmt_value`` rewritten as a step on ``_v`` (its operands added to ``steps``), or
    None when it is not elementwise in ``v`` and ``known``."""
    rewrite = _Rewrite(name, len(steps.params), known, prefix)
    step = rewrite.visit(stmt_value)
    if not rewrite.ok or not _reads(stmt_value, {name, *known}):
        return None
    steps.params += rewrite.params
    steps.channel_axes += [axes.index("C")] * len(rewrite.params)
    return step  # type: ignore[return-value]


def read_tail(body: list[ast.stmt], out_layout: str) -> Tail | None:
    """The fusable tail after the first ``v = _conv(...)`` of ``body`` (None without
    one); ``out_layout`` is the convolution's output layout ("NHWC", "NCHW")."""
    conv = next((i for i, s in enumerate(body) if _assigned(s) and isinstance(
        s.value, ast.Call) and getattr(s.value.func, "id", "") == "_conv"), None)  # type: ignore[attr-defined]
    if conv is None or sorted(out_layout) != sorted("NHWC"):
        return None  # (a layout other than a 2-D image's: nothing is read)
    name = _assigned(body[conv]) or ""
    tail = Tail(conv=conv, name=name, end=conv + 1)
    axes = list(out_layout)  # which of N, H, W, C each axis of ``v`` is now
    temps: dict[str, ast.expr] = {}  # temporaries of the current ``v``: their steps
    committed = 0  # the operands of the steps taken (a temporary's wait for its use)
    hoisted: list[int] = []
    for index in range(conv + 1, len(body)):
        stmt = body[index]
        target = _assigned(stmt)
        if target is None:
            break
        value = stmt.value  # type: ignore[attr-defined]
        if target != name and not _reads(value, {name, *temps, *tail.temps}):
            if not _movable(body, conv, index, target):
                break
            hoisted.append(index)  # reads nothing of ``v`` (an epsilon): before the kernel
            continue
        if target != name:  # a temporary computed from ``v`` (a mish's softplus_x)
            if target in temps or _reads(value, set(tail.temps) - set(temps)):
                break
            found = _step(value, name, temps, tail, axes, "_p")
            if found is None:
                break
            temps[target] = found
            tail.temps.append(target)
            continue
        perm = _transpose(value, name)
        fn = _last_name(value.func) if isinstance(value, ast.Call) else ""
        if perm is not None and not temps:
            axes = [axes[p] for p in perm]
            tail.transposes.append(perm)
        elif fn == "mean" and not temps and isinstance(value, ast.Call) and value.args \
                and isinstance(value.args[0], ast.Name) and value.args[0].id == name:
            found_kw = {k.arg: literal_value(k.value) for k in value.keywords}
            over = found_kw.get("axis", literal_value(value.args[1]) if len(value.args) > 1
                                else None)
            spatial = {axes.index("H"), axes.index("W")}
            if not (isinstance(over, tuple | list) and set(over) == spatial
                    and set(found_kw) <= {"axis", "keepdims"}):
                break
            tail.mean = (bool(found_kw.get("keepdims")), "".join(axes))
            tail.end = index + 1
            break
        else:
            if _reads(value, set(tail.temps) - set(temps)):
                break  # a temporary of an earlier ``v``: defined only as written
            step = _step(value, name, temps, tail, axes, "_p")
            if step is None:
                break
            tail.steps.append(step)
            temps = {}  # they were of the ``v`` this step replaced
        tail.end = index + 1
        committed = len(tail.params)
    if temps:  # unused: the statements that define them are left as written
        tail.temps = [t for t in tail.temps if t not in temps]
        del tail.params[committed:], tail.channel_axes[committed:]
    tail.hoisted = [i for i in hoisted if i < tail.end]
    tail.layout = "".join(axes)
    if tail.mean is None:
        _read_norm(body, tail, axes)
    return tail


def _read_norm(body: list[ast.stmt], tail: Tail, axes: list[str]) -> None:
    """A norm from ``tail.end`` on: its statistics, the statements that read nothing of
    ``v`` (hoisted), and the steps that use them up to the first other statement; set on
    ``tail`` when they take in everything up to the function's last statement."""
    name = tail.name
    stats: dict[str, ast.expr] = {}
    over: dict[str, str] = {}
    post = Steps()
    hoisted: list[int] = []
    end = tail.end
    for index in range(tail.end, len(body) - 1):
        stmt = body[index]
        target = _assigned(stmt)
        if target is None:
            return
        value = stmt.value  # type: ignore[attr-defined]
        if target != name:
            if target in stats or target in tail.temps:
                return
            found = _statistic(value, name, axes, stats, over)
            if found is not None and not post.steps:
                stats[target] = ast.Name(found[0], ast.Load())
                over[target] = found[1]
            elif not _reads(value, {name, *stats, *tail.temps}) and _movable(
                    body, tail.conv, index, target):
                hoisted.append(index)
            else:
                return
        elif (perm := _transpose(value, name)) is not None:
            axes = [axes[p] for p in perm]
            post.transposes.append(perm)
        elif stats and not _reads(value, set(tail.temps)):
            step = _step(value, name, stats, post, axes, "_q")
            if step is None:
                return
            post.steps.append(step)
        else:
            return
        end = index + 1
    kinds = set(over.values())
    if not post.steps or len(kinds) != 1 or kinds.pop() not in ("HW", "NHW"):
        return
    tail.norm = next(iter(over.values()))
    tail.post, tail.end = post, end
    tail.hoisted += hoisted
    tail.layout = "".join(axes)
