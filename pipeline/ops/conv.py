"""The conv operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/conv.py
Their ONNX converters: pipeline/frontend/onnx/conv.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register
from pipeline.ops.windows import infer_1d, window_out


def _conv_infer(types, node):
    """(N, C, spatial...) with weights (OC, C/groups, kernel...) -> (N, OC, outputs...)."""
    x, w = types[0], types[1]
    n, c, *spatial = x.shape
    oc, icg, *kernel = w.shape
    strides, dilations, pads = node.attr("strides"), node.attr("dilations"), node.attr("pads")
    groups, d = node.attr("groups"), len(spatial)
    if c != icg * groups or oc % groups:
        raise ModelError(f"node {node.name!r} ({node.op}): {c} input channels do not match "
                         f"weights {list(w.shape)} with groups={groups}")
    out = [window_out(size, k, s, pads[i], pads[d + i], dl) for i, (size, k, s, dl)
           in enumerate(zip(spatial, kernel, strides, dilations, strict=True))]
    if min(out) < 1:
        raise ModelError(f"node {node.name!r} ({node.op}): kernel {kernel} does not fit "
                         f"the padded input {list(x.shape)}")
    return [TensorType((n, oc, *out), x.dtype)]


register("conv2d", OpKind.ANCHOR, _conv_infer)

register("conv3d", OpKind.ANCHOR, _conv_infer)


_conv1d_infer = infer_1d(_conv_infer)


register("conv1d", OpKind.ANCHOR, _conv1d_infer)
