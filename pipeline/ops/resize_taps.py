"""Resize's source coordinates and interpolation taps per output axis, which both
the numpy reference (pipeline/ops/resize.py) and the lowering
(pipeline/kernels/resize.py) compute from."""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import TensorType, row_major_strides


def source_coords(mode: str, in_len: int, out_len: int, scale: float,
                  roi: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """The input coordinate of every output index along one axis: float32, as
    onnxruntime computes them, except align_corners and tf_crop_and_resize (float64,
    as ONNX's reference: their target length in_len * scale is fractional when a
    scale gives it, onnx/onnx#2462, and tf_crop_and_resize's bounds test needs it)."""
    x, s, f = np.arange(out_len, dtype=np.float32), np.float32(scale), np.float32
    if mode in ("align_corners", "tf_crop_and_resize"):
        width = np.float64(in_len) * scale
        start, end = roi if mode == "tf_crop_and_resize" else (0.0, 1.0)
        if width == 1:
            return np.full(out_len, (start + end) / 2 * (in_len - 1))
        return start * (in_len - 1) + np.arange(out_len, dtype=np.float64) * (
            (end - start) * (in_len - 1) / (width - 1))
    if mode == "half_pixel":
        return (x + f(0.5)) / s - f(0.5)
    if mode == "pytorch_half_pixel":
        return (x + f(0.5)) / s - f(0.5) if out_len > 1 else np.zeros_like(x)
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


def _antialias_taps(node, src: np.ndarray, scale: float) -> list[tuple]:
    """Taps of linear or cubic interpolation with the kernel stretched by 1 / scale
    when downsampling (ONNX antialias): 2 * ceil(support / scale) taps around src,
    their weights normalised to sum 1, as ONNX's reference computes them."""
    s = min(scale, 1.0)
    support = 1 if node.attr("mode") == "linear" else 2
    start = int(np.floor(-support / s) + 1)
    lo = np.floor(src)
    ratio = src - lo
    # On an input index the window starts one further left (ratio 1), as the reference's
    lo, ratio = np.where(ratio == 0, lo - 1, lo), np.where(ratio == 0, 1.0, ratio)
    ks = np.arange(start, 2 - start)
    t = np.abs((ks[None, :] - ratio[:, None]) * s)
    if support == 1:
        w = np.clip(1 - t, 0, 1)
    else:
        a = node.attr("cubic_a")
        w = np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                     np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))
    w = w / w.sum(axis=1, keepdims=True)
    return [(lo + k, w[:, j]) for j, k in enumerate(ks)]


def _axis_taps(node, d: int, n_in: int, n_out: int, stride: int):
    """The taps of one axis: [(input offsets, weights or None)] per output index."""
    scale = node.attr("scales")[d]
    roi = node.attr("roi")
    src = source_coords(node.attr("coord"), n_in, n_out, scale,
                        (roi[d], roi[d + len(roi) // 2]) if roi else (0.0, 1.0))
    mode = node.attr("mode")
    if mode == "nearest":
        idx = np.clip(_nearest(node.attr("nearest"), src, scale), 0, n_in - 1)
        return [(idx.astype(np.int64) * stride, None)]
    antialias = node.attr("antialias", 0)
    if mode == "linear" and not antialias:
        src = np.clip(src, 0, n_in - 1)
    lo = np.floor(src)
    frac = (src - lo).astype(np.float64)
    if not frac.any() and (not antialias or scale >= 1):
        # every output index sits on an input index: no blending
        return [(np.clip(lo, 0, n_in - 1).astype(np.int64) * stride, None)]
    if antialias:
        taps = _antialias_taps(node, src.astype(np.float64), scale)
    elif mode == "linear":
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


def taps_of(node, x: TensorType, out: TensorType):
    return [_axis_taps(node, d, n_in, n_out, stride) for d, (n_in, n_out, stride)
            in enumerate(zip(x.shape, out.shape, row_major_strides(x.shape), strict=True))]


def extrapolated(node, x: TensorType, out: TensorType) -> list[np.ndarray | None]:
    """Per axis, which output indices map outside the input (tf_crop_and_resize: the
    output is the extrapolation value where any axis does), or None."""
    if node.attr("coord") != "tf_crop_and_resize":
        return [None] * len(x.shape)
    roi = node.attr("roi")
    masks = []
    for d, (n_in, n_out) in enumerate(zip(x.shape, out.shape, strict=True)):
        src = source_coords("tf_crop_and_resize", n_in, n_out, node.attr("scales")[d],
                            (roi[d], roi[d + len(roi) // 2]))
        outside = (src < 0) | (src > n_in - 1)
        masks.append(outside if outside.any() else None)
    return masks
