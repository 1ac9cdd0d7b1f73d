"""The conv_winograd operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/conv_winograd.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register


def _infer(types, node):
    x, u = types[0], types[1]
    n, icb, h, wd, ib = x.shape
    p, ocg, c, kob = u.shape
    m, ob = node.attr("winograd_m"), node.attr("oc_block")
    if p != (m + 2) ** 2 or c != icb * ib or ib != ob or kob % ob:
        raise ModelError(f"node {node.name!r} (conv2d_winograd_nchwc): weights "
                         f"{list(u.shape)} do not match input {list(x.shape)} for F({m},3)")
    pt, pl, pb, pr = node.attr("pads")
    return [TensorType((n, ocg * kob // ob, h + pt + pb - 2, wd + pl + pr - 2, ob), x.dtype)]


register("conv2d_winograd_nchwc", OpKind.ANCHOR, _infer)
