"""ONNX converters to the norm operators (defined in pipeline/ops/norm.py)."""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import Limit, onnx_op
from pipeline.ir.graph import Node
from pipeline.ops.registry import axis_attr


@onnx_op("BatchNormalization", 1, emits=("batch_norm",), limits=(Limit(
    "training mode",
    lambda n: len(n.outputs) > 1 or bool(n.attrs.get("training_mode", 0))),))
def _batch_norm(ctx, n):
    if len([o for o in n.outputs if o]) > 1 or n.attrs.get("training_mode", 0):
        raise ModelError(f"node {n.name!r} (BatchNormalization): training mode "
                         "(running statistics outputs) is not supported")
    return [Node.make("batch_norm", n.name, n.inputs[:5], n.outputs[:1],
                      epsilon=float(n.attrs.get("epsilon", 1e-5)))]


def _chain(n, tag: str, steps, out: str) -> list[Node]:
    """Graph nodes for `steps`, [(op, inputs, attrs)], where "@" in inputs is the
    previous step's result; the last step writes `out`, the others temporaries
    named after the ONNX node's first output and `tag`."""
    nodes, prev = [], None
    for k, (op, args, attrs) in enumerate(steps):
        result = out if k == len(steps) - 1 else f"{n.outputs[0]}__{tag}{k}"
        nodes.append(Node.make(op, f"{n.name}__{tag}{k}", [prev if a == "@" else a for a in args],
                               (result,), **attrs))
        prev = result
    return nodes


@onnx_op("LayerNormalization", 17, emits=("layer_norm", "reduce_mean", "sub", "mul", "add",
                                           "sqrt", "reciprocal"))
def _layer_norm(ctx, n):
    """Y is one layer_norm kernel; the optional Mean and InvStdDev outputs (shape
    x.shape[:axis] + ones) are computed beside it by reduce_mean and elementwise ops."""
    x = n.inputs[0]
    rank = len(ctx.type(x).shape)
    axis = axis_attr(n, rank, -1)
    eps = float(n.attrs.get("epsilon", 1e-5))
    nodes = [Node.make("layer_norm", n.name, [i for i in n.inputs[:3] if i], n.outputs[:1],
                       axis=axis, epsilon=eps)]
    mean_out, istd_out = (*n.outputs[1:3], "", "")[:2]
    if not mean_out and not istd_out:
        return nodes
    mean = mean_out or f"{n.outputs[0]}__mean"
    stats = {"axes": tuple(range(axis, rank)), "keepdims": 1}
    nodes.append(Node.make("reduce_mean", f"{n.name}__mean", (x,), (mean,), **stats))
    if istd_out:
        eps_name = ctx.add_param(f"{n.name}_epsilon", np.array([eps], np.float32))
        nodes += _chain(n, "istd", [("sub", (x, mean), {}), ("mul", ("@", "@"), {}),
                                    ("reduce_mean", ("@",), stats),
                                    ("add", ("@", eps_name), {}), ("sqrt", ("@",), {}),
                                    ("reciprocal", ("@",), {})], istd_out)
    return nodes


@onnx_op("MeanVarianceNormalization", 9, emits=("reduce_mean", "sub", "mul", "sqrt", "add",
                                                  "div"))
def _mean_variance_norm(ctx, n):
    """(x - mean) / (sqrt(mean((x - mean)^2)) + 1e-9) over `axes` (default N, H, W),
    as the ONNX function body defines it, from reductions and elementwise ops."""
    x = n.inputs[0]
    rank = len(ctx.type(x).shape)
    raw = [int(a) for a in n.attrs.get("axes", (0, 2, 3))]
    if any(not -rank <= a < rank for a in raw):
        raise ModelError(f"node {n.name!r} (MeanVarianceNormalization): axes {raw} out of "
                         f"range for rank {rank}")
    axes = tuple(sorted({a % rank for a in raw}))
    stats = {"axes": axes, "keepdims": 1}
    eps = ctx.add_param(f"{n.name}_epsilon", np.array([1e-9], ctx.type(x).dtype))
    centred = f"{n.outputs[0]}__centred"
    return _chain(n, "mean", [("reduce_mean", (x,), stats), ("sub", (x, "@"), {})],
                  centred) + \
        _chain(n, "std", [("mul", (centred, centred), {}), ("reduce_mean", ("@",), stats),
                          ("sqrt", ("@",), {}), ("add", ("@", eps), {}),
                          ("div", (centred, "@"), {})], n.outputs[0])


@onnx_op("LpNormalization", 1, emits=("reduce_l1", "reduce_l2", "max", "div"))
def _lp_norm(ctx, n):
    """x / ||x||_p along `axis` (p 1 or 2): a keepdims reduction, then a division.
    An all-zero slice gives 0 (onnxruntime, onnx.reference): its norm is raised to
    the smallest normal float, which leaves every other norm unchanged."""
    x = n.inputs[0]
    axis = axis_attr(n, len(ctx.type(x).shape), -1)
    p = int(n.attrs.get("p", 2))
    if p not in (1, 2):
        raise ModelError(f"node {n.name!r} (LpNormalization): p must be 1 or 2, got {p}")
    tiny = ctx.add_param(f"{n.name}_tiny",
                         np.array([np.finfo(np.float32).tiny], ctx.type(x).dtype))
    return _chain(n, "norm", [(f"reduce_l{p}", (x,), {"axes": (axis,), "keepdims": 1}),
                              ("max", ("@", tiny), {}), ("div", (x, "@"), {})], n.outputs[0])


@onnx_op("RMSNormalization", 23, emits=("rms_norm",))
def _rms_norm(ctx, n):
    axis = axis_attr(n, len(ctx.type(n.inputs[0]).shape), -1)
    return [Node.make("rms_norm", n.name, n.inputs[:2], n.outputs[:1], axis=axis,
                      epsilon=float(n.attrs.get("epsilon", 1e-5)))]


@onnx_op("GroupNormalization", 18, emits=("group_norm",))
def _group_norm(ctx, n):
    """Scale and bias are per group at opset 18, per channel from 21 (the shapes say which)."""
    if "num_groups" not in n.attrs:
        raise ModelError(f"node {n.name!r} (GroupNormalization): num_groups is required")
    return [Node.make("group_norm", n.name, n.inputs[:3], n.outputs[:1],
                      groups=int(n.attrs["num_groups"]),
                      epsilon=float(n.attrs.get("epsilon", 1e-5)))]


@onnx_op("InstanceNormalization", 1, emits=("instance_norm",))
def _instance_norm(ctx, n):
    return [Node.make("instance_norm", n.name, n.inputs[:3], n.outputs[:1],
                      epsilon=float(n.attrs.get("epsilon", 1e-5)))]


@onnx_op("LRN", 1, emits=("lrn",))
def _lrn(ctx, n):
    if "size" not in n.attrs or len(ctx.type(n.inputs[0]).shape) < 3:
        raise ModelError(f"node {n.name!r} (LRN): needs the size attribute and an input "
                         "with channel and spatial dims")
    return [Node.make("lrn", n.name, n.inputs[:1], n.outputs[:1], size=int(n.attrs["size"]),
                      alpha=float(n.attrs.get("alpha", 1e-4)),
                      beta=float(n.attrs.get("beta", 0.75)),
                      bias=float(n.attrs.get("bias", 1.0)))]
