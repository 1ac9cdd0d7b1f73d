"""ONNX converters to the index operators (defined in pipeline/ops/index.py)."""

from __future__ import annotations

import math

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.elementwise import unsigned_inputs
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.frontend.onnx.shape import const_or_runtime, need_const, norm_axis
from pipeline.frontend.onnx.symbolic import symbolic_slice
from pipeline.ir.graph import Node
from pipeline.ops.index import slice_node


@onnx_op("Gather", 1, emits=("gather",))
def _gather(ctx, n):
    rank = len(ctx.type(n.inputs[0]).shape)
    axis = norm_axis(n, int(n.attrs.get("axis", 0)), rank)
    return [Node.make("gather", n.name, n.inputs[:2], n.outputs[:1], axis=axis)]


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


@onnx_op("Slice", 1, emits=("slice", "slice_to", "iota", "gather", "identity"),
         build_time_inputs=(1, 2, 3, 4))
def _slice(ctx, n):
    shape = ctx.type(n.inputs[0]).shape
    symbolic = symbolic_slice(ctx, n) if n.opset >= 10 else None
    if symbolic is not None:  # starts or ends over symbolic dimensions
        return symbolic
    runtime = [i for i in n.inputs[1:5] if i and const_or_runtime(ctx, i, n) is None]
    if n.opset >= 10 and runtime:  # runtime starts, ends or steps: only the VM runs it
        return _runtime_slice(ctx, n, shape)
    return [slice_node(n.name, n.inputs[0], n.outputs[0], shape, *_slice_args(ctx, n))]


def _runtime_slice(ctx, n, shape) -> list[Node]:
    """slice_to (ops/dynamic_movement.py): absent axes are 0..k-1, absent steps ones."""
    count = ctx.type(n.inputs[1]).size

    def given(pos: int) -> str:
        return n.inputs[pos] if len(n.inputs) > pos else ""

    axes = given(3) or ctx.add_param(f"{n.name}_axes", np.arange(count, dtype=np.int64))
    steps = given(4) or ctx.add_param(f"{n.name}_steps", np.ones(count, np.int64))
    return [Node.make("slice_to", n.name, (*n.inputs[:3], axes, steps), n.outputs[:1])]


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
    return [Node.make("less", f"{n.name}__neg", (indices, zero), (f"{t}_neg",),
                      **unsigned_inputs(ctx, (indices, zero))),  # uint64: never negative
            Node.make("add", f"{n.name}__wrap", (indices, depth_name), (f"{t}_wrapped",)),
            Node.make("where", f"{n.name}__idx", (f"{t}_neg", f"{t}_wrapped", indices),
                      (f"{t}_idx",)),
            Node.make("reshape", f"{n.name}__axis", (f"{t}_idx",), (f"{t}_at",), shape=shape),
            Node.make("equal", f"{n.name}__hit", (f"{t}_at", ctx.add_param(
                f"{n.name}_positions", positions)), (f"{t}_hit",)),
            Node.make("where", n.name, (f"{t}_hit", on, off), n.outputs[:1])]
