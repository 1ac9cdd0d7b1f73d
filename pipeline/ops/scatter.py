"""The scatter operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/scatter.py
Their ONNX converters: pipeline/frontend/onnx/scatter.py
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import OpKind, register

_INDEX_DTYPES = ("int64", "int32")


def _check_indices(node: Node, indices: TensorType) -> None:
    if indices.dtype not in _INDEX_DTYPES:
        raise ModelError(f"node {node.name!r} ({node.op}): indices dtype {indices.dtype} is "
                         "not supported (int64, int32 are)")


def _gather_elements_infer(types, node):
    data, indices = types
    _check_indices(node, indices)
    if len(indices.shape) != len(data.shape):
        raise ModelError(f"node {node.name!r} (gather_elements): indices rank "
                         f"{len(indices.shape)} differs from data rank {len(data.shape)}")
    return [TensorType(indices.shape, data.dtype)]


def _gather_elements_np(xs, node):
    data, indices = xs
    axis = node.attr("axis")
    return [np.take_along_axis(data, np.where(indices < 0, indices + data.shape[axis],
                                              indices), axis)]


register("gather_elements", OpKind.ANCHOR, _gather_elements_infer, numpy=_gather_elements_np,
         float64=True,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (3, 4)).astype(dtype),
                                     rng.integers(-4, 4, (3, 2))], {"axis": 1}))


def _scatter_elements_infer(types, node):
    data, indices, updates = types
    _check_indices(node, indices)
    if indices.shape != updates.shape or len(indices.shape) != len(data.shape) \
            or updates.dtype != data.dtype:
        raise ModelError(f"node {node.name!r} (scatter_elements): indices {list(indices.shape)}"
                         f" and updates {list(updates.shape)} {updates.dtype} must match and "
                         f"have the rank of data {list(data.shape)} {data.dtype}")
    return [data]


register("scatter_elements", OpKind.OPAQUE, _scatter_elements_infer, float64=True)


def _scatter_nd_infer(types, node):
    data, indices, updates = types
    _check_indices(node, indices)
    q, k = len(indices.shape), indices.shape[-1] if indices.shape else 0
    want = indices.shape[:-1] + data.shape[k:]
    if not indices.shape or k > len(data.shape) or updates.shape != want \
            or updates.dtype != data.dtype:
        raise ModelError(f"node {node.name!r} (scatter_nd): updates {list(updates.shape)} "
                         f"must be {list(want)} for indices {list(indices.shape)} (rank {q}) "
                         f"and data {list(data.shape)} {data.dtype}")
    return [data]


register("scatter_nd", OpKind.OPAQUE, _scatter_nd_infer, float64=True)


def _gather_nd_infer(types, node):
    data, indices = types
    _check_indices(node, indices)
    b = node.attr("batch_dims")
    k = indices.shape[-1] if indices.shape else 0
    if not 1 <= k <= len(data.shape) - b or indices.shape[:b] != data.shape[:b] \
            or b >= len(indices.shape):
        raise ModelError(f"node {node.name!r} (gather_nd): indices {list(indices.shape)} do "
                         f"not index data {list(data.shape)} with batch_dims {b}")
    return [TensorType(indices.shape[:-1] + data.shape[b + k:], data.dtype)]


def _gather_nd_np(xs, node):
    data, indices = xs
    b, lead = node.attr("batch_dims"), indices.shape[:-1]
    out = np.empty(lead + data.shape[b + indices.shape[-1]:], data.dtype)
    for at in np.ndindex(*lead):
        out[at] = data[at[:b] + tuple(int(i) for i in indices[at])]
    return [out]


# gather_nd(data, indices; batch_dims): out[i..., :] = data[i[:batch_dims]...,
# indices[i...]..., :], an index tuple per row of indices' last axis (ONNX GatherND).
register("gather_nd", OpKind.OPAQUE, _gather_nd_infer, numpy=_gather_nd_np, float64=True,
         uint64=True,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (2, 3, 4)).astype(dtype),
                                     rng.integers(-3, 3, (2, 5, 1))], {"batch_dims": 1}))


def _tensor_scatter_infer(types, node):
    past, update = types[:2]
    axis = node.attr("axis")
    if len(types) > 2:
        _check_indices(node, types[2])
    if update.dtype != past.dtype or len(update.shape) != len(past.shape) or not (
            0 < axis < len(past.shape)) or update.shape[axis] > past.shape[axis] or any(
            a != b for d, (a, b) in enumerate(zip(update.shape, past.shape, strict=True))
            if d != axis) or (len(types) > 2 and types[2].shape != past.shape[:1]):
        raise ModelError(f"node {node.name!r} (tensor_scatter): update {update.to_json()} "
                         f"does not fit the cache {past.to_json()} along axis {axis} (not the "
                         "batch axis 0), or write_indices is not one per batch entry")
    return [past]


def _tensor_scatter_np(xs, node):
    past, update = xs[:2]
    axis, length = node.attr("axis"), past.shape[node.attr("axis")]
    starts = xs[2] if len(xs) > 2 else np.zeros(past.shape[0], np.int64)
    out = past.copy()
    for prefix in np.ndindex(*past.shape[:axis]):
        at = starts[prefix[0]] + np.arange(update.shape[axis])
        out[prefix][at % length if node.attr("circular") else at] = update[prefix]
    return [out]


# tensor_scatter(past, update[, write_indices]; axis, circular): past with update written
# along `axis` from write_indices[batch] on (wrapping modulo the axis if circular).
register("tensor_scatter", OpKind.OPAQUE, _tensor_scatter_infer, numpy=_tensor_scatter_np,
         float64=True, uint64=True,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (2, 3, 4)).astype(dtype),
                                     rng.uniform(-2, 2, (2, 2, 4)).astype(dtype),
                                     np.array([2, 0])], {"axis": 1, "circular": 1}))
