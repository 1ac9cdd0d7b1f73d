"""Shape and layout operators: Reshape, Flatten, Concat.

Their shape arguments must be known at build time (initializers or values
constant folding can compute); a data-dependent shape is a clear error.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import onnx_op, register


def _reshape_infer(types, node):
    shape = tuple(node.attr("shape"))
    if math.prod(shape) != types[0].size:
        raise ModelError(f"node {node.name!r} (reshape): cannot reshape "
                         f"{list(types[0].shape)} to {list(shape)}")
    return [TensorType(shape, types[0].dtype)]


def _copy_lower(kb, node, ins, out, epilogue):
    """A reshape moves no data in a row-major layout: copy element by element."""
    with kb.loop(0, out.type.size, "i") as i:
        kb.store(out, i, kb.load(ins[0], i))


register("reshape", "opaque", _reshape_infer, lower=_copy_lower,
         numpy=lambda xs, node: [xs[0].reshape(node.attr("shape"))])


def resolve_reshape(name: str, in_shape: tuple[int, ...], target, allowzero: bool = False):
    """ONNX Reshape semantics: 0 copies the input dim (unless allowzero), -1 is inferred."""
    out = [in_shape[i] if (d == 0 and not allowzero) else int(d)
           for i, d in enumerate(target)]
    if out.count(-1) > 1:
        raise ModelError(f"node {name!r} (Reshape): more than one -1 in {list(target)}")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        total = math.prod(in_shape)
        if known == 0 or total % known:
            raise ModelError(f"node {name!r} (Reshape): cannot reshape {list(in_shape)} "
                             f"to {list(target)}")
        out[out.index(-1)] = total // known
    return tuple(out)


@onnx_op("Reshape", 1)
def _reshape_v1(ctx, n):
    shape = resolve_reshape(n.name, ctx.type(n.inputs[0]).shape, n.attrs["shape"])
    return [Node.make("reshape", n.name, n.inputs[:1], n.outputs, shape=shape)]


@onnx_op("Reshape", 5)
def _reshape_v5(ctx, n):
    target = ctx.const(n.inputs[1])
    if target is None:
        raise ModelError(f"node {n.name!r} (Reshape): the shape input {n.inputs[1]!r} "
                         "must be known at build time")
    shape = resolve_reshape(n.name, ctx.type(n.inputs[0]).shape, target.tolist(),
                            bool(n.attrs.get("allowzero", 0)))
    return [Node.make("reshape", n.name, n.inputs[:1], n.outputs, shape=shape)]


@onnx_op("Flatten", 1)
def _flatten(ctx, n):
    in_shape = ctx.type(n.inputs[0]).shape
    axis = int(n.attrs.get("axis", 1))
    axis = axis + len(in_shape) if axis < 0 else axis  # ONNX: axis in [-rank, rank]
    shape = (math.prod(in_shape[:axis]), math.prod(in_shape[axis:]))
    return [Node.make("reshape", n.name, n.inputs[:1], n.outputs, shape=shape)]


# -- Concat ------------------------------------------------------------------------

def _concat_infer(types, node):
    axis = node.attr("axis")
    first = types[0].shape
    for t in types[1:]:
        if len(t.shape) != len(first) or any(
                a != b for d, (a, b) in enumerate(zip(t.shape, first, strict=True))
                if d != axis):
            raise ModelError(f"node {node.name!r} (concat): shapes "
                             f"{[list(t.shape) for t in types]} differ off axis {axis}")
    total = sum(t.shape[axis] for t in types)
    return [TensorType(first[:axis] + (total,) + first[axis + 1:], types[0].dtype)]


def _concat_lower(kb, node, ins, out, epilogue):
    axis = node.attr("axis")
    shape = out.type.shape
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    offset = 0
    for x in ins:
        width = x.type.shape[axis] * inner
        with kb.loop(0, outer, "o") as o, kb.loop(0, width, "j") as j:
            src = kb.add(kb.mul(o, width), j)
            dst = kb.add(kb.mul(o, shape[axis] * inner), kb.add(j, offset))
            kb.store(out, dst, kb.load(x, src))
        offset += width


register("concat", "opaque", _concat_infer, lower=_concat_lower,
         numpy=lambda xs, node: [np.concatenate(xs, axis=node.attr("axis"))])


@onnx_op("Concat", 1)
def _concat(ctx, n):
    rank = len(ctx.type(n.inputs[0]).shape)
    axis = int(n.attrs.get("axis", 1))
    if not -rank <= axis < rank:
        raise ModelError(f"node {n.name!r} (Concat): axis {axis} out of range for rank {rank}")
    return [Node.make("concat", n.name, [i for i in n.inputs if i], n.outputs, axis=axis % rank)]
