"""Element-indexed gathers and scatters: GatherElements, ScatterElements, ScatterND;
ReverseSequence (a gather_elements with constant indices).

Their indices are read at run time: a negative index counts from the end of its
axis, and an index outside the data makes the kernel return an error code, which
the executor raises as a RuntimeError (as Gather does, pipeline/ops/index.py).
All three are dtype-generic (float32/64, int64/32, bool data).

Graph ops:
  gather_elements(data, indices; axis)          out[i] = data[i with i[axis] = indices[i]]
  scatter_elements(data, indices, updates; axis, reduction)
  scatter_nd(data, indices, updates; reduction)
reduction is none, add, mul, max or min; with none, of two updates to one
element the later (in row-major order) wins, as in onnxruntime.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.dsl.builder import LLVM_TYPES
from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import onnx_op, register
from pipeline.ops.shape import need_const, norm_axis

_INDEX_DTYPES = ("int64", "int32")
_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _check_indices(node: Node, indices: TensorType) -> None:
    if indices.dtype not in _INDEX_DTYPES:
        raise ModelError(f"node {node.name!r} ({node.op}): indices dtype {indices.dtype} is "
                         "not supported (int64, int32 are)")


def _combine(kb, reduction: str, old, new):
    """`new` merged into `old` by the scatter's reduction (bool: and/or for mul/add)."""
    if reduction == "none":
        return new
    if old.type == LLVM_TYPES["bool"]:  # 0/1: add and max are or, mul and min are and
        return (kb.or_ if reduction in ("add", "max") else kb.and_)(old, new)
    return kb.arith(reduction, old, new)


def _copy(kb, src, out) -> None:
    with kb.loop(0, out.type.size, "c") as i:
        kb.store(out, i, kb.load(src, i))


# -- GatherElements ------------------------------------------------------------------------

def _gather_elements_infer(types, node):
    data, indices = types
    _check_indices(node, indices)
    if len(indices.shape) != len(data.shape):
        raise ModelError(f"node {node.name!r} (gather_elements): indices rank "
                         f"{len(indices.shape)} differs from data rank {len(data.shape)}")
    return [TensorType(indices.shape, data.dtype)]


def _gather_elements_lower(kb, node, ins, out, epilogue):
    data, indices = ins
    axis = node.attr("axis")
    with kb.nest(out.type.shape, "o") as index:
        k = kb.checked_index(kb.load(indices, kb.dot(index, indices.strides)),
                             data.type.shape[axis])
        src = kb.dot([k if d == axis else i for d, i in enumerate(index)], data.strides)
        value = kb.load(data, src)
        if epilogue is not None:
            value = epilogue(value, index)
        kb.store(out, kb.dot(index, out.strides), value)


def _gather_elements_np(xs, node):
    data, indices = xs
    axis = node.attr("axis")
    return [np.take_along_axis(data, np.where(indices < 0, indices + data.shape[axis],
                                              indices), axis)]


register("gather_elements", "anchor", _gather_elements_infer, lower=_gather_elements_lower,
         numpy=_gather_elements_np, float64=True,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (3, 4)).astype(dtype),
                                     rng.integers(-4, 4, (3, 2))], {"axis": 1}))


@onnx_op("GatherElements", 11, emits=("gather_elements",))
def _gather_elements(ctx, n):
    rank = len(ctx.type(n.inputs[0]).shape)
    return [Node.make("gather_elements", n.name, n.inputs[:2], n.outputs[:1],
                      axis=norm_axis(n, int(n.attrs.get("axis", 0)), rank))]



@onnx_op("ReverseSequence", 10, emits=("gather_elements",), build_time_inputs=(1,))
def _reverse_sequence(ctx, n):
    """The first sequence_lens[b] steps of each batch entry b reversed along time_axis,
    the rest kept: a gather_elements with constant indices."""
    shape = ctx.type(n.inputs[0]).shape
    time_axis, batch_axis = (int(n.attrs.get(k, d)) for k, d in
                             (("time_axis", 0), ("batch_axis", 1)))
    lens = need_const(ctx, n, 1, "sequence_lens").reshape(-1)
    if len(shape) < 2 or {time_axis, batch_axis} != {0, 1} or lens.size != shape[batch_axis] \
            or np.any((lens < 0) | (lens > shape[time_axis])):
        raise ModelError(f"node {n.name!r} (ReverseSequence): needs time and batch axes 0 "
                         f"and 1 and lengths within [0, {shape[time_axis]}] for each of "
                         f"{shape[batch_axis]} batch entries, got {lens.tolist()}")
    t = np.arange(shape[time_axis])[:, None]  # [time, batch]
    steps = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)
    if batch_axis == 0:
        steps = steps.T
    indices = np.broadcast_to(steps.reshape(steps.shape + (1,) * (len(shape) - 2)), shape)
    name = ctx.add_param(f"{n.name}_steps", np.ascontiguousarray(indices, np.int64))
    return [Node.make("gather_elements", n.name, (n.inputs[0], name), n.outputs[:1],
                      axis=time_axis)]

# -- ScatterElements ---------------------------------------------------------------------

def _scatter_elements_infer(types, node):
    data, indices, updates = types
    _check_indices(node, indices)
    if indices.shape != updates.shape or len(indices.shape) != len(data.shape) \
            or updates.dtype != data.dtype:
        raise ModelError(f"node {node.name!r} (scatter_elements): indices {list(indices.shape)}"
                         f" and updates {list(updates.shape)} {updates.dtype} must match and "
                         f"have the rank of data {list(data.shape)} {data.dtype}")
    return [data]


def _scatter_elements_lower(kb, node, ins, out, epilogue):
    data, indices, updates = ins
    axis, reduction = node.attr("axis"), node.attr("reduction")
    _copy(kb, data, out)
    with kb.nest(updates.type.shape, "u") as index:
        k = kb.checked_index(kb.load(indices, kb.dot(index, indices.strides)),
                             data.type.shape[axis])
        dst = kb.dot([k if d == axis else i for d, i in enumerate(index)], out.strides)
        value = kb.load(updates, kb.dot(index, updates.strides))
        kb.store(out, dst, _combine(kb, reduction, kb.load(out, dst), value))


register("scatter_elements", "opaque", _scatter_elements_infer, lower=_scatter_elements_lower,
         float64=True)


@onnx_op("Scatter", 9, emits=("scatter_elements",))
@onnx_op("ScatterElements", 11, emits=("scatter_elements",))
def _scatter_elements(ctx, n):
    rank = len(ctx.type(n.inputs[0]).shape)
    return [Node.make("scatter_elements", n.name, n.inputs[:3], n.outputs[:1],
                      axis=norm_axis(n, int(n.attrs.get("axis", 0)), rank),
                      reduction=n.text("reduction", "none", _REDUCTIONS))]


# -- ScatterND ---------------------------------------------------------------------------

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


def _scatter_nd_lower(kb, node, ins, out, epilogue):
    """Per index tuple (the last axis of indices): the slice of data it names gets
    the matching slice of updates, element by element."""
    data, indices, updates = ins
    k = indices.type.shape[-1]
    lead = indices.type.shape[:-1]
    block = math.prod(data.type.shape[k:])
    _copy(kb, data, out)
    with kb.nest(lead, "n") as index:
        base = kb.dot(index, indices.strides[:-1])
        dst = 0
        for d in range(k):
            at = kb.checked_index(kb.load(indices, base + d), data.type.shape[d])
            dst = dst + at * out.strides[d]
        src = kb.dot(index, updates.strides[:len(lead)])
        with kb.loop(0, block, "e") as e:
            o = dst + e
            value = kb.load(updates, src + e)
            kb.store(out, o, _combine(kb, node.attr("reduction"), kb.load(out, o), value))


register("scatter_nd", "opaque", _scatter_nd_infer, lower=_scatter_nd_lower, float64=True)


@onnx_op("ScatterND", 11, emits=("scatter_nd",))
def _scatter_nd(ctx, n):
    return [Node.make("scatter_nd", n.name, n.inputs[:3], n.outputs[:1],
                      reduction=n.text("reduction", "none", _REDUCTIONS))]
