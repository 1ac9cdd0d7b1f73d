"""ONNX converters to the quant_conv operators (defined in pipeline/ops/quant_conv.py)."""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.quant import const_of
from pipeline.frontend.onnx.registry import Limit, onnx_op
from pipeline.frontend.onnx.windows import spatial_attrs
from pipeline.ir.graph import Node


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
