"""What of a reference's code after its convolution the conv kernel can take in: the
statements that follow it on the same variable and are elementwise with per-channel (or
scalar) operands, the layout changes between them, and a closing mean over the two
spatial axes (a global average pool). The template takes them only when nothing on the
whole output is left after them. Pure ``ast``: the reference is read, never run.

The operands are checked again when the kernel is traced (``_per_channel`` in the kernel
text): one that turns out not to be per channel makes the kernel run the statements as
written, after an unfused convolution.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from tilewright.agents.offline.reference_reading import literal_value

# Elementwise functions an epilogue may call (by their last name: jax.nn.relu, jnp.tanh).
ELEMENTWISE = frozenset({
    "relu", "relu6", "gelu", "silu", "swish", "sigmoid", "tanh", "softplus", "exp", "log",
    "log1p", "expm1", "maximum", "minimum", "clip", "abs", "sqrt", "rsqrt", "square",
    "leaky_relu", "elu", "celu", "selu", "hard_tanh", "hard_sigmoid", "hard_swish", "erf",
    "sin", "cos", "negative", "reciprocal"})


@dataclass
class Tail:
    """The part of the reference the kernel takes in after ``conv`` (statement index)."""

    conv: int  # index of ``v = _conv(...)`` in the function body
    name: str  # ``v``
    end: int  # index of the first statement left as written
    steps: list[ast.expr] = field(default_factory=list)  # each step's new value of ``v``
    params: list[ast.expr] = field(default_factory=list)  # operands computed outside
    channel_axes: list[int] = field(default_factory=list)  # each param's channel axis
    transposes: list[tuple[int, ...]] = field(default_factory=list)  # in order
    # A closing mean over H and W: (keepdims, the layout of ``v`` it is taken in)
    mean: tuple[bool, str] | None = None
    layout: str = ""  # the layout of ``v`` after the fused part (without a mean)

    def fused(self) -> bool:
        return bool(self.steps or self.mean)


def _last_name(fn: ast.expr) -> str:
    return fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")


def _reads(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


class _Rewrite(ast.NodeTransformer):
    """``v`` becomes ``_v``; each operand that does not read ``v`` becomes ``_pN`` (kept
    in ``params``); anything that reads ``v`` other than elementwise arithmetic and the
    functions above makes the step unfusable (``ok`` False)."""

    def __init__(self, name: str, first: int) -> None:
        self.name, self.first = name, first
        self.params: list[ast.expr] = []
        self.ok = True

    def _param(self, node: ast.expr) -> ast.expr:
        self.params.append(node)
        return ast.Name(f"_p{self.first + len(self.params) - 1}", ast.Load())

    def visit(self, node: ast.AST) -> ast.AST:  # type: ignore[override]
        if isinstance(node, ast.expr) and not isinstance(node, ast.Constant) \
                and not _reads(node, self.name):
            return self._param(node)
        if isinstance(node, ast.Name):
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


def read_tail(body: list[ast.stmt], out_layout: str) -> Tail | None:
    """The fusable tail after the first ``v = _conv(...)`` of ``body`` (None without
    one); ``out_layout`` is the convolution's output layout ("NHWC", "NCHW")."""
    conv = next((i for i, s in enumerate(body) if isinstance(s, ast.Assign)
                 and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
                 and isinstance(s.value, ast.Call)
                 and getattr(s.value.func, "id", "") == "_conv"), None)
    if conv is None or sorted(out_layout) != sorted("NHWC"):
        return None  # (a layout other than a 2-D image's: nothing is read)
    name = body[conv].targets[0].id  # type: ignore[attr-defined]
    tail = Tail(conv=conv, name=name, end=conv + 1)
    axes = list(out_layout)  # which of N, H, W, C each axis of ``v`` is now
    for index in range(conv + 1, len(body)):
        stmt = body[index]
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name) and stmt.targets[0].id == name):
            break
        value = stmt.value
        fn = _last_name(value.func) if isinstance(value, ast.Call) else ""
        if fn == "transpose" and isinstance(value, ast.Call) and len(value.args) == 2 \
                and isinstance(value.args[0], ast.Name) and value.args[0].id == name:
            perm = literal_value(value.args[1])
            if not (isinstance(perm, tuple | list) and sorted(perm) == [0, 1, 2, 3]):
                break
            axes = [axes[p] for p in perm]
            tail.transposes.append(tuple(perm))
        elif fn == "mean" and isinstance(value, ast.Call) and value.args \
                and isinstance(value.args[0], ast.Name) and value.args[0].id == name:
            found = {k.arg: literal_value(k.value) for k in value.keywords}
            over = found.get("axis", literal_value(value.args[1]) if len(value.args) > 1 else None)
            spatial = {axes.index("H"), axes.index("W")}
            if not (isinstance(over, tuple | list) and set(over) == spatial
                    and set(found) <= {"axis", "keepdims"}):
                break
            tail.mean = (bool(found.get("keepdims")), "".join(axes))
            tail.end = index + 1
            break
        else:
            rewrite = _Rewrite(name, len(tail.params))
            step = rewrite.visit(value)
            if not rewrite.ok or not _reads(value, name):
                break
            tail.steps.append(step)  # type: ignore[arg-type]
            tail.params += rewrite.params
            tail.channel_axes += [axes.index("C")] * len(rewrite.params)
        tail.end = index + 1
    tail.layout = "".join(axes)
    return tail
