"""The conv_pointwise operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/conv_pointwise.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register


def _infer(types, node):
    x, w = types[0], types[1]
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    groups = node.attr("groups")
    if (kh, kw) != (1, 1) or c != icg * groups or oc % groups:
        raise ModelError(f"node {node.name!r} (conv2d_pointwise): weights {list(w.shape)} "
                         f"do not fit input {list(x.shape)} with groups={groups}")
    return [TensorType((n, oc, h, wd), x.dtype)]


register("conv2d_pointwise", OpKind.ANCHOR, _infer)
