"""Data movement by index tables: Transpose, Tile, DepthToSpace, SpaceToDepth,
and the lowering Slice, Pad and Resize (nearest) share with them.

`remap_lower`: output element (i0, .., ik) reads input element
sum_d table_d[i_d], one table of flat-offset contributions per output axis,
computed here in Python. An affine table (a + b * i) becomes arithmetic, so
plain transposes and slices stay loop-index arithmetic; others (tile, reflect
padding) become constant arrays in the kernel. Tables are O(sum of dims),
never O(size).
"""

from __future__ import annotations

import numpy as np

from pipeline.dsl.vector import ELEMENT_WORK, parallel_nest
from pipeline.ir.graph import row_major_strides
from pipeline.kernels.registry import lowering
from pipeline.kernels.runtime_dims import transpose_dims
from pipeline.ops.movement_tables import (
    depth_to_space_tables,
    space_to_depth_tables,
    tile_tables,
    transpose_tables,
)


def remap_lower(tables_of):
    """A `lower` for an op whose tables are `tables_of(node, in_type, out_type)`;
    positions whose offset is negative get the node's `value` attribute (or 0)."""
    def lower(kb, node, ins, out, epilogue):
        tables = tables_of(node, ins[0].type, out.type)
        padded = any((t < 0).any() for t in tables)
        shape = out.type.shape
        if epilogue is None and not padded:
            shape, tables = merge_axes(shape, tables)
        with parallel_nest(kb, shape, "o", work=out.type.size * ELEMENT_WORK) as index:
            offset = 0
            for i, t in zip(index, tables, strict=True):
                offset = offset + axis_term(kb, t, i)
            if padded:
                offset = kb.i64(offset) if isinstance(offset, int) else offset
                inside = offset >= 0
                value = kb.load(ins[0], kb.select(inside, offset, 0))
                value = kb.select(inside, value, kb.const(node.attr("value", 0), value.type))
            else:
                value = kb.load(ins[0], offset)
            if epilogue is not None:
                value = epilogue(value, index)
            kb.store(out, kb.dot(index, row_major_strides(shape)), value)
    return lower


def merge_axes(shape: tuple[int, ...], tables: list) -> tuple[tuple[int, ...], list]:
    """The output viewed with fewer axes: an axis whose table is affine with a step of
    the next (affine) axis's step times its length reads on where that axis ends, so
    the two are one axis (a transpose's untouched trailing axes become one long,
    contiguous inner loop); size-1 axes fold into their neighbour. Tables must not
    hold OUTSIDE entries."""
    def step(t):
        return int(t[1] - t[0]) if len(t) > 1 and (np.diff(t) == t[1] - t[0]).all() else None

    dims, tabs = [], []
    for d, t in zip(shape, tables, strict=True):
        if dims and d == 1:
            tabs[-1] = tabs[-1] + t[0]
        elif dims and dims[-1] == 1:
            dims[-1], tabs[-1] = d, t + tabs[-1][0]
        elif dims and step(t) is not None and step(tabs[-1]) == step(t) * d:
            dims[-1] *= d
            tabs[-1] = tabs[-1][0] + t[0] + step(t) * np.arange(dims[-1], dtype=np.int64)
        else:
            dims.append(d)
            tabs.append(t)
    return tuple(dims), tabs


def axis_term(kb, table: np.ndarray, i):
    """table[i] as LLVM code: arithmetic if the table is affine, else a constant array."""
    if len(table) <= 1:
        return int(table[0]) if len(table) else 0
    step = int(table[1] - table[0])
    if (np.diff(table) == step).all():
        return i * step + int(table[0])
    return kb.load_table(kb.table(table.tolist()), i)


lowering("transpose", lower=remap_lower(transpose_tables), lower_dims=transpose_dims)

lowering("tile", lower=remap_lower(tile_tables))

lowering("depth_to_space", lower=remap_lower(depth_to_space_tables))

lowering("space_to_depth", lower=remap_lower(space_to_depth_tables))
