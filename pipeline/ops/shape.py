"""Shape and layout operators: Reshape, Flatten, Squeeze, Unsqueeze, Concat,
Expand, Transpose, Tile, DepthToSpace, SpaceToDepth; Shape, Size,
ConstantOfShape and Range, whose values are known at build time.

Shape arguments must be known at build time (initializers, or values the
frontend computes from constants: ImportContext.const); a data-dependent
shape is a clear ModelError.

Pure data movement is lowered by `remap_lower`: output element (i0, .., ik)
reads input element sum_d table_d[i_d], one table of flat-offset
contributions per output axis, computed here in Python. An affine table
(a + b * i) becomes arithmetic, so plain transposes and slices stay
loop-index arithmetic; others (tile, reflect padding, resize) become
constant arrays in the kernel. Tables are O(sum of dims), never O(size).
"""

from __future__ import annotations

import math
from functools import reduce

import numpy as np

from pipeline.codegen.builder import row_major_strides
from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import broadcast_shape, get, onnx_op, register

# A table entry this negative marks an output position outside the input
# (constant padding): any sum containing it is negative, whatever the others add.
OUTSIDE = -(1 << 40)


def remap_lower(tables_of):
    """A `lower` for an op whose tables are `tables_of(node, in_type, out_type)`;
    positions whose offset is negative get the node's `value` attribute (or 0)."""
    def lower(kb, node, ins, out, epilogue):
        tables = tables_of(node, ins[0].type, out.type)
        padded = any((t < 0).any() for t in tables)
        with kb.nest(out.type.shape, "o") as index:
            offset = 0
            for i, t in zip(index, tables, strict=True):
                offset = kb.add(offset, axis_term(kb, t, i))
            offset = kb.idx(offset)
            if padded:
                inside = kb.b.icmp_signed(">=", offset, kb.i64(0))
                value = kb.load(ins[0], kb.b.select(inside, offset, kb.i64(0)))
                value = kb.b.select(inside, value, kb.const(node.attr("value", 0), value.type))
            else:
                value = kb.load(ins[0], offset)
            if epilogue is not None:
                value = epilogue(value, index)
            kb.store(out, kb.dot(index, out.strides), value)
    return lower


def axis_term(kb, table: np.ndarray, i):
    """table[i] as LLVM code: arithmetic if the table is affine, else a constant array."""
    if len(table) <= 1:
        return int(table[0]) if len(table) else 0
    step = int(table[1] - table[0])
    if (np.diff(table) == step).all():
        return kb.add(kb.mul(i, step), int(table[0]))
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


def register_remap(name: str, infer, tables_of) -> None:
    """Register a data-movement op lowered by its index tables."""
    register(name, "anchor", infer, lower=remap_lower(tables_of),
             numpy=remap_numpy(tables_of))


def need_const(ctx, n, pos: int, what: str) -> np.ndarray | None:
    """Input `pos` of ONNX node `n` as a build-time value (None if absent);
    ModelError naming the node if it is present but not constant."""
    if len(n.inputs) <= pos or not n.inputs[pos]:
        return None
    value = ctx.const(n.inputs[pos])
    if value is None:
        raise ModelError(f"node {n.name!r} ({n.op_type}): {what} {n.inputs[pos]!r} must be "
                         "known at build time")
    return value


def norm_axis(n, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ModelError(f"node {n.name!r} ({n.op_type}): axis {axis} out of range for "
                         f"rank {rank}")
    return axis % rank


# -- Reshape and friends: a copy in row-major layout ------------------------------------

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


def reshape(n, shape) -> list[Node]:
    return [Node.make("reshape", n.name, n.inputs[:1], n.outputs[:1],
                      shape=tuple(int(d) for d in shape))]


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
    return reshape(n, resolve_reshape(n.name, ctx.type(n.inputs[0]).shape, n.attrs["shape"]))


@onnx_op("Reshape", 5)
def _reshape_v5(ctx, n):
    target = need_const(ctx, n, 1, "the shape input")
    return reshape(n, resolve_reshape(n.name, ctx.type(n.inputs[0]).shape, target.tolist(),
                                      bool(n.attrs.get("allowzero", 0))))


@onnx_op("Flatten", 1)
def _flatten(ctx, n):
    in_shape = ctx.type(n.inputs[0]).shape
    axis = int(n.attrs.get("axis", 1))
    axis = axis + len(in_shape) if axis < 0 else axis  # ONNX: axis in [-rank, rank]
    return reshape(n, (math.prod(in_shape[:axis]), math.prod(in_shape[axis:])))


def _axes(ctx, n, since_input: int):
    """Squeeze/Unsqueeze axes: an attribute before opset 13, an input from 13."""
    if n.opset < since_input:
        return n.attrs.get("axes")
    value = need_const(ctx, n, 1, "the axes input")
    return None if value is None else value.tolist()


@onnx_op("Squeeze", 1)
def _squeeze(ctx, n):
    shape = ctx.type(n.inputs[0]).shape
    axes = _axes(ctx, n, 13)
    if axes is None:
        return reshape(n, [d for d in shape if d != 1])
    axes = {norm_axis(n, int(a), len(shape)) for a in axes}
    if any(shape[a] != 1 for a in axes):
        raise ModelError(f"node {n.name!r} (Squeeze): axes {sorted(axes)} of shape "
                         f"{list(shape)} are not all 1")
    return reshape(n, [d for k, d in enumerate(shape) if k not in axes])


@onnx_op("Unsqueeze", 1)
def _unsqueeze(ctx, n):
    shape = list(ctx.type(n.inputs[0]).shape)
    axes = _axes(ctx, n, 13)
    if axes is None:
        raise ModelError(f"node {n.name!r} (Unsqueeze): axes are required")
    rank = len(shape) + len(axes)
    for a in sorted(norm_axis(n, int(a), rank) for a in axes):
        shape.insert(a, 1)
    return reshape(n, shape)


# -- Concat ------------------------------------------------------------------------------

def _concat_infer(types, node):
    axis = node.attr("axis")
    first = types[0].shape
    for t in types[1:]:
        if len(t.shape) != len(first) or t.dtype != types[0].dtype or any(
                a != b for d, (a, b) in enumerate(zip(t.shape, first, strict=True))
                if d != axis):
            raise ModelError(f"node {node.name!r} (concat): inputs "
                             f"{[t.to_json() for t in types]} differ off axis {axis}")
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
    inputs = [i for i in n.inputs if i]
    rank = len(ctx.type(inputs[0]).shape)
    axis = norm_axis(n, int(n.attrs.get("axis", 1)), rank)
    return [Node.make("concat", n.name, inputs, n.outputs, axis=axis)]


# -- Expand: an elementwise op whose output is the broadcast shape -------------------------

register("expand", "elementwise",
         lambda types, node: [TensorType(broadcast_shape(
             types[0].shape, tuple(node.attr("shape")), where=f"node {node.name!r}"),
             types[0].dtype)],
         scalar=lambda kb, a, node: a[0],
         numpy=lambda xs, node: [np.broadcast_to(
             xs[0], np.broadcast_shapes(xs[0].shape, tuple(node.attr("shape")))).copy()])


@onnx_op("Expand", 8)
def _expand(ctx, n):
    shape = need_const(ctx, n, 1, "the shape input")
    return [Node.make("expand", n.name, n.inputs[:1], n.outputs[:1],
                      shape=tuple(int(d) for d in shape))]


# -- Transpose, Tile, DepthToSpace, SpaceToDepth: index tables --------------------------

def _transpose_infer(types, node):
    return [TensorType(tuple(types[0].shape[p] for p in node.attr("perm")), types[0].dtype)]


def _transpose_tables(node, x, out):
    strides = row_major_strides(x.shape)
    return [np.arange(d, dtype=np.int64) * strides[p]
            for d, p in zip(out.shape, node.attr("perm"), strict=True)]


register_remap("transpose", _transpose_infer, _transpose_tables)


@onnx_op("Transpose", 1)
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


register_remap("tile", _tile_infer, _tile_tables)


@onnx_op("Tile", 6)
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


register_remap("depth_to_space", _depth_to_space_infer, _depth_to_space_tables)


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


register_remap("space_to_depth", _space_to_depth_infer, _space_to_depth_tables)


def _block_converter(op: str):
    def convert(ctx, n):
        if len(ctx.type(n.inputs[0]).shape) != 4:
            raise ModelError(f"node {n.name!r} ({n.op_type}): only 4-D (NCHW) inputs are "
                             "supported")
        mode = n.attrs.get("mode", b"DCR")  # SpaceToDepth has it from opset 28
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1],
                          blocksize=int(n.attrs["blocksize"]),
                          mode=mode.decode() if isinstance(mode, bytes) else mode)]
    return convert


onnx_op("DepthToSpace", 1)(_block_converter("depth_to_space"))
onnx_op("SpaceToDepth", 1)(_block_converter("space_to_depth"))


# -- values known at build time: become constants, no node -------------------------------

@onnx_op("Shape", 1)
def _shape(ctx, n):
    shape = ctx.type(n.inputs[0]).shape
    rank = len(shape)
    start, end = int(n.attrs.get("start", 0)), int(n.attrs.get("end", rank))
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    ctx.set_const(n.outputs[0], np.array(shape[start:end], np.int64))
    return []


@onnx_op("Size", 1)
def _size(ctx, n):
    ctx.set_const(n.outputs[0], np.array(ctx.type(n.inputs[0]).size, np.int64))
    return []


@onnx_op("ConstantOfShape", 9)
def _constant_of_shape(ctx, n):
    from onnx import numpy_helper  # converters run at import, where onnx is loaded

    shape = need_const(ctx, n, 0, "the shape input")
    value = n.attrs.get("value")
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else \
        np.zeros(1, np.float32)
    ctx.set_const(n.outputs[0], np.full(tuple(int(d) for d in shape), fill[0], fill.dtype))
    return []


@onnx_op("Range", 11)
def _range(ctx, n):
    start, limit, delta = (need_const(ctx, n, k, what) for k, what in
                           enumerate(("start", "limit", "delta")))
    count = max(math.ceil((limit.item() - start.item()) / delta.item()), 0)
    ctx.set_const(n.outputs[0], (start + np.arange(count) * delta).astype(start.dtype))
    return []
