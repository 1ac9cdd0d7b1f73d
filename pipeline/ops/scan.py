"""The scan operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/scan.py
Their ONNX converters: pipeline/frontend/onnx/scan.py
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register

_NUMERIC = ("float32", "float64", "int64", "int32", "float16", "int8", "uint8", "int16",
            "uint16", "uint32", "uint64")


def _numeric(types, node):
    if types[0].dtype not in _NUMERIC:
        raise ModelError(f"node {node.name!r} ({node.op}): input dtype {types[0].dtype} is "
                         f"not supported ({', '.join(_NUMERIC)} are)")
    return [types[0]]


# op -> (the identity an exclusive scan starts from, numpy)
_CUMULATIVE = {"cumsum": (0, np.cumsum), "cumprod": (1, np.cumprod)}


def _cumulative_np(xs, node):
    x, axis = xs[0], node.attr("axis")
    start, fn = _CUMULATIVE[node.op]
    if node.attr("reverse"):
        x = np.flip(x, axis)
    y = fn(x, axis=axis, dtype=x.dtype)
    if node.attr("exclusive") and x.shape[axis]:  # shift by one, the identity in front
        y = np.roll(y, 1, axis)
        first = [slice(None)] * y.ndim
        first[axis] = 0
        y[tuple(first)] = start
    return [np.flip(y, axis) if node.attr("reverse") else y]


for _op in _CUMULATIVE:
    register(_op, OpKind.OPAQUE, _numeric, numpy=_cumulative_np,
             float64=True, uint64=True, sample=lambda rng, dtype: (
                 [rng.uniform(0.5, 1.5, (2, 4, 3)).astype(dtype)],
                 {"axis": 1, "exclusive": 1, "reverse": 1}))


def _topk_infer(types, node):
    _numeric(types, node)
    x, axis, k = types[0], node.attr("axis"), node.attr("k")
    if len(types) > 1:  # a runtime k (an int64 input): the bound is the axis length
        k = x.shape[axis]
    if not 0 <= k <= x.shape[axis]:
        raise ModelError(f"node {node.name!r} ({node.op}): k {k} is outside [0, "
                         f"{x.shape[axis]}] (axis {axis} of {list(x.shape)})")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorType(shape, x.dtype if node.op == "topk_values" else "int64")]


def _topk_np(xs, node):
    x, axis, k = xs[0], node.attr("axis"), node.attr("k")
    if len(xs) > 1:
        k = int(xs[1].reshape(-1)[0])
    order = np.argsort(-x if node.attr("largest") else x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis) if node.op == "topk_values" else
            idx.astype(np.int64)]


for _op in ("topk_values", "topk_indices"):
    register(_op, OpKind.OPAQUE, _topk_infer, numpy=_topk_np, float64=True, uint64=True,
             sample=lambda rng, dtype: ([rng.uniform(-2, 2, (2, 5, 3)).astype(dtype)],
                                        {"axis": 1, "k": 3, "largest": 1}))


def _trilu_infer(types, node):
    if len(types[0].shape) < 2:
        raise ModelError(f"node {node.name!r} (trilu): input rank {len(types[0].shape)} < 2")
    return _numeric(types, node) if types[0].dtype != "bool" else [types[0]]


def _trilu_np(xs, node):
    fn = np.triu if node.attr("upper") else np.tril
    return [fn(xs[0], node.attr("k"))]


register("trilu", OpKind.OPAQUE, _trilu_infer, numpy=_trilu_np, float64=True, uint64=True,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (2, 3, 4)).astype(dtype)],
                                    {"k": 1, "upper": 0}))
