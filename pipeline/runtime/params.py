"""Parameter dictionaries in TVM's `save_param_dict` binary layout.

Layout (all integers little endian):

    u64 0xF7E58D4F05049CB7  list magic
    u64 0                   reserved
    u64 N                   number of names, then N x (u64 length + UTF-8 bytes)
    u64 N                   number of arrays, then N arrays, each:
        u64 0xDD5E40F096B4A13F  array magic
        u64 0                   reserved
        i32 device_type (1 = CPU), i32 device_id (0)
        i32 ndim
        u8 type code (0 int, 1 uint, 2 float), u8 bits, u16 lanes (1)
        i64 shape[ndim]
        i64 data size in bytes, then the raw C-contiguous data

bfloat16 and the float8 types (ml_dtypes' numpy types) carry DLPack's codes: kDLBfloat
(4) with 16 bits, kDLFloat8_e4m3fn, _e4m3fnuz, _e5m2, _e5m2fnuz (10-13) with 8 bits.
int4 and uint4 (ml_dtypes' one-a-byte numpy types) are written packed, two to a byte,
as DLPack and TVM do (codes 0 and 1 with 4 bits; element 2i in the low nibble); int2 and
uint2 four to a byte (2 bits), float4_e2m1fn two (kDLFloat4_e2m1fn, 17, with 4 bits).
float8_e8m0fnu is kDLFloat8_e8m0fnu (14) with 8 bits.
bool arrays are written as TVM writes them: type code 1 (uint) with 1 bit,
one byte per element; that is what TVM's loader expects for "bool". On load,
uint/1 and DLPack's kDLBool (code 6, 8 bits) both come back as numpy bool.
"""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np

from pipeline.errors import FormatError, check_elements
from pipeline.ir.nibbles import PACKED, pack_nibbles, packed_nbytes, unpack_nibbles

__all__ = ["load_params", "pack_nibbles", "param_chunks", "param_names", "save_params",
           "unpack_nibbles"]

LIST_MAGIC = 0xF7E58D4F05049CB7
ARRAY_MAGIC = 0xDD5E40F096B4A13F
_CPU = 1

# numpy dtype -> (DLPack type code, bits). bool is TVM's UInt(1), stored in bytes.
_TO_DL = {
    np.dtype("float16"): (2, 16), np.dtype("float32"): (2, 32), np.dtype("float64"): (2, 64),
    np.dtype("int8"): (0, 8), np.dtype("int16"): (0, 16), np.dtype("int32"): (0, 32),
    np.dtype("int64"): (0, 64), np.dtype("uint8"): (1, 8), np.dtype("uint16"): (1, 16),
    np.dtype("uint32"): (1, 32), np.dtype("uint64"): (1, 64), np.dtype("bool"): (1, 1),
    # DLPack's kDLBfloat and kDLFloat8_* codes (ml_dtypes' numpy types)
    np.dtype(ml_dtypes.bfloat16): (4, 16), np.dtype(ml_dtypes.float8_e4m3fn): (10, 8),
    np.dtype(ml_dtypes.float8_e4m3fnuz): (11, 8), np.dtype(ml_dtypes.float8_e5m2): (12, 8),
    np.dtype(ml_dtypes.float8_e5m2fnuz): (13, 8),
    np.dtype(ml_dtypes.int4): (0, 4), np.dtype(ml_dtypes.uint4): (1, 4),
    np.dtype(ml_dtypes.float4_e2m1fn): (17, 4), np.dtype(ml_dtypes.float8_e8m0fnu): (14, 8),
    np.dtype(ml_dtypes.int2): (0, 2), np.dtype(ml_dtypes.uint2): (1, 2),
}
_PACKED = PACKED
_FROM_DL = {v: k for k, v in _TO_DL.items()}
_FROM_DL[(6, 8)] = np.dtype("bool")  # DLPack >= 0.8 kDLBool


def save_params(params: dict[str, np.ndarray]) -> bytes:
    """Serialize {name: array} to TVM param-dict bytes.

    Names are written in sorted order so equal dicts give equal bytes no
    matter their insertion order. Raises TypeError for non-str names and
    ValueError for unsupported dtypes.
    """
    return b"".join(param_chunks(params))


def param_chunks(params: dict[str, np.ndarray]) -> list:
    """save_params' bytes as a list of bytes-like chunks, the arrays' data
    uncopied where it already is C-contiguous little endian: for writing 100 MB
    of weights to a file (writelines) without first joining them."""
    names = sorted(params)
    parts = [struct.pack("<QQQ", LIST_MAGIC, 0, len(names))]
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"parameter names must be str, got {name!r}")
        raw = name.encode("utf-8")
        parts += [struct.pack("<Q", len(raw)), raw]
    parts.append(struct.pack("<Q", len(names)))
    for name in names:
        arr = np.asarray(params[name])
        code_bits = _TO_DL.get(arr.dtype.newbyteorder("="))
        if code_bits is None:
            raise ValueError(f"parameter {name!r}: unsupported dtype {arr.dtype} "
                             f"(supported: {', '.join(sorted(map(str, _TO_DL)))})")
        # Little endian on disk whatever the host byte order.
        data = pack_nibbles(arr) if arr.dtype in _PACKED else \
            np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        parts.append(struct.pack("<QQiiiBBH", ARRAY_MAGIC, 0, _CPU, 0, arr.ndim,
                                 code_bits[0], code_bits[1], 1))
        parts.append(struct.pack(f"<{arr.ndim}q", *arr.shape))
        parts += [struct.pack("<q", data.nbytes), data.reshape(-1).view(np.uint8)]
    return parts


class _Reader:
    """Sequential little-endian reader that reports truncation precisely."""

    def __init__(self, data: bytes):
        self.view = memoryview(data)
        self.pos = 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.view):
            raise FormatError(f"param dict truncated: expected {n} bytes for {what} at "
                             f"offset {self.pos}, only {len(self.view) - self.pos} left")
        chunk = self.view[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))


def load_params(data: bytes) -> dict[str, np.ndarray]:
    """Parse TVM param-dict bytes into {name: writable numpy array}.

    Raises FormatError (a ValueError) naming what was expected on a bad magic
    number, truncation, unsupported dtype, size mismatch or trailing bytes, and
    LimitError for a shape over pipeline.errors.check_elements' limit.
    """
    r = _Reader(data)
    names = _read_names(r)
    out = {}
    for name in names:
        out[name] = _read_array(r, name)
    if r.pos != len(r.view):
        raise FormatError(f"param dict has {len(r.view) - r.pos} unexpected trailing bytes")
    return out


def param_names(data: bytes) -> list[str]:
    """The names of TVM param-dict bytes, arrays left unread (what TVM's share_params
    reads of them); FormatError as load_params for a bad header or name."""
    return _read_names(_Reader(data))


def _read_names(r: _Reader) -> list[str]:
    """Header and names, up to and including the array count (checked against them)."""
    magic, _reserved = r.unpack("<QQ", "list header")
    if magic != LIST_MAGIC:
        raise FormatError(f"not a param dict: expected magic {LIST_MAGIC:#x}, found {magic:#x}")
    (count,) = r.unpack("<Q", "name count")
    names = []
    for i in range(count):
        (size,) = r.unpack("<Q", f"length of name {i}")
        try:
            names.append(str(r.take(size, f"name {i}"), "utf-8"))
        except UnicodeDecodeError:
            raise FormatError(f"param dict: name {i} is not UTF-8") from None
    (n_arrays,) = r.unpack("<Q", "array count")
    if n_arrays != count:
        raise FormatError(f"param dict has {count} names but {n_arrays} arrays")
    return names


def _read_array(r: _Reader, name: str) -> np.ndarray:
    magic, _res, _dev_type, _dev_id, ndim, code, bits, lanes = r.unpack(
        "<QQiiiBBH", f"header of array {name!r}")
    if magic != ARRAY_MAGIC:
        raise FormatError(f"array {name!r}: expected magic {ARRAY_MAGIC:#x}, found {magic:#x}")
    dtype = _FROM_DL.get((code, bits))
    if dtype is None or lanes != 1:
        raise FormatError(f"array {name!r}: unsupported type code {code} bits {bits} "
                         f"lanes {lanes}")
    if ndim < 0:
        raise FormatError(f"array {name!r}: negative ndim {ndim}")
    shape = r.unpack(f"<{ndim}q", f"shape of array {name!r}")
    (size,) = r.unpack("<q", f"data size of array {name!r}")
    if any(d < 0 for d in shape):
        raise FormatError(f"array {name!r}: negative dimension in shape {list(shape)}")
    count = check_elements(shape, f"param dict: array {name!r}")
    expected = packed_nbytes(dtype, count) if dtype in _PACKED else count * dtype.itemsize
    if size != expected:
        raise FormatError(f"array {name!r}: shape {list(shape)} of {dtype} needs {expected} "
                         f"bytes, header says {size}")
    raw = r.take(size, f"data of array {name!r}")
    if dtype in _PACKED:
        return unpack_nibbles(np.frombuffer(raw, np.uint8), dtype, shape)
    arr = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)
    # Copy: the result must be writable, native-endian and not pin `data`.
    return arr.astype(dtype, copy=True)
