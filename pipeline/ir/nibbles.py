"""Sub-byte arrays as the library stores them: int4, uint4 and float4_e2m1fn two
elements a byte (element 2i in the low nibble of byte i), int2 and uint2 four (element
4i in the low two bits): ONNX's and DLPack's packing. numpy (ml_dtypes) holds them one
a byte; these convert between the two (param dicts, .ro constants, executors)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

# numpy dtype -> bits per element
PACKED = {np.dtype(ml_dtypes.int4): 4, np.dtype(ml_dtypes.uint4): 4,
          np.dtype(ml_dtypes.float4_e2m1fn): 4, np.dtype(ml_dtypes.int2): 2,
          np.dtype(ml_dtypes.uint2): 2}


def packed_nbytes(dtype, count: int) -> int:
    """Bytes of `count` packed elements of the sub-byte numpy `dtype`."""
    per = 8 // PACKED[np.dtype(dtype)]
    return (count + per - 1) // per


def pack_nibbles(arr: np.ndarray) -> np.ndarray:
    """A sub-byte array (one element a byte) as its packed uint8 bytes (the unused
    high bits of the last byte 0)."""
    bits = PACKED[arr.dtype]
    per = 8 // bits
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8) & ((1 << bits) - 1)
    if flat.size % per:
        flat = np.append(flat, np.zeros(per - flat.size % per, np.uint8))
    out = np.zeros(flat.size // per, np.uint8)
    for k in range(per):
        out |= flat[k::per] << (k * bits)
    return out


def unpack_nibbles(raw: np.ndarray, dtype, shape) -> np.ndarray:
    """pack_nibbles' inverse: packed uint8 bytes -> a new sub-byte array of `shape`."""
    dtype = np.dtype(dtype)
    bits = PACKED[dtype]
    count = int(np.prod(shape, dtype=np.int64))
    parts = [(raw >> (k * bits)) & ((1 << bits) - 1) for k in range(8 // bits)]
    # ml_dtypes holds an element as its low bits (int4 -1 is the byte 15)
    values = np.stack(parts, axis=-1).reshape(-1)[:count].astype(np.uint8)
    return values.view(dtype).reshape(shape).copy()
