"""Convolutions as KH x KW shifted MXU matmuls over one padded NHWC image in VMEM."""

from __future__ import annotations

import ast

from tilewright.agents.base import TaskBrief
from tilewright.agents.offline.reference_reading import (
    _IMPORTS,
    TemplateError,
    _preamble,
    defining_source,
    reference_parts,
)
from tilewright.agents.offline.templates.kernel_text import VMEM_HELPERS


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


_CONV_KERNEL = '''

BLOCK_ROWS = 32  # output rows per grid step (one product of rows x width rows each tap)
TUNABLES = {"BLOCK_ROWS": [1, 2, 4, 8, 16, 32, 64, 128]}
''' + VMEM_HELPERS + '''

def _conv_body(x_ref, w_ref, o_ref, *, kh, kw, rows, width, padded, group):
    r = pl.program_id(1)
    o = o_ref.shape[-1]
    c = x_ref.shape[-1]
    acc = jnp.zeros((rows, width, o), jnp.float32)
    for g, first in enumerate(range(0, kh, group)):
        # ``group`` row taps side by side in the contraction: channels fewer than the
        # MXU's depth (128) share one pass instead of leaving most of it empty. Each tap
        # is ``rows`` image rows at every (padded) column: an aligned slab.
        taps = range(first, min(first + group, kh))
        slabs = [x_ref[0, pl.ds(r * rows + i, rows), :, :] for i in taps]
        lhs = slabs[0] if len(slabs) == 1 else jnp.concatenate(slabs, axis=-1)
        lhs = lhs.reshape(rows * padded, len(slabs) * c)
        for j in range(kw):
            w = w_ref[g, j] if len(slabs) == group else w_ref[g, j, :len(slabs) * c, :]
            # The column taps shift the float32 products, not the inputs: a window of
            # packed bf16 rows at an odd column offset is a sublane shift the TPU
            # compiler's estimator cannot price.
            product = jnp.dot(lhs, w, preferred_element_type=jnp.float32)
            acc += product.reshape(rows, padded, o)[:, j:j + width, :]
    o_ref[0] = acc.astype(o_ref.dtype)


def _conv(lhs, rhs, window_strides=(1, 1), padding="VALID", lhs_dilation=None,
          rhs_dilation=None, dimension_numbers=None, feature_group_count=1, **unused):
    """lax.conv_general_dilated for 2-D, stride 1, undilated, ungrouped convolutions."""
    layout = tuple(dimension_numbers) if dimension_numbers is not None else (
        "NCHW", "OIHW", "NCHW")
    if len(layout) != 3 or any(not isinstance(s, str) for s in layout) or len(layout[0]) != 4:
        raise ValueError(f"the conv template handles 2-D convolutions named by strings "
                         f"(NHWC/HWIO or NCHW/OIHW), not {dimension_numbers!r}")
    if tuple(window_strides) != (1, 1) or any(d not in (None, (1, 1), [1, 1]) for d in (
            lhs_dilation, rhs_dilation)) or feature_group_count != 1:
        raise ValueError("the conv template handles stride 1, no dilation, one group")
    x = jnp.transpose(lhs, [layout[0].index(c) for c in "NHWC"])
    w = jnp.transpose(rhs, [layout[1].index(c) for c in "HWIO"])
    kh, kw = w.shape[0], w.shape[1]
    if isinstance(padding, str):
        if padding.upper() == "SAME":
            ph, pw = ((kh - 1) // 2, kh // 2), ((kw - 1) // 2, kw // 2)
        elif padding.upper() == "VALID":
            ph = pw = (0, 0)
        else:
            raise ValueError(f"padding {padding!r}")
    else:
        ph, pw = (tuple(p) for p in padding)
    n, h, wd, c = x.shape
    oh, ow = h + sum(ph) - kh + 1, wd + sum(pw) - kw + 1
    rows = min(BLOCK_ROWS, oh)
    width = -(-ow // 16) * 16  # whole sublane tiles: a window's rows flatten for free
    padded = -(-(width + kw - 1) // 16) * 16  # the image's columns: every tap's, whole tiles
    oh_pad = -(-oh // rows) * rows
    x = jnp.pad(x, ((0, 0), (ph[0], ph[1] + oh_pad - oh),
                    (pw[0], padded - wd - pw[0]), (0, 0)))
    o = w.shape[-1]
    out_dtype = jnp.result_type(lhs.dtype, rhs.dtype)
    # Row taps grouped into the contraction: (groups, kw, group * c, o), the last group
    # zero-padded (its kernel reads only its own taps' rows of it).
    group = min(kh, max(1, 128 // c))
    groups = -(-kh // group)
    w = jnp.pad(w, ((0, groups * group - kh), (0, 0), (0, 0), (0, 0)))
    w = w.reshape(groups, group, kw, c, o).transpose(0, 2, 1, 3, 4).reshape(
        groups, kw, group * c, o)
    # VMEM holds the channels padded to whole 128-lane vregs (C_in = 64 takes 128)
    lanes = -(-c // 128) * 128
    image = x.shape[1] * x.shape[2] * lanes * x.dtype.itemsize
    need = 2 * (image + w.size * w.dtype.itemsize
                + rows * width * o * jnp.dtype(out_dtype).itemsize) + 3 * rows * padded * o * 4
    out = pl.pallas_call(
        functools.partial(_conv_body, kh=kh, kw=kw, rows=rows, width=width, padded=padded,
                          group=group),
        out_shape=jax.ShapeDtypeStruct((n, oh_pad, width, o), out_dtype),
        grid=(n, oh_pad // rows),
        in_specs=[pl.BlockSpec((1, *x.shape[1:]), lambda b, r: (b, 0, 0, 0)),
                  pl.BlockSpec(w.shape, lambda b, r: (0, 0, 0, 0))],
        out_specs=pl.BlockSpec((1, rows, width, o), lambda b, r: (b, r, 0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=_vmem_limit(need)),
    )(x, w)
    out = out[:, :oh, :ow, :]
    return jnp.transpose(out, ["NHWC".index(ch) for ch in layout[2]])


# The reference, its convolution done by the kernel above.
'''


def conv(brief: TaskBrief) -> tuple[str, str]:
    """Convolution as matmuls: the reference's ``conv_general_dilated`` (2-D, stride 1,
    VALID or SAME, NHWC/HWIO or NCHW/OIHW) becomes a Pallas kernel that keeps one padded
    image in VMEM and, for each block of output rows, accumulates ``KH x KW`` MXU
    matmuls of shifted (rows x width, C_in) windows by the (C_in, C_out) weight slices in
    float32. The rest of the reference (layout changes, bias, activations, norms) stays
    as written around it."""
    head, fn, helpers = reference_parts(brief)
    fn = ast.parse(ast.get_source_segment(defining_source(brief)[0], fn)
                   or ast.unparse(fn)).body[0]
    cutter = _CutConv()
    fn = cutter.visit(fn)
    if not cutter.cut:
        raise TemplateError("the conv template needs the reference to call "
                            "`lax.conv_general_dilated` (or `lax.conv`)")
    ast.fix_missing_locations(fn)
    body = ast.unparse(fn).replace(f"def {fn.name}(", f"def {brief.entry}(", 1)
    src = _preamble(brief, "convolution as shifted MXU matmuls") + _IMPORTS + "\n"
    src += "\n\n\n".join(x for x in ("# From the task's reference.\n" + head if head else "",
                                     *helpers) if x)
    src += _CONV_KERNEL + body + "\n"
    why = ("Convolution: the reference's conv_general_dilated becomes a Pallas kernel. One "
           "padded image (NHWC) stays in VMEM while the grid walks blocks of BLOCK_ROWS "
           "output rows; each block accumulates KH x KW MXU matmuls of a shifted "
           "(rows x width, C_in) window by the (C_in, C_out) weight slice in float32 "
           "(convolution as matmul, without materialising im2col patches in HBM). The "
           "width is padded to whole sublane tiles so a window flattens without a "
           "relayout; the rest of the reference (its layout changes, bias and activations) "
           "runs as written around the kernel. The tuner sizes BLOCK_ROWS next.")
    return src, why
