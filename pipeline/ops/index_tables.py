"""The index tables of Slice and Pad (see pipeline/ops/movement_tables.py): what the
numpy references (pipeline/ops/index.py) and the lowerings (pipeline/kernels/index.py)
both compute from, so neither imports the other."""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import row_major_strides
from pipeline.ops.movement_tables import OUTSIDE


def slice_tables(node, x, out):
    strides = row_major_strides(x.shape)
    return [(start + np.arange(count, dtype=np.int64) * step) * s for start, step, count, s
            in zip(node.attr("starts"), node.attr("steps"), out.shape, strides, strict=True)]


def _source_index(mode: str, src: np.ndarray, size: int) -> np.ndarray:
    """The input index each output position reads along one axis (OUTSIDE if none)."""
    if mode == "constant":
        return np.where((src >= 0) & (src < size), src, OUTSIDE)
    if mode == "edge":
        return np.clip(src, 0, size - 1)
    if mode == "wrap":
        return src % size
    if size == 1:  # reflect
        return np.zeros_like(src)
    period = 2 * (size - 1)
    src = src % period
    return np.where(src < size, src, period - src)


def pad_tables(node, x, out):
    mode = node.attr("mode")
    tables = []
    for d, (size, stride) in enumerate(zip(x.shape, row_major_strides(x.shape),
                                           strict=True)):
        src = _source_index(mode, np.arange(out.shape[d], dtype=np.int64)
                            - node.attr("pads")[d], size)
        tables.append(np.where(src == OUTSIDE, OUTSIDE, src * stride))
    return tables
