"""Resize and Upsample: nearest (all rounding modes) and n-linear interpolation
with the ONNX coordinate transformation modes, from scales or sizes.

Per output axis the source coordinate of every output index is computed here,
in float32 as onnxruntime does, and turned into index tables: nearest mode
reads one input element (an index remap), linear mode blends the 2^k corners
of the k axes that need interpolation with per-axis weight tables.
"""

from __future__ import annotations

import itertools
from functools import reduce

import numpy as np

from pipeline.codegen.builder import F32, row_major_strides
from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import onnx_op, register
from pipeline.ops.shape import axis_term, need_const

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


def _axis_tables(node, x: TensorType, out: TensorType):
    """Per axis: (lo offsets, hi offsets, weights of hi) or (offsets, None, None)."""
    tables = []
    for d, (n_in, n_out, stride) in enumerate(zip(x.shape, out.shape,
                                                  row_major_strides(x.shape), strict=True)):
        src = source_coords(node.attr("coord"), n_in, n_out, node.attr("scales")[d])
        if node.attr("mode") == "nearest":
            idx = np.clip(_nearest(node.attr("nearest"), src, node.attr("scales")[d]),
                          0, n_in - 1).astype(np.int64)
            tables.append((idx * stride, None, None))
            continue
        src = np.clip(src, 0, n_in - 1)
        lo = np.floor(src).astype(np.int64)
        weight = (src - lo).astype(np.float32)
        if not weight.any():
            tables.append((lo * stride, None, None))
        else:
            tables.append((lo * stride, np.minimum(lo + 1, n_in - 1) * stride, weight))
    return tables


def _resize_infer(types, node):
    x = types[0]
    if node.attr("mode") == "linear" and x.dtype != "float32":
        raise ModelError(f"node {node.name!r} (resize): linear mode needs float32, "
                         f"not {x.dtype}")
    return [TensorType(tuple(node.attr("shape")), x.dtype)]


def _resize_lower(kb, node, ins, out, epilogue):
    tables = _axis_tables(node, ins[0].type, out.type)
    with kb.nest(out.type.shape, "o") as index:
        base, blends = 0, []
        for i, (lo, hi, weight) in zip(index, tables, strict=True):
            if weight is None:
                base = kb.add(base, axis_term(kb, lo, i))
            else:
                w = kb.load_table(kb.table(weight.tolist(), F32), i)
                blends.append((axis_term(kb, lo, i), axis_term(kb, hi, i), w))
        value = None
        for corner in itertools.product((0, 1), repeat=len(blends)):
            offset, weight = base, None
            for bit, (lo, hi, w) in zip(corner, blends, strict=True):
                offset = kb.add(offset, hi if bit else lo)
                factor = w if bit else kb.fsub(kb.f32(1.0), w)
                weight = factor if weight is None else kb.fmul(weight, factor)
            term = kb.load(ins[0], offset)
            term = term if weight is None else kb.fmul(weight, term)
            value = term if value is None else kb.fadd(value, term)
        if epilogue is not None:
            value = epilogue(value, index)
        kb.store(out, kb.dot(index, out.strides), value)


def _resize_np(xs, node):
    x = xs[0]
    out_type = TensorType(tuple(node.attr("shape")), str(x.dtype))
    tables = _axis_tables(node, TensorType(x.shape, str(x.dtype)), out_type)
    flat = x.reshape(-1)
    result = np.zeros(out_type.shape, np.float64 if x.dtype.kind == "f" else x.dtype)
    for corner in itertools.product((0, 1), repeat=len(tables)):
        if any(bit and t[2] is None for bit, t in zip(corner, tables, strict=True)):
            continue
        offsets = [t[1] if bit else t[0] for bit, t in zip(corner, tables, strict=True)]
        weights = [np.ones(len(t[0])) if t[2] is None else t[2] if bit else 1 - t[2]
                   for bit, t in zip(corner, tables, strict=True)]
        weight = reduce(np.multiply, np.ix_(*weights), np.ones(()))
        result = result + weight * flat[reduce(np.add, np.ix_(*offsets), np.zeros((), int))]
    return [result.astype(x.dtype)]


register("resize", "anchor", _resize_infer, lower=_resize_lower, numpy=_resize_np)


# -- ONNX converters -------------------------------------------------------------------

def _text(n, key: str, default: str) -> str:
    value = n.attrs.get(key, default)
    return value.decode() if isinstance(value, bytes) else value


def _resize_node(ctx, n, scales, sizes, coord: str, nearest: str, axes=None,
                 policy: str = "stretch") -> Node:
    in_shape = ctx.type(n.inputs[0]).shape
    rank = len(in_shape)
    mode = _text(n, "mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise ModelError(f"node {n.name!r} ({n.op_type}): mode {mode!r} is not supported "
                         "(nearest, linear are)")
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
                     nearest=nearest, scales=full_scales, shape=shape)


@onnx_op("Upsample", 7)
def _upsample(ctx, n):
    scales = need_const(ctx, n, 1, "the scales input") if n.opset >= 9 else \
        np.array(n.attrs["scales"], np.float32)
    return [_resize_node(ctx, n, scales, None, "asymmetric", "simple")]


@onnx_op("Resize", 10)
def _resize10(ctx, n):
    scales = need_const(ctx, n, 1, "the scales input")
    return [_resize_node(ctx, n, scales, None, "asymmetric", "simple")]


@onnx_op("Resize", 11)
def _resize11(ctx, n):
    coord = _text(n, "coordinate_transformation_mode", "half_pixel")
    if int(n.attrs.get("antialias", 0)):
        raise ModelError(f"node {n.name!r} (Resize): antialias is not supported")
    policy = _text(n, "keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise ModelError(f"node {n.name!r} (Resize): keep_aspect_ratio_policy {policy!r} "
                         "is not supported")
    scales = need_const(ctx, n, 2, "the scales input")
    sizes = need_const(ctx, n, 3, "the sizes input")
    return [_resize_node(ctx, n, scales, sizes, coord,
                         _text(n, "nearest_mode", "round_prefer_floor"), n.attrs.get("axes"),
                         policy)]
