"""The dense_packed operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/dense_packed.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register


def _infer(types, node):
    a, w = types[0], types[1]
    nb, k, b = w.shape
    n = node.attr("units")
    if a.shape[-1] != k or not (nb - 1) * b < n <= nb * b:
        raise ModelError(f"node {node.name!r} (dense_packed): input {list(a.shape)} does "
                         f"not match packed weight {list(w.shape)} for {n} units")
    return [TensorType(a.shape[:-1] + (n,), a.dtype)]


register("dense_packed", OpKind.ANCHOR, _infer)
