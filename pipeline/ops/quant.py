"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and the
elementwise helpers of the integer kernels.

Graph ops (int8/uint8 tensors; scales float32; zero points of the quantized type):
  quantize_linear(x, scale, zp)    y = saturate(roundeven(x / scale) + zp), attr dtype
  dequantize_linear(x, scale, zp)  y = (x - zp) * scale in float32, attr dtype (of x)
  dynamic_qscale(min, max)         DynamicQuantizeLinear's scale
  dynamic_qzero(min, scale)        DynamicQuantizeLinear's uint8 zero point
All are elementwise with numpy broadcasting, so per-axis scales and zero points
are constants the converter reshapes to broadcast along the axis ([1, C, 1, 1]),
and a (de)quantization becomes the epilogue of the kernel before it. The
integer convolution and matrix product are in quant_conv.py.

Rounding is round-half-to-even (llvm.roundeven), the division x / scale is the
spec's (not a multiplication by 1/scale), and the result saturates to the type's
range before it is narrowed.
"""

from __future__ import annotations

import numpy as np

from pipeline.dsl.builder import F32, I32
from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import Limit, broadcast_shape, onnx_op, register

QTYPES = {"uint8": (0, 255), "int8": (-128, 127)}
# ONNX TensorProto codes of the quantized types (output_dtype attribute)
_ONNX_QTYPES = {2: "uint8", 3: "int8"}


def to_i32(kb, v, dtype: str):
    """An integer value of `dtype` (int8, uint8, int32) as i32. Kernels load int8 and
    uint8 already widened (sign- or zero-extended: dsl/builder.py), so this only
    extends a raw byte."""
    if v.type == I32:
        return v
    return kb.b.zext(v, I32) if dtype == "uint8" else kb.b.sext(v, I32)


def saturate_to(kb, r, dtype: str):
    """The float r (already rounded) clamped to `dtype`'s range, as the i32 the
    kernels compute int8/uint8 in (stores narrow it)."""
    lo, hi = QTYPES[dtype]
    r = kb.fmin(kb.fmax(r, kb.fconst(lo, r)), kb.fconst(hi, r))
    return kb.b.fptosi(r, I32)


def quantize_np(x: np.ndarray, scale, zp, dtype: str) -> np.ndarray:
    lo, hi = QTYPES[dtype]
    q = np.rint(np.asarray(x, np.float32) / np.asarray(scale, np.float32))
    return np.clip(q + np.asarray(zp, np.float32), lo, hi).astype(dtype)


def _q_infer(types, node):
    x, scale, zp = types
    if x.dtype != "float32" or scale.dtype != "float32" or zp.dtype != node.attr("dtype"):
        raise ModelError(f"node {node.name!r} ({node.op}): needs float32 x and scale and a "
                         f"{node.attr('dtype')} zero point, got {x.dtype}, {scale.dtype}, "
                         f"{zp.dtype}")
    shape = broadcast_shape(x.shape, scale.shape, zp.shape, where=f"node {node.name!r}")
    return [TensorType(shape, node.attr("dtype"))]


def _q_scalar(kb, a, node):
    x, scale, zp = a
    r = kb.intrinsic("roundeven", kb.fdiv(x, scale, fast=False))
    r = kb.fadd(r, kb.b.sitofp(to_i32(kb, zp, node.attr("dtype")), F32), fast=False)
    return saturate_to(kb, r, node.attr("dtype"))


register("quantize_linear", "elementwise", _q_infer, scalar=_q_scalar,
         numpy=lambda xs, node: [quantize_np(*xs, node.attr("dtype"))],
         sample=lambda rng, dtype: ([(rng.standard_normal((2, 3, 4)) * 3).astype(np.float32),
                                     np.array([[0.05], [0.02], [0.1]], np.float32),
                                     np.array([[3], [128], [0]], np.uint8)],
                                    {"dtype": "uint8"}))


def _dq_infer(types, node):
    x, scale, zp = types
    if x.dtype != node.attr("dtype") or zp.dtype != x.dtype or scale.dtype != "float32":
        raise ModelError(f"node {node.name!r} ({node.op}): needs x and zero point of "
                         f"{node.attr('dtype')} and a float32 scale, got {x.dtype}, "
                         f"{zp.dtype}, {scale.dtype}")
    shape = broadcast_shape(x.shape, scale.shape, zp.shape, where=f"node {node.name!r}")
    return [TensorType(shape, "float32")]


def _dq_scalar(kb, a, node):
    x, scale, zp = a
    dtype = node.attr("dtype")
    diff = kb.b.sub(to_i32(kb, x, dtype), to_i32(kb, zp, dtype))
    return kb.fmul(kb.b.sitofp(diff, F32), scale, fast=False)


def dequantize_np(x, scale, zp) -> np.ndarray:
    diff = np.asarray(x).astype(np.int32) - np.asarray(zp).astype(np.int32)
    return (diff.astype(np.float32) * np.asarray(scale, np.float32)).astype(np.float32)


register("dequantize_linear", "elementwise", _dq_infer, scalar=_dq_scalar,
         numpy=lambda xs, node: [dequantize_np(*xs)],
         sample=lambda rng, dtype: ([rng.integers(-128, 128, (2, 3, 4)).astype(np.int8),
                                     np.array([[0.05], [0.02], [0.1]], np.float32),
                                     np.array([[3], [-5], [0]], np.int8)], {"dtype": "int8"}))


# -- DynamicQuantizeLinear: uint8, scale from the range [min(x, 0), max(x, 0)] ----------

def _scalar_float(types, node):
    return [TensorType(broadcast_shape(*(t.shape for t in types)), "float32")]


def _dyn_scale(kb, a, node):
    lo = kb.fmin(a[0], kb.f32(0.0))
    hi = kb.fmax(a[1], kb.f32(0.0))
    same = kb.b.fcmp_ordered("==", hi, lo)
    return kb.b.select(same, kb.f32(1.0),
                       kb.fdiv(kb.fsub(hi, lo, fast=False), kb.f32(255.0), fast=False))


def _dyn_scale_np(xs, node):
    lo, hi = np.minimum(xs[0], 0).astype(np.float32), np.maximum(xs[1], 0).astype(np.float32)
    return [np.where(hi == lo, np.float32(1), (hi - lo) / np.float32(255)).astype(np.float32)]


def _dyn_zero(kb, a, node):
    lo = kb.fmin(a[0], kb.f32(0.0))
    zp = kb.fsub(kb.f32(0.0), kb.fdiv(lo, a[1], fast=False), fast=False)
    zp = kb.fmin(kb.fmax(zp, kb.f32(0.0)), kb.f32(255.0))
    return saturate_to(kb, kb.intrinsic("roundeven", zp), "uint8")


def _dyn_zero_np(xs, node):
    lo = np.minimum(xs[0], 0).astype(np.float32)
    zp = np.clip(np.float32(0) - lo / xs[1].astype(np.float32), 0, 255)
    return [np.rint(zp).astype(np.uint8)]


def _range_sample(rng, dtype):
    """(min, max) pairs around zero, one-sided and empty ranges included."""
    lo = np.array([-3.0, 0.5, -0.25, 0.0, -1.0], np.float32)
    return [lo, np.array([2.0, 4.0, -0.1, 0.0, 7.5], np.float32)], {}


register("dynamic_qscale", "elementwise", _scalar_float, scalar=_dyn_scale,
         numpy=_dyn_scale_np, sample=_range_sample)
register("dynamic_qzero", "elementwise",
         lambda types, node: [TensorType(_scalar_float(types, node)[0].shape, "uint8")],
         scalar=_dyn_zero, numpy=_dyn_zero_np,
         sample=lambda rng, dtype: ([np.array([-3.0, 0.5, -0.25, -1.0], np.float32),
                                     np.array([0.02, 0.1, 0.003, 0.004], np.float32)], {}))


# -- converters --------------------------------------------------------------------------

def const_of(ctx, n, pos: int, what: str) -> np.ndarray | None:
    """Input `pos` of ONNX node `n` as a build-time constant (None if absent)."""
    if pos >= len(n.inputs) or not n.inputs[pos]:
        return None
    value = ctx.const(n.inputs[pos])
    if value is None:
        raise ModelError(f"node {n.name!r} ({n.op_type}): {what} must be a constant")
    return value


def per_axis(value: np.ndarray, rank: int, axis: int, n, what: str) -> np.ndarray:
    """A scalar or 1-D per-axis `value` reshaped to broadcast against a rank-`rank`
    tensor along `axis` (ONNX's per-axis quantization)."""
    value = np.asarray(value)
    if value.size == 1:
        return value.reshape(())
    if value.ndim != 1:
        raise ModelError(f"node {n.name!r} ({n.op_type}): {what} of shape {list(value.shape)} "
                         "(blocked quantization) is not supported")
    shape = [1] * rank
    shape[axis] = value.size
    return value.reshape(shape)


def qtype_of(n, dtype: str) -> str:
    if dtype not in QTYPES:
        raise ModelError(f"node {n.name!r} ({n.op_type}): quantized type {dtype} is not "
                         f"supported ({', '.join(QTYPES)} are)")
    return dtype


def emit_quantize(ctx, n, x: str, scale, zp, dtype: str, out: str, rank: int,
                  axis: int = 1) -> Node:
    """quantize_linear of `x` with constant scale and zero point (arrays)."""
    s = ctx.add_param(f"{out}.scale", per_axis(np.asarray(scale, np.float32), rank, axis,
                                               n, "scale"))
    z = ctx.add_param(f"{out}.zero_point", per_axis(
        np.zeros((), dtype) if zp is None else np.asarray(zp).astype(dtype), rank, axis,
        n, "zero point"))
    return Node.make("quantize_linear", f"{n.name}.quantize", (x, s, z), (out,), dtype=dtype)


def emit_dequantize(ctx, n, x: str, scale, zp, out: str, axis: int = 1) -> Node:
    """dequantize_linear of tensor `x` with constant scale and zero point (arrays)."""
    t = ctx.type(x)
    s = ctx.add_param(f"{out}.scale", per_axis(np.asarray(scale, np.float32), len(t.shape),
                                               axis, n, "scale"))
    z = ctx.add_param(f"{out}.zero_point", per_axis(
        np.zeros((), t.dtype) if zp is None else np.asarray(zp).astype(t.dtype),
        len(t.shape), axis, n, "zero point"))
    return Node.make("dequantize_linear", f"{n.name}.dequantize.{out}", (x, s, z), (out,),
                     dtype=t.dtype)


def _axis(n, rank: int, per_axis: bool = True) -> int:
    """The axis attribute made non-negative (checked only for per-axis parameters)."""
    axis = int(n.attrs.get("axis", 1))
    if not per_axis:
        return 0
    if not -rank <= axis < rank:
        raise ModelError(f"node {n.name!r} ({n.op_type}): axis {axis} out of range")
    return axis % max(rank, 1)


_BLOCKED = Limit("blocked quantization (block_size)",
                 lambda v: int(v.attrs.get("block_size", 0) or 0) > 0)
_PRECISION = Limit("the precision attribute", lambda v: "precision" in v.attrs)


@onnx_op("QuantizeLinear", 10, emits=("quantize_linear",), build_time_inputs=(1, 2),
         limits=(_BLOCKED, _PRECISION))
def _quantize(ctx, n):
    x = ctx.type(n.inputs[0])
    scale = const_of(ctx, n, 1, "y_scale")
    zp = const_of(ctx, n, 2, "y_zero_point")
    code = int(n.attrs.get("output_dtype", 0) or 0)
    dtype = str(zp.dtype) if zp is not None else _ONNX_QTYPES.get(code, "uint8" if not code
                                                                  else f"code {code}")
    if int(n.attrs.get("block_size", 0) or 0):
        raise ModelError(f"node {n.name!r} (QuantizeLinear): blocked quantization is not "
                         "supported")
    rank = len(x.shape)
    return [emit_quantize(ctx, n, n.inputs[0], scale, zp, qtype_of(n, dtype), n.outputs[0],
                          rank, _axis(n, rank, np.size(scale) > 1))]


@onnx_op("DequantizeLinear", 10, emits=("dequantize_linear",), build_time_inputs=(1, 2),
         limits=(_BLOCKED, _PRECISION))
def _dequantize(ctx, n):
    t = ctx.type(n.inputs[0])
    if t.dtype not in (*QTYPES, "int32"):
        raise ModelError(f"node {n.name!r} (DequantizeLinear): input type {t.dtype} is not "
                         "supported (uint8, int8, int32 are)")
    if int(n.attrs.get("block_size", 0) or 0):
        raise ModelError(f"node {n.name!r} (DequantizeLinear): blocked quantization is not "
                         "supported")
    scale = const_of(ctx, n, 1, "x_scale")
    zp = const_of(ctx, n, 2, "x_zero_point")
    return [emit_dequantize(ctx, n, n.inputs[0], scale, zp, n.outputs[0],
                            _axis(n, len(t.shape), np.size(scale) > 1))]


@onnx_op("DynamicQuantizeLinear", 11,
         emits=("reduce_min", "reduce_max", "dynamic_qscale", "dynamic_qzero",
                "quantize_linear"))
def _dynamic_quantize(ctx, n):
    x = n.inputs[0]
    rank = len(ctx.type(x).shape)
    y, scale, zp = (list(n.outputs) + ["", "", ""])[:3]
    lo, hi = f"{n.name}.min", f"{n.name}.max"
    scale = scale or f"{n.name}.scale"
    zp = zp or f"{n.name}.zero_point"
    axes = tuple(range(rank))
    return [Node.make("reduce_min", f"{n.name}.reduce_min", (x,), (lo,), axes=axes,
                      keepdims=0),
            Node.make("reduce_max", f"{n.name}.reduce_max", (x,), (hi,), axes=axes,
                      keepdims=0),
            Node.make("dynamic_qscale", f"{n.name}.scale", (lo, hi), (scale,)),
            Node.make("dynamic_qzero", f"{n.name}.zero_point", (lo, scale), (zp,)),
            Node.make("quantize_linear", f"{n.name}.quantize", (x, scale, zp), (y,),
                      dtype="uint8")]
