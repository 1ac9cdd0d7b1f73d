"""The movement operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/movement.py
Their ONNX converters: pipeline/frontend/onnx/movement.py
"""

from __future__ import annotations

from functools import reduce

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.movement_tables import (
    depth_to_space_tables,
    space_to_depth_tables,
    tile_tables,
    transpose_tables,
)
from pipeline.ops.registry import OpKind, get, register


def remap_numpy(tables_of):
    """The numpy implementation matching `remap_lower(tables_of)`."""
    def run(xs, node):
        x = xs[0]
        in_type = TensorType(x.shape, str(x.dtype))
        out_type = get(node.op).infer([in_type], node)[0]
        tables = tables_of(node, in_type, out_type)
        offsets = reduce(np.add, np.ix_(*tables), np.zeros((), np.int64))
        values = x.reshape(-1)[np.maximum(offsets, 0)] if x.size else \
            np.zeros(offsets.shape, x.dtype)
        return [np.where(offsets >= 0, values, np.asarray(node.attr("value", 0), x.dtype))]
    return run


def register_remap(name: str, infer, tables_of, sample=None) -> None:
    """Register a data-movement op lowered by its index tables (pipeline/kernels/
    movement.py remap_lower; pipeline/ops/movement_tables.py has the tables)."""
    register(name, OpKind.ANCHOR, infer, numpy=remap_numpy(tables_of), float64=True,
             sample=sample, uint64=True)


def _sample(shape: tuple[int, ...], **attrs):
    """A sample (tests/ops/test_registry_ops.py): one float input of `shape`, `attrs`."""
    return lambda rng, dtype: ([rng.uniform(-2, 2, shape).astype(dtype)], attrs)


def _transpose_infer(types, node):
    return [TensorType(tuple(types[0].shape[p] for p in node.attr("perm")), types[0].dtype)]


register_remap("transpose", _transpose_infer, transpose_tables,
               _sample((2, 3, 4), perm=(2, 0, 1)))


def _tile_infer(types, node):
    reps = node.attr("repeats")
    return [TensorType(tuple(d * r for d, r in zip(types[0].shape, reps, strict=True)),
                       types[0].dtype)]


register_remap("tile", _tile_infer, tile_tables, _sample((2, 1, 3), repeats=(2, 3, 1)))


def _depth_to_space_infer(types, node):
    b = node.attr("blocksize")
    n, c, h, w = types[0].shape
    if c % (b * b):
        raise ModelError(f"node {node.name!r} (depth_to_space): {c} channels are not a "
                         f"multiple of blocksize^2 = {b * b}")
    return [TensorType((n, c // (b * b), h * b, w * b), types[0].dtype)]


register_remap("depth_to_space", _depth_to_space_infer, depth_to_space_tables,
               _sample((1, 8, 2, 3), blocksize=2, mode="CRD"))


def _space_to_depth_infer(types, node):
    b = node.attr("blocksize")
    n, c, h, w = types[0].shape
    if h % b or w % b:
        raise ModelError(f"node {node.name!r} (space_to_depth): {h}x{w} is not a multiple "
                         f"of blocksize {b}")
    return [TensorType((n, c * b * b, h // b, w // b), types[0].dtype)]


register_remap("space_to_depth", _space_to_depth_infer, space_to_depth_tables,
               _sample((1, 2, 4, 6), blocksize=2, mode="DCR"))
