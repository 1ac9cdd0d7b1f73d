"""ONNX converters to the scatter operators (defined in pipeline/ops/scatter.py)."""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.frontend.onnx.shape import need_const, norm_axis
from pipeline.ir.graph import Node

_REDUCTIONS = ("none", "add", "mul", "max", "min")


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


@onnx_op("Scatter", 9, emits=("scatter_elements",))
@onnx_op("ScatterElements", 11, emits=("scatter_elements",))
def _scatter_elements(ctx, n):
    rank = len(ctx.type(n.inputs[0]).shape)
    return [Node.make("scatter_elements", n.name, n.inputs[:3], n.outputs[:1],
                      axis=norm_axis(n, int(n.attrs.get("axis", 0)), rank),
                      reduction=n.text("reduction", "none", _REDUCTIONS))]


@onnx_op("ScatterND", 11, emits=("scatter_nd",))
def _scatter_nd(ctx, n):
    return [Node.make("scatter_nd", n.name, n.inputs[:3], n.outputs[:1],
                      reduction=n.text("reduction", "none", _REDUCTIONS))]


@onnx_op("GatherND", 11, emits=("gather_nd",))
def _gather_nd(ctx, n):
    """Opset 12 added batch_dims (0 before), 13 bfloat16 (widened to float32)."""
    return [Node.make("gather_nd", n.name, n.inputs[:2], n.outputs[:1],
                      batch_dims=int(n.attrs.get("batch_dims", 0)))]


@onnx_op("TensorScatter", 24, emits=("tensor_scatter",))
def _tensor_scatter(ctx, n):
    rank = len(ctx.type(n.inputs[0]).shape)
    inputs = [i for i in n.inputs[:3] if i]
    return [Node.make("tensor_scatter", n.name, inputs, n.outputs[:1],
                      axis=norm_axis(n, int(n.attrs.get("axis", -2)), rank),
                      circular=int(n.text("mode", "linear", ("linear", "circular")) ==
                                   "circular"))]
