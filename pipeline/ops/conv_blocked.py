"""The conv_blocked operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/conv_blocked.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register


def _infer(types, node):
    x, w = types[0], types[1]
    n, icb, h, wd, ib = x.shape
    ocg, wicb, kh, kw, wib, kob = w.shape
    ob, groups = node.attr("oc_block"), node.attr("groups", 1)
    if (wicb * groups, wib) != (icb, ib) or kob % ob or ocg % groups:
        raise ModelError(f"node {node.name!r} (conv2d_nchwc): weights {list(w.shape)} do not "
                         f"match input {list(x.shape)} with oc_block {ob}")
    (sh, sw), (pt, pl, pb, pr) = node.attr("strides"), node.attr("pads")
    oh = (h + pt + pb - kh) // sh + 1
    ow = (wd + pl + pr - kw) // sw + 1
    return [TensorType((n, ocg * kob // ob, oh, ow, ob), x.dtype)]


register("conv2d_nchwc", OpKind.ANCHOR, _infer)
