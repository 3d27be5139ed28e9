"""What of a reference's code after its convolution the conv kernel can take in: the
statements that follow it on the same variable and are elementwise with per-channel (or
scalar) operands (with the temporaries they use, a mish's ``softplus_x``), the layout
changes between them, and then either a closing mean over the two spatial axes (a global
average pool) or a norm: statistics over the image (an instance norm) or over the batch
and the image (a training-mode batch norm), each channel's mean and variance, and the
elementwise steps that use them. The template takes them only when nothing on the whole
output is left after them. After a 3-D convolution only the elementwise steps (and the
layout changes between them) are read. Pure ``ast``: the reference is read, never run.

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

# A norm's statistics, as the second kernel's epilogue names them (per channel, float32),
# and the first pass's value there (the output before the norm)
MEAN, VAR, PRE = "_mean", "_var", "_y"
# A closing reduction over the channels after a norm's steps (``keepdims``), by last name
CLOSING = frozenset({"logsumexp", "sum", "mean", "max", "min"})


@dataclass
class Steps:
    """Elementwise steps on ``v`` and what they read besides it."""

    steps: list[ast.expr] = field(default_factory=list)  # each step's new value of ``v``
    params: list[ast.expr] = field(default_factory=list)  # operands computed outside
    # each param's channel axis (None: it must be a scalar)
    channel_axes: list[int | None] = field(default_factory=list)
    transposes: list[tuple[int, ...]] = field(default_factory=list)  # in order
    # a norm's steps: the local each assigns (the first pass's steps all assign ``_v``)
    targets: list[str] = field(default_factory=list)


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
    # instance norm; "NHW": the batch's, a batch norm; "G": each image's over groups of
    # channels, a group norm, ``groups`` of them) and the steps that use them (with
    # MEAN and VAR standing for the statistics, PRE for the output before the norm),
    # the last one's value ``result`` (what the reference returns), and a closing
    # reduction over the channels (``closing``, one of CLOSING) taken from it.
    norm: str | None = None
    post: Steps = field(default_factory=Steps)
    groups: ast.expr | None = None
    result: str = ""
    final: str = ""  # the kernel's local holding ``result`` (before ``closing``)
    closing: str | None = None
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


def _transpose(value: ast.expr, name: str, rank: int = 4) -> tuple[int, ...] | None:
    """``jnp.transpose(name, perm)`` of a ``name`` of ``rank`` axes: its permutation."""
    if isinstance(value, ast.Call) and _last_name(value.func) == "transpose" \
            and len(value.args) == 2 and isinstance(value.args[0], ast.Name) \
            and value.args[0].id == name:
        perm = literal_value(value.args[1])
        if isinstance(perm, tuple | list) and sorted(perm) == list(range(rank)):
            return tuple(perm)
    return None


def _over(call: ast.Call, axes: list[str]) -> str | None:
    """The axes (letters of ``axes``, in NHWC order; a group norm's view splits C into
    G and c) a keepdims reduction takes, else None."""
    found = {k.arg: literal_value(k.value) for k in call.keywords}
    if set(found) - {"axis", "keepdims", "ddof"} or not found.get("keepdims") \
            or found.get("ddof", 0) != 0:
        return None
    over = found.get("axis", literal_value(call.args[1]) if len(call.args) > 1 else None)
    over = (over,) if isinstance(over, int) else over
    rank = len(axes)
    if not (isinstance(over, tuple | list) and all(isinstance(a, int) and -rank <= a < rank
                                                   for a in over)):
        return None
    letters = {axes[a % rank] for a in over}
    return "".join(a for a in "NGcHWC" if a in letters)


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
    if conv is None or sorted(out_layout) not in (sorted("NHWC"), sorted("NDHWC")):
        return None  # (a layout other than a 2-D or 3-D image's: nothing is read)
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
        perm = _transpose(value, name, len(axes))
        fn = _last_name(value.func) if isinstance(value, ast.Call) else ""
        if perm is not None and not temps:
            axes = [axes[p] for p in perm]
            tail.transposes.append(perm)
        elif fn == "mean" and not temps and "D" not in axes and isinstance(
                value, ast.Call) and value.args and isinstance(value.args[0], ast.Name) \
                and value.args[0].id == name:
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
    if tail.mean is None and "D" not in axes:  # (a 3-D image's: the elementwise steps only)
        _read_norm(body, tail, axes)
    return tail




def _bound(stmt: ast.stmt) -> set[str]:
    """The names ``stmt`` binds (its assignments' targets, unpacked)."""
    return {n.id for node in ast.walk(stmt) if isinstance(node, ast.Assign | ast.AugAssign)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            for n in ast.walk(t) if isinstance(n, ast.Name)}


def _shape_unpack(stmt: ast.stmt, env: dict[str, ast.expr]) -> tuple[str, list[str]] | None:
    """``N, C, H, W = v.shape`` of a value of ``env``: (``v``, the names), else None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
            and isinstance(stmt.targets[0], ast.Tuple) \
            and all(isinstance(e, ast.Name) for e in stmt.targets[0].elts) \
            and isinstance(stmt.value, ast.Attribute) and stmt.value.attr == "shape" \
            and isinstance(stmt.value.value, ast.Name) and stmt.value.value.id in env:
        return stmt.value.value.id, [e.id for e in stmt.targets[0].elts]  # type: ignore[attr-defined]
    return None


def _reshape(value: ast.expr, env: dict[str, ast.expr]) -> tuple[str, list[ast.expr]] | None:
    """``v.reshape(a, b, ...)``, ``v.reshape((a, ...))`` or ``jnp.reshape(v, (a, ...))`` of
    a value of ``env``: (``v``, the new shape's expressions), else None."""
    if not (isinstance(value, ast.Call) and _last_name(value.func) == "reshape"
            and not value.keywords):
        return None
    args = list(value.args)
    if isinstance(value.func, ast.Attribute) and isinstance(value.func.value, ast.Name) \
            and value.func.value.id in env:
        source = value.func.value.id
    elif len(args) == 2 and isinstance(args[0], ast.Name) and args[0].id in env:
        source, args = args[0].id, args[1:]
    else:
        return None
    if len(args) == 1 and isinstance(args[0], ast.Tuple | ast.List):
        args = list(args[0].elts)
    return source, args


def _is_dim(node: ast.expr, dims: dict[str, str], letter: str) -> bool:
    return isinstance(node, ast.Name) and dims.get(node.id) == letter


def _grouping(args: list[ast.expr], axes: list[str], dims: dict[str, str]) -> ast.expr | None:
    """The group count ``G`` where ``args`` view a 4-D value of ``axes`` with its channels
    split into groups (``N, G, C // G, H, W``, or ``-1`` for ``C // G``; the other
    axes named by ``dims``), else None."""
    if len(args) != 5:
        return None
    at = axes.index("C")
    groups, within = args[at], args[at + 1]
    rest = args[:at] + args[at + 2:]
    if not all(_is_dim(a, dims, letter) for a, letter in zip(
            rest, [x for x in axes if x != "C"], strict=True)):
        return None
    if literal_value(within) == -1 or (
            isinstance(within, ast.BinOp) and isinstance(within.op, ast.FloorDiv)
            and _is_dim(within.left, dims, "C")
            and ast.dump(within.right) == ast.dump(groups)):
        return groups
    return None


def _ungrouping(args: list[ast.expr], axes: list[str], dims: dict[str, str]) -> bool:
    """Whether ``args`` view a grouped value back as 4-D (``N, C, H, W``)."""
    return len(args) == 4 and all(
        _is_dim(a, dims, letter) or (letter == "C" and literal_value(a) == -1)
        for a, letter in zip(args, axes, strict=True))


def _statistic(value: ast.expr, env: dict[str, ast.expr], view: dict[str, list[str]],
               stats: dict[str, ast.expr], over: dict[str, str]) -> tuple[str, str] | None:
    """(MEAN or VAR, the axes) when ``value`` is a mean of the output before the norm,
    its variance (``jnp.var``), or a mean of its squared deviation from a mean already
    read over the same axes (``(v - mean) ** 2``, ``jnp.square(v - mean)``); else None."""
    if not (isinstance(value, ast.Call) and value.args
            and _last_name(value.func) in ("mean", "var")):
        return None

    def before_norm(node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and node.id in env \
            and getattr(env[node.id], "id", "") == PRE

    arg = value.args[0]
    if before_norm(arg):
        axes_of = _over(value, view[arg.id])  # type: ignore[attr-defined]
        return None if axes_of is None else (
            (MEAN if _last_name(value.func) == "mean" else VAR), axes_of)
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
            and before_norm(inner.left) and isinstance(inner.right, ast.Name) \
            and getattr(stats.get(inner.right.id), "id", "") == MEAN:
        axes_of = _over(value, view[inner.left.id])  # type: ignore[attr-defined]
        if axes_of is not None and over[inner.right.id] == axes_of:
            return VAR, axes_of
    return None


def _closing(value: ast.expr, env: dict[str, ast.expr],
             view: dict[str, list[str]]) -> tuple[str, str] | None:
    """(the reduction, ``v``) when ``value`` reduces a 4-D value of ``env`` over its
    channels with ``keepdims`` (``logsumexp(v, axis=1, keepdims=True)`` in NCHW)."""
    if not (isinstance(value, ast.Call) and _last_name(value.func) in CLOSING
            and value.args and isinstance(value.args[0], ast.Name)
            and value.args[0].id in env and len(view[value.args[0].id]) == 4):
        return None
    source = value.args[0].id
    return (_last_name(value.func), source) if _over(value, view[source]) == "C" else None


def _read_norm(body: list[ast.stmt], tail: Tail, axes: list[str]) -> None:
    """A norm from ``tail.end`` on; set on ``tail`` when it takes in everything up to the
    function's ``return``. Each value on the whole output (``env``) is known by its
    expression in the second kernel's epilogue (PRE, or a local ``_lK``) and its view
    (``view``: the axes' letters, C split into G and c while grouped); names bound since
    the convolution and not known so (temporaries of the steps before, the shape's
    names) end the reading where a statement would need them."""
    env: dict[str, ast.expr] = {tail.name: ast.Name(PRE, ast.Load())}
    view: dict[str, list[str]] = {tail.name: list(axes)}
    stats: dict[str, ast.expr] = {}
    over: dict[str, str] = {}
    dims: dict[str, str] = {}  # names the shape's unpacking binds: each one's axis
    hoisted_by_tail = {_assigned(body[i]) for i in tail.hoisted}
    bound = set().union(*(_bound(s) for s in body[tail.conv:tail.end])) - hoisted_by_tail
    post = Steps()
    hoisted: list[int] = []
    groups: ast.expr | None = None
    closing: tuple[str, str, str] | None = None  # the reduction, its operand, its name
    last = len(body) - 1
    for index in range(tail.end, last):
        stmt = body[index]
        unpacked = _shape_unpack(stmt, env)
        if unpacked is not None and len(unpacked[1]) == len(view[unpacked[0]]) == 4:
            dims.update(zip(unpacked[1], view[unpacked[0]], strict=True))
            bound |= set(unpacked[1])
            continue
        target = _assigned(stmt)
        if target is None or target in stats:
            return
        value = stmt.value  # type: ignore[attr-defined]
        known = {**env, **stats}
        dead = bound - set(known) - set(dims)
        if _reads(value, dead):
            return
        reshaped = _reshape(value, env)
        if reshaped is not None:
            source, args = reshaped
            flat = view[source]
            if len(flat) == 4 and (found := _grouping(args, flat, dims)) is not None:
                if _reads(found, bound) or (groups is not None
                                            and ast.dump(groups) != ast.dump(found)):
                    return
                groups = found
                at = flat.index("C")
                view[target] = [*flat[:at], "G", "c", *flat[at + 1:]]
            elif len(flat) == 5 and _ungrouping(
                    args, back := [("C" if x == "G" else x) for x in flat if x != "c"], dims):
                view[target] = back
            else:
                return
            env[target] = env[source]
        elif (found_stat := _statistic(value, env, view, stats, over)) is not None:
            stats[target] = ast.Name(found_stat[0], ast.Load())
            over[target] = found_stat[1]
        elif isinstance(value, ast.Call) and _last_name(value.func) == "transpose":
            source = value.args[0].id if value.args and isinstance(
                value.args[0], ast.Name) else ""
            perm = _transpose(value, source) if source in env else None
            if perm is None or target != source or len(env) > 1 or len(view[source]) != 4:
                return  # (another value on the whole output would keep the old layout)
            view[target] = [view[source][p] for p in perm]
            post.transposes.append(perm)
        elif index == last - 1 and (found_closing := _closing(value, env, view)) is not None:
            closing = (*found_closing, target)
            env[target], view[target] = env[closing[1]], view[closing[1]]
        elif _reads(value, set(known)):
            read = [n for n in env if _reads(value, n)]
            shapes = {len(view[n]) for n in read}
            if len(shapes) > 1:
                return
            kept = view[read[0]] if read else list(axes)
            rewrite = _Rewrite(PRE, len(post.params), known, "_q")
            step = rewrite.visit(value)
            if not rewrite.ok or any(_reads(p, bound) for p in rewrite.params):
                return
            post.params += rewrite.params
            post.channel_axes += [kept.index("C") if "C" in kept else None] * len(
                rewrite.params)
            local = f"_l{len(post.steps)}"
            post.steps.append(step)  # type: ignore[arg-type]
            post.targets.append(local)
            env[target], view[target] = ast.Name(local, ast.Load()), kept
        elif not _reads(value, bound) and _movable(body, tail.conv, index, target):
            hoisted.append(index)
            continue
        else:
            return
        bound.add(target)
    ret = body[last]
    returned = ret.value if isinstance(ret, ast.Return) else None
    if isinstance(returned, ast.Call) and _last_name(returned.func) == "transpose" \
            and returned.args:
        returned = returned.args[0]
    kinds = set(over.values())
    if not (isinstance(returned, ast.Name) and returned.id in env and post.steps
            and len(kinds) == 1 and len(view[returned.id]) == 4):
        return
    kind = kinds.pop()
    if kind not in ("HW", "NHW", "cHW") or (kind == "cHW") != (groups is not None):
        return
    if closing is not None and closing[2] != returned.id:
        return  # (the reduction's operand returned, or another value)
    tail.norm = "G" if kind == "cHW" else kind
    tail.groups = groups
    tail.closing = closing[0] if closing is not None else None
    tail.result = returned.id
    tail.final = ast.unparse(env[returned.id])
    tail.post, tail.end = post, last
    tail.hoisted += hoisted
    tail.layout = "".join(view[returned.id])
