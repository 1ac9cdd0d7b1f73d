"""The depthwise_blocked operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/depthwise_blocked.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register


def _infer(types, node):
    x, w = types[0], types[1]
    n, cb, h, wd, b = x.shape
    if w.shape[0] != cb or w.shape[3] != b:
        raise ModelError(f"node {node.name!r} (depthwise_conv2d_nchwc): weights "
                         f"{list(w.shape)} do not match input {list(x.shape)}")
    _, kh, kw, _ = w.shape
    (sh, sw), (pt, pl, pb, pr) = node.attr("strides"), node.attr("pads")
    return [TensorType((n, cb, (h + pt + pb - kh) // sh + 1, (wd + pl + pr - kw) // sw + 1, b),
                       x.dtype)]


register("depthwise_conv2d_nchwc", OpKind.ANCHOR, _infer)
