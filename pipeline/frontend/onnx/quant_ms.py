"""The com.microsoft quantized operators onnxruntime's quantizer emits (QOperator
format): QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QLinearSoftmax and QGemm.

Semantics (onnxruntime's ContribOperators): every operand is uint8 or int8 with a
scalar scale and zero point; the result is the float operator applied to the
dequantized operands, quantized with the output's scale and zero point. So each
converts to dequantize_linear -> the float operator's own conversion ->
quantize_linear, one fused kernel after FuseOps. QGemm is an integer product
(matmul_integer): Y = alpha * (A - a_zp)(B - b_zp) + C, C int32 with scale
alpha * a_scale * b_scale; quantized with y_scale / y_zero_point, or float32
when they are absent.

The frontend looks these converters up as "com.microsoft.<op>" (domain opset 1).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.quant import const_of, emit_dequantize, emit_quantize
from pipeline.frontend.onnx.quant_conv import requant_inputs, zero_point
from pipeline.frontend.onnx.registry import Limit, onnx_converter, onnx_op
from pipeline.ir.graph import Node
from pipeline.ops.geometry import QTYPES
from pipeline.ops.registry import infer_types

MS = "com.microsoft."


_CHANNELS_LAST = Limit("channels_last", lambda v: int(v.attrs.get("channels_last", 0)) != 0)


def _dequantized(ctx, n, x: str, scale_pos: int, nodes: list) -> str:
    """Append the dequantize_linear of `x` (scale and zero point at scale_pos and
    scale_pos + 1 of `n`) to `nodes`; returns the float tensor, typed in ctx."""
    if ctx.type(x).dtype not in QTYPES:
        raise ModelError(f"node {n.name!r} ({n.op_type}): operand {x!r} is "
                         f"{ctx.type(x).dtype}, not uint8 or int8")
    node = emit_dequantize(ctx, n, x, const_of(ctx, n, scale_pos, "a scale"),
                           const_of(ctx, n, scale_pos + 1, "a zero point"), f"{x}.{n.name}.f")
    _typed(ctx, node)
    nodes.append(node)
    return node.outputs[0]


def _typed(ctx, node) -> None:
    ctx.types.update(zip(node.outputs, infer_types(node, [ctx.type(i) for i in node.inputs]),
                         strict=True))


def _float_op(ctx, n, op_type: str, inputs, nodes: list, opset: int = 13) -> str:
    """The nodes of ONNX operator `op_type` (the default domain's converter at
    `opset`, with `n`'s attributes) on float `inputs`; returns its output."""
    out = f"{n.name}.float"
    converter = onnx_converter(op_type, opset)
    inner = dataclasses.replace(n, op_type=op_type, inputs=tuple(inputs), outputs=(out,),
                                opset=opset)
    for node in converter.fn(ctx, inner):
        _typed(ctx, node)
        nodes.append(node)
    return out


def _quantized(ctx, n, value: str, scale_pos: int, like: str, nodes: list) -> list:
    """nodes + the quantize_linear of float `value` into `n`'s output, with the scale
    and zero point at scale_pos, scale_pos + 1 (the type of `like` if absent)."""
    zp = const_of(ctx, n, scale_pos + 1, "the output zero point")
    dtype = str(zp.dtype) if zp is not None else ctx.type(like).dtype
    return nodes + [emit_quantize(ctx, n, value, const_of(ctx, n, scale_pos, "the output scale"),
                                  zp, dtype, n.outputs[0], len(ctx.type(value).shape))]


def _binary(op_type: str):
    def convert(ctx, n):
        nodes: list = []
        a = _dequantized(ctx, n, n.inputs[0], 1, nodes)
        b = _dequantized(ctx, n, n.inputs[3], 4, nodes)
        return _quantized(ctx, n, _float_op(ctx, n, op_type, (a, b), nodes), 6, n.inputs[0],
                          nodes)
    return convert


def _unary(op_type: str):
    def convert(ctx, n):
        if int(n.attrs.get("channels_last", 0)):
            raise ModelError(f"node {n.name!r} ({n.op_type}): channels_last is not supported")
        nodes: list = []
        x = _dequantized(ctx, n, n.inputs[0], 1, nodes)
        return _quantized(ctx, n, _float_op(ctx, n, op_type, (x,), nodes), 3, n.inputs[0],
                          nodes)
    return convert


_Q = ("dequantize_linear", "quantize_linear")


onnx_op(MS + "QLinearAdd", 1, emits=(*_Q, "add"),
        build_time_inputs=(1, 2, 4, 5, 6, 7))(_binary("Add"))

onnx_op(MS + "QLinearMul", 1, emits=(*_Q, "mul"),
        build_time_inputs=(1, 2, 4, 5, 6, 7))(_binary("Mul"))

onnx_op(MS + "QLinearSigmoid", 1, emits=(*_Q, "sigmoid"),
        build_time_inputs=(1, 2, 3, 4))(_unary("Sigmoid"))

onnx_op(MS + "QLinearLeakyRelu", 1, emits=(*_Q, "leaky_relu"),
        build_time_inputs=(1, 2, 3, 4))(_unary("LeakyRelu"))

onnx_op(MS + "QLinearGlobalAveragePool", 1, emits=(*_Q, "global_avg_pool"),
        build_time_inputs=(1, 2, 3, 4), limits=(_CHANNELS_LAST,))(
    _unary("GlobalAveragePool"))

onnx_op(MS + "QLinearAveragePool", 1, emits=(*_Q, "avg_pool1d", "avg_pool2d", "avg_pool3d"),
        build_time_inputs=(1, 2, 3, 4), limits=(_CHANNELS_LAST,))(_unary("AveragePool"))


@onnx_op(MS + "QLinearConcat", 1, emits=(*_Q, "concat"))
def _qlinear_concat(ctx, n):
    """Inputs: Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per operand."""
    nodes: list = []
    operands = [_dequantized(ctx, n, n.inputs[k], k + 1, nodes)
                for k in range(2, len(n.inputs), 3)]
    return _quantized(ctx, n, _float_op(ctx, n, "Concat", operands, nodes), 0, n.inputs[2],
                      nodes)


@onnx_op(MS + "QLinearSoftmax", 1, emits=(*_Q, "softmax"), build_time_inputs=(1, 2, 3, 4))
def _qlinear_softmax(ctx, n):
    """Inputs X, X_scale, X_zero_point, Y_scale, Y_zero_point; attributes axis and opset,
    the original Softmax's opset: before 13 it flattens from axis (default 1), from 13
    on it normalises along axis (default -1).

    onnxruntime divides by the whole number floor(1 / Y_scale), not by Y_scale (the
    same for the 1/256 its quantizer writes), so the output is quantized with the
    scale 1 / floor(1 / Y_scale). (Its int8 kernel also wraps a probability that
    rounds to 1.0 to -128, where this saturates to 127.)"""
    if "opset" not in n.attrs:
        raise ModelError(f"node {n.name!r} (QLinearSoftmax): the attribute opset (the "
                         "original Softmax's) is missing")
    y_scale = const_of(ctx, n, 3, "the output scale")
    if y_scale is None or y_scale.size != 1 or not 0 < float(y_scale.reshape(())) <= 1:
        raise ModelError(f"node {n.name!r} (QLinearSoftmax): Y_scale must be one value "
                         "in (0, 1]")
    levels = np.floor(np.float32(1) / np.float32(y_scale.reshape(())))
    nodes: list = []
    x = _dequantized(ctx, n, n.inputs[0], 1, nodes)
    p = _float_op(ctx, n, "Softmax", (x,), nodes, opset=int(n.attrs["opset"]))
    zp = const_of(ctx, n, 4, "the output zero point")
    dtype = str(zp.dtype) if zp is not None else ctx.type(n.inputs[0]).dtype
    return nodes + [emit_quantize(ctx, n, p, np.float32(1 / levels), zp, dtype, n.outputs[0],
                                  len(ctx.type(p).shape))]


@onnx_op(MS + "QGemm", 1, emits=("matmul_integer",), build_time_inputs=(1, 3, 4, 6, 7, 8))
def _qgemm(ctx, n):
    """A [M, K] x B ([K, N], or [N, K] with transB; a constant then), int32 C."""
    a, b = n.inputs[0], n.inputs[3]
    if int(n.attrs.get("transA", 0)):
        raise ModelError(f"node {n.name!r} (QGemm): transA is not supported")
    if int(n.attrs.get("transB", 0)):
        value = const_of(ctx, n, 3, "B (with transB)")
        b = ctx.add_param(f"{b}.transposed", np.ascontiguousarray(value.T))
    cols = ctx.type(b).shape[-1]
    a_zp = zero_point(ctx, n, 2, a, ())
    b_zp = zero_point(ctx, n, 5, b, (cols,))
    alpha = np.float32(n.attrs.get("alpha", 1.0))
    y_scale = const_of(ctx, n, 7, "y_scale")
    y_zp = const_of(ctx, n, 8, "y_zero_point")
    out = "float32" if y_scale is None else (str(y_zp.dtype) if y_zp is not None
                                             else ctx.type(a).dtype)
    bias = const_of(ctx, n, 6, "C")
    if bias is not None and bias.size not in (1, cols):
        raise ModelError(f"node {n.name!r} (QGemm): C of shape {list(bias.shape)} is not "
                         "supported (a scalar or one value per column)")
    if bias is not None:
        bias = np.broadcast_to(bias.reshape(-1), (cols,))
    req = requant_inputs(ctx, n, np.float32(const_of(ctx, n, 1, "a_scale")) * alpha,
                         const_of(ctx, n, 4, "b_scale"), y_scale, y_zp, bias, cols, out)
    return [Node.make("matmul_integer", n.name, (a, b, a_zp, b_zp, *req), n.outputs[:1],
                      out=out)]
