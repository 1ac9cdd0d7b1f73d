"""The recurrent_kernel operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/recurrent_kernel.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register


def _infer(types, node):
    xw = types[0]
    if xw.dtype != "float32":
        raise ModelError(f"node {node.name!r} (rnn_sequence): dtype {xw.dtype} is not "
                         "supported (float32 is)")
    seq, batch = xw.shape[:2] if node.attr("layout") == 0 else xw.shape[1::-1]
    dirs, hidden = len(node.attr("directions")), node.attr("hidden")
    if node.attr("result") == "y":
        shape = (seq, dirs, batch, hidden) if node.attr("layout") == 0 else \
            (batch, seq, dirs, hidden)
    else:
        shape = (dirs, batch, hidden) if node.attr("layout") == 0 else (batch, dirs, hidden)
    return [TensorType(shape, "float32")]


register("rnn_sequence", OpKind.OPAQUE, _infer)
