"""Resize's source coordinates and interpolation taps per output axis, which both
the numpy reference (pipeline/ops/resize.py) and the lowering
(pipeline/kernels/resize.py) compute from."""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import TensorType, row_major_strides


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


def taps_of(node, x: TensorType, out: TensorType):
    return [_axis_taps(node, d, n_in, n_out, stride) for d, (n_in, n_out, stride)
            in enumerate(zip(x.shape, out.shape, row_major_strides(x.shape), strict=True))]
