"""Indexing operators: Gather, Compress (a gather), Slice, Split (as slices), Pad,
CenterCropPad (a pad), and OneHot (compare and Where).

Slice and Pad are lowered by index tables (pipeline/ops/movement.py remap_lower):
all their arguments are build-time constants, normalised here to ONNX
semantics (negative indices, clamping, negative steps, negative pads).
Gather reads its indices at run time; an index outside the data makes the
kernel return an error code, which the executor raises as a RuntimeError.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.dsl.builder import row_major_strides
from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.movement import OUTSIDE, register_remap
from pipeline.ops.registry import onnx_op, register
from pipeline.ops.shape import need_const, norm_axis

# -- Gather ------------------------------------------------------------------------------


def _gather_infer(types, node):
    data, indices = types
    axis = node.attr("axis")
    if indices.dtype not in ("int64", "int32"):
        raise ModelError(f"node {node.name!r} (gather): indices dtype {indices.dtype} is "
                         "not supported (int64, int32 are)")
    shape = data.shape[:axis] + indices.shape + data.shape[axis + 1:]
    return [TensorType(shape, data.dtype)]


def _gather_lower(kb, node, ins, out, epilogue):
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


def _gather_np(xs, node):
    data, indices = xs
    dim = data.shape[node.attr("axis")]
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise ModelError(f"node {node.name!r} (Gather): indices out of range [-{dim}, {dim})")
    return [np.take(data, indices, axis=node.attr("axis"))]


register("gather", "anchor", _gather_infer, lower=_gather_lower, numpy=_gather_np,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (4, 3)).astype(dtype),
                                     rng.integers(-4, 4, (2, 2))], {"axis": 0}),
         float64=True)


@onnx_op("Gather", 1, emits=("gather",))
def _gather(ctx, n):
    rank = len(ctx.type(n.inputs[0]).shape)
    axis = norm_axis(n, int(n.attrs.get("axis", 0)), rank)
    return [Node.make("gather", n.name, n.inputs[:2], n.outputs[:1], axis=axis)]


# -- Slice and Split -----------------------------------------------------------------------

def _slice_infer(types, node):
    shape = types[0].shape
    out = tuple(node.attr("shape"))
    for d, (size, start, step, count) in enumerate(zip(shape, node.attr("starts"),
                                                       node.attr("steps"), out, strict=True)):
        if count and not (0 <= start < size and 0 <= start + (count - 1) * step < size):
            raise ModelError(f"node {node.name!r} (slice): axis {d} reads outside "
                             f"[0, {size})")
    return [TensorType(out, types[0].dtype)]


def _slice_tables(node, x, out):
    strides = row_major_strides(x.shape)
    return [(start + np.arange(count, dtype=np.int64) * step) * s for start, step, count, s
            in zip(node.attr("starts"), node.attr("steps"), out.shape, strides, strict=True)]


register_remap("slice", _slice_infer, _slice_tables,
               lambda rng, dtype: ([rng.uniform(-2, 2, (4, 6)).astype(dtype)], dict(slice_node(
                   "s", "x", "y", (4, 6), [1, -1], [4, 0], [0, 1], [1, -2]).attrs)))


def slice_node(name: str, x: str, out: str, shape, starts, ends, axes, steps) -> Node:
    """A slice node with ONNX Slice semantics, normalised to per-axis
    (start, step, count): negative starts/ends count from the end, then both
    are clamped ([0, dim] going forward, [-1, dim - 1] going backward)."""
    full_starts, full_steps, counts = [0] * len(shape), [1] * len(shape), list(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        dim = shape[axis]
        if step == 0:
            raise ModelError(f"node {name!r} (Slice): step 0 on axis {axis}")
        start, end = (v + dim if v < 0 else v for v in (start, end))
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        count = max(0, -((start - end) // step) if step > 0 else -((end - start) // -step))
        full_starts[axis], full_steps[axis], counts[axis] = start, step, count
    return Node.make("slice", name, (x,), (out,), starts=full_starts, steps=full_steps,
                     shape=counts)


def _slice_args(ctx, n):
    if n.opset < 10:
        starts, ends = n.attrs["starts"], n.attrs["ends"]
        axes, steps = n.attrs.get("axes"), None
    else:
        starts, ends, axes, steps = (
            need_const(ctx, n, k, what) for k, what in
            enumerate(("starts", "ends", "axes", "steps"), start=1))
        starts, ends = starts.tolist(), ends.tolist()
        axes = None if axes is None else axes.tolist()
        steps = None if steps is None else steps.tolist()
    rank = len(ctx.type(n.inputs[0]).shape)
    axes = list(range(len(starts))) if axes is None else [norm_axis(n, int(a), rank)
                                                          for a in axes]
    return starts, ends, axes, steps or [1] * len(starts)


@onnx_op("Slice", 1, emits=("slice",), build_time_inputs=(1, 2, 3, 4))
def _slice(ctx, n):
    shape = ctx.type(n.inputs[0]).shape
    return [slice_node(n.name, n.inputs[0], n.outputs[0], shape, *_slice_args(ctx, n))]


@onnx_op("Split", 1, emits=("slice",), build_time_inputs=(1,))
def _split(ctx, n):
    """One slice per output. Sizes: the `split` attribute (before opset 13) or
    input, else equal parts (opset 18: `num_outputs` parts, the last smaller)."""
    shape = ctx.type(n.inputs[0]).shape
    axis = norm_axis(n, int(n.attrs.get("axis", 0)), len(shape))
    outputs = [o for o in n.outputs if o]
    if n.opset < 13:
        sizes = n.attrs.get("split")
    else:
        sizes = need_const(ctx, n, 1, "the split input")
        sizes = None if sizes is None else sizes.tolist()
    if sizes is None:
        parts = int(n.attrs.get("num_outputs", len(outputs)))
        chunk = -(-shape[axis] // parts)
        sizes = [min(chunk, shape[axis] - k * chunk) for k in range(parts)]
    if len(sizes) != len(outputs) or sum(sizes) != shape[axis] or min(sizes) < 0:
        raise ModelError(f"node {n.name!r} (Split): sizes {list(sizes)} do not split "
                         f"{shape[axis]} into {len(outputs)} outputs")
    nodes, start = [], 0
    for k, (out, size) in enumerate(zip(outputs, sizes, strict=True)):
        nodes.append(slice_node(f"{n.name}__{k}" if k else n.name, n.inputs[0], out, shape,
                                [start], [start + size], [axis], [1]))
        start += size
    return nodes


# -- Pad -------------------------------------------------------------------------------

def _pad_infer(types, node):
    pads = node.attr("pads")
    in_shape = types[0].shape
    rank = len(in_shape)
    shape = tuple(d + pads[k] + pads[k + rank] for k, d in enumerate(in_shape))
    if min(shape, default=1) < 0:
        raise ModelError(f"node {node.name!r} (pad): pads {list(pads)} crop "
                         f"{list(in_shape)} below zero")
    if node.attr("mode") != "constant" and any(
            d == 0 and o > 0 for d, o in zip(in_shape, shape, strict=True)):
        raise ModelError(f"node {node.name!r} (pad): {node.attr('mode')} padding of an "
                         "empty axis")
    return [TensorType(shape, types[0].dtype)]


def _source_index(mode: str, src: np.ndarray, size: int) -> np.ndarray:
    """The input index each output position reads along one axis (OUTSIDE if none)."""
    if mode == "constant":
        return np.where((src >= 0) & (src < size), src, OUTSIDE)
    if mode == "edge":
        return np.clip(src, 0, size - 1)
    if mode == "wrap":
        return src % size
    if size == 1:  # reflect
        return np.zeros_like(src)
    period = 2 * (size - 1)
    src = src % period
    return np.where(src < size, src, period - src)


def _pad_tables(node, x, out):
    mode = node.attr("mode")
    tables = []
    for d, (size, stride) in enumerate(zip(x.shape, row_major_strides(x.shape),
                                           strict=True)):
        src = _source_index(mode, np.arange(out.shape[d], dtype=np.int64)
                            - node.attr("pads")[d], size)
        tables.append(np.where(src == OUTSIDE, OUTSIDE, src * stride))
    return tables


register_remap("pad", _pad_infer, _pad_tables,
               lambda rng, dtype: ([rng.uniform(-2, 2, (2, 3)).astype(dtype)],
                                   {"pads": (1, 0, 0, 2), "mode": "constant", "value": 0.5}))

_PAD_MODES = ("constant", "reflect", "edge", "wrap")


@onnx_op("Pad", 1, emits=("pad",), build_time_inputs=(1, 2, 3))
def _pad(ctx, n):
    rank = len(ctx.type(n.inputs[0]).shape)
    mode = n.text("mode", "constant")
    if mode not in _PAD_MODES or (mode == "wrap" and n.opset < 19):
        raise ModelError(f"node {n.name!r} (Pad): mode {mode!r} is not supported")
    if n.opset < 11:
        pads, value = list(n.attrs.get("pads", n.attrs.get("paddings"))), \
            float(n.attrs.get("value", 0.0))
    else:
        pads = need_const(ctx, n, 1, "the pads input").tolist()
        fill = need_const(ctx, n, 2, "the constant_value input")
        value = 0 if fill is None or fill.size == 0 else fill.item()
        axes = need_const(ctx, n, 3, "the axes input")
        if axes is not None:  # opset 18: pads for the listed axes only
            full = [0] * (2 * rank)
            for k, a in enumerate(axes.tolist()):
                a = norm_axis(n, a, rank)
                full[a], full[a + rank] = pads[k], pads[k + len(axes)]
            pads = full
    if len(pads) != 2 * rank:
        raise ModelError(f"node {n.name!r} (Pad): {len(pads)} pads for rank {rank}")
    return [Node.make("pad", n.name, n.inputs[:1], n.outputs[:1], pads=pads, mode=mode,
                      value=value)]



@onnx_op("CenterCropPad", 18, emits=("pad",), build_time_inputs=(1,))
def _center_crop_pad(ctx, n):
    """Each listed axis cropped or zero-padded to its target size, centred (the odd
    element at the end): one pad node whose negative pads crop."""
    rank = len(ctx.type(n.inputs[0]).shape)
    shape = ctx.type(n.inputs[0]).shape
    sizes = need_const(ctx, n, 1, "the shape input").tolist()
    axes = [norm_axis(n, int(a), rank) for a in n.attrs.get("axes", range(rank))]
    if len(sizes) != len(axes):
        raise ModelError(f"node {n.name!r} (CenterCropPad): {len(sizes)} sizes for "
                         f"{len(axes)} axes")
    pads = [0] * (2 * rank)
    for a, size in zip(axes, sizes, strict=True):
        grow = int(size) - shape[a]
        begin = grow // 2 if grow >= 0 else -(-grow // 2)
        pads[a], pads[a + rank] = begin, grow - begin
    return [Node.make("pad", n.name, n.inputs[:1], n.outputs[:1], pads=pads,
                      mode="constant", value=0)]


@onnx_op("Compress", 9, emits=("reshape", "gather"), build_time_inputs=(1,))
def _compress(ctx, n):
    """The slices along `axis` (of the flattened input if none) whose condition is true:
    a gather of their constant indices."""
    x = n.inputs[0]
    shape = ctx.type(x).shape
    keep = np.flatnonzero(need_const(ctx, n, 1, "the condition input").reshape(-1))
    nodes = []
    if "axis" in n.attrs:
        axis = norm_axis(n, int(n.attrs["axis"]), len(shape))
    else:
        axis, flat = 0, f"{n.outputs[0]}__flat"
        nodes.append(Node.make("reshape", f"{n.name}__flat", (x,), (flat,),
                               shape=(math.prod(shape),)))
        shape, x = (math.prod(shape),), flat
    if keep.size == 0 or keep[-1] >= shape[axis]:
        raise ModelError(f"node {n.name!r} (Compress): the condition selects "
                         f"{'nothing' if keep.size == 0 else 'beyond the axis'}")
    indices = ctx.add_param(f"{n.name}_indices", keep.astype(np.int64))
    return nodes + [Node.make("gather", n.name, (x, indices), n.outputs[:1], axis=axis)]

# -- OneHot ------------------------------------------------------------------------------


@onnx_op("OneHot", 9, emits=("less", "add", "where", "reshape", "equal"),
         build_time_inputs=(1, 2))
def _one_hot(ctx, n):
    """y = on where index (negative ones wrapped by + depth) == position along the new
    `axis`, off elsewhere; an index outside [-depth, depth) matches nothing. Graph
    ops: the wrapped indices reshaped with a 1 at `axis`, compared with the constant
    0..depth-1 (in the indices' dtype) laid along `axis`, and a Where."""
    indices = n.inputs[0]
    itype = ctx.type(indices)
    depth = need_const(ctx, n, 1, "depth")
    values = need_const(ctx, n, 2, "values")
    if depth.size != 1 or values.size != 2:
        raise ModelError(f"node {n.name!r} (OneHot): depth must hold one value and values "
                         f"two, got {depth.size} and {values.size}")
    depth, rank = int(depth.reshape(())), len(itype.shape)
    axis = norm_axis(n, int(n.attrs.get("axis", -1)), rank + 1)
    idtype = np.dtype(itype.dtype)
    positions = np.arange(depth, dtype=idtype).reshape(
        (depth,) + (1,) * (rank - axis))
    off, on = (ctx.add_param(f"{n.name}_{k}", values.reshape(-1)[i].reshape(()))
               for i, k in ((0, "off"), (1, "on")))
    zero = ctx.add_param(f"{n.name}_zero", np.zeros((), idtype))
    depth_name = ctx.add_param(f"{n.name}_depth", np.array(depth, idtype))
    shape = itype.shape[:axis] + (1,) + itype.shape[axis:]
    t = f"{n.outputs[0]}__onehot"
    return [Node.make("less", f"{n.name}__neg", (indices, zero), (f"{t}_neg",)),
            Node.make("add", f"{n.name}__wrap", (indices, depth_name), (f"{t}_wrapped",)),
            Node.make("where", f"{n.name}__idx", (f"{t}_neg", f"{t}_wrapped", indices),
                      (f"{t}_idx",)),
            Node.make("reshape", f"{n.name}__axis", (f"{t}_idx",), (f"{t}_at",), shape=shape),
            Node.make("equal", f"{n.name}__hit", (f"{t}_at", ctx.add_param(
                f"{n.name}_positions", positions)), (f"{t}_hit",)),
            Node.make("where", n.name, (f"{t}_hit", on, off), n.outputs[:1])]
