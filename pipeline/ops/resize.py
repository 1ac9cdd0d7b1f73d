"""Resize and Upsample: nearest (all rounding modes), n-linear and cubic
interpolation with the ONNX coordinate transformation modes, from scales or sizes.

Per output axis the source coordinate of every output index is computed here,
in float32 as onnxruntime does, and turned into taps: (input offset, weight)
tables, one tap per axis for nearest (an index remap), two for linear, four for
cubic. An output element is the weighted sum over every combination of one tap
per axis; axes that need no blending (batch, channels) have a single tap.
"""

from __future__ import annotations

import itertools
from functools import reduce

import numpy as np

from pipeline.dsl.builder import F32, row_major_strides
from pipeline.dsl.vector import ELEMENT_WORK, parallel_nest
from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.movement import axis_term
from pipeline.ops.registry import Limit, onnx_op, register
from pipeline.ops.shape import need_const

_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


def source_coords(mode: str, in_len: int, out_len: int, scale: float) -> np.ndarray:
    """The input coordinate of every output index along one axis (float32)."""
    x, s, f = np.arange(out_len, dtype=np.float32), np.float32(scale), np.float32
    if mode == "half_pixel":
        return (x + f(0.5)) / s - f(0.5)
    if mode == "pytorch_half_pixel":
        return (x + f(0.5)) / s - f(0.5) if out_len > 1 else np.zeros_like(x)
    if mode == "align_corners":
        return np.zeros_like(x) if out_len == 1 else x * f(in_len - 1) / f(out_len - 1)
    if mode == "asymmetric":
        return x / s
    if mode == "tf_half_pixel_for_nn":
        return (x + f(0.5)) / s
    # half_pixel_symmetric
    adjustment = f(out_len) / (s * f(in_len))
    offset = f(in_len) / f(2) * (f(1) - adjustment)
    return offset + (x + f(0.5)) / s - f(0.5)


def _nearest(mode: str, x: np.ndarray, scale: float) -> np.ndarray:
    if mode == "round_prefer_floor":
        return np.ceil(x - np.float32(0.5))
    if mode == "round_prefer_ceil":
        return np.floor(x + np.float32(0.5))
    if mode == "floor" or (mode == "simple" and scale >= 1):
        return np.floor(x)
    return np.ceil(x)  # ceil, or "simple" when downsampling (Resize-10, Upsample)


def _cubic_weights(frac: np.ndarray, a: float) -> list[np.ndarray]:
    """Keys cubic convolution weights of the taps at floor(x) - 1 .. floor(x) + 2."""
    def near(t):  # |t| <= 1
        return ((a + 2) * t - (a + 3)) * t * t + 1

    def far(t):  # 1 < |t| < 2
        return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a

    return [far(frac + 1), near(frac), near(1 - frac), far(2 - frac)]


def _axis_taps(node, d: int, n_in: int, n_out: int, stride: int):
    """The taps of one axis: [(input offsets, weights or None)] per output index."""
    scale = node.attr("scales")[d]
    src = source_coords(node.attr("coord"), n_in, n_out, scale)
    mode = node.attr("mode")
    if mode == "nearest":
        idx = np.clip(_nearest(node.attr("nearest"), src, scale), 0, n_in - 1)
        return [(idx.astype(np.int64) * stride, None)]
    if mode == "linear":
        src = np.clip(src, 0, n_in - 1)
    lo = np.floor(src)
    frac = (src - lo).astype(np.float64)
    if not frac.any():  # every output index sits on an input index: no blending
        return [(np.clip(lo, 0, n_in - 1).astype(np.int64) * stride, None)]
    if mode == "linear":
        taps = [(lo, 1 - frac), (lo + 1, frac)]
    else:
        taps = list(zip((lo + k for k in (-1, 0, 1, 2)),
                        _cubic_weights(frac, node.attr("cubic_a")), strict=True))
        if node.attr("exclude_outside"):  # taps outside get no weight; renormalise
            taps = [(i, np.where((i >= 0) & (i < n_in), w, 0)) for i, w in taps]
            total = sum(w for _, w in taps)
            taps = [(i, w / total) for i, w in taps]
    return [(np.clip(i, 0, n_in - 1).astype(np.int64) * stride, w.astype(np.float32))
            for i, w in taps]


def _taps(node, x: TensorType, out: TensorType):
    return [_axis_taps(node, d, n_in, n_out, stride) for d, (n_in, n_out, stride)
            in enumerate(zip(x.shape, out.shape, row_major_strides(x.shape), strict=True))]


def _resize_infer(types, node):
    x = types[0]
    if node.attr("mode") != "nearest" and x.dtype not in ("float32", "float16"):
        raise ModelError(f"node {node.name!r} (resize): {node.attr('mode')} mode needs "
                         f"float32 or float16, not {x.dtype}")
    return [TensorType(tuple(node.attr("shape")), x.dtype)]


def _resize_lower(kb, node, ins, out, epilogue):
    """Sum over every combination of one tap per axis of weight product x input."""
    taps = _taps(node, ins[0].type, out.type)
    work = out.type.size * ELEMENT_WORK * 2
    with parallel_nest(kb, out.type.shape, "o", work=work) as index:
        axes = [[(axis_term(kb, offsets, i),
                  None if w is None else kb.load_table(kb.table(w.tolist(), F32), i))
                 for offsets, w in axis] for i, axis in zip(index, taps, strict=True)]
        value = None
        for combo in itertools.product(*axes):
            offset, weight = 0, None
            for term, w in combo:
                offset = offset + term
                if w is not None:
                    weight = w if weight is None else kb.fmul(weight, w)
            term = kb.load(ins[0], offset)
            term = term if weight is None else kb.fmul(weight, term)
            value = term if value is None else kb.fadd(value, term)
        if epilogue is not None:
            value = epilogue(value, index)
        kb.store(out, kb.dot(index, out.strides), value)


def _resize_np(xs, node):
    x = xs[0]
    out_type = TensorType(tuple(node.attr("shape")), str(x.dtype))
    taps = _taps(node, TensorType(x.shape, str(x.dtype)), out_type)
    flat = x.reshape(-1)
    result = np.zeros(out_type.shape, np.float64 if x.dtype.kind == "f" else x.dtype)
    for combo in itertools.product(*taps):
        offsets = reduce(np.add, np.ix_(*(o for o, _ in combo)), np.zeros((), np.int64))
        weights = [np.ones(len(o)) if w is None else w for o, w in combo]
        weight = reduce(np.multiply, np.ix_(*weights), np.ones(()))
        result = result + weight * flat[offsets]
    return [result.astype(x.dtype)]


register("resize", "anchor", _resize_infer, lower=_resize_lower, numpy=_resize_np,
         sample=lambda rng, dtype: ([rng.uniform(-2, 2, (1, 2, 3, 4)).astype(dtype)], {
             "mode": "linear", "coord": "half_pixel", "nearest": "round_prefer_floor",
             "scales": (1.0, 1.0, 2.0, 1.5), "shape": (1, 2, 6, 6), "cubic_a": -0.75,
             "exclude_outside": 0}))


# -- ONNX converters -------------------------------------------------------------------

def _resize_node(ctx, n, scales, sizes, coord: str, nearest: str, axes=None,
                 policy: str = "stretch") -> Node:
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
            full_scales[a] = float(ratio)
    elif scales is not None and scales.size:
        for a, s in zip(axes, scales.tolist(), strict=True):
            full_scales[a] = float(s)
            shape[a] = int(np.floor(np.float32(s) * np.float32(in_shape[a])))
    else:
        raise ModelError(f"node {n.name!r} ({n.op_type}): needs scales or sizes")
    return Node.make("resize", n.name, n.inputs[:1], n.outputs[:1],
                     mode="linear" if mode == "bilinear" else mode, coord=coord,
                     nearest=nearest, scales=full_scales, shape=shape,
                     cubic_a=float(n.attrs.get("cubic_coeff_a", -0.75)),
                     exclude_outside=int(n.attrs.get("exclude_outside", 0)))


@onnx_op("Upsample", 7, emits=("resize",), build_time_inputs=(1,))
def _upsample(ctx, n):
    scales = need_const(ctx, n, 1, "the scales input") if n.opset >= 9 else \
        np.array(n.attrs["scales"], np.float32)
    return [_resize_node(ctx, n, scales, None, "asymmetric", "simple")]


@onnx_op("Resize", 10, emits=("resize",), build_time_inputs=(1,))
def _resize10(ctx, n):
    scales = need_const(ctx, n, 1, "the scales input")
    return [_resize_node(ctx, n, scales, None, "asymmetric", "simple")]


# The ONNX spec (and reference) divide align_corners by in_len * scale - 1,
# onnxruntime by out_len - 1: they differ when in_len * scale is not an integer;
# we follow onnxruntime. Scales fed as an input are not known to the backend's
# check, so that limit also skips integer upsampling cases.
@onnx_op("Resize", 11, emits=("resize",), build_time_inputs=(1, 2, 3), limits=(
    Limit("antialias", lambda n: bool(n.attrs.get("antialias", 0))),
    Limit("coordinate_transformation_mode tf_crop_and_resize",
          lambda n: n.attrs.get("coordinate_transformation_mode") == b"tf_crop_and_resize"),
    Limit("align_corners with scales (ONNX reference and onnxruntime disagree)",
          lambda n: n.attrs.get("coordinate_transformation_mode") == b"align_corners"
          and n.given(2) and not n.given(3))))
def _resize11(ctx, n):
    coord = n.text("coordinate_transformation_mode", "half_pixel")
    if int(n.attrs.get("antialias", 0)):
        raise ModelError(f"node {n.name!r} (Resize): antialias is not supported")
    policy = n.text("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise ModelError(f"node {n.name!r} (Resize): keep_aspect_ratio_policy {policy!r} "
                         "is not supported")
    scales = need_const(ctx, n, 2, "the scales input")
    sizes = need_const(ctx, n, 3, "the sizes input")
    return [_resize_node(ctx, n, scales, sizes, coord,
                         n.text("nearest_mode", "round_prefer_floor"), n.attrs.get("axes"),
                         policy)]
