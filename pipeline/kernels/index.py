"""Indexing operators: Gather, Compress (a gather), Slice, Split (as slices), Pad,
CenterCropPad (a pad), and OneHot (compare and Where).

Slice and Pad are lowered by index tables (pipeline/kernels/movement.py remap_lower):
all their arguments are build-time constants, normalised here to ONNX
semantics (negative indices, clamping, negative steps, negative pads).
Gather reads its indices at run time; an index outside the data makes the
kernel return an error code, which the executor raises as a RuntimeError.
"""

from __future__ import annotations

from pipeline.kernels.movement import remap_lower
from pipeline.kernels.registry import lowering
from pipeline.ops.index_tables import pad_tables, slice_tables


def _gather_lower(kb, node, ins, out, epilogue, shapes=None):
    """Per (outer, index) position: load and check the index once, then copy the
    contiguous row of trailing elements (a branch-free, vectorisable inner loop)."""
    data, indices = ins
    axis, rank = node.attr("axis"), len(indices.type.shape)
    dim = data.type.shape[axis]
    strides = data.strides
    head, tail = out.type.shape[:axis + rank], out.type.shape[axis + rank:]
    with kb.nest(head, "o") as index:
        k = kb.checked_index(kb.load(indices, kb.dot(index[axis:], indices.strides)), dim)
        src = kb.dot(index[:axis], strides[:axis]) + k * strides[axis]
        dst = kb.dot(index, out.strides[:axis + rank])
        with kb.nest(tail, "t") as rest:
            value = kb.load(data, src + kb.dot(rest, strides[axis + 1:]))
            if epilogue is not None:
                value = epilogue(value, index + rest)
            kb.store(out, dst + kb.dot(rest, out.strides[axis + rank:]), value)


# (the same loops serve runtime shapes: docs/vm.md, "Symbolic dimensions")
lowering("gather", lower=_gather_lower, lower_dims=_gather_lower)

lowering("slice", lower=remap_lower(slice_tables))

lowering("pad", lower=remap_lower(pad_tables))
