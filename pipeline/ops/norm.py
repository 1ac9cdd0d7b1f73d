"""The norm operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/norm.py
Their ONNX converters: pipeline/frontend/onnx/norm.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ops.registry import OpKind, broadcast_shape, register

register("batch_norm", OpKind.ANCHOR, lambda types, node: [types[0]])


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


register("layer_norm", OpKind.ANCHOR, _layer_norm_infer)

register("rms_norm", OpKind.ANCHOR, _layer_norm_infer)

register("instance_norm", OpKind.ANCHOR, _channel_norm_infer)

register("group_norm", OpKind.ANCHOR, _channel_norm_infer)

register("lrn", OpKind.ANCHOR, lambda types, node: [types[0]])
