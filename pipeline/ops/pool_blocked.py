"""The pool_blocked operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/pool_blocked.py
"""

from __future__ import annotations

from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, get, register


def _infer(types, node):
    n, cb, h, w, b = types[0].shape
    plain = get(node.op.removesuffix("_nchwc")).infer([TensorType((n, cb * b, h, w),
                                                                  types[0].dtype)], node)[0]
    return [TensorType((n, cb, plain.shape[2], plain.shape[3], b), types[0].dtype)]


register("max_pool2d_nchwc", OpKind.ANCHOR, _infer)

register("avg_pool2d_nchwc", OpKind.ANCHOR, _infer)


for _op in ("global_avg_pool_nchwc", "global_max_pool_nchwc"):
    register(_op, OpKind.ANCHOR,
             lambda types, node: [TensorType(types[0].shape[:2] + (1, 1, types[0].shape[4]),
                                             types[0].dtype)])
