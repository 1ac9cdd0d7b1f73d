"""The index operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/index.py
Their ONNX converters: pipeline/frontend/onnx/index.py
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.index_tables import pad_tables, slice_tables
from pipeline.ops.movement import register_remap
from pipeline.ops.registry import OpKind, register


def _gather_infer(types, node):
    data, indices = types
    axis = node.attr("axis")
    if indices.dtype not in ("int64", "int32"):
        raise ModelError(f"node {node.name!r} (gather): indices dtype {indices.dtype} is "
                         "not supported (int64, int32 are)")
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1:]
    return [TensorType(shape, data.dtype)]


def _gather_np(xs, node):
    data, indices = xs
    dim = data.shape[node.attr("axis")]
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise ModelError(f"node {node.name!r} (Gather): indices out of range [-{dim}, {dim})")
    return [np.take(data, indices, axis=node.attr("axis"))]


register("gather", OpKind.ANCHOR, _gather_infer, numpy=_gather_np,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (4, 3)).astype(dtype),
                                     rng.integers(-4, 4, (2, 2))], {"axis": 0}),
         float64=True, uint64=True)


def _slice_infer(types, node):
    shape = types[0].shape
    out = tuple(node.attr("shape"))
    for d, (size, start, step, count) in enumerate(zip(shape, node.attr("starts"),
                                                       node.attr("steps"), out, strict=True)):
        if isinstance(size, str) or isinstance(count, str):  # a whole symbolic axis
            if (start, step, count) != (0, 1, size):
                raise ModelError(f"node {node.name!r} (slice): symbolic axis {d} is not "
                                 "kept whole")
            continue
        if count and not (0 <= start < size and 0 <= start + (count - 1) * step < size):
            raise ModelError(f"node {node.name!r} (slice): axis {d} reads outside "
                             f"[0, {size})")
    return [TensorType(out, types[0].dtype)]


register_remap("slice", _slice_infer, slice_tables,
               lambda rng, dtype: ([rng.uniform(-2, 2, (4, 6)).astype(dtype)], dict(slice_node(
                   "s", "x", "y", (4, 6), [1, -1], [4, 0], [0, 1], [1, -2]).attrs)))


def slice_node(name: str, x: str, out: str, shape, starts, ends, axes, steps) -> Node:
    """A slice node with ONNX Slice semantics, normalised to per-axis
    (start, step, count): negative starts/ends count from the end, then both
    are clamped ([0, dim] going forward, [-1, dim - 1] going backward)."""
    full_starts, full_steps, counts = [0] * len(shape), [1] * len(shape), list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        dim = shape[axis]
        if step == 0:
            raise ModelError(f"node {name!r} (Slice): step 0 on axis {axis}")
        if isinstance(dim, str):  # a symbolic axis (the VM's) is kept whole, or refused
            if start != 0 or step != 1 or end < 2 ** 62:
                raise ModelError(f"node {name!r} (Slice): axis {axis} is symbolic ({dim}): "
                                 "only its whole range is supported yet")
            continue
        start, end = (v + dim if v < 0 else v for v in (start, end))
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        count = max(0, -((start - end) // step) if step > 0 else -((end - start) // -step))
        full_starts[axis], full_steps[axis], counts[axis] = start, step, count
    return Node.make("slice", name, (x,), (out,), starts=full_starts, steps=full_steps,
                     shape=counts)


def _pad_infer(types, node):
    pads = node.attr("pads")
    in_shape = types[0].shape
    rank = len(in_shape)
    shape = tuple(d + pads[k] + pads[k + rank] for k, d in enumerate(in_shape))
    if min(shape, default=1) < 0:
        raise ModelError(f"node {node.name!r} (pad): pads {list(pads)} crop "
                         f"{list(in_shape)} below zero")
    if node.attr("mode") != "constant" and any(
            d == 0 and o > 0 for d, o in zip(in_shape, shape, strict=True)):
        raise ModelError(f"node {node.name!r} (pad): {node.attr('mode')} padding of an "
                         "empty axis")
    return [TensorType(shape, types[0].dtype)]


register_remap("pad", _pad_infer, pad_tables,
               lambda rng, dtype: ([rng.uniform(-2, 2, (2, 3)).astype(dtype)],
                                   {"pads": (1, 0, 0, 2), "mode": "constant", "value": 0.5}))
