"""Operators whose output shape depends on values (issue 25, point 5): NonZero,
NonMaxSuppression, Unique, and Range, ConstantOfShape and Expand whose shape-giving
inputs are runtime values. TopK with a runtime k is topk_values/topk_indices with a
second input (scan.py). Only the VM runs them (docs/vm.md, pipeline/vm/dynamic.py).

Each such operator `op` has a shape operator (DATA_DEPENDENT[op].shape_op) computing
its runtime shape as an int64 vector. Two ways to hold the result:
  - at its bound: the IR type of op's output is an upper bound (NonZero: [rank,
    numel]); the kernel writes the result at its runtime shape into the start of that
    storage, and the VM views it with the shape the shape operator computed;
  - at run time: the IR type has zeros where dimensions are unknown (Range: [0]);
    the VM allocates the storage from the computed shape and the kernel takes that
    shape as its last input.

Graph ops (numpy references give the runtime result; the lowerings are in
pipeline/kernels/dynamic.py, the converters in pipeline/frontend/onnx/dynamic.py):
  nonzero(x)                                 int64 [rank, n]; bound [rank, numel]
  nms(boxes, scores, max_out, iou, score_threshold; center_point_box)
                                             int64 [n, 3]; bound [rows, 3], rows unused
                                             rows -1
  unique(x; sorted, output, axis)            output 0: values, 1: first indices,
                                             3: counts; [u] (axis -1: x flattened) or
                                             x's shape with u along axis; bound: u =
                                             the element or slice count
  unique_inverse(x; sorted, axis)            int64 [elements or slices]: static
  range(start, limit, delta, shape)          [n] at run time
  fill(shape_in, shape; value, dtype)        shape_in's shape, `value` everywhere
  expand_to(x, shape_in, shape)              x broadcast to shape_in's shape
and their shape operators, each an int64 vector of the output's rank:
  nonzero_shape(x), nms_shape(selected), unique_shape(x), topk_shape(x, k; axis),
  range_shape(start, limit, delta), fill_shape(shape_in), expand_to_shape(x, shape_in)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import OpKind, register

__all__ = ["DATA_DEPENDENT", "DataDependent", "data_dependent"]


@dataclass(frozen=True)
class DataDependent:
    """How the VM runs a data-dependent op: its shape op, whether its output is
    held at its bound (else allocated at run time from the shape), and whether the
    shape op reads the op's output (NMS counts its rows) instead of its inputs."""

    shape_op: str
    at_bound: bool
    from_output: bool = False


DATA_DEPENDENT = {
    "nonzero": DataDependent("nonzero_shape", True),
    "nms": DataDependent("nms_shape", True, from_output=True),
    "unique": DataDependent("unique_shape", True),
    "topk_values": DataDependent("topk_shape", True),
    "topk_indices": DataDependent("topk_shape", True),
    "range": DataDependent("range_shape", False),
    "fill": DataDependent("fill_shape", False),
    "expand_to": DataDependent("expand_to_shape", False),
    # Reshape, Slice and Tile with runtime shape inputs (ops/dynamic_movement.py)
    "reshape_to": DataDependent("reshape_to_shape", True),
    "slice_to": DataDependent("slice_to_shape", True),
    "tile_to": DataDependent("tile_to_shape", False),
}


def data_dependent(node: Node) -> DataDependent | None:
    """The DataDependent of `node` if its output shape depends on values (TopK only
    with a runtime k: a second input), else None."""
    if node.op in ("topk_values", "topk_indices") and len(node.inputs) < 2:
        return None
    return DATA_DEPENDENT.get(node.op)


def _vector(n: int) -> list[TensorType]:
    return [TensorType((n,), "int64")]


def _nonzero_np(xs, node):
    x = xs[0]
    return [np.array(np.nonzero(x), np.int64).reshape(max(x.ndim, 1), -1)]


register("nonzero", OpKind.OPAQUE,
         lambda ts, node: [TensorType((max(len(ts[0].shape), 1), ts[0].size), "int64")],
         numpy=_nonzero_np, float64=True,
         sample=lambda rng, dtype: ([(rng.uniform(-1, 1, (3, 4)) > 0.3).astype(dtype)], {}))
register("nonzero_shape", OpKind.OPAQUE, lambda ts, node: _vector(2),
         numpy=lambda xs, node: [np.array(_nonzero_np(xs, node)[0].shape, np.int64)],
         float64=True, sample=lambda rng, dtype: (
             [(rng.uniform(-1, 1, (3, 4)) > 0.3).astype(dtype)], {}))


def _iou(a: np.ndarray, b: np.ndarray, center: int) -> float:
    """Intersection over union of two boxes ([y1, x1, y2, x2] or [xc, yc, w, h])."""
    if center:
        a = np.array([a[1] - a[3] / 2, a[0] - a[2] / 2, a[1] + a[3] / 2, a[0] + a[2] / 2])
        b = np.array([b[1] - b[3] / 2, b[0] - b[2] / 2, b[1] + b[3] / 2, b[0] + b[2] / 2])
    ay1, ay2 = sorted((a[0], a[2]))
    ax1, ax2 = sorted((a[1], a[3]))
    by1, by2 = sorted((b[0], b[2]))
    bx1, bx2 = sorted((b[1], b[3]))
    inter = max(min(ay2, by2) - max(ay1, by1), 0) * max(min(ax2, bx2) - max(ax1, bx1), 0)
    union = (ay2 - ay1) * (ax2 - ax1) + (by2 - by1) * (bx2 - bx1) - inter
    return inter / union if union > 0 else 0.0


def _nms_np(xs, node):
    boxes, scores, max_out, iou, threshold = xs
    limit, iou, threshold = int(max_out.reshape(-1)[0]), float(iou.reshape(-1)[0]), \
        float(threshold.reshape(-1)[0])
    rows = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            kept: list[int] = []
            for i in np.argsort(-s, kind="stable"):
                if len(kept) >= limit or s[i] <= threshold:
                    break
                if all(_iou(boxes[b, i], boxes[b, j], node.attr("center_point_box")) <= iou
                       for j in kept):
                    kept.append(int(i))
            rows += [[b, c, i] for i in kept]
    return [np.array(rows, np.int64).reshape(-1, 3)]


def _nms_infer(ts, node):
    boxes, scores = ts[0], ts[1]
    if len(boxes.shape) != 3 or boxes.shape[2] != 4 or len(scores.shape) != 3 or \
            scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ModelError(f"node {node.name!r} (NonMaxSuppression): boxes {list(boxes.shape)} "
                         f"and scores {list(scores.shape)} do not match")
    return [TensorType((node.attr("rows"), 3), "int64")]


def _nms_sample(rng, dtype):
    boxes = rng.uniform(0, 1, (1, 6, 4)).astype(dtype)
    boxes[..., 2:] += boxes[..., :2]
    return ([boxes, rng.uniform(0, 1, (1, 2, 6)).astype(dtype), np.array([3], np.int64),
             np.array([0.5], dtype), np.array([0.2], dtype)], {"center_point_box": 0,
                                                                "rows": 6})


register("nms", OpKind.OPAQUE, _nms_infer, numpy=_nms_np, float64=True, sample=_nms_sample)
register("nms_shape", OpKind.OPAQUE, lambda ts, node: _vector(2),
         numpy=lambda xs, node: [np.array([int((xs[0][:, 0] >= 0).sum()), 3], np.int64)],
         sample=lambda rng, dtype: ([np.array([[0, 0, 1], [-1, -1, -1]], np.int64)], {}))


def _unique_np(xs, node):
    """(values, first indices, inverse, counts) of ONNX Unique: of the flattened x, or
    of its slices along `axis` (-1: flattened)."""
    x, axis = xs[0], node.attr("axis")
    x = x.reshape(-1) if axis == -1 else x
    axis = 0 if axis == -1 else axis
    values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                               return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not node.attr("sorted"):  # in order of first occurrence
        order = np.argsort(first, kind="stable")
        values, first, counts = np.take(values, order, axis), first[order], counts[order]
        inverse = np.argsort(order)[inverse]
    return [values, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]


def _slices(t: TensorType, node) -> int:
    """How many elements (axis -1) or slices Unique compares."""
    return t.size if node.attr("axis") == -1 else t.shape[node.attr("axis")]


def _unique_infer(ts, node):
    if node.attr("output") != 0:
        return _vector(_slices(ts[0], node))
    return [TensorType((ts[0].size,) if node.attr("axis") == -1 else ts[0].shape, ts[0].dtype)]


def _unique_sample(rng, dtype):
    x = rng.integers(0, 2, (3, 4)).astype(dtype)
    x[:, 2] = x[:, 0]
    return [x], {"sorted": 0, "output": 0, "axis": 1}


register("unique", OpKind.OPAQUE, _unique_infer, float64=True, sample=_unique_sample,
         numpy=lambda xs, node: [_unique_np(xs, node)[node.attr("output")]])
register("unique_inverse", OpKind.OPAQUE, lambda ts, node: _vector(_slices(ts[0], node)),
         numpy=lambda xs, node: [_unique_np(xs, node)[2]], float64=True,
         sample=lambda rng, dtype: ([rng.integers(0, 4, (3, 4)).astype(dtype)],
                                    {"sorted": 1, "axis": -1}))
register("unique_shape", OpKind.OPAQUE,
         lambda ts, node: _vector(len(_unique_infer(ts, node)[0].shape)), float64=True,
         numpy=lambda xs, node: [np.array(_unique_np(xs, node)[node.attr("output")].shape,
                                          np.int64)],
         sample=_unique_sample)


def _topk_shape_np(xs, node):
    shape = list(xs[0].shape)
    shape[node.attr("axis")] = int(xs[1].reshape(-1)[0])
    return [np.array(shape, np.int64)]


register("topk_shape", OpKind.OPAQUE, lambda ts, node: _vector(len(ts[0].shape)),
         numpy=_topk_shape_np, float64=True, uint64=True,
         sample=lambda rng, dtype: ([rng.uniform(size=(2, 5)).astype(dtype),
                                     np.array([3], np.int64)], {"axis": 1}))


def _range_count(start, limit, delta) -> int:
    return max(math.ceil((float(limit) - float(start)) / float(delta)), 0)


def _range_np(xs, node):
    start, limit, delta = (x.reshape(()) for x in xs[:3])
    n = _range_count(start, limit, delta)
    return [(start + np.arange(n) * delta).astype(start.dtype)]


def _scalars(rng, dtype):
    return [np.array(v, dtype) for v in (1.5, 9.0, 2.0)], {}


register("range", OpKind.OPAQUE, lambda ts, node: [TensorType((0,), ts[0].dtype)],
         numpy=_range_np, float64=True, sample=_scalars)
register("range_shape", OpKind.OPAQUE, lambda ts, node: _vector(1), float64=True,
         numpy=lambda xs, node: [np.array([_range_count(*(x.reshape(()) for x in xs))],
                                          np.int64)], sample=_scalars)


def _fill_np(xs, node):
    return [np.full(tuple(int(d) for d in xs[0]), node.attr("value"), node.attr("dtype"))]


register("fill", OpKind.OPAQUE,
         lambda ts, node: [TensorType((0,) * ts[0].size, node.attr("dtype"))],
         numpy=_fill_np, float64=True,
         sample=lambda rng, dtype: ([np.array([2, 3], np.int64)],
                                    {"value": 1.5, "dtype": dtype}))
register("fill_shape", OpKind.OPAQUE, lambda ts, node: _vector(ts[0].size),
         numpy=lambda xs, node: [xs[0].astype(np.int64)],
         sample=lambda rng, dtype: ([np.array([2, 3], np.int64)], {}))


def _expand_to_np(xs, node):
    x, shape = xs[0], tuple(int(d) for d in xs[1])
    return [x * np.ones(shape, x.dtype)]


def _expand_sample(rng, dtype):
    return [rng.uniform(size=(3, 1)).astype(dtype), np.array([2, 1, 4], np.int64)], {}


register("expand_to", OpKind.OPAQUE,
         lambda ts, node: [TensorType((0,) * max(len(ts[0].shape), ts[1].size), ts[0].dtype)],
         numpy=_expand_to_np, float64=True, uint64=True, sample=_expand_sample)
register("expand_to_shape", OpKind.OPAQUE,
         lambda ts, node: _vector(max(len(ts[0].shape), ts[1].size)), float64=True, uint64=True,
         numpy=lambda xs, node: [np.array(_expand_to_np(xs, node)[0].shape, np.int64)],
         sample=_expand_sample)
