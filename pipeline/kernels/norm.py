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

from pipeline.dsl.vector import ELEMENT_WORK, parallel_for
from pipeline.kernels.registry import lowering


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


lowering("batch_norm", lower=_batch_norm_lower)


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


lowering("layer_norm", lower=_normalize_lower)

lowering("rms_norm", lower=_normalize_lower)

lowering("instance_norm", lower=_normalize_lower)

lowering("group_norm", lower=_normalize_lower)


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


lowering("lrn", lower=_lrn_lower)
