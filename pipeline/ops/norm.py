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

from pipeline.errors import ModelError
from pipeline.ir.graph import Node
from pipeline.ops.registry import broadcast_shape, onnx_op, register


def _axis(n, rank: int, default: int) -> int:
    axis = int(n.attrs.get("axis", default))
    if not -rank <= axis < rank:
        raise ModelError(f"node {n.name!r} ({n.op_type}): axis {axis} out of range "
                         f"for rank {rank}")
    return axis % rank


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
            o = kb.add(base, kb.dot(rest, x.strides[2:]))
            y = kb.fadd(kb.fmul(kb.load(x, o), g), shift)
            if epilogue is not None:
                y = epilogue(y, [n, c, *rest])
            kb.store(out, o, y)


register("batch_norm", "anchor", lambda types, node: [types[0]], lower=_batch_norm_lower)


@onnx_op("BatchNormalization", 1)
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
    with kb.nest(view[:axis], "r") as outer:
        base = kb.dot(outer, strides[:axis])
        slot = kb.local(kb.f32(0.0))
        mean = kb.f32(0.0)
        if centred:
            with kb.loop(0, length, "k") as k:
                kb.set(slot, kb.fadd(kb.get(slot), kb.load(x, kb.add(base, k))))
            mean = kb.fmul(kb.get(slot), kb.f32(1.0 / length))
            kb.set(slot, kb.f32(0.0))
        with kb.loop(0, length, "k") as k:
            dev = kb.fsub(kb.load(x, kb.add(base, k)), mean) if centred else \
                kb.load(x, kb.add(base, k))
            kb.set(slot, kb.fadd(kb.get(slot), kb.fmul(dev, dev)))
        var = kb.fmul(kb.get(slot), kb.f32(1.0 / length))
        rstd = kb.fdiv(kb.f32(1.0), kb.intrinsic(
            "sqrt", kb.fadd(var, kb.f32(node.attr("epsilon")))))
        if per_row:  # per-channel (instance) or per-group affine, hoisted out of the row
            g, beta = kb.load(scale, outer[1]), kb.load(bias, outer[1])
        with kb.nest(view[axis:], "i") as inner:
            o = kb.add(base, kb.dot(inner, strides[axis:]))
            index = [*outer, *inner]
            if node.op == "group_norm":  # back to (n, c, spatial...)
                index = [outer[0], kb.add(kb.mul(outer[1], view[2]), inner[0]), *inner[1:]]
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


@onnx_op("LayerNormalization", 17)
def _layer_norm(ctx, n):
    """Y is one layer_norm kernel; the optional Mean and InvStdDev outputs (shape
    x.shape[:axis] + ones) are computed beside it by reduce_mean and elementwise ops."""
    x = n.inputs[0]
    rank = len(ctx.type(x).shape)
    axis = _axis(n, rank, -1)
    eps = float(n.attrs.get("epsilon", 1e-5))
    nodes = [Node.make("layer_norm", n.name, [i for i in n.inputs[:3] if i], n.outputs[:1],
                       axis=axis, epsilon=eps)]
    mean_out, istd_out = (*n.outputs[1:3], "", "")[:2]
    if not mean_out and not istd_out:
        return nodes
    y = n.outputs[0]
    mean = mean_out or f"{y}__mean"
    axes = tuple(range(axis, rank))
    nodes.append(Node.make("reduce_mean", f"{n.name}__mean", (x,), (mean,), axes=axes,
                           keepdims=1))
    if istd_out:
        eps_name = ctx.add_param(f"{n.name}_epsilon", np.array([eps], np.float32))
        chain = [("sub", (x, mean)), ("mul", ("@", "@")), ("reduce_mean", ("@",)),
                 ("add", ("@", eps_name)), ("sqrt", ("@",)), ("reciprocal", ("@",))]
        prev = None
        for k, (op, args) in enumerate(chain):
            out = istd_out if k == len(chain) - 1 else f"{y}__istd{k}"
            attrs = {"axes": axes, "keepdims": 1} if op == "reduce_mean" else {}
            nodes.append(Node.make(op, f"{n.name}__istd{k}",
                                   [prev if a == "@" else a for a in args], (out,), **attrs))
            prev = out
    return nodes


@onnx_op("RMSNormalization", 23)
def _rms_norm(ctx, n):
    axis = _axis(n, len(ctx.type(n.inputs[0]).shape), -1)
    return [Node.make("rms_norm", n.name, n.inputs[:2], n.outputs[:1], axis=axis,
                      epsilon=float(n.attrs.get("epsilon", 1e-5)))]


@onnx_op("GroupNormalization", 18)
def _group_norm(ctx, n):
    """Scale and bias are per group at opset 18, per channel from 21 (the shapes say which)."""
    if "num_groups" not in n.attrs:
        raise ModelError(f"node {n.name!r} (GroupNormalization): num_groups is required")
    return [Node.make("group_norm", n.name, n.inputs[:3], n.outputs[:1],
                      groups=int(n.attrs["num_groups"]),
                      epsilon=float(n.attrs.get("epsilon", 1e-5)))]


@onnx_op("InstanceNormalization", 1)
def _instance_norm(ctx, n):
    return [Node.make("instance_norm", n.name, n.inputs[:3], n.outputs[:1],
                      epsilon=float(n.attrs.get("epsilon", 1e-5)))]


# -- LRN: local response normalisation across channels ------------------------------------

def _lrn_lower(kb, node, ins, out, epilogue):
    """y = x / (bias + alpha / size * sum of x^2 over nearby channels) ** beta."""
    x = ins[0]
    shape = x.type.shape
    size = node.attr("size")
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    b = kb.b
    with kb.nest(shape, "d") as index:
        c = index[1]
        o = kb.dot(index, x.strides)
        acc = kb.f32(0.0)
        for j in range(-lo, hi + 1):
            cj = kb.add(c, j)
            ok = b.and_(b.icmp_signed(">=", cj, kb.i64(0)),
                        b.icmp_signed("<", cj, kb.i64(shape[1])))
            # Clamp the offset so the load stays in bounds; the select drops it.
            safe = b.select(ok, kb.i64(j * x.strides[1]), kb.i64(0))
            v = kb.load(x, kb.add(o, safe))
            acc = b.select(ok, kb.fadd(acc, kb.fmul(v, v)), acc)
        denom = kb.fadd(kb.f32(node.attr("bias")), kb.fmul(acc, kb.f32(node.attr("alpha") / size)))
        y = kb.fdiv(kb.load(x, o), kb.intrinsic("pow", denom, kb.f32(node.attr("beta"))))
        if epilogue is not None:
            y = epilogue(y, index)
        kb.store(out, o, y)


register("lrn", "anchor", lambda types, node: [types[0]], lower=_lrn_lower)


@onnx_op("LRN", 1)
def _lrn(ctx, n):
    if "size" not in n.attrs or len(ctx.type(n.inputs[0]).shape) < 3:
        raise ModelError(f"node {n.name!r} (LRN): needs the size attribute and an input "
                         "with channel and spatial dims")
    return [Node.make("lrn", n.name, n.inputs[:1], n.outputs[:1], size=int(n.attrs["size"]),
                      alpha=float(n.attrs.get("alpha", 1e-4)),
                      beta=float(n.attrs.get("beta", 0.75)),
                      bias=float(n.attrs.get("bias", 1.0)))]


# -- Softmax, LogSoftmax ---------------------------------------------------------------

# Softmax along a non-last axis keeps per-column statistics for this many
# columns at a time in stack buffers.
_COLUMNS = 1024


def _softmax_lower(kb, node, ins, out, epilogue):
    """Rows of length L with stride `inner`: max, sum of exp(x - max), then scale
    (softmax) or x - max - log(sum) (log_softmax). With inner > 1 the columns
    are processed _COLUMNS at a time, their statistics in stack buffers, so
    every loop runs along contiguous memory."""
    shape = ins[0].type.shape
    axis = node.attr("axis")
    outer = math.prod(shape[:axis])
    if node.attr("flatten"):
        length, inner = math.prod(shape[axis:]), 1
    else:
        length, inner = shape[axis], math.prod(shape[axis + 1:])
    if inner > 1:
        _softmax_columns(kb, node, ins[0], out, outer, length, inner)
        return
    x = ins[0]
    with kb.loop(0, outer, "r") as r:
        base = kb.mul(r, length)
        slot = kb.local(kb.f32(-math.inf))
        with kb.loop(0, length, "k") as k:
            kb.set(slot, kb.fmax(kb.get(slot), kb.load(x, kb.add(base, k))))
        peak = kb.get(slot)
        kb.set(slot, kb.f32(0.0))
        with kb.loop(0, length, "k") as k:
            e = kb.exp(kb.fsub(kb.load(x, kb.add(base, k)), peak))
            if node.op == "softmax":
                kb.store(out, kb.add(base, k), e)
            kb.set(slot, kb.fadd(kb.get(slot), e))
        if node.op == "log_softmax":
            shift = kb.fadd(peak, kb.intrinsic("log", kb.get(slot)))
        else:
            scale = kb.fdiv(kb.f32(1.0), kb.get(slot))
        with kb.loop(0, length, "k") as k:
            o = kb.add(base, k)
            y = kb.fsub(kb.load(x, o), shift) if node.op == "log_softmax" else \
                kb.fmul(kb.load(out, o), scale)
            kb.store(out, o, y)


def _softmax_columns(kb, node, x, out, outer, length, inner):
    """Softmax over k of x[r, k, q] for blocks of columns q (see _softmax_lower)."""
    width = min(inner, _COLUMNS)
    peak, total = kb.scratch(width), kb.scratch(width)
    b = kb.b
    with kb.loop(0, outer, "r") as r, kb.loop(0, -(-inner // width), "qb") as qb:
        q0 = kb.mul(qb, width)
        left = b.sub(kb.i64(inner), q0)
        cols = b.select(b.icmp_signed("<", left, kb.i64(width)), left, kb.i64(width))
        base = kb.add(kb.mul(r, length * inner), q0)
        with kb.loop(0, cols, "q") as q:
            kb.store(peak, q, kb.f32(-math.inf))
            kb.store(total, q, kb.f32(0.0))
        with kb.loop(0, length, "k") as k, kb.loop(0, cols, "q") as q:
            v = kb.load(x, kb.add(kb.add(base, kb.mul(k, inner)), q))
            kb.store(peak, q, kb.fmax(kb.load(peak, q), v))
        with kb.loop(0, length, "k") as k, kb.loop(0, cols, "q") as q:
            o = kb.add(kb.add(base, kb.mul(k, inner)), q)
            e = kb.exp(kb.fsub(kb.load(x, o), kb.load(peak, q)))
            if node.op == "softmax":
                kb.store(out, o, e)
            kb.store(total, q, kb.fadd(kb.load(total, q), e))
        with kb.loop(0, cols, "q") as q:
            if node.op == "log_softmax":  # peak becomes the shift max + log(sum)
                kb.store(peak, q, kb.fadd(kb.load(peak, q),
                                          kb.intrinsic("log", kb.load(total, q))))
            else:
                kb.store(total, q, kb.fdiv(kb.f32(1.0), kb.load(total, q)))
        with kb.loop(0, length, "k") as k, kb.loop(0, cols, "q") as q:
            o = kb.add(kb.add(base, kb.mul(k, inner)), q)
            y = kb.fsub(kb.load(x, o), kb.load(peak, q)) if node.op == "log_softmax" else \
                kb.fmul(kb.load(out, o), kb.load(total, q))
            kb.store(out, o, y)


register("softmax", "opaque", lambda types, node: [types[0]], lower=_softmax_lower)
register("log_softmax", "opaque", lambda types, node: [types[0]], lower=_softmax_lower)


def _softmax_converter(op: str, flatten: bool, default_axis: int):
    def convert(ctx, n):
        axis = _axis(n, len(ctx.type(n.inputs[0]).shape), default_axis)
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1], axis=axis,
                          flatten=int(flatten))]
    return convert


# Before opset 13 (Log)Softmax flattened the input to 2-D at `axis` (default 1).
for _onnx, _op in (("Softmax", "softmax"), ("LogSoftmax", "log_softmax")):
    onnx_op(_onnx, 1)(_softmax_converter(_op, flatten=True, default_axis=1))
    onnx_op(_onnx, 13)(_softmax_converter(_op, flatten=False, default_axis=-1))
