"""The quant_conv operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/quant_conv.py
Their ONNX converters: pipeline/frontend/onnx/quant_conv.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.geometry import QTYPES
from pipeline.ops.registry import OpKind, register
from pipeline.ops.windows import window_out


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


register("conv2d_integer", OpKind.OPAQUE, _conv_infer)


def _matmul_infer(types, node):
    _check_int(node, types)
    a, b = types[0], types[1]
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2] or (
            len(b.shape) > 2 and b.shape[:-2] != a.shape[:-2]):
        raise ModelError(f"node {node.name!r} ({node.op}): shapes {list(a.shape)} and "
                         f"{list(b.shape)} are not supported (b 2-D or with a's batch dims)")
    return [TensorType(a.shape[:-1] + b.shape[-1:], node.attr("out"))]


register("matmul_integer", OpKind.OPAQUE, _matmul_infer)
