"""ONNX converters to the resize operators (defined in pipeline/ops/resize.py)."""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import onnx_op
from pipeline.frontend.onnx.shape import need_const
from pipeline.ir.graph import Node

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize")


_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


def _resize_nodes(ctx, n, scales, sizes, coord: str, nearest: str, axes=None,
                  policy: str = "stretch", roi=None) -> list[Node]:
    in_shape = ctx.type(n.inputs[0]).shape
    rank = len(in_shape)
    mode = n.text("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear", "cubic"):
        raise ModelError(f"node {n.name!r} ({n.op_type}): mode {mode!r} is not supported "
                         "(nearest, linear, cubic are)")
    if coord not in _COORD_MODES or nearest not in _NEAREST_MODES:
        raise ModelError(f"node {n.name!r} ({n.op_type}): coordinate_transformation_mode "
                         f"{coord!r} / nearest_mode {nearest!r} is not supported")
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    full_scales, shape = [1.0] * rank, list(in_shape)
    if sizes is not None and sizes.size:
        ratios = [np.float32(size) / np.float32(in_shape[a])
                  for a, size in zip(axes, sizes.tolist(), strict=True)]
        if policy != "stretch":  # one scale for every axis, keeping the aspect ratio
            ratios = [(min if policy == "not_larger" else max)(ratios)] * len(axes)
        for a, size, ratio in zip(axes, sizes.tolist(), ratios, strict=True):
            shape[a] = int(size) if policy == "stretch" else \
                int(np.floor(ratio * np.float32(in_shape[a]) + np.float32(0.5)))
            # in double when stretching: align_corners and tf_crop_and_resize compute
            # in_len * scale in double, as ONNX's reference
            full_scales[a] = int(size) / in_shape[a] if policy == "stretch" else float(ratio)
    elif scales is not None and scales.size:
        for a, s in zip(axes, scales.tolist(), strict=True):
            full_scales[a] = float(s)
            shape[a] = int(np.floor(np.float32(s) * np.float32(in_shape[a])))
    else:
        raise ModelError(f"node {n.name!r} ({n.op_type}): needs scales or sizes")
    full_roi = []
    if coord == "tf_crop_and_resize":  # [starts..., ends...] over every axis
        if roi is None or roi.size != 2 * len(axes):
            raise ModelError(f"node {n.name!r} ({n.op_type}): tf_crop_and_resize needs a roi "
                             f"of {2 * len(axes)} values")
        full_roi = [0.0] * rank + [1.0] * rank
        for k, a in enumerate(axes):
            full_roi[a], full_roi[rank + a] = float(roi[k]), float(roi[len(axes) + k])
    node = Node.make("resize", n.name, n.inputs[:1], n.outputs[:1],
                     mode="linear" if mode == "bilinear" else mode, coord=coord,
                     nearest=nearest, scales=full_scales, shape=shape,
                     cubic_a=float(n.attrs.get("cubic_coeff_a", -0.75)),
                     exclude_outside=int(n.attrs.get("exclude_outside", 0)),
                     antialias=int(n.attrs.get("antialias", 0)), roi=full_roi,
                     extrapolation=float(n.attrs.get("extrapolation_value", 0.0)))
    return _axis_by_axis(node, in_shape) if node.attr("antialias") and mode != "nearest" \
        else [node]


def _axis_by_axis(node: Node, in_shape) -> list[Node]:
    """An antialiased resize of several axes as one resize node per axis, in axis order
    (as ONNX's reference computes it): an axis's taps widen with 1 / scale (cubic:
    2 * ceil(2 / scale)), and one node over all axes would take their product."""
    rank, scales, roi = len(in_shape), node.attr("scales"), node.attr("roi")
    moved = [a for a in range(rank) if scales[a] != 1.0 or node.attr("shape")[a] !=
             in_shape[a] or (roi and (roi[a], roi[rank + a]) != (0.0, 1.0))]
    if len(moved) < 2:
        return [node]
    nodes, source, shape = [], node.inputs[0], list(in_shape)
    for a in moved:
        shape[a] = node.attr("shape")[a]
        one = {"scales": [scales[a] if d == a else 1.0 for d in range(rank)],
               "shape": list(shape), "roi": [] if not roi else
               [roi[d] if d == a else 0.0 for d in range(rank)]
               + [roi[rank + d] if d == a else 1.0 for d in range(rank)]}
        out = node.outputs[0] if a == moved[-1] else f"{node.outputs[0]}__axis{a}"
        nodes.append(Node.make("resize", f"{node.name}__axis{a}", (source,), (out,),
                               **{**dict(node.attrs), **one}))
        source = out
    return nodes


@onnx_op("Upsample", 7, emits=("resize",), build_time_inputs=(1,))
def _upsample(ctx, n):
    scales = need_const(ctx, n, 1, "the scales input") if n.opset >= 9 else \
        np.array(n.attrs["scales"], np.float32)
    return _resize_nodes(ctx, n, scales, None, "asymmetric", "simple")


@onnx_op("Resize", 10, emits=("resize",), build_time_inputs=(1,))
def _resize10(ctx, n):
    scales = need_const(ctx, n, 1, "the scales input")
    return _resize_nodes(ctx, n, scales, None, "asymmetric", "simple")


# align_corners divides by in_len * scale - 1 as ONNX's reference does (fractional
# when a scale gives the output length; the spec's author confirmed it is meant so,
# onnx/onnx#2462), not by out_len - 1 as onnxruntime: they differ when
# in_len * scale is not an integer.
@onnx_op("Resize", 11, emits=("resize",), build_time_inputs=(1, 2, 3))
def _resize11(ctx, n):
    coord = n.text("coordinate_transformation_mode", "half_pixel")
    policy = n.text("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise ModelError(f"node {n.name!r} (Resize): keep_aspect_ratio_policy {policy!r} "
                         "is not supported")
    scales = need_const(ctx, n, 2, "the scales input")
    sizes = need_const(ctx, n, 3, "the sizes input")
    roi = need_const(ctx, n, 1, "the roi input") if coord == "tf_crop_and_resize" else None
    return _resize_nodes(ctx, n, scales, sizes, coord,
                         n.text("nearest_mode", "round_prefer_floor"), n.attrs.get("axes"),
                         policy, roi)


_GRID_MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic",
               "nearest": "nearest"}


@onnx_op("GridSample", 16, emits=("grid_sample",))
def _grid_sample(ctx, n):
    """Opset 16's bilinear / bicubic are opset 20's linear / cubic (and 20 adds N-D)."""
    mode, padding = n.text("mode", "bilinear"), n.text("padding_mode", "zeros")
    if mode not in _GRID_MODES or padding not in ("zeros", "border", "reflection"):
        raise ModelError(f"node {n.name!r} (GridSample): mode {mode!r} / padding_mode "
                         f"{padding!r} is not supported")
    return [Node.make("grid_sample", n.name, n.inputs[:2], n.outputs[:1], mode=_GRID_MODES[mode],
                      padding=padding, align_corners=int(n.attrs.get("align_corners", 0)))]
