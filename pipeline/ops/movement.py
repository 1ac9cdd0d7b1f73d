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

from functools import reduce

import numpy as np

from pipeline.dsl.builder import row_major_strides
from pipeline.dsl.vector import ELEMENT_WORK, parallel_nest
from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import get, onnx_op, register
from pipeline.ops.shape import need_const

# A table entry this negative marks an output position outside the input
# (constant padding): any sum containing it is negative, whatever the others add.
OUTSIDE = -(1 << 40)


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
    """Register a data-movement op lowered by its index tables."""
    register(name, "anchor", infer, lower=remap_lower(tables_of),
             numpy=remap_numpy(tables_of), float64=True, sample=sample)


def _sample(shape: tuple[int, ...], **attrs):
    """A sample (tests/ops/test_registry_ops.py): one float input of `shape`, `attrs`."""
    return lambda rng, dtype: ([rng.uniform(-2, 2, shape).astype(dtype)], attrs)



# -- Transpose, Tile, DepthToSpace, SpaceToDepth: index tables --------------------------

def _transpose_infer(types, node):
    return [TensorType(tuple(types[0].shape[p] for p in node.attr("perm")), types[0].dtype)]


def _transpose_tables(node, x, out):
    strides = row_major_strides(x.shape)
    return [np.arange(d, dtype=np.int64) * strides[p]
            for d, p in zip(out.shape, node.attr("perm"), strict=True)]


register_remap("transpose", _transpose_infer, _transpose_tables,
               _sample((2, 3, 4), perm=(2, 0, 1)))


@onnx_op("Transpose", 1, emits=("transpose",))
def _transpose(ctx, n):
    rank = len(ctx.type(n.inputs[0]).shape)
    perm = [int(p) for p in n.attrs.get("perm", range(rank - 1, -1, -1))]
    if sorted(perm) != list(range(rank)):
        raise ModelError(f"node {n.name!r} (Transpose): perm {perm} is not a permutation "
                         f"of {rank} axes")
    return [Node.make("transpose", n.name, n.inputs[:1], n.outputs[:1], perm=perm)]


def _tile_infer(types, node):
    reps = node.attr("repeats")
    return [TensorType(tuple(d * r for d, r in zip(types[0].shape, reps, strict=True)),
                       types[0].dtype)]


def _tile_tables(node, x, out):
    strides = row_major_strides(x.shape)
    return [np.arange(o, dtype=np.int64) % d * s
            for o, d, s in zip(out.shape, x.shape, strides, strict=True)]


register_remap("tile", _tile_infer, _tile_tables, _sample((2, 1, 3), repeats=(2, 3, 1)))


@onnx_op("Tile", 6, emits=("tile",), build_time_inputs=(1,))
def _tile(ctx, n):
    reps = need_const(ctx, n, 1, "the repeats input").tolist()
    if len(reps) != len(ctx.type(n.inputs[0]).shape) or min(reps, default=0) < 0:
        raise ModelError(f"node {n.name!r} (Tile): repeats {reps} do not fit input "
                         f"{list(ctx.type(n.inputs[0]).shape)}")
    return [Node.make("tile", n.name, n.inputs[:1], n.outputs[:1], repeats=reps)]


def _depth_to_space_infer(types, node):
    b = node.attr("blocksize")
    n, c, h, w = types[0].shape
    if c % (b * b):
        raise ModelError(f"node {node.name!r} (depth_to_space): {c} channels are not a "
                         f"multiple of blocksize^2 = {b * b}")
    return [TensorType((n, c // (b * b), h * b, w * b), types[0].dtype)]


def _depth_to_space_tables(node, x, out):
    """DCR: channel (i * b + j) * C' + c; CRD: c * b * b + i * b + j, where (i, j)
    is the position inside the output's b x b block."""
    b, crd = node.attr("blocksize"), node.attr("mode") == "CRD"
    sn, sc, sh, sw = row_major_strides(x.shape)
    _, c_out, h_out, w_out = out.shape
    h, w = np.arange(h_out, dtype=np.int64), np.arange(w_out, dtype=np.int64)
    block_row, block_col = (b * sc, sc) if crd else (b * c_out * sc, c_out * sc)
    return [np.arange(out.shape[0], dtype=np.int64) * sn,
            np.arange(c_out, dtype=np.int64) * ((b * b if crd else 1) * sc),
            h % b * block_row + h // b * sh, w % b * block_col + w // b * sw]


register_remap("depth_to_space", _depth_to_space_infer, _depth_to_space_tables,
               _sample((1, 8, 2, 3), blocksize=2, mode="CRD"))


def _space_to_depth_infer(types, node):
    b = node.attr("blocksize")
    n, c, h, w = types[0].shape
    if h % b or w % b:
        raise ModelError(f"node {node.name!r} (space_to_depth): {h}x{w} is not a multiple "
                         f"of blocksize {b}")
    return [TensorType((n, c * b * b, h // b, w // b), types[0].dtype)]


def _space_to_depth_tables(node, x, out):
    """Output channel (i * b + j) * C + c (DCR; CRD: c * b * b + i * b + j) reads
    input channel c at row offset i, column offset j of the block."""
    b = node.attr("blocksize")
    sn, sc, sh, sw = row_major_strides(x.shape)
    c = x.shape[1]
    oc = np.arange(out.shape[1], dtype=np.int64)
    channel, block = (oc // (b * b), oc % (b * b)) if node.attr("mode") == "CRD" else \
        (oc % c, oc // c)
    return [np.arange(out.shape[0], dtype=np.int64) * sn,
            channel * sc + block // b * sh + block % b * sw,
            np.arange(out.shape[2], dtype=np.int64) * b * sh,
            np.arange(out.shape[3], dtype=np.int64) * b * sw]


register_remap("space_to_depth", _space_to_depth_infer, _space_to_depth_tables,
               _sample((1, 2, 4, 6), blocksize=2, mode="DCR"))


def _block_converter(op: str):
    def convert(ctx, n):
        if len(ctx.type(n.inputs[0]).shape) != 4:
            raise ModelError(f"node {n.name!r} ({n.op_type}): only 4-D (NCHW) inputs are "
                             "supported")
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1],
                          blocksize=int(n.attrs["blocksize"]),
                          mode=n.text("mode", "DCR"))]  # SpaceToDepth's from opset 28
    return convert


onnx_op("DepthToSpace", 1, emits=("depth_to_space",))(_block_converter("depth_to_space"))
onnx_op("SpaceToDepth", 1, emits=("space_to_depth",))(_block_converter("space_to_depth"))
