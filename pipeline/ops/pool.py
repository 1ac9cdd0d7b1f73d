"""The pool operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/pool.py
Their ONNX converters: pipeline/frontend/onnx/pool.py
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import GraphError, ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register
from pipeline.ops.windows import infer_1d, window_out


def _pool_infer(types, node):
    """(N, C, spatial...) -> (N, C, windows per spatial dim) for 2-D and 3-D windows."""
    n, c, *spatial = types[0].shape
    kernel, strides, dilations = node.attr("kernel"), node.attr("strides"), \
        node.attr("dilations")
    pads, d = node.attr("pads"), len(kernel)
    ceil = bool(node.attr("ceil_mode", 0))
    try:
        out = [window_out(size, k, s, pads[i], pads[d + i], dl, ceil) for i, (size, k, s, dl)
               in enumerate(zip(spatial, kernel, strides, dilations, strict=True))]
    except GraphError as err:  # a symbolic size this window cannot take
        raise GraphError(f"node {node.name!r} ({node.op}): {err}") from None
    if min((o for o in out if isinstance(o, int)), default=1) < 1:
        raise ModelError(f"node {node.name!r} ({node.op}): window {list(kernel)} does not "
                         f"fit the padded input {list(types[0].shape)}")
    return [TensorType((n, c, *out), types[0].dtype)]


_pool1d_infer = infer_1d(_pool_infer)


for _kind in ("max", "avg", "lp"):
    register(f"{_kind}_pool2d", OpKind.ANCHOR, _pool_infer)
    register(f"{_kind}_pool3d", OpKind.ANCHOR, _pool_infer)
    register(f"{_kind}_pool1d", OpKind.ANCHOR, _pool1d_infer)


def _global_infer(types, node):
    shape = types[0].shape
    return [TensorType(shape[:2] + (1,) * (len(shape) - 2), types[0].dtype)]


def _global_numpy(xs, node):
    x = xs[0]
    axes = tuple(range(2, x.ndim))
    kind = node.op[len("global_"):-len("_pool")]
    if kind == "lp":
        p = node.attr("p")
        out = (np.abs(x) ** p).sum(axis=axes, keepdims=True) ** (1 / p)
    else:
        out = (x.max if kind == "max" else x.mean)(axis=axes, keepdims=True)
    return [out.astype(x.dtype)]


for _kind in ("avg", "max", "lp"):
    register(f"global_{_kind}_pool", OpKind.ANCHOR, _global_infer, numpy=_global_numpy,
             sample=lambda rng, dtype, k=_kind: ([rng.uniform(-2, 2, (2, 3, 4, 5)).astype(dtype)],
                                                 {"p": 3.0} if k == "lp" else {}))
