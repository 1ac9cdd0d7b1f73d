"""The conv_transpose operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/conv_transpose.py
Their ONNX converters: pipeline/frontend/onnx/conv_transpose.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register
from pipeline.ops.windows import infer_1d


def _conv_t_infer(types, node):
    """(N, C, spatial...) with weights (C, OC/groups, kernel...) -> (N, OC, outputs...)."""
    x, w = types[0], types[1]
    n, c, *spatial = x.shape
    icw, ocg, *kernel = w.shape
    groups, d = node.attr("groups"), len(spatial)
    if c != icw or c % groups:
        raise ModelError(f"node {node.name!r} ({node.op}): {c} input channels do not match "
                         f"weights {list(w.shape)} with groups={groups}")
    strides, dilations, pads = node.attr("strides"), node.attr("dilations"), node.attr("pads")
    out = [s * (i - 1) + op + (k - 1) * dl + 1 - pads[a] - pads[d + a] for a, (i, k, s, dl, op)
           in enumerate(zip(spatial, kernel, strides, dilations, node.attr("output_padding"),
                            strict=True))]
    if min(out) < 1:
        raise ModelError(f"node {node.name!r} ({node.op}): output size {out} is empty")
    return [TensorType((n, ocg * groups, *out), x.dtype)]


register("conv_transpose3d", OpKind.ANCHOR, _conv_t_infer)

register("conv_transpose2d", OpKind.ANCHOR, _conv_t_infer)


_conv_t1d_infer = infer_1d(_conv_t_infer)


register("conv_transpose1d", OpKind.ANCHOR, _conv_t1d_infer)
