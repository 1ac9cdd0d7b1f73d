"""Constant arrays reshaped for AlterOpLayout's blocked kernels (transform/layout.py):
zero filters, columns or channels appended to whole vectors, and one-channel int8
weights as four columns a pixel."""

from __future__ import annotations

import numpy as np


def columns_as_channels(weight: np.ndarray) -> np.ndarray:
    """[OC, 1, KH, KW <= 4] -> [OC, 4, KH, 1]: channel j the weight of column j (zero
    past KW), for qpad_nchwc's window layout (four consecutive columns a pixel)."""
    oc, _, kh, kw = weight.shape
    out = np.zeros((oc, 4, kh, 1), weight.dtype)
    out[:, :kw, :, 0] = weight[:, 0].transpose(0, 2, 1)
    return out


def pad_columns(value: np.ndarray, width: int) -> np.ndarray:
    """`value` ([..., N]) with zero columns appended up to `width`, contiguous."""
    pad = [(0, 0)] * (value.ndim - 1) + [(0, width - value.shape[-1])]
    return np.ascontiguousarray(np.pad(value, pad))


def pad_filters(value: np.ndarray, pad: int) -> np.ndarray:
    """`value` (weights [OC, ...] or bias [OC]) with `pad` zero filters appended."""
    return np.pad(value, [(0, pad)] + [(0, 0)] * (value.ndim - 1)) if pad else value


def pad_channels(value: np.ndarray, channels: int, pad: int) -> np.ndarray:
    """A constant broadcast against [N, channels, H, W]: with a channel dim of its own,
    `pad` zero channels appended (as numpy broadcasting aligns it, rank up to 4)."""
    v = value.reshape((1,) * (4 - value.ndim) + value.shape)
    return pad_filters(v.swapaxes(0, 1), pad).swapaxes(0, 1) if pad and v.shape[1] == \
        channels else value
