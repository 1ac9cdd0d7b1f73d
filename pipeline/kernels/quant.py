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

import llvmlite.ir as ir

from pipeline.dsl.builder import F32, I32
from pipeline.dsl.minifloat import FLOAT4, QFLOATS
from pipeline.kernels.registry import lowering
from pipeline.ops.geometry import LINEAR_QTYPES


def _like(v, elem: ir.Type) -> ir.Type:
    """`elem`, or a vector of it as wide as v (the quantize ops are lane-generic: an
    elementwise kernel applies them to whole vectors, dsl/vector.py LANE_GENERIC_OPS)."""
    return ir.VectorType(elem, v.type.count) if isinstance(v.type, ir.VectorType) else elem


def to_i32(kb, v, dtype: str):
    """An integer value of `dtype` (int8, uint8, int32) as i32 (scalar or vector).
    Kernels load int8 and uint8 already widened (sign- or zero-extended:
    dsl/builder.py), so this only extends a raw byte."""
    i32 = _like(v, I32)
    if v.type == i32:
        return v
    return kb.b.zext(v, i32) if dtype == "uint8" else kb.b.sext(v, i32)


def saturate_to(kb, r, dtype: str):
    """The float r (already rounded) clamped to `dtype`'s range, as the i32 the
    kernels compute int8/uint8 in (stores narrow it)."""
    lo, hi = LINEAR_QTYPES[dtype]
    r = kb.fmin(kb.fmax(r, kb.fconst(lo, r)), kb.fconst(hi, r))
    return kb.b.fptosi(r, _like(r, I32))


def _q_scalar(kb, a, node):
    x, scale, zp = a
    if node.attr("dtype") in QFLOATS:  # x / scale rounded by the float8 encoding (the
        # float8 zero point is 0, the converter checks: ONNX does not add it, which would
        # turn -0 into +0; float4's it adds, as onnx.reference does)
        q = kb.fdiv(x, scale, fast=False)
        if node.attr("dtype") in FLOAT4:
            q = kb.fadd(q, zp, fast=False)
        return kb.narrow(q, node.attr("dtype"), saturate=bool(node.attr("saturate", 1)))
    r = kb.intrinsic("roundeven", kb.fdiv(x, scale, fast=False))
    r = kb.fadd(r, kb.b.sitofp(to_i32(kb, zp, node.attr("dtype")), _like(r, F32)), fast=False)
    return saturate_to(kb, r, node.attr("dtype"))


lowering("quantize_linear", scalar=_q_scalar)


def _dq_scalar(kb, a, node):
    x, scale, zp = a
    dtype = node.attr("dtype")
    if dtype in QFLOATS:  # loaded as float32 already
        return kb.fmul(kb.fsub(x, zp, fast=False), scale, fast=False)
    diff = kb.b.sub(to_i32(kb, x, dtype), to_i32(kb, zp, dtype))
    return kb.fmul(kb.b.sitofp(diff, _like(diff, F32)), scale, fast=False)


lowering("dequantize_linear", scalar=_dq_scalar)


def _dyn_scale(kb, a, node):
    lo = kb.fmin(a[0], kb.f32(0.0))
    hi = kb.fmax(a[1], kb.f32(0.0))
    same = kb.b.fcmp_ordered("==", hi, lo)
    return kb.b.select(same, kb.f32(1.0),
                       kb.fdiv(kb.fsub(hi, lo, fast=False), kb.f32(255.0), fast=False))


def _dyn_zero(kb, a, node):
    lo = kb.fmin(a[0], kb.f32(0.0))
    zp = kb.fsub(kb.f32(0.0), kb.fdiv(lo, a[1], fast=False), fast=False)
    zp = kb.fmin(kb.fmax(zp, kb.f32(0.0)), kb.f32(255.0))
    return saturate_to(kb, kb.intrinsic("roundeven", zp), "uint8")


lowering("dynamic_qscale", scalar=_dyn_scale)

lowering("dynamic_qzero", scalar=_dyn_zero)
