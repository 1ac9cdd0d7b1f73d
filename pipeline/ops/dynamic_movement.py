"""Reshape, Slice and Tile whose shape-giving inputs are runtime values: data-dependent
operators the VM runs (pipeline/ops/dynamic.py says how; DATA_DEPENDENT lists them).

  reshape_to(x, shape; allowzero)            x's elements at the shape `shape` resolves
                                             to (0 copies x's dimension unless
                                             allowzero, -1 is inferred): a view of x
  slice_to(x, starts, ends, axes, steps)     ONNX Slice; bound: x's shape
  tile_to(x, repeats, shape)                 x repeated `repeats` times per dimension,
                                             allocated at run time
and their shape operators: reshape_to_shape(x, shape; allowzero),
slice_to_shape(x, starts, ends, axes, steps), tile_to_shape(x, repeats).

Lowerings: pipeline/kernels/dynamic_movement.py.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register


def _vector(n: int) -> list[TensorType]:
    return [TensorType((n,), "int64")]


def _reshaped(shape, target, allowzero: int) -> tuple[int, ...]:
    out = [shape[i] if d == 0 and not allowzero else int(d) for i, d in enumerate(target)]
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(shape) // known if known else 0
    if math.prod(out) != math.prod(shape):
        raise ModelError(f"cannot reshape {list(shape)} to {list(target)}")
    return tuple(out)


def _reshape_to_np(xs, node):
    return [xs[0].reshape(_reshaped(xs[0].shape, xs[1].tolist(), node.attr("allowzero")))]


def _reshape_to_infer(ts, node):
    size, rank = ts[0].size, ts[1].size
    return [TensorType((size,) + (1,) * (rank - 1) if rank else (), ts[0].dtype)]


def _reshape_sample(rng, dtype):
    return [rng.uniform(size=(2, 3, 4)).astype(dtype), np.array([0, -1, 2], np.int64)], {
        "allowzero": 0}


register("reshape_to", OpKind.OPAQUE, _reshape_to_infer, numpy=_reshape_to_np, float64=True,
         uint64=True, sample=_reshape_sample)
register("reshape_to_shape", OpKind.OPAQUE, lambda ts, node: _vector(ts[1].size),
         numpy=lambda xs, node: [np.array(_reshape_to_np(xs, node)[0].shape, np.int64)],
         float64=True, uint64=True, sample=_reshape_sample)


def _slice_to_np(xs, node):
    x, starts, ends, axes, steps = xs
    index = [slice(None)] * x.ndim
    for k, axis in enumerate(axes.tolist()):
        index[axis] = slice(int(starts[k]), int(ends[k]), int(steps[k]))
    return [x[tuple(index)]]


def _slice_sample(rng, dtype):
    return [rng.uniform(size=(4, 5)).astype(dtype), np.array([1, -1], np.int64),
            np.array([10, 0], np.int64), np.array([0, -1], np.int64),
            np.array([2, -2], np.int64)], {}


register("slice_to", OpKind.OPAQUE, lambda ts, node: [ts[0]], numpy=_slice_to_np,
         float64=True, uint64=True, sample=_slice_sample)
register("slice_to_shape", OpKind.OPAQUE, lambda ts, node: _vector(len(ts[0].shape)),
         numpy=lambda xs, node: [np.array(_slice_to_np(xs, node)[0].shape, np.int64)],
         float64=True, uint64=True, sample=_slice_sample)


def _tile_sample(rng, dtype):
    return [rng.uniform(size=(2, 3)).astype(dtype), np.array([2, 1], np.int64)], {}


register("tile_to", OpKind.OPAQUE,
         lambda ts, node: [TensorType((0,) * len(ts[0].shape), ts[0].dtype)],
         numpy=lambda xs, node: [np.tile(xs[0], xs[1].tolist())], float64=True,
         uint64=True, sample=_tile_sample)
register("tile_to_shape", OpKind.OPAQUE, lambda ts, node: _vector(len(ts[0].shape)),
         numpy=lambda xs, node: [np.array(np.tile(xs[0], xs[1].tolist()).shape, np.int64)],
         float64=True, uint64=True, sample=_tile_sample)
