"""Integer convolution and matrix product: ConvInteger, MatMulInteger, QLinearConv,
QLinearMatMul (the portable kernels; the AVX-512 VNNI one is qconv_blocked.py).

Graph ops, int8/uint8 operands with int32 accumulation:
  conv2d_integer(x, w, x_zp, w_zp[, bias, multiplier, y_zp])
  matmul_integer(a, b, a_zp, b_zp[, bias, multiplier, y_zp])
Zero points are tensors (DynamicQuantizeLinear computes them at run time): x_zp and
a_zp of one element, w_zp of one or OC elements, b_zp of one or N. With the three
requantization inputs (attr `out` a quantized type) the int32 sum acc becomes
saturate(roundeven((acc + bias) * multiplier) + y_zp), multiplier =
x_scale * w_scale / y_scale per output channel (or column), computed at build
time; with `out` float32, (acc + bias) * multiplier (QGemm without y_scale);
without them the output is the int32 sum.
"""

from __future__ import annotations

import numpy as np

from pipeline.dsl.builder import F32, I32
from pipeline.dsl.vector import parallel_for
from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.nn import spatial_attrs, window_out
from pipeline.ops.quant import QTYPES, const_of, saturate_to, to_i32
from pipeline.ops.registry import Limit, onnx_op, register


def _check_int(node, types):
    for t in types[:2]:
        if t.dtype not in QTYPES:
            raise ModelError(f"node {node.name!r} ({node.op}): operand type {t.dtype} is not "
                             "supported (uint8, int8 are)")


def _conv_infer(types, node):
    _check_int(node, types)
    x, w = types[0], types[1]
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    (sh, sw), (dh, dw), pads = node.attr("strides"), node.attr("dilations"), node.attr("pads")
    if c != icg * node.attr("groups") or oc % node.attr("groups"):
        raise ModelError(f"node {node.name!r} ({node.op}): {c} input channels do not match "
                         f"weights {list(w.shape)} with groups={node.attr('groups')}")
    oh = window_out(h, kh, sh, pads[0], pads[2], dh)
    ow = window_out(wd, kw, sw, pads[1], pads[3], dw)
    return [TensorType((n, oc, oh, ow), node.attr("out"))]


def _element(kb, buf, index):
    """buf[index] for a per-channel tensor, buf[0] for a one-element one."""
    return kb.load(buf, 0 if buf.type.size == 1 else index)


def requantize(kb, node, acc, ins, channel):
    """The output value of int32 sum `acc` for output channel/column `channel`."""
    if len(ins) <= 4:
        return acc
    bias, mult, yzp = ins[4], ins[5], ins[6] if len(ins) > 6 else None
    acc = kb.b.add(acc, _element(kb, bias, channel))
    r = kb.fmul(kb.b.sitofp(acc, F32), _element(kb, mult, channel), fast=False)
    out = node.attr("out")
    if out == "float32":
        return r
    r = kb.fadd(kb.intrinsic("roundeven", r),
                kb.b.sitofp(to_i32(kb, kb.load(yzp, 0), out), F32), fast=False)
    return saturate_to(kb, r, out)


def _conv_lower(kb, node, ins, out, epilogue):
    x, w, xzp, wzp = ins[:4]
    n_n, c, h, wd = x.type.shape
    oc_n, icg, kh_n, kw_n = w.type.shape
    _, _, oh_n, ow_n = out.type.shape
    (sh, sw), (dh, dw) = node.attr("strides"), node.attr("dilations")
    pt, pl = node.attr("pads")[:2]
    ocg = oc_n // node.attr("groups")
    xt, wt = x.type.dtype, w.type.dtype
    work = out.type.size * icg * kh_n * kw_n
    with parallel_for(kb, n_n * oc_n, "planes", work=work) as item:
        n, oc = item // oc_n, item % oc_n
        x_zero = to_i32(kb, kb.load(xzp, 0), xt)
        w_zero = to_i32(kb, _element(kb, wzp, oc), wt)
        g = oc // ocg
        with kb.loop(0, oh_n, "oh") as oh, kb.loop(0, ow_n, "ow") as ow:
            acc = kb.local(kb.const(0, I32))
            with kb.loop(0, icg, "ic") as ic, kb.loop(0, kh_n, "kh") as kh, \
                    kb.loop(0, kw_n, "kw") as kw:
                ih = oh * sh - pt + kh * dh
                iw = ow * sw - pl + kw * dw
                ok = kb.and_(kb.below(ih, h), kb.below(iw, wd))
                at = ((n * c + g * icg + ic) * h + ih) * wd + iw
                xv = to_i32(kb, kb.load(x, kb.select(ok, at, 0)), xt)
                wv = to_i32(kb, kb.load(w, ((oc * icg + ic) * kh_n + kh) * kw_n + kw), wt)
                prod = kb.b.mul(kb.b.sub(xv, x_zero), kb.b.sub(wv, w_zero))
                kb.set(acc, kb.b.add(kb.get(acc), kb.select(ok, prod, kb.const(0, I32))))
            kb.store(out, ((n * oc_n + oc) * oh_n + oh) * ow_n + ow,
                     requantize(kb, node, kb.get(acc), ins, oc))


register("conv2d_integer", "opaque", _conv_infer, lower=_conv_lower)


def _matmul_infer(types, node):
    _check_int(node, types)
    a, b = types[0], types[1]
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2] or (
            len(b.shape) > 2 and b.shape[:-2] != a.shape[:-2]):
        raise ModelError(f"node {node.name!r} ({node.op}): shapes {list(a.shape)} and "
                         f"{list(b.shape)} are not supported (b 2-D or with a's batch dims)")
    return [TensorType(a.shape[:-1] + b.shape[-1:], node.attr("out"))]


def _matmul_lower(kb, node, ins, out, epilogue):
    """Row by row: acc[n] += (a[m, k] - a_zp) * (b[k, n] - b_zp[n]), the n loop
    innermost and contiguous (it vectorises)."""
    a, b, azp, bzp = ins[:4]
    *_, m_n, k_n = a.type.shape
    n_n = b.type.shape[-1]
    rows = a.type.size // k_n
    batched = len(b.type.shape) > 2
    at, bt = a.type.dtype, b.type.dtype
    with parallel_for(kb, rows, "rows", work=rows * n_n * k_n) as row:
        acc = kb.scratch(n_n, "int32")
        b_base = (row // m_n) * (k_n * n_n) if batched else 0
        a_zero = to_i32(kb, kb.load(azp, 0), at)
        with kb.loop(0, n_n, "z") as j:
            kb.store(acc, j, kb.const(0, I32))
        with kb.loop(0, k_n, "k") as k:
            av = kb.b.sub(to_i32(kb, kb.load(a, row * k_n + k), at), a_zero)
            with kb.loop(0, n_n, "n") as j:
                bv = kb.b.sub(to_i32(kb, kb.load(b, b_base + k * n_n + j), bt),
                              to_i32(kb, _element(kb, bzp, j), bt))
                kb.store(acc, j, kb.b.add(kb.load(acc, j), kb.b.mul(av, bv)))
        with kb.loop(0, n_n, "o") as j:
            kb.store(out, row * n_n + j, requantize(kb, node, kb.load(acc, j), ins, j))


register("matmul_integer", "opaque", _matmul_infer, lower=_matmul_lower)


# -- converters --------------------------------------------------------------------------

def zero_point(ctx, n, pos: int, like: str, size_ok: tuple[int, ...]) -> str:
    """Input `pos` (a zero point, run time or constant) or a zero of `like`'s dtype;
    ModelError unless it has one element or a size in `size_ok`."""
    dtype = ctx.type(like).dtype
    if pos >= len(n.inputs) or not n.inputs[pos]:
        return ctx.add_param(f"{n.name}.zero_point{pos}", np.zeros((), dtype))
    t = ctx.type(n.inputs[pos])
    if t.dtype != dtype:
        raise ModelError(f"node {n.name!r} ({n.op_type}): zero point {n.inputs[pos]!r} is "
                         f"{t.dtype}, its operand {dtype}")
    if t.size != 1 and (len(t.shape) != 1 or t.size not in size_ok):
        raise ModelError(f"node {n.name!r} ({n.op_type}): zero point {n.inputs[pos]!r} of "
                         f"shape {list(t.shape)} is not supported (per-tensor, or per "
                         "output channel/column)")
    return n.inputs[pos]


def requant_inputs(ctx, n, scale_a, scale_b, scale_y, zp_y, bias, channels: int,
                   out: str) -> list[str]:
    """[bias, multiplier, y_zp] params: multiplier = float32(sa * sb / sy), per channel
    when sb is; bias int32 of `channels` (zeros if None)."""
    sa, sb = np.asarray(scale_a, np.float32), np.asarray(scale_b, np.float32).reshape(-1)
    mult = (sa.reshape(()) * sb) if scale_y is None else \
        (sa.reshape(()) * sb) / np.asarray(scale_y, np.float32).reshape(())
    mult = mult.astype(np.float32)
    if mult.size not in (1, channels):
        raise ModelError(f"node {n.name!r} ({n.op_type}): {mult.size} scales for "
                         f"{channels} output channels")
    bias = np.zeros(channels, np.int32) if bias is None else np.asarray(bias, np.int32)
    names = [ctx.add_param(f"{n.name}.bias", bias.reshape(-1)),
             ctx.add_param(f"{n.name}.multiplier", mult.reshape(-1))]
    if out != "float32":
        names.append(ctx.add_param(f"{n.name}.y_zero_point",
                                   np.asarray(0 if zp_y is None else zp_y).astype(out)
                                   .reshape(())))
    return names


def conv_attrs(ctx, n, x: str, w: str) -> dict:
    x_shape, w_shape = ctx.type(x).shape, ctx.type(w).shape
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ModelError(f"node {n.name!r} ({n.op_type}): only 2-D convolutions (NCHW) are "
                         "supported")
    kernel = tuple(int(k) for k in n.attrs.get("kernel_shape", w_shape[2:]))
    if kernel != tuple(w_shape[2:]):
        raise ModelError(f"node {n.name!r} ({n.op_type}): kernel_shape {list(kernel)} "
                         f"differs from weight shape {list(w_shape)}")
    return {"groups": int(n.attrs.get("group", 1)), **spatial_attrs(n, x_shape, kernel)}


_NOT_2D = Limit("convolutions other than 2-D", lambda v: v.inputs[0] is not None
                and len(v.inputs[0][1]) != 4)


@onnx_op("ConvInteger", 10, emits=("conv2d_integer",), limits=(_NOT_2D,))
def _conv_integer(ctx, n):
    x, w = n.inputs[:2]
    oc = ctx.type(w).shape[0]
    zps = [zero_point(ctx, n, 2, x, ()), zero_point(ctx, n, 3, w, (oc,))]
    return [Node.make("conv2d_integer", n.name, (x, w, *zps), n.outputs[:1], out="int32",
                      **conv_attrs(ctx, n, x, w))]


@onnx_op("MatMulInteger", 10, emits=("matmul_integer",))
def _matmul_integer(ctx, n):
    a, b = n.inputs[:2]
    cols = ctx.type(b).shape[-1]
    zps = [zero_point(ctx, n, 2, a, ()), zero_point(ctx, n, 3, b, (cols,))]
    return [Node.make("matmul_integer", n.name, (a, b, *zps), n.outputs[:1], out="int32")]


@onnx_op("QLinearConv", 10, emits=("conv2d_integer",), build_time_inputs=(1, 4, 6, 7),
         limits=(_NOT_2D,))
def _qlinear_conv(ctx, n):
    x, w = n.inputs[0], n.inputs[3]
    oc = ctx.type(w).shape[0]
    zps = [zero_point(ctx, n, 2, x, ()), zero_point(ctx, n, 5, w, (oc,))]
    yzp = const_of(ctx, n, 7, "y_zero_point")
    out = str(yzp.dtype) if yzp is not None else ctx.type(x).dtype
    bias = const_of(ctx, n, 8, "B")
    req = requant_inputs(ctx, n, const_of(ctx, n, 1, "x_scale"),
                         const_of(ctx, n, 4, "w_scale"), const_of(ctx, n, 6, "y_scale"),
                         yzp, bias, oc, out)
    return [Node.make("conv2d_integer", n.name, (x, w, *zps, *req), n.outputs[:1], out=out,
                      **conv_attrs(ctx, n, x, w))]


@onnx_op("QLinearMatMul", 10, emits=("matmul_integer",), build_time_inputs=(1, 4, 6, 7))
def _qlinear_matmul(ctx, n):
    a, b = n.inputs[0], n.inputs[3]
    cols = ctx.type(b).shape[-1]
    zps = [zero_point(ctx, n, 2, a, ()), zero_point(ctx, n, 5, b, (cols,))]
    yzp = const_of(ctx, n, 7, "y_zero_point")
    out = str(yzp.dtype) if yzp is not None else ctx.type(a).dtype
    req = requant_inputs(ctx, n, const_of(ctx, n, 1, "a_scale"),
                         const_of(ctx, n, 4, "b_scale"), const_of(ctx, n, 6, "y_scale"),
                         yzp, None, cols, out)
    return [Node.make("matmul_integer", n.name, (a, b, *zps, *req), n.outputs[:1], out=out)]
