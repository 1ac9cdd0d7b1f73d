"""ONNX converters to the quant operators (defined in pipeline/ops/quant.py)."""

from __future__ import annotations

import numpy as np

from pipeline.dsl.minifloat import FLOAT8, QFLOATS
from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import Limit, onnx_op
from pipeline.ir.graph import Node
from pipeline.ops.geometry import LINEAR_QTYPES

# ONNX TensorProto codes of the quantized types (output_dtype attribute)
_ONNX_QTYPES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 17: "float8_e4m3fn",
                18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4",
                22: "int4", 23: "float4_e2m1fn", 25: "uint2", 26: "int2"}


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
    if value.ndim == rank and rank > 1:  # blocked, already repeated to the full shape
        return value
    if value.ndim != 1:
        raise ModelError(f"node {n.name!r} ({n.op_type}): {what} of shape {list(value.shape)} "
                         "(blocked quantization) is not supported")
    shape = [1] * rank
    shape[axis] = value.size
    return value.reshape(shape)


def qtype_of(n, dtype: str) -> str:
    if dtype not in LINEAR_QTYPES and dtype not in QFLOATS:
        raise ModelError(f"node {n.name!r} ({n.op_type}): quantized type {dtype} is not "
                         f"supported ({', '.join([*LINEAR_QTYPES, *QFLOATS])} are)")
    return dtype


def blocked(value, shape: tuple, axis: int, block: int, n, what: str) -> np.ndarray:
    """A blocked scale or zero point (opset 21: `value` has the rank of the tensor of
    `shape`, and ceil(shape[axis] / block) entries along `axis`) repeated to `shape`,
    so that it broadcasts elementwise."""
    value = np.asarray(value)
    want = list(shape)
    want[axis] = -(-shape[axis] // block)
    if list(value.shape) != want:
        raise ModelError(f"node {n.name!r} ({n.op_type}): blocked {what} of shape "
                         f"{list(value.shape)}, expected {want} (block_size {block})")
    return np.repeat(value, block, axis=axis)[tuple(
        slice(0, d) if k == axis else slice(None) for k, d in enumerate(shape))]


def emit_quantize(ctx, n, x: str, scale, zp, dtype: str, out: str, rank: int,
                  axis: int = 1, **attrs) -> Node:
    """quantize_linear of `x` with constant scale and zero point (arrays, already
    shaped to broadcast when not scalars or 1-D per-axis ones)."""
    s = ctx.add_param(f"{out}.scale", per_axis(np.asarray(scale, np.float32), rank, axis,
                                               n, "scale"))
    z = ctx.add_param(f"{out}.zero_point", per_axis(
        np.zeros((), dtype) if zp is None else np.asarray(zp).astype(dtype), rank, axis,
        n, "zero point"))
    return Node.make("quantize_linear", f"{n.name}.quantize", (x, s, z), (out,), dtype=dtype,
                     **attrs)


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


_PRECISION = Limit("the precision attribute", lambda v: "precision" in v.attrs)


def _scale_and_zero(ctx, n, shape: tuple) -> tuple:
    """(scale, zero point or None, axis) of a QuantizeLinear / DequantizeLinear; blocked
    ones (block_size, opset 21) repeated to `shape`."""
    scale = const_of(ctx, n, 1, "scale")
    zp = const_of(ctx, n, 2, "zero point")
    axis = _axis(n, len(shape), np.size(scale) > 1)
    block = int(n.attrs.get("block_size", 0) or 0)
    if block and np.ndim(scale) == len(shape) and len(shape) > 1:
        scale = blocked(scale, shape, axis, block, n, "scale")
        zp = None if zp is None else blocked(zp, shape, axis, block, n, "zero point")
    return scale, zp, axis


@onnx_op("QuantizeLinear", 10, emits=("quantize_linear",), build_time_inputs=(1, 2),
         limits=(_PRECISION,))
def _quantize(ctx, n):
    x = ctx.type(n.inputs[0])
    scale, zp, axis = _scale_and_zero(ctx, n, x.shape)
    code = int(n.attrs.get("output_dtype", 0) or 0)
    dtype = str(zp.dtype) if zp is not None else _ONNX_QTYPES.get(code, "uint8" if not code
                                                                  else f"code {code}")
    if dtype in FLOAT8 and zp is not None and np.any(zp.astype(np.float32) != 0):
        raise ModelError(f"node {n.name!r} (QuantizeLinear): a float8 zero point must be 0")
    # saturate (opset 19) matters to float8 only; kept on the node only when 0
    extra = {"saturate": 0} if dtype in QFLOATS and not n.attrs.get("saturate", 1) else {}
    return [emit_quantize(ctx, n, n.inputs[0], scale, zp, qtype_of(n, dtype), n.outputs[0],
                          len(x.shape), axis, **extra)]


@onnx_op("DequantizeLinear", 10, emits=("dequantize_linear", "cast"), build_time_inputs=(1, 2),
         limits=(_PRECISION,))
def _dequantize(ctx, n):
    t = ctx.type(n.inputs[0])
    if t.dtype not in (*LINEAR_QTYPES, "int32", *QFLOATS):
        raise ModelError(f"node {n.name!r} (DequantizeLinear): input type {t.dtype} is not "
                         f"supported ({', '.join([*LINEAR_QTYPES, *QFLOATS])}, int32 are)")
    scale, zp, axis = _scale_and_zero(ctx, n, t.shape)
    if scale.dtype == np.float32:
        return [emit_dequantize(ctx, n, n.inputs[0], scale, zp, n.outputs[0], axis)]
    # a float16 (bfloat16) scale gives a result of that type: computed in float32
    wide = f"{n.outputs[0]}.float32"
    return [emit_dequantize(ctx, n, n.inputs[0], scale, zp, wide, axis),
            Node.make("cast", f"{n.name}.cast", (wide,), n.outputs[:1], to=str(scale.dtype))]


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
