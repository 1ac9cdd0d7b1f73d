"""The recurrent operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/recurrent.py
Their ONNX converters: pipeline/frontend/onnx/recurrent.py
"""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register


def _last_infer(types, node):
    y = types[0]
    shape = y.shape[1:] if node.attr("layout") == 0 else (y.shape[0],) + y.shape[2:]
    return [TensorType(shape, y.dtype)]


def _last_np(xs, node):
    y, layout = xs[0], node.attr("layout")
    if layout == 1:  # as layout 0
        y = y.transpose(1, 2, 0, 3)
    seq, dirs, batch, _ = y.shape
    lens = np.clip(xs[1], 0, seq) if len(xs) > 1 else np.full(batch, seq)
    out = np.zeros(y.shape[1:], y.dtype)
    for d, name in enumerate(node.attr("directions")):
        for b in range(batch):
            if lens[b]:
                out[d, b] = y[0 if name == "reverse" else lens[b] - 1, d, b]
    return [out if layout == 0 else out.transpose(1, 0, 2)]


register("rnn_last", OpKind.OPAQUE, _last_infer, numpy=_last_np,
         sample=lambda rng, dtype: ([rng.uniform(-1, 1, (5, 2, 3, 4)).astype(dtype),
                                     np.array([5, 0, 2], np.int32)],
                                    {"layout": 0, "directions": ("forward", "reverse")}))
