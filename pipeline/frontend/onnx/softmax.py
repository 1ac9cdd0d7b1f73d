"""ONNX converters to the softmax operators (defined in pipeline/ops/softmax.py)."""

from __future__ import annotations

from pipeline.frontend.onnx.registry import onnx_op
from pipeline.ir.graph import Node
from pipeline.ops.registry import axis_attr


def _softmax_converter(op: str, flatten: bool, default_axis: int):
    def convert(ctx, n):
        axis = axis_attr(n, len(ctx.type(n.inputs[0]).shape), default_axis)
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1], axis=axis,
                          flatten=int(flatten))]
    return convert


# Before opset 13 (Log)Softmax and Hardmax flattened the input to 2-D at `axis` (default 1).
for _onnx, _op in (("Softmax", "softmax"), ("LogSoftmax", "log_softmax"),
                   ("Hardmax", "hardmax")):
    onnx_op(_onnx, 1, emits=(_op,))(_softmax_converter(_op, flatten=True, default_axis=1))
    onnx_op(_onnx, 13, emits=(_op,))(_softmax_converter(_op, flatten=False, default_axis=-1))
