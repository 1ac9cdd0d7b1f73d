"""matmul_nbits: a float matrix times weights quantized blockwise to 4 or 8 bits, in
onnxruntime's MatMulNBits layout, kept packed (the graph op of com.microsoft.MatMulNBits).

  a       [..., K]             float32 (run time)
  b       [N, nb, blob]        uint8: column n's K weights in nb = ceil(K / block) blocks
                               of `block` values, 4-bit ones two to a byte (the even
                               index in the low nibble), blob = block * bits / 8 bytes
  scales  [N, nb]              float32
  [zero_points]                zero_points="packed": uint8 [N, ceil(nb * bits / 8)], 4-bit
                               ones two to a byte like b; "float": float32 [N, nb];
                               "none": 2^(bits - 1) (8 or 128)
  [bias   [N]]                 float32 (bias=1)
  out     [..., N]             a @ W + bias, W[k, n] = (q[n, k] - z[n, k // block]) *
                               scales[n, k // block]

layout="cols16" (set by AlterOpLayout, transform/layout.py, for constant 4-bit weights,
N a multiple of 16 and K of the block): the same shapes and bytes, each group of 16
columns' values interleaved column-fastest (to_cols16: b as [N/16, nb, blob, 16],
scales and zero points as [N/16, nb or ceil(nb/2), 16]), so a kernel loads one
value of 16 columns at once (kernels/nbits.py).
layout="cols16x4" (instead, on a target with AVX-512 VNNI where the zero points
are packed or absent; at accuracy=4 also for any K and N): b interleaved in runs of
4 bytes, [N'/16, nb, blob/4, 16, 4] (scales and zero points as cols16), so 64 bytes
hold 8 values of each of 16 columns, the operand of one vpdpbusd
(kernels/nbits_int8.py); N' is N rounded up to 16 (zero columns; attr units = N
where they differ).
accuracy=4 (onnxruntime's accuracy_level 4): the product may quantize `a` to int8
per block (kernels/nbits_int8.py, on the cols16x4 layout); the numpy reference is
the float product. Other levels (0, unset, onnxruntime's default, is float32 there)
keep float32's accuracy: in cols16x4 a few rows' product splits `a` into three int8
parts whose sum is `a` to about 2^-24 of its block's largest value.

gather_nbits: rows of a table quantized blockwise along its rows, dequantized (the graph
op of com.microsoft.GatherBlockQuantized with gather_axis 0 and the last axis quantized:
a decoder's embedding table as onnxruntime's quantizer writes it), kept packed.

  data    [V, row_bytes]       uint8: row v's `cols` values, 4-bit ones two to a byte
                               (the even index in the low nibble), row_bytes =
                               ceil(cols * bits / 8)
  indices [...]                int32/int64 (run time), negative ones from the end
  scales  [V, nb]              float32, nb = ceil(cols / block)
  [zero_points]                zero_points="packed": uint8 [V, ceil(nb * bits / 8)], like
                               data; "none": 2^(bits - 1) (8 or 128)
  out     [..., cols]          out[i, c] = (q[k, c] - z[k, c // block]) * scales[k, c // block],
                               k = indices[i]

Their lowerings: pipeline/kernels/nbits.py, pipeline/kernels/nbits_gather.py. Their ONNX
converters: pipeline/frontend/onnx/nbits.py.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import TensorType
from pipeline.ops.registry import OpKind, register


def unpack_nbits(b: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint8 rows [N, ...] holding `bits`-bit values (4: two to a byte, the first in
    the low nibble) -> their first `count` values per row, as int32 [N, count]."""
    b = np.asarray(b, np.uint8).reshape(b.shape[0], -1)
    if bits == 4:
        b = np.stack([b & 15, b >> 4], axis=-1).reshape(b.shape[0], -1)
    return b[:, :count].astype(np.int32)


COLS = 16  # columns of a cols16 group
# per layout, to_cols16's run for b, scales and zero points
RUNS = {"cols16": (1, 1, 1), "cols16x4": (4, 1, 1)}


def to_cols16(value: np.ndarray, run: int = 1) -> np.ndarray:
    """b, scales or zero points [N, ...] -> the cols16 layout: [N'/16, ..., 16], as
    the shape [N', ...] (N' = N rounded up to 16: zero columns added; column 16g + j's
    values in group g, lane j); with `run` > 1, runs of that many of the last axis'
    values per column (cols16x4's b: 4)."""
    value = np.concatenate([value, np.zeros((-len(value) % COLS, *value.shape[1:]),
                                            value.dtype)])
    n, rest = value.shape[0], value.shape[1:]
    runs = (*rest[:-1], rest[-1] // run, run)
    moved = np.moveaxis(value.reshape(n // COLS, COLS, *runs), 1, -2)
    return np.ascontiguousarray(moved).reshape(value.shape)


def nbits_layout(node, consts: list, vnni: bool) -> str | None:
    """The layout AlterOpLayout gives a matmul_nbits node whose b, scales (and zero
    points) are `consts` (None: not a constant), `vnni` if the target has AVX-512
    VNNI: "cols16x4" for the int8 kernel (accuracy 4, zero points packed or none),
    else "cols16" (K a multiple of the block, N of 16), or None; 4 bits, constant,
    not reordered yet."""
    if node.attr("bits") != 4 or node.attr("layout") or any(c is None for c in consts):
        return None
    int8 = vnni and node.attr("zero_points") != "float"  # (onnxruntime's level 4 is
    if node.attr("accuracy") == 4 and int8:              # float for those too)
        return "cols16x4"
    whole = node.attr("k") % node.attr("block") == 0 and consts[0].shape[0] % COLS == 0
    if not whole:
        return None
    return "cols16x4" if int8 else "cols16"  # (other levels: three int8 parts, or float)


def from_cols16(value: np.ndarray, run: int = 1) -> np.ndarray:
    """to_cols16's inverse."""
    n, rest = value.shape[0], value.shape[1:]
    runs = (*rest[:-1], rest[-1] // run, COLS, run)
    moved = np.moveaxis(np.asarray(value).reshape(n // COLS, *runs), -2, 1)
    return np.ascontiguousarray(moved).reshape(value.shape)


def dequantize_nbits(b, scales, zero_points, node) -> np.ndarray:
    """The float32 weights W [K, N] a matmul_nbits node multiplies by."""
    bits, block, k = node.attr("bits"), node.attr("block"), node.attr("k")
    if node.attr("layout") in ("cols16", "cols16x4"):
        b = from_cols16(np.asarray(b), RUNS[node.attr("layout")][0])
        scales = from_cols16(np.asarray(scales))
        zero_points = None if zero_points is None else from_cols16(np.asarray(zero_points))
    n, nb = scales.shape
    q = unpack_nbits(b, bits, nb * block).reshape(n, nb, block)
    kind = node.attr("zero_points")
    if kind == "packed":
        z = unpack_nbits(zero_points, bits, nb).astype(np.float32)
    elif kind == "float":
        z = np.asarray(zero_points, np.float32)
    else:
        z = np.full((n, nb), 2.0 ** (bits - 1), np.float32)
    w = (q.astype(np.float32) - z[..., None]) * np.asarray(scales, np.float32)[..., None]
    return w.reshape(n, nb * block)[:node.attr("units") or n, :k].T


def _numpy(xs, node):
    a, b, scales = xs[:3]
    zp = xs[3] if node.attr("zero_points") != "none" else None
    y = np.asarray(a, np.float32) @ dequantize_nbits(b, scales, zp, node)
    if node.attr("bias"):
        y = y + xs[-1]
    return [y.astype(np.float32)]


def _infer(types, node):
    a, b, scales = types[:3]
    k, bits, block = node.attr("k"), node.attr("bits"), node.attr("block")
    n, nb = b.shape[0], -(-k // block)
    units = node.attr("units") or n  # N (cols16x4 pads b, scales, zero points to 16s)
    want = [("a", a, None, "float32"), ("b", b, (n, nb, block * bits // 8), "uint8"),
            ("scales", scales, (n, nb), "float32")]
    if node.attr("zero_points") == "packed":
        want.append(("zero_points", types[3], (n, -(-nb * bits // 8)), "uint8"))
    elif node.attr("zero_points") == "float":
        want.append(("zero_points", types[3], (n, nb), "float32"))
    if node.attr("bias"):
        want.append(("bias", types[-1], (units,), "float32"))
    for what, t, shape, dtype in want:
        if t.dtype != dtype or (shape is not None and t.shape != shape) or \
                (shape is None and (not t.shape or t.shape[-1] != k)):
            raise ModelError(f"node {node.name!r} (matmul_nbits): {what} is {t.dtype} "
                             f"{list(t.shape)}, expected {dtype} "
                             f"{list(shape) if shape else ['...', k]}")
    return [TensorType(a.shape[:-1] + (units,), "float32")]


def _sample(rng, dtype):
    k, n, block = 40, 6, 16  # a partial last block
    nb = -(-k // block)
    b = rng.integers(0, 256, (n, nb, block // 2)).astype(np.uint8)
    zp = rng.integers(0, 256, (n, -(-nb // 2))).astype(np.uint8)
    return ([rng.uniform(-1, 1, (3, k)).astype(np.float32), b,
             rng.uniform(0.01, 0.1, (n, nb)).astype(np.float32), zp,
             rng.uniform(-1, 1, n).astype(np.float32)],
            {"k": k, "bits": 4, "block": block, "zero_points": "packed", "bias": 1})


register("matmul_nbits", OpKind.ANCHOR, _infer, numpy=_numpy, sample=_sample)


def _gather_numpy(xs, node):
    data, indices, scales = (np.asarray(x) for x in xs[:3])
    bits, block, cols = node.attr("bits"), node.attr("block"), node.attr("cols")
    rows, nb = scales.shape
    if indices.size and (indices.min() < -rows or indices.max() >= rows):
        raise ModelError(f"node {node.name!r} (gather_nbits): indices out of range "
                         f"[-{rows}, {rows})")
    picked = np.where(indices < 0, indices + rows, indices).reshape(-1)
    q = unpack_nbits(data[picked], bits, cols).astype(np.float32)
    if node.attr("zero_points") == "packed":
        z = unpack_nbits(np.asarray(xs[3])[picked], bits, nb).astype(np.float32)
    else:
        z = np.full((picked.size, nb), 2.0 ** (bits - 1), np.float32)
    w = (q - np.repeat(z, block, axis=1)[:, :cols]) * \
        np.repeat(scales[picked].astype(np.float32), block, axis=1)[:, :cols]
    return [w.reshape(*indices.shape, cols).astype(np.float32)]


def _gather_infer(types, node):
    data, indices, scales = types[:3]
    bits, block, cols = node.attr("bits"), node.attr("block"), node.attr("cols")
    rows, nb = data.shape[0], -(-cols // block)
    want = [("data", data, (rows, -(-cols * bits // 8)), ("uint8",)),
            ("indices", indices, None, ("int32", "int64")),
            ("scales", scales, (rows, nb), ("float32",))]
    if node.attr("zero_points") == "packed":
        want.append(("zero_points", types[3], (rows, -(-nb * bits // 8)), ("uint8",)))
    for what, t, shape, dtypes in want:
        if t.dtype not in dtypes or (shape is not None and t.shape != shape):
            raise ModelError(f"node {node.name!r} (gather_nbits): {what} is {t.dtype} "
                             f"{list(t.shape)}, expected {' or '.join(dtypes)}"
                             f"{' ' + str(list(shape)) if shape else ''}")
    return [TensorType(indices.shape + (cols,), "float32")]


def _gather_sample(rng, dtype):
    rows, cols, block = 5, 40, 16  # a partial last block
    nb = -(-cols // block)
    return ([rng.integers(0, 256, (rows, cols // 2)).astype(np.uint8),
             rng.integers(-rows, rows, (2, 3)), rng.uniform(0.01, 0.1, (rows, nb))
             .astype(np.float32), rng.integers(0, 256, (rows, -(-nb // 2))).astype(np.uint8)],
            {"bits": 4, "block": block, "cols": cols, "zero_points": "packed"})


register("gather_nbits", OpKind.ANCHOR, _gather_infer, numpy=_gather_numpy,
         sample=_gather_sample)
