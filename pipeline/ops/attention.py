"""The attention operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/attention.py
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.geometry import logical_shapes
from pipeline.ops.registry import OpKind, broadcast_shape, register


def _infer(types, node):
    if any(t.dtype != "float32" for t in types):
        raise ModelError(f"node {node.name!r} (attention): float32 operands only")
    q, kt, v = logical_shapes([t.shape for t in types], node)
    if not (q[:2] == kt[:2] == v[:2] and q[3] == kt[2] and kt[3] == v[2]):
        raise ModelError(f"node {node.name!r} (attention): Q {list(q)}, Kᵀ {list(kt)}, "
                         f"V {list(v)} do not multiply")
    logical = (*q[:3], v[3])
    if len(types) > 3:
        scores = (*q[:3], kt[3])
        if broadcast_shape(scores, types[3].shape, where=f"node {node.name!r}") != scores:
            raise ModelError(f"node {node.name!r} (attention): mask {list(types[3].shape)} "
                             f"does not broadcast to the scores {list(scores)}")
    return [TensorType(tuple(logical[p] for p in node.attr("out_perm")), "float32")]


def _numpy(xs, node):
    q, k, v = (np.transpose(x, node.attr(f"{n}_perm")) for x, n in zip(xs, "qkv",
                                                                      strict=False))
    s = np.matmul(q.astype(np.float64), k) * node.attr("scale")
    if len(xs) > 3:
        s = s + xs[3]
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    y = np.matmul(e / e.sum(axis=-1, keepdims=True), v)
    inverse = np.argsort(node.attr("out_perm"))  # logical dim u sits at position inverse[u]
    return [np.transpose(y, np.argsort(inverse)).astype(np.float32)]


def _sample(rng, dtype):
    """Q from [B, Sq, H, D], Kᵀ from [B, Sk, H, D], V plain, a mask over k, the
    output merged back as [B, Sq, H, Dv]; Sk = 19 (a partial vector)."""
    b, h, sq, sk, d, dv = 2, 3, 6, 19, 5, 7
    xs = [rng.uniform(-1, 1, s).astype(dtype)
          for s in ((b, sq, h, d), (b, sk, h, d), (b, h, sk, dv), (b, 1, 1, sk))]
    return xs, {"q_perm": (0, 2, 1, 3), "k_perm": (0, 2, 3, 1), "v_perm": (0, 1, 2, 3),
                "out_perm": (0, 2, 1, 3), "scale": 0.4}


register("attention", OpKind.OPAQUE, _infer, numpy=_numpy, sample=_sample)
