"""ONNX converters to the operators whose output shape depends on values (defined
in pipeline/ops/dynamic.py; only the VM runs them, docs/vm.md): NonZero,
NonMaxSuppression, Unique. Their outputs get their upper bounds as IR types. With
constant inputs they fold at import, as any constant expression.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.frontend.onnx.shape import norm_axis
from pipeline.ir.graph import Node
from pipeline.ops.dynamic import _nonzero_np, _unique_np


def _folded(ctx, n, fn, attrs: dict) -> bool:
    """Fold `n` into constants if all its inputs are; whether it did."""
    values = [ctx.const(i) for i in n.inputs if i]
    if any(v is None for v in values):
        return False
    results = fn(values, Node.make("fold", n.name, (), (), **attrs))
    for out, value in zip(n.outputs, results, strict=False):
        if out:
            ctx.set_const(out, np.asarray(value))
    return True


@onnx_op("NonZero", 9, emits=("nonzero",))
def _nonzero(ctx, n):
    if _folded(ctx, n, _nonzero_np, {}):
        return []
    return [Node.make("nonzero", n.name, n.inputs[:1], n.outputs[:1])]


@onnx_op("NonMaxSuppression", 10, emits=("nms",))
def _nms(ctx, n):
    """Absent optional inputs become constants: no box per class, IoU 0, no score
    threshold (ONNX's defaults). The bound: every box of every (batch, class), or
    max_output_boxes_per_class of each if that is a constant."""
    boxes, scores = ctx.type(n.inputs[0]), ctx.type(n.inputs[1])
    if len(scores.shape) != 3 or len(boxes.shape) != 3:
        raise ModelError(f"node {n.name!r} (NonMaxSuppression): boxes and scores must be "
                         f"3-d, got {list(boxes.shape)} and {list(scores.shape)}")
    defaults = (np.array([0], np.int64), np.array([0], scores.dtype),
                np.array([-np.inf], scores.dtype))
    inputs = list(n.inputs[:2])
    for pos, default in enumerate(defaults, start=2):
        given = pos < len(n.inputs) and n.inputs[pos]
        inputs.append(n.inputs[pos] if given else ctx.add_param(f"{n.name}_default{pos}",
                                                                  default))
    b, c, per_class = scores.shape[0], scores.shape[1], scores.shape[2]
    limit = ctx.const(inputs[2])
    if limit is not None:
        per_class = min(per_class, max(int(np.asarray(limit).reshape(-1)[0]), 0))
    attrs = {"center_point_box": int(n.attrs.get("center_point_box", 0)),
             "rows": b * c * per_class}
    return [Node.make("nms", n.name, tuple(inputs), n.outputs[:1], **attrs)]


@onnx_op("Unique", 11, emits=("unique", "unique_inverse"))
def _unique(ctx, n):
    """One node per output asked for: values, first indices, inverse indices,
    counts (the inverse has a static shape, the others their bound)."""
    rank = len(ctx.type(n.inputs[0]).shape)
    attrs = {"sorted": int(n.attrs.get("sorted", 1)),
             "axis": norm_axis(n, int(n.attrs["axis"]), rank) if "axis" in n.attrs else -1}
    if _folded(ctx, n, _unique_np, attrs):
        return []
    nodes = []
    for k, out in enumerate(n.outputs):
        if not out:
            continue
        name = n.name if k == 0 else f"{n.name}__{k}"
        nodes.append(Node.make("unique_inverse", name, n.inputs[:1], (out,), **attrs)
                     if k == 2 else Node.make("unique", name, n.inputs[:1], (out,), output=k,
                                              **attrs))
    return nodes
