"""int4 and uint4 arrays as the library stores them: two elements a byte, element 2i
in the low nibble of byte i (ONNX's and DLPack's packing). numpy (ml_dtypes) holds them
one a byte; these convert between the two (param dicts, .ro constants, executors)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

PACKED = (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4))


def pack_nibbles(arr: np.ndarray) -> np.ndarray:
    """An int4 or uint4 array (one element a byte) as its packed uint8 bytes (an odd
    count: the last high nibble 0)."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8) & 15
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def unpack_nibbles(raw: np.ndarray, dtype, shape) -> np.ndarray:
    """pack_nibbles' inverse: packed uint8 bytes -> a new int4/uint4 array of `shape`."""
    count = int(np.prod(shape, dtype=np.int64))
    nibbles = np.stack([raw & 15, raw >> 4], axis=-1).reshape(-1)[:count]
    if np.dtype(dtype) == PACKED[0]:
        nibbles = (nibbles.astype(np.int8) << 4) >> 4  # sign-extend bit 3
    return nibbles.astype(np.int8).astype(dtype).reshape(shape)
