"""Element-indexed gathers and scatters: GatherElements, GatherND, ScatterElements,
ScatterND, TensorScatter; ReverseSequence (a gather_elements with constant indices).

Their indices are read at run time: a negative index counts from the end of its
axis, and an index outside the data makes the kernel return an error code, which
the executor raises as a RuntimeError (as Gather does, pipeline/ops/index.py).
All are dtype-generic (float32/64, int64/32, bool data).

Graph ops:
  gather_elements(data, indices; axis)          out[i] = data[i with i[axis] = indices[i]]
  gather_nd(data, indices; batch_dims)          out[i, :] = data[i[:batch_dims], indices[i], :]
  scatter_elements(data, indices, updates; axis, reduction)
  scatter_nd(data, indices, updates; reduction)
  tensor_scatter(past, update[, write_indices]; axis, circular)   a KV-cache write
reduction is none, add, mul, max or min; with none, of two updates to one
element the later (in row-major order) wins, as in onnxruntime.
"""

from __future__ import annotations

import math

from pipeline.dsl.builder import LLVM_TYPES
from pipeline.kernels.registry import lowering


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


lowering("gather_elements", lower=_gather_elements_lower)


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


lowering("scatter_elements", lower=_scatter_elements_lower)


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


lowering("scatter_nd", lower=_scatter_nd_lower)


def _gather_nd_lower(kb, node, ins, out, epilogue):
    """Per index tuple (the last axis of indices, after batch_dims leading dims shared
    with data): the slice of data it names, copied to the tuple's place in out."""
    data, indices = ins
    b, k = node.attr("batch_dims"), indices.type.shape[-1]
    lead = indices.type.shape[:-1]
    block = math.prod(data.type.shape[b + k:])
    with kb.nest(lead, "n") as index:
        base = kb.dot(index, indices.strides[:-1])
        src = kb.dot(index[:b], data.strides[:b])
        for d in range(k):
            at = kb.checked_index(kb.load(indices, base + d), data.type.shape[b + d])
            src = src + at * data.strides[b + d]
        dst = kb.dot(index, out.strides[:len(lead)])
        with kb.loop(0, block, "e") as e:
            kb.store(out, dst + e, kb.load(data, src + e))


lowering("gather_nd", lower=_gather_nd_lower)


def _tensor_scatter_lower(kb, node, ins, out, epilogue):
    """The cache copied, then per prefix (the dims before `axis`) update's rows written
    from write_indices[batch] on: modulo the axis length if circular, else all inside
    it (a write past the end, or a negative write index, fails the kernel)."""
    past, update = ins[:2]
    axis, circular = node.attr("axis"), node.attr("circular")
    length, rows = past.type.shape[axis], update.type.shape[axis]
    inner = math.prod(past.type.shape[axis + 1:])
    _copy(kb, past, out)
    with kb.nest(past.type.shape[:axis], "p") as prefix:
        start = kb.index(kb.load(ins[2], prefix[0])) if len(ins) > 2 else kb.i64(0)
        kb.fail_unless(start >= 0 if circular else kb.inside(start, 0, length - rows + 1))
        dst_base = kb.dot(prefix, out.strides[:axis])
        src_base = kb.dot(prefix, update.strides[:axis])
        with kb.loop(0, rows, "s") as s:
            row = (start + s) % length if circular else start + s
            dst, src = dst_base + row * inner, src_base + s * inner
            with kb.loop(0, inner, "e") as e:
                kb.store(out, dst + e, kb.load(update, src + e))


lowering("tensor_scatter", lower=_tensor_scatter_lower)
