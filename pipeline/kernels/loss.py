"""Loss functions: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Graph op nll_loss(input [N, C, d...], target [N, d...] int, [weight [C]];
reduction, ignore_index): per element loss = -input[n, target, d...] * w[target]
(0 where target == ignore_index); reduction none keeps the [N, d...] losses, sum
adds them, mean divides the sum by the sum of the weights used (ONNX: an all-ignored
batch gives 0 / 0). A target outside [0, C) that is not ignore_index makes the
kernel return an error code (a RuntimeError in the executor).

SoftmaxCrossEntropyLoss is log_softmax over axis 1 (its optional second output,
log_prob) followed by nll_loss: a converter only.
"""

from __future__ import annotations

import math

import llvmlite.ir as ir

from pipeline.kernels.registry import lowering


def _nll_lower(kb, node, ins, out, epilogue):
    """One pass over the targets: each loss stored (none) or summed with its weight."""
    x, target = ins[:2]
    weight = ins[2] if len(ins) > 2 else None
    n_n, c_n = x.type.shape[:2]
    inner = math.prod(x.type.shape[2:])
    reduction, ignore = node.attr("reduction"), node.attr("ignore_index")
    zero, one = kb.const(0.0, x.elem), kb.const(1.0, x.elem)
    total, weights = kb.local(zero), kb.local(zero)
    with kb.loop(0, n_n, "n") as n, kb.loop(0, inner, "d") as d:
        t_at = n * inner + d
        t = kb.index(kb.load(target, t_at))
        skip = kb.compare("==", t, ignore) if ignore is not None else \
            ir.Constant(ir.IntType(1), 0)
        kb.fail_unless(kb.or_(skip, kb.inside(t, 0, c_n)))
        safe = kb.select(skip, 0, t)  # an ignored target may lie outside [0, C)
        value = kb.load(x, (n * c_n + safe) * inner + d)
        w = kb.load(weight, safe) if weight is not None else one
        w = kb.select(skip, zero, w)
        loss = kb.neg(kb.fmul(value, w))
        loss = kb.select(skip, zero, loss)  # -0.0 * ... would print as -0
        if reduction == "none":
            kb.store(out, t_at, loss)
        else:
            kb.set(total, kb.fadd(kb.get(total), loss))
            kb.set(weights, kb.fadd(kb.get(weights), w))
    if reduction == "sum":
        kb.store(out, 0, kb.get(total))
    elif reduction == "mean":
        kb.store(out, 0, kb.fdiv(kb.get(total), kb.get(weights), fast=False))


lowering("nll_loss", lower=_nll_lower)
