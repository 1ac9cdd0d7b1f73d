"""ONNX converters to the loss operators (defined in pipeline/ops/loss.py)."""

from __future__ import annotations

from pipeline.frontend.onnx.registry import onnx_op
from pipeline.ir.graph import Node

_REDUCTIONS = ("none", "sum", "mean")


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
