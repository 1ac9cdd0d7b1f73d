"""The softmax operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/softmax.py
Their ONNX converters: pipeline/frontend/onnx/softmax.py
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.errors import ModelError
from pipeline.ops.registry import OpKind, register


def _float_infer(types, node):
    """The input's type; a float input (else a ModelError naming the node)."""
    if types[0].dtype not in ("float32", "float64", "float16"):
        raise ModelError(f"node {node.name!r} ({node.op}): input dtype {types[0].dtype} is "
                         "not supported (float32, float64, float16 are)")
    return [types[0]]


def _rows(x, node):
    """x as [outer, length, inner] rows along `axis` (flatten: everything from `axis` on)."""
    axis = node.attr("axis")
    outer = math.prod(x.shape[:axis])
    if node.attr("flatten"):
        return x.reshape(outer, -1, 1)
    return x.reshape(outer, x.shape[axis], -1)


def _softmax_numpy(xs, node):
    rows = _rows(xs[0], node)
    shifted = rows - rows.max(axis=1, keepdims=True)
    total = np.exp(shifted).sum(axis=1, keepdims=True)
    out = shifted - np.log(total) if node.op == "log_softmax" else np.exp(shifted) / total
    return [out.reshape(xs[0].shape).astype(xs[0].dtype)]


def _hardmax_numpy(xs, node):
    rows = _rows(xs[0], node)
    hit = np.arange(rows.shape[1])[None, :, None] == rows.argmax(axis=1)[:, None, :]
    return [hit.reshape(xs[0].shape).astype(xs[0].dtype)]


def _sample(rng, dtype):  # tests/ops/test_registry_ops.py
    return [rng.uniform(-3, 3, (2, 3, 4)).astype(dtype)], {"axis": 1, "flatten": 0}


register("softmax", OpKind.OPAQUE, _float_infer, float64=True,
         numpy=_softmax_numpy, sample=_sample)

register("log_softmax", OpKind.OPAQUE, _float_infer, float64=True,
         numpy=_softmax_numpy, sample=_sample)

register("hardmax", OpKind.OPAQUE, _float_infer, float64=True,
         numpy=_hardmax_numpy,
         sample=lambda rng, dtype: ([rng.uniform(-3, 3, (2, 3, 4)).astype(dtype)],
                                    {"axis": 1, "flatten": 1}))
