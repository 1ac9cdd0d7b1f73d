"""The quant operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/quant.py
Their ONNX converters: pipeline/frontend/onnx/quant.py
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pipeline.dsl.minifloat import FLOAT4, QFLOATS
from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.geometry import LINEAR_QTYPES
from pipeline.ops.registry import OpKind, broadcast_shape, register


def quantize_np(x: np.ndarray, scale, zp, dtype: str, saturate: int = 1) -> np.ndarray:
    if dtype in QFLOATS:  # no rounding to integers: the float8 cast rounds; zp is 0
        q = np.asarray(x, np.float32) / np.asarray(scale, np.float32)
        if dtype in FLOAT4:  # ONNX adds float4's (-0 becomes +0)
            q = q + np.asarray(zp).astype(np.float32)
        if saturate:
            top = float(ml_dtypes.finfo(dtype).max)
            q = np.where(np.isnan(q), q, np.clip(q, -top, top))
        return q.astype(dtype)
    lo, hi = LINEAR_QTYPES[dtype]
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


register("quantize_linear", OpKind.ELEMENTWISE, _q_infer,
         numpy=lambda xs, node: [quantize_np(*xs, node.attr("dtype"), node.attr("saturate", 1))],
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


def dequantize_np(x, scale, zp) -> np.ndarray:
    if str(np.asarray(x).dtype) in QFLOATS:
        diff = np.asarray(x).astype(np.float32) - np.asarray(zp).astype(np.float32)
        return (diff * np.asarray(scale, np.float32)).astype(np.float32)
    diff = np.asarray(x).astype(np.int32) - np.asarray(zp).astype(np.int32)
    return (diff.astype(np.float32) * np.asarray(scale, np.float32)).astype(np.float32)


register("dequantize_linear", OpKind.ELEMENTWISE, _dq_infer,
         numpy=lambda xs, node: [dequantize_np(*xs)],
         sample=lambda rng, dtype: ([rng.integers(-128, 128, (2, 3, 4)).astype(np.int8),
                                     np.array([[0.05], [0.02], [0.1]], np.float32),
                                     np.array([[3], [-5], [0]], np.int8)], {"dtype": "int8"}))


def _scalar_float(types, node):
    return [TensorType(broadcast_shape(*(t.shape for t in types)), "float32")]


def _dyn_scale_np(xs, node):
    lo, hi = np.minimum(xs[0], 0).astype(np.float32), np.maximum(xs[1], 0).astype(np.float32)
    return [np.where(hi == lo, np.float32(1), (hi - lo) / np.float32(255)).astype(np.float32)]


def _dyn_zero_np(xs, node):
    lo = np.minimum(xs[0], 0).astype(np.float32)
    zp = np.clip(np.float32(0) - lo / xs[1].astype(np.float32), 0, 255)
    return [np.rint(zp).astype(np.uint8)]


def _range_sample(rng, dtype):
    """(min, max) pairs around zero, one-sided and empty ranges included."""
    lo = np.array([-3.0, 0.5, -0.25, 0.0, -1.0], np.float32)
    return [lo, np.array([2.0, 4.0, -0.1, 0.0, 7.5], np.float32)], {}


register("dynamic_qscale", OpKind.ELEMENTWISE, _scalar_float, numpy=_dyn_scale_np,
         sample=_range_sample)

register("dynamic_qzero", OpKind.ELEMENTWISE,
         lambda types, node: [TensorType(_scalar_float(types, node)[0].shape, "uint8")],
         numpy=_dyn_zero_np,
         sample=lambda rng, dtype: ([np.array([-3.0, 0.5, -0.25, -1.0], np.float32),
                                     np.array([0.02, 0.1, 0.003, 0.004], np.float32)], {}))
