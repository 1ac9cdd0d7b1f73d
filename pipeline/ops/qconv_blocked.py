"""The qconv_blocked operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/qconv_blocked.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.geometry import QTYPES
from pipeline.ops.registry import OpKind, register


def _pad_infer(types, node):
    x = types[0]
    ib, (pt, pl, pb, pr) = node.attr("block"), node.attr("pads")
    channels = node.attr("channels")
    n, _, h, w = x.shape[:4]
    cp = -(-channels // ib) * ib
    window = node.attr("window", 1)  # columns a pixel holds (one input channel)
    return [TensorType((n, cp // ib, h + pt + pb, w + pl + pr - window + 1, ib), x.dtype)]


register("qpad_nchwc", OpKind.OPAQUE, _pad_infer)


def _infer(types, node):
    x, w = types[0], types[1]
    n, cb, hp, wp, ib = x.shape
    ocg, wcb, kh, kw, ib4, kob, four = w.shape
    ob = node.attr("oc_block")
    if (wcb, ib4 * 4, four) != (cb, ib, 4) or kob % ob or x.dtype not in QTYPES:
        raise ModelError(f"node {node.name!r} (qconv2d_nchwc): weights {list(w.shape)} do "
                         f"not match input {list(x.shape)} {x.dtype}")
    sh, sw = node.attr("strides")
    pt, pl, pb, pr = node.attr("out_pads", (0, 0, 0, 0))  # transform/padded_outputs.py
    return [TensorType((n, ocg * kob // ob, (hp - kh) // sh + 1 + pt + pb,
                        (wp - kw) // sw + 1 + pl + pr, ob), node.attr("out"))]


# An anchor: a residual block's DequantizeLinear-Add-QuantizeLinear joins it as the
# epilogue of its requantized bytes (transform/fuse.py: it writes each output once).
register("qconv2d_nchwc", OpKind.ANCHOR, _infer)


def _dw_infer(types, node):
    x, w = types[0], types[1]
    n, cb, hp, wp, b = x.shape
    wcb, kh, kw, wb = w.shape
    if (wcb, wb) != (cb, b) or x.dtype not in QTYPES:
        raise ModelError(f"node {node.name!r} (qdepthwise_conv2d_nchwc): weights "
                         f"{list(w.shape)} do not match input {list(x.shape)} {x.dtype}")
    sh, sw = node.attr("strides")
    pt, pl, pb, pr = node.attr("pads", (0, 0, 0, 0))  # borders the kernel pads (smlad)
    hp, wp = hp + pt + pb, wp + pl + pr
    pt, pl, pb, pr = node.attr("out_pads", (0, 0, 0, 0))  # transform/padded_outputs.py
    return [TensorType((n, cb, (hp - kh) // sh + 1 + pt + pb, (wp - kw) // sw + 1 + pl + pr, b),
                       node.attr("out"))]


register("qdepthwise_conv2d_nchwc", OpKind.OPAQUE, _dw_infer)
