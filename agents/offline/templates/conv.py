"""Convolutions as MXU matmuls over one NHWC image in VMEM (padded only where the
convolution pads or its width is not whole sublane tiles), with the per-channel steps
after them (and a mean over the image, or a norm in a second kernel) in the kernel; a
3-D convolution reads each output plane's input planes as blocks of the same image."""

from __future__ import annotations

import ast

from tilewright.agents.base import TaskBrief
from tilewright.agents.offline.reference_reading import (
    _IMPORTS,
    TemplateError,
    _preamble,
    defining_source,
    operand_dtypes,
    reference_parts,
)
from tilewright.agents.offline.templates.conv_epilogue import Tail, read_tail
from tilewright.agents.offline.templates.conv_kernel import (
    _CONV_END,
    _CONV_KERNEL,
    _NORM_F32,
    _PACK_TAPS,
    _TUNABLES,
)
from tilewright.agents.offline.templates.conv_lanes import _LANES, _LANES_KERNEL


class _CutConv(ast.NodeTransformer):
    """Replaces every ``lax.conv_general_dilated(...)`` / ``lax.conv(...)`` call of the
    reference with ``_conv(...)`` (the same arguments): the kernel's own convolution."""

    def __init__(self) -> None:
        self.cut = 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if name in ("conv_general_dilated", "conv"):
            self.cut += 1
            return ast.copy_location(ast.Call(ast.Name("_conv", ast.Load()), node.args,
                                              node.keywords), node)
        return node


def _out_layout(call: ast.Call) -> str:
    """The convolution's output layout as its call names it (default NCHW)."""
    numbers = next((k.value for k in call.keywords if k.arg == "dimension_numbers"),
                   call.args[6] if len(call.args) > 6 else None)
    try:
        found = ast.literal_eval(numbers) if numbers is not None else None
    except ValueError:
        found = None
    if isinstance(found, tuple | list) and len(found) == 3 and isinstance(found[2], str):
        return found[2]
    return "NCHW"


def _returns(value: ast.expr | None, name: str) -> bool:
    """``return name``, or ``return jnp.transpose(name, perm)``: nothing but a layout
    change is left on the whole output."""
    if isinstance(value, ast.Call) and getattr(value.func, "attr", "") == "transpose" \
            and len(value.args) == 2 and not value.keywords:
        value = value.args[0]
    return isinstance(value, ast.Name) and value.id == name


def _epilogue_text(fn_name: str, args: list[str], steps: list[ast.expr], what: str) -> str:
    lines = "\n".join(f"    _v = {ast.unparse(step)}" for step in steps)
    return (f"def {fn_name}({', '.join(args)}):\n    \"\"\"On a float32 block: the "
            f"reference's steps\n    {what}.\"\"\"\n{lines}\n    return _v")


def _norm_epilogue_text(tail: Tail) -> str:
    """The second kernel's epilogue: the norm's steps, each on its own local, on the first
    pass's float32 block (``_y``, the output before the norm), and a closing reduction
    over the channels where the reference ends on one."""
    over = {"HW": "its image", "NHW": "the batch", "G": "its group of channels in its "
            "image"}[tail.norm or "HW"]
    lines = [f"    {t} = {ast.unparse(step)}" for t, step in zip(
        tail.post.targets, tail.post.steps, strict=True)]
    final = tail.final
    if tail.closing == "logsumexp":
        lines += [f"    _top = jnp.max({final}, axis=_axis, keepdims=True)",
                  f"    return _top + jnp.log(jnp.sum(jnp.exp({final} - _top), axis=_axis, "
                  "keepdims=True))"]
    elif tail.closing is not None:
        lines.append(f"    return jnp.{tail.closing}({final}, axis=_axis, keepdims=True)")
    else:
        lines.append(f"    return {final}")
    # (_axis: the channels' axis, the last in the channels-on-lanes kernel, the first in
    # the channels-first one)
    args = ["_y", "_mean", "_var", *(f"_q{i}" for i in range(len(tail.post.params))),
            "_axis=-1"]
    closing = (f", then its {tail.closing} over the channels" if tail.closing else "")
    return (f"def _epilogue_2({', '.join(args)}):\n    \"\"\"On the first pass's float32 "
            f"block: the reference's steps\n    that use each channel's mean and variance "
            f"over {over}{closing}.\"\"\"\n" + "\n".join(lines))


def _fuse_tail(fn: ast.FunctionDef) -> str | None:
    """Take the reference's elementwise steps after its convolution (and a closing mean
    over the image, or a norm and its steps) into the kernel: the convolution's
    statement and those steps become one ``_conv`` call with an ``_epilogue`` (and a
    norm's ``_epilogue_2``; returned as text), inside a ``try`` whose ``except
    _Unfusable`` runs them as written (an operand found not per channel when traced).
    None when nothing follows that the kernel can take."""
    body = fn.body
    conv = next((s for s in body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call)
                 and getattr(s.value.func, "id", "") == "_conv"), None)
    if conv is None or len(conv.targets) != 1 or not isinstance(conv.targets[0], ast.Name):
        return None
    tail = read_tail(body, _out_layout(conv.value))  # type: ignore[arg-type]
    if tail is None or not tail.fused():
        return None
    rest = body[tail.end:]
    name = tail.result or tail.name  # (a norm's steps may end on another name)
    if tail.mean is None and not (len(rest) == 1 and isinstance(rest[0], ast.Return)
                                  and _returns(rest[0].value, name)):
        # Work on the whole output is left after the steps (a norm the kernel does not
        # take, a residual): the kernel would be flagged for it anyway, and the steps in
        # float32 round differently from the reference's bf16: all of it stays as written.
        return None
    if tail.mean is not None and any(isinstance(n, ast.Name) and n.id in tail.temps
                                     for s in rest for n in ast.walk(s)):
        return None  # a temporary the fused steps define is read after them
    call = conv.value
    assert isinstance(call, ast.Call)
    keywords = [*call.keywords,
                ast.keyword("params", ast.Tuple(list(tail.params), ast.Load())),
                ast.keyword("channel_axes", ast.Constant(tuple(tail.channel_axes)))]
    if tail.steps:
        keywords.append(ast.keyword("epilogue", ast.Name("_epilogue", ast.Load())))
    if tail.mean is not None:
        keywords.append(ast.keyword("mean", ast.Constant(tail.mean)))
    if tail.norm is not None:
        keywords += [
            ast.keyword("norm", ast.Constant(tail.norm)),
            ast.keyword("norm_epilogue", ast.Name("_epilogue_2", ast.Load())),
            ast.keyword("norm_params", ast.Tuple(list(tail.post.params), ast.Load())),
            ast.keyword("norm_channel_axes", ast.Constant(tuple(tail.post.channel_axes)))]
        if tail.groups is not None:
            keywords.append(ast.keyword("norm_groups", tail.groups))
        if tail.closing is not None:
            keywords.append(ast.keyword("norm_closing", ast.Constant(True)))
    fused: list[ast.stmt] = [body[i] for i in tail.hoisted]  # they read nothing of v
    fused.append(ast.Assign([ast.Name(name, ast.Store())],
                            ast.Call(call.func, call.args, keywords)))
    if tail.mean is None:
        fused += [ast.Assign([ast.Name(name, ast.Store())], ast.Call(
            ast.Attribute(ast.Name("jnp", ast.Load()), "transpose", ast.Load()),
            [ast.Name(name, ast.Load()), ast.Constant(perm)], []))
            for perm in (*tail.transposes, *tail.post.transposes)]
    guarded = ast.Try(body=fused, handlers=[ast.ExceptHandler(
        ast.Name("_Unfusable", ast.Load()), None, body[tail.conv:tail.end])], orelse=[],
        finalbody=[])
    fn.body = [*body[:tail.conv], guarded, *body[tail.end:]]
    texts = []
    if tail.steps:
        texts.append(_epilogue_text(
            "_epilogue", ["_v", *(f"_p{i}" for i in range(len(tail.params)))], tail.steps,
            "after its convolution"))
    if tail.norm is not None:
        texts.append(_norm_epilogue_text(tail))
    return "\n\n\n".join(texts) or None


def _float32_operands(brief: TaskBrief) -> bool:
    """Whether the task's operands are known to be float32."""
    dtypes = operand_dtypes(brief)
    return bool(dtypes) and dtypes <= {"float32", "f32"}


def _few_channels(inputs: list) -> bool:
    """Whether the convolution has fewer than 32 input channels (read from the first two
    4-D inputs, the image and the weights, as the smallest size they share): the
    channels-first kernel first. Measured on a v5e in bf16, channels-first against
    channels on the lanes: 8 channels in, 1.27 against 4.93 ms (46k) and 2.36 against
    10.86 (39k); 64 in, 8.34 against 4.98 (18k) and 9.38 against 7.91 (22k)."""
    four = [tuple(shape) for shape, _dtype in inputs if len(shape) == 4][:2]
    shared = set(four[0]) & set(four[1]) if len(four) == 2 else set()
    return bool(shared) and min(shared) < 32


def conv(brief: TaskBrief) -> tuple[str, str]:
    """Convolution as matmuls: the reference's ``conv_general_dilated`` (2-D, stride 1,
    VALID or SAME, NHWC/HWIO or NCHW/OIHW; or 3-D, NDHWC/DHWIO or NCDHW/OIDHW, each
    output plane's input planes side by side) becomes a Pallas kernel that keeps one image
    in VMEM and, for each block of output rows, accumulates MXU matmuls of aligned
    (rows x width, row taps x C_in) slabs by the weight slices in float32 (column taps
    rotate the products). The per-channel elementwise steps after it and a closing mean
    over the image run on each block in the kernel, a norm's statistics (over each image
    or over the batch) and the steps that use them in a second kernel; what else follows
    stays as written."""
    head, fn, helpers = reference_parts(brief)
    fn = ast.parse(ast.get_source_segment(defining_source(brief)[0], fn)
                   or ast.unparse(fn)).body[0]
    cutter = _CutConv()
    fn = cutter.visit(fn)
    if not cutter.cut:
        raise TemplateError("the conv template needs the reference to call "
                            "`lax.conv_general_dilated` (or `lax.conv`)")
    epilogue = _fuse_tail(fn)
    ast.fix_missing_locations(fn)
    body = ast.unparse(fn).replace(f"def {fn.name}(", f"def {brief.entry}(", 1)
    src = _preamble(brief, "convolution as shifted MXU matmuls") + _IMPORTS + "\n"
    src += "\n\n\n".join(x for x in ("# From the task's reference.\n" + head if head else "",
                                     *helpers) if x)
    inputs = (brief.production or {}).get("inputs") or next(
        (x["inputs"] for x in brief.shapes if x.get("inputs")), [])
    # (by the inputs a worker built, else by the layouts the reference names: only the
    # switch's first value depends on it)
    three_d = any(len(shape) == 5 for shape, _dtype in inputs) or "DHW" in body
    # packed first for a 3-D convolution (its contraction is kd times deeper: the passes
    # saved outweigh the slicing), a product per tap first for a 2-D one
    tunables = _TUNABLES.replace("]}", f'], "PACK_TAPS": [{three_d}, {not three_d}]}}')
    switches: tuple[str, ...] = ("PACK_TAPS",)
    lanes = not three_d and _few_channels(inputs)
    if not three_d:  # (a 3-D convolution has no channels-first kernel)
        tunables = tunables.replace("]}", f'], "LANES": [{lanes}, {not lanes}]}}')
        switches = ("LANES", *switches)
    extra = ""
    if "norm_epilogue=" in body and not _float32_operands(brief):  # (f32: one program)
        tunables = tunables.replace("]}", '], "NORM_F32": [True, False]}')
        switches, extra = ("NORM_F32", *switches), _NORM_F32
    elif "norm_epilogue=" in body:
        extra = _NORM_F32
    kernel = _CONV_KERNEL.replace(_TUNABLES, _PACK_TAPS.format(default=three_d) + "\n"
                                  + _LANES.format(default=lanes) + "\n"
                                  + tunables + extra
                                  + f"\nTUNABLE_SWITCHES = {switches!r}")
    kernel += _LANES_KERNEL + _CONV_END
    src += kernel + (epilogue + "\n\n\n" if epilogue else "") + body + "\n"
    why = ("Convolution: the reference's conv_general_dilated becomes a Pallas kernel. One "
           "image (NHWC, padded only where the convolution pads) stays in VMEM while the "
           "grid walks blocks of BLOCK_ROWS output rows; each block accumulates MXU "
           "matmuls of aligned (rows x width, C_in) slabs by the weight slices in float32 "
           "(convolution as matmul, without materialising im2col patches in HBM), with "
           "the row taps side by side in the "
           "contraction (channels under 128 share an MXU pass) and column taps rotating the "
           "float32 products. "
           + ("A 3-D convolution: each output plane's input planes come in as blocks of "
              "the same image, their row taps side by side in the contraction too. "
              if three_d else "")
           + ("The reference's per-channel steps after the convolution"
              + (" and its mean over the image" if "mean=(" in body else "")
              + " run on each block before it is stored"
              + ("; its norm's statistics are gathered as the blocks are stored, and a "
                 "second kernel applies the steps that use them (NORM_F32: the blocks "
                 "between the two in float32 or in the output's dtype); "
                 if "norm_epilogue=" in body else "; ")
              if "_conv(" in body and "except _Unfusable" in body else "")
           + "the rest of the reference runs as written around the kernel. "
           + ("LANES (first here: fewer than 32 channels come in; a switch the tuner "
              "measures) runs it channels-first instead: one image a step, its pixels "
              "flattened onto the lanes, the taps as lane rotations stacked into one "
              "product, and a norm over the image in the same kernel. "
              if lanes else "LANES, a switch the tuner measures, would run it "
              "channels-first (pixels on the lanes), which pays with few input channels. "
              if not three_d else "")
           + "The tuner sizes BLOCK_ROWS next.")
    return src, why
