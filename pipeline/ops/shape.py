"""The shape operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/shape.py
Their ONNX converters: pipeline/frontend/onnx/shape.py
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.dims import dim_product, dim_sum
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, broadcast_shape, register


def _reshape_infer(types, node):
    shape = tuple(node.attr("shape"))
    if dim_product(shape) != dim_product(types[0].shape):
        raise ModelError(f"node {node.name!r} (reshape): cannot reshape "
                         f"{list(types[0].shape)} to {list(shape)}")
    return [TensorType(shape, types[0].dtype)]


register("reshape", OpKind.OPAQUE, _reshape_infer, float64=True, uint64=True,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (2, 3, 4)).astype(dtype)],
                                    {"shape": (4, 6)}),
         numpy=lambda xs, node: [xs[0].reshape(node.attr("shape"))])


def _concat_infer(types, node):
    axis = node.attr("axis")
    first = types[0].shape
    for t in types[1:]:
        if len(t.shape) != len(first) or t.dtype != types[0].dtype or any(
                a != b for d, (a, b) in enumerate(zip(t.shape, first, strict=True))
                if d != axis):
            raise ModelError(f"node {node.name!r} (concat): inputs "
                             f"{[t.to_json() for t in types]} differ off axis {axis}")
    total = dim_sum(t.shape[axis] for t in types)
    return [TensorType(first[:axis] + (total,) + first[axis + 1:], types[0].dtype)]


register("concat", OpKind.OPAQUE, _concat_infer, float64=True, uint64=True,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, s).astype(dtype)
                                     for s in ((2, 3), (2, 1), (2, 4))], {"axis": 1}),
         numpy=lambda xs, node: [np.concatenate(xs, axis=node.attr("axis"))])

register("expand", OpKind.ELEMENTWISE,
         lambda types, node: [TensorType(broadcast_shape(
             types[0].shape, tuple(node.attr("shape")), where=f"node {node.name!r}"),
             types[0].dtype)],
         numpy=lambda xs, node: [np.broadcast_to(
             xs[0], np.broadcast_shapes(xs[0].shape, tuple(node.attr("shape")))).copy()],
         float64=True, uint64=True,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (3, 1)).astype(dtype)],
                                    {"shape": (2, 3, 4)}))


# Values computed from symbolic dimensions (frontend/onnx/symbolic.py): `dims` holds
# ints and dimension expressions, evaluated by the kernel from its runtime dims; the
# inputs are only there to carry symbols the output's shape lacks (their data is
# not read). iota: out[i] = dims[0] + i * delta, i < dims[1] (a Range over a symbolic
# length); dim_values: the `dims` themselves in `shape` (a shape value read as data).
# (the numpy references take int dims only: what fold_constant and the tests give them)
register("iota", OpKind.OPAQUE,
         lambda types, node: [TensorType((node.attr("dims")[1],), node.attr("dtype"))],
         numpy=lambda xs, node: [(node.attr("dims")[0] + node.attr("delta") * np.arange(
             node.attr("dims")[1])).astype(node.attr("dtype"))], float64=True,
         sample=lambda rng, dtype: ([], {"dims": (3, 5), "delta": 1, "dtype": dtype}))
register("dim_values", OpKind.OPAQUE,
         lambda types, node: [TensorType(tuple(node.attr("shape")), node.attr("dtype"))],
         numpy=lambda xs, node: [np.array(node.attr("dims"), node.attr("dtype")).reshape(
             node.attr("shape"))], float64=True,
         sample=lambda rng, dtype: ([], {"dims": (3, 5), "shape": (2,), "dtype": dtype}))
