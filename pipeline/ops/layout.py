"""The layout operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/layout.py
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import GraphError
from pipeline.ir.graph import TensorType
from pipeline.ops.geometry import layout_blocks
from pipeline.ops.registry import OpKind, register


def to_blocked_shape(shape: tuple[int, ...], block: int) -> tuple[int, ...]:
    """The NCHW{block}c shape of NCHW `shape`, the last block padded."""
    n, c, h, w = shape
    return (n, -(-c // block), h, w, block)


def _infer(types, node):
    src, dst = layout_blocks(node)
    shape = types[0].shape
    if (src == 0) == (dst == 0) or len(shape) != (5 if src else 4):
        raise GraphError(f"node {node.name!r} (layout_transform): cannot go from "
                         f"{node.attr('src_layout')} {list(shape)} to {node.attr('dst_layout')}")
    if src:
        n, cb, h, w, b = shape
        channels = node.attr("channels", cb * b)
        if not cb * b - b < channels <= cb * b:
            raise GraphError(f"node {node.name!r} (layout_transform): {channels} channels "
                             f"do not fit {list(shape)}")
        return [TensorType((n, channels, h, w), types[0].dtype)]
    return [TensorType(to_blocked_shape(shape, dst), types[0].dtype)]


def _numpy(xs, node):
    src, dst = layout_blocks(node)
    x = xs[0]
    if src:
        n, cb, h, w, b = x.shape
        plain = x.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)
        return [plain[:, :node.attr("channels", cb * b)].copy()]
    n, c, h, w = x.shape
    x = np.pad(x, [(0, 0), (0, -c % dst), (0, 0), (0, 0)])
    return [x.reshape(n, -1, dst, h, w).transpose(0, 1, 3, 4, 2).copy()]


register("layout_transform", OpKind.OPAQUE, _infer, numpy=_numpy,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (2, 8, 3, 2)).astype(dtype)],
                                    {"src_layout": "NCHW", "dst_layout": "NCHW4c"}))
