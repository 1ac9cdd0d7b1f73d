"""Normalisation: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, RMSNormalization, LRN, Softmax and LogSoftmax.

Graph ops: batch_norm (with constant statistics rewritten to a scale and shift
by SimplifyInference; lowered as is otherwise), layer_norm, rms_norm,
instance_norm, group_norm, lrn, softmax, log_softmax.
Statistics are float32, two-pass (mean, then the mean of squared deviations),
and softmax subtracts the row maximum before exponentiating.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.dsl.vector import ELEMENT_WORK, parallel_for
from pipeline.errors import ModelError
from pipeline.ir.graph import Node
from pipeline.ops.registry import Limit, axis_attr, broadcast_shape, onnx_op, register

# -- BatchNormalization ---------------------------------------------------------------

def _batch_norm_lower(kb, node, ins, out, epilogue):
    """y = (x - mean[c]) * scale[c] / sqrt(var[c] + eps) + bias[c], for statistics
    known only at run time (constant ones become a folded scale and shift)."""
    x, scale, bias, mean, var = ins
    shape = x.type.shape
    with kb.nest(shape[:2], "c") as (n, c):
        g = kb.fdiv(kb.load(scale, c), kb.intrinsic(
            "sqrt", kb.fadd(kb.load(var, c), kb.f32(node.attr("epsilon")))))
        shift = kb.fsub(kb.load(bias, c), kb.fmul(kb.load(mean, c), g))
        base = kb.dot([n, c], x.strides[:2])
        with kb.nest(shape[2:], "p") as rest:
            o = base + kb.dot(rest, x.strides[2:])
            y = kb.fadd(kb.fmul(kb.load(x, o), g), shift)
            if epilogue is not None:
                y = epilogue(y, [n, c, *rest])
            kb.store(out, o, y)


register("batch_norm", "anchor", lambda types, node: [types[0]], lower=_batch_norm_lower)


@onnx_op("BatchNormalization", 1, emits=("batch_norm",), limits=(Limit(
    "training mode",
    lambda n: len(n.outputs) > 1 or bool(n.attrs.get("training_mode", 0))),))
def _batch_norm(ctx, n):
    if len([o for o in n.outputs if o]) > 1 or n.attrs.get("training_mode", 0):
        raise ModelError(f"node {n.name!r} (BatchNormalization): training mode "
                         "(running statistics outputs) is not supported")
    return [Node.make("batch_norm", n.name, n.inputs[:5], n.outputs[:1],
                      epsilon=float(n.attrs.get("epsilon", 1e-5)))]


# -- row normalisation: layer_norm, rms_norm, instance_norm, group_norm ------------------------

def _norm_view(node, shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """(view, axis): the op normalises the rows view[axis:] of x seen as `view`
    (the same memory): layer_norm and rms_norm the dims from `axis` on,
    instance_norm the spatial dims of each (n, c), group_norm (n, group, C / G,
    spatial...) rows."""
    if node.op == "instance_norm":
        return shape, 2
    if node.op == "group_norm":
        g = node.attr("groups")
        return (shape[0], g, shape[1] // g, *shape[2:]), 2
    return shape, node.attr("axis")


def _normalize_lower(kb, node, ins, out, epilogue):
    """y = (x - mean) / sqrt(var + eps) * scale + bias over each row (rms_norm:
    x / sqrt(mean(x^2) + eps) * scale), statistics in two passes.

    Scale and bias broadcast over the row (layer_norm, rms_norm), are per
    channel (instance_norm, group_norm from opset 21) or per group (group_norm
    opset 18).
    """
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    view, axis = _norm_view(node, x.type.shape)
    length = math.prod(view[axis:])
    strides = [math.prod(view[d + 1:]) for d in range(len(view))]
    centred = node.op != "rms_norm"
    per_row = node.op == "instance_norm" or (node.op == "group_norm"
                                             and scale.type.shape[0] == view[1])
    # Rows split over threads (each reads its row three times: two statistics passes
    # and the output), as their producer split them: a row left on one thread of two
    # is read from the other core's cache (the encoder's at batch 8: 3.6 us alone, 13-18 us
    # after a two-thread dense layer).
    rows = view[:axis]
    with parallel_for(kb, math.prod(rows), "r", work=3 * ELEMENT_WORK * x.type.size) as r:
        outer = kb.unflatten(r, rows)
        base = kb.dot(outer, strides[:axis])
        slot = kb.local(kb.f32(0.0))
        mean = kb.f32(0.0)
        if centred:
            with kb.loop(0, length, "k") as k:
                kb.set(slot, kb.fadd(kb.get(slot), kb.load(x, base + k)))
            mean = kb.fmul(kb.get(slot), kb.f32(1.0 / length))
            kb.set(slot, kb.f32(0.0))
        with kb.loop(0, length, "k") as k:
            dev = kb.fsub(kb.load(x, base + k), mean) if centred else \
                kb.load(x, base + k)
            kb.set(slot, kb.fadd(kb.get(slot), kb.fmul(dev, dev)))
        var = kb.fmul(kb.get(slot), kb.f32(1.0 / length))
        rstd = kb.fdiv(kb.f32(1.0), kb.intrinsic(
            "sqrt", kb.fadd(var, kb.f32(node.attr("epsilon")))))
        if per_row:  # per-channel (instance) or per-group affine, hoisted out of the row
            g, beta = kb.load(scale, outer[1]), kb.load(bias, outer[1])
        with kb.nest(view[axis:], "i") as inner:
            o = base + kb.dot(inner, strides[axis:])
            index = [*outer, *inner]
            if node.op == "group_norm":  # back to (n, c, spatial...)
                index = [outer[0], outer[1] * view[2] + inner[0], *inner[1:]]
                if not per_row:
                    g, beta = kb.load(scale, index[1]), kb.load(bias, index[1])
            elif not per_row:
                g = kb.load_broadcast(scale, inner)
                beta = kb.load_broadcast(bias, inner) if bias else None
            y = kb.fmul(kb.fmul(kb.fsub(kb.load(x, o), mean), rstd), g) if centred else \
                kb.fmul(kb.fmul(kb.load(x, o), rstd), g)
            if beta is not None:
                y = kb.fadd(y, beta)
            if epilogue is not None:
                y = epilogue(y, index)
            kb.store(out, o, y)


def _layer_norm_infer(types, node):
    x = types[0]
    normalized = x.shape[node.attr("axis"):]
    for t in types[1:]:
        if broadcast_shape(normalized, t.shape, where=f"node {node.name!r}") != normalized:
            raise ModelError(f"node {node.name!r} ({node.op}): scale/bias {list(t.shape)} "
                             f"do not broadcast to {list(normalized)}")
    return [x]


def _channel_norm_infer(types, node):
    """instance_norm: scale and bias [C]; group_norm: [C] or [groups], C % groups == 0."""
    x = types[0]
    c = x.shape[1] if len(x.shape) >= 3 else 0
    groups = node.attr("groups") if node.op == "group_norm" else c
    shapes = {(c,), (groups,)}
    if not c or c % groups or any(t.shape not in shapes for t in types[1:]):
        raise ModelError(f"node {node.name!r} ({node.op}): input {list(x.shape)} needs "
                         f"spatial dims and scale, bias of shape {sorted(shapes)}")
    return [x]


register("layer_norm", "anchor", _layer_norm_infer, lower=_normalize_lower)
register("rms_norm", "anchor", _layer_norm_infer, lower=_normalize_lower)
register("instance_norm", "anchor", _channel_norm_infer, lower=_normalize_lower)
register("group_norm", "anchor", _channel_norm_infer, lower=_normalize_lower)


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


# -- LRN: local response normalisation across channels ------------------------------------

def _lrn_lower(kb, node, ins, out, epilogue):
    """y = x / (bias + alpha / size * sum of x^2 over nearby channels) ** beta.

    Planes (n, c) split over threads; within one, the window's channels are fixed, so
    the loop over the plane's pixels is plain arithmetic LLVM vectorises (with beta
    0.75, 0.5 or 1 the power is square roots: powf was a scalar libm call per
    element, a quarter of inception_v1's time)."""
    x = ins[0]
    shape = x.type.shape
    size, beta = node.attr("size"), node.attr("beta")
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    c_n, plane = shape[1], math.prod(shape[2:])
    with parallel_for(kb, shape[0] * c_n, "planes", work=x.type.size * size) as item:
        n, c = item // c_n, item % c_n
        with kb.loop(0, plane, "p") as p:
            o = item * plane + p
            acc = kb.f32(0.0)
            for j in range(-lo, hi + 1):
                cj = c + j
                ok = kb.inside(cj, 0, c_n)
                # Clamp the offset so the load stays in bounds; the select drops it.
                v = kb.load(x, o + kb.select(ok, j * plane, 0))
                acc = kb.select(ok, kb.fadd(acc, kb.fmul(v, v)), acc)
            denom = kb.fadd(kb.f32(node.attr("bias")),
                            kb.fmul(acc, kb.f32(node.attr("alpha") / size)))
            y = kb.fdiv(kb.load(x, o), _power(kb, denom, beta))
            if epilogue is not None:
                y = epilogue(y, [n, c, *kb.unflatten(p, shape[2:])])
            kb.store(out, o, y)


def _power(kb, d, beta: float):
    """d ** beta for d > 0: square roots for the betas models use, else powf."""
    if beta == 1.0:
        return d
    if beta in (0.5, 0.75):
        root = kb.intrinsic("sqrt", d)
        return root if beta == 0.5 else kb.fmul(root, kb.intrinsic("sqrt", root))
    return kb.intrinsic("pow", d, kb.f32(beta))


register("lrn", "anchor", lambda types, node: [types[0]], lower=_lrn_lower)


@onnx_op("LRN", 1, emits=("lrn",))
def _lrn(ctx, n):
    if "size" not in n.attrs or len(ctx.type(n.inputs[0]).shape) < 3:
        raise ModelError(f"node {n.name!r} (LRN): needs the size attribute and an input "
                         "with channel and spatial dims")
    return [Node.make("lrn", n.name, n.inputs[:1], n.outputs[:1], size=int(n.attrs["size"]),
                      alpha=float(n.attrs.get("alpha", 1e-4)),
                      beta=float(n.attrs.get("beta", 0.75)),
                      bias=float(n.attrs.get("bias", 1.0)))]
