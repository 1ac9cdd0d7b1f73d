"""The resize operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/resize.py
Their ONNX converters: pipeline/frontend/onnx/resize.py
"""

from __future__ import annotations

import itertools
from functools import reduce

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register
from pipeline.ops.resize_taps import extrapolated, taps_of


def _resize_infer(types, node):
    x = types[0]
    if node.attr("mode") != "nearest" and x.dtype not in ("float32", "float16"):
        raise ModelError(f"node {node.name!r} (resize): {node.attr('mode')} mode needs "
                         f"float32 or float16, not {x.dtype}")
    return [TensorType(tuple(node.attr("shape")), x.dtype)]


def _resize_np(xs, node):
    x = xs[0]
    out_type = TensorType(tuple(node.attr("shape")), str(x.dtype))
    in_type = TensorType(x.shape, str(x.dtype))
    taps = taps_of(node, in_type, out_type)
    flat = x.reshape(-1)
    result = np.zeros(out_type.shape, np.float64 if x.dtype.kind == "f" else x.dtype)
    for combo in itertools.product(*taps):
        offsets = reduce(np.add, np.ix_(*(o for o, _ in combo)), np.zeros((), np.int64))
        weights = [np.ones(len(o)) if w is None else w for o, w in combo]
        weight = reduce(np.multiply, np.ix_(*weights), np.ones(()))
        result = result + weight * flat[offsets]
    outside = np.zeros(out_type.shape, bool)
    for d, mask in enumerate(extrapolated(node, in_type, out_type)):
        if mask is not None:
            outside |= mask.reshape([-1 if k == d else 1 for k in range(x.ndim)])
    result = np.where(outside, node.attr("extrapolation", 0.0), result)
    return [result.astype(x.dtype)]


register("resize", OpKind.ANCHOR, _resize_infer, numpy=_resize_np,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (1, 2, 3, 4)).astype(dtype)], {
             "mode": "linear", "coord": "half_pixel", "nearest": "round_prefer_floor",
             "scales": (1.0, 1.0, 2.0, 1.5), "shape": (1, 2, 6, 6), "cubic_a": -0.75,
             "exclude_outside": 0}))


def _grid_sample_infer(types, node):
    x, grid = types
    r = len(x.shape) - 2
    if x.dtype != "float32" or grid.dtype != "float32":
        raise ModelError(f"node {node.name!r} (grid_sample): float32 operands only")
    if r < 1 or len(grid.shape) != r + 2 or grid.shape[0] != x.shape[0] or \
            grid.shape[-1] != r:
        raise ModelError(f"node {node.name!r} (grid_sample): grid {list(grid.shape)} does "
                         f"not sample the {r} spatial dims of {list(x.shape)}")
    return [TensorType((*x.shape[:2], *grid.shape[1:-1]), "float32")]


register("grid_sample", OpKind.OPAQUE, _grid_sample_infer)
"""grid_sample: ONNX GridSample. x [N, C, *S] sampled at grid [N, *O, r] (normalised
coordinates in [-1, 1], the last one along S's last dim), giving [N, C, *O]; attrs
mode (nearest, linear, cubic), padding (zeros, border, reflection), align_corners.
Checked against onnx.reference through GridSample (node suite, tests/ops/
test_ops_grid_sample.py), not a numpy version here."""
