"""The loss operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/loss.py
Their ONNX converters: pipeline/frontend/onnx/loss.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register


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


register("nll_loss", OpKind.OPAQUE, _nll_infer, float64=True)
