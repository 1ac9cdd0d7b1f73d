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

from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import onnx_op, register

_REDUCTIONS = ("none", "sum", "mean")


def _nll_infer(types, node):
    x, target = types[:2]
    if x.dtype not in ("float32", "float64", "float16") or target.dtype not in ("int64", "int32"):
        raise ModelError(f"node {node.name!r} (nll_loss): input {x.dtype} and target "
                         f"{target.dtype} are not supported (float32/float64/float16 and "
                         "int64/int32 are)")
    if len(x.shape) < 2 or target.shape != x.shape[:1] + x.shape[2:]:
        raise ModelError(f"node {node.name!r} (nll_loss): target {list(target.shape)} does "
                         f"not match input {list(x.shape)} (expects [N, d...] for [N, C, d...])")
    if len(types) > 2 and (types[2].shape != x.shape[1:2] or types[2].dtype != x.dtype):
        raise ModelError(f"node {node.name!r} (nll_loss): weight {list(types[2].shape)} "
                         f"{types[2].dtype} must be [{x.shape[1]}] {x.dtype}")
    shape = target.shape if node.attr("reduction") == "none" else ()
    return [TensorType(shape, x.dtype)]


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


register("nll_loss", "opaque", _nll_infer, lower=_nll_lower, float64=True)


def _attrs(n) -> dict:
    reduction = n.text("reduction", "mean", _REDUCTIONS)
    ignore = n.attrs.get("ignore_index")
    return {"reduction": reduction, "ignore_index": None if ignore is None else int(ignore)}


@onnx_op("NegativeLogLikelihoodLoss", 12, emits=("nll_loss",))
def _nll(ctx, n):
    inputs = [i for i in n.inputs if i]
    return [Node.make("nll_loss", n.name, inputs, n.outputs[:1], **_attrs(n))]


@onnx_op("SoftmaxCrossEntropyLoss", 12, emits=("log_softmax", "nll_loss"))
def _softmax_cross_entropy(ctx, n):
    scores = n.inputs[0]
    log_prob = n.outputs[1] if len(n.outputs) > 1 and n.outputs[1] else \
        f"{n.outputs[0]}__log_prob"
    rest = [i for i in n.inputs[1:] if i]
    return [Node.make("log_softmax", f"{n.name}__log_softmax", (scores,), (log_prob,),
                      axis=1, flatten=0),
            Node.make("nll_loss", n.name, (log_prob, *rest), n.outputs[:1], **_attrs(n))]
