"""The qdense_packed operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/qdense_packed.py
"""

from __future__ import annotations

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.geometry import QTYPES
from pipeline.ops.registry import OpKind, register


def _infer(types, node):
    a, w = types[0], types[1]
    nb, k4, lanes, four = w.shape
    if a.shape[-1] != 4 * k4 or four != 4 or a.dtype not in QTYPES:
        raise ModelError(f"node {node.name!r} (qdense_packed): input {list(a.shape)} "
                         f"{a.dtype} does not match packed weights {list(w.shape)}")
    units = node.attr("units", nb * lanes)  # N: the last block may be partial
    if not (nb - 1) * lanes < units <= nb * lanes:
        raise ModelError(f"node {node.name!r} (qdense_packed): {units} units do not fit "
                         f"packed weights {list(w.shape)}")
    return [TensorType(a.shape[:-1] + (units,), node.attr("out"))]


register("qdense_packed", OpKind.OPAQUE, _infer)
