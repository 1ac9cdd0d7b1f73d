"""The ONNX converters of com.microsoft.MatMulNBits (onnxruntime's blockwise 4- and 8-bit
weights, as its MatMulNBitsQuantizer writes them) to matmul_nbits and of
com.microsoft.GatherBlockQuantized (a 4- or 8-bit embedding table, which that quantizer
writes for a Gather) to gather_nbits (pipeline/ops/nbits.py): the packed weights, scales
and zero points go into the params as they are (no float copy of the weights),
reshaped to [N, blocks, ...] or, an int4/uint4 table, packed two values a byte.

accuracy_level (onnxruntime's choice of the activations' precision: 0/1 float32, 2
float16, 3 bfloat16, 4 int8): 4 becomes the node's accuracy=4, for which a target
with AVX-512 VNNI quantizes A to int8 per block and multiplies in integer as
onnxruntime does (kernels/nbits_int8.py: 4-bit constant weights, zero points packed
or absent, opt level 3); everything else, and levels 0 to 3, multiply in float32
with float32 accumulation, the most accurate of them.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import Limit, onnx_op
from pipeline.ir.graph import Node

_LIMITS = (Limit("bits other than 4 and 8", lambda v: v.attrs.get("bits", 4) not in (4, 8)),
           Limit("the g_idx input (act-order)",
                 lambda v: len(v.inputs) > 4 and bool(v.inputs[4])))


def _const(ctx, n, pos: int, what: str) -> np.ndarray | None:
    if pos >= len(n.inputs) or not n.inputs[pos]:
        return None
    value = ctx.const(n.inputs[pos])
    if value is None:
        raise ModelError(f"node {n.name!r} ({n.op_type}): {what} must be an initializer")
    return value


@onnx_op("com.microsoft.MatMulNBits", 1, emits=("matmul_nbits",),
         build_time_inputs=(1, 2, 3, 4, 5), limits=_LIMITS)
def _matmul_nbits(ctx, n):
    k, cols = int(n.attrs["K"]), int(n.attrs["N"])
    bits, block = int(n.attrs.get("bits", 4)), int(n.attrs["block_size"])
    if bits not in (4, 8) or block < 16 or block & (block - 1):
        raise ModelError(f"node {n.name!r} (MatMulNBits): bits {bits}, block_size {block} "
                         "(bits 4 or 8, block_size a power of two >= 16 are supported)")
    if _const(ctx, n, 4, "g_idx") is not None:
        raise ModelError(f"node {n.name!r} (MatMulNBits): the g_idx input is not supported")
    if ctx.type(n.inputs[0]).dtype != "float32":
        raise ModelError(f"node {n.name!r} (MatMulNBits): input A of "
                         f"{ctx.type(n.inputs[0]).dtype} (float32 is supported)")
    nb = -(-k // block)
    b = _const(ctx, n, 1, "B").reshape(cols, nb, block * bits // 8)
    scales = _const(ctx, n, 2, "scales").astype(np.float32).reshape(cols, nb)
    inputs = [n.inputs[0], ctx.add_param(f"{n.name}.b", b),
              ctx.add_param(f"{n.name}.scales", scales)]
    zp = _const(ctx, n, 3, "zero_points")
    kind = "none" if zp is None else "packed" if zp.dtype == np.uint8 else "float"
    if kind == "packed":
        inputs.append(ctx.add_param(f"{n.name}.zero_points",
                                    zp.reshape(cols, -(-nb * bits // 8))))
    elif kind == "float":
        inputs.append(ctx.add_param(f"{n.name}.zero_points",
                                    zp.astype(np.float32).reshape(cols, nb)))
    bias = _const(ctx, n, 5, "bias")
    if bias is not None:
        inputs.append(ctx.add_param(f"{n.name}.bias", bias.astype(np.float32).reshape(cols)))
    int8 = {"accuracy": 4} if int(n.attrs.get("accuracy_level", 0)) == 4 else {}
    return [Node.make("matmul_nbits", n.name, inputs, n.outputs[:1], k=k, bits=bits,
                      block=block, zero_points=kind, bias=int(bias is not None), **int8)]


def _blocks_of(value: np.ndarray, block: int) -> bool:
    """Whether `value` [K, N] is constant over each run of `block` rows."""
    firsts = value[::block]
    return np.array_equal(np.repeat(firsts, block, axis=0)[:value.shape[0]], value)


def _pack_rows(values: np.ndarray) -> np.ndarray:
    """uint values < 16 [N, L] -> [N, ceil(L / 2)] bytes, the even ones in the low nibble."""
    if values.shape[1] % 2:
        values = np.pad(values, ((0, 0), (0, 1)))
    return (values[:, 0::2] | (values[:, 1::2] << 4)).astype(np.uint8)


def from_dequantized(ctx, name: str, a: str, b: str, out: str) -> list[Node] | None:
    """MatMul(a, DequantizeLinear(q)) -> `out`, with q a constant int4/uint4 [K, N] whose scale and
    zero point are constant over blocks of K (blocked along K, per column, or per
    tensor: the QDQ form of onnxruntime's 4-bit quantizer) as one matmul_nbits with the
    weights repacked to MatMulNBits' layout at 4 bits, else None. Without it the
    weights become float at import (the MatMul converter evaluates a constant B)."""
    dq = ctx.pending.get(b)
    if dq is None or dq.op != "dequantize_linear" or \
            not all(i in ctx.params for i in dq.inputs) or ctx.type(a).dtype != "float32":
        return None
    q = ctx.params[dq.inputs[0]]
    if str(q.dtype) not in ("int4", "uint4") or q.ndim != 2 or \
            ctx.type(a).shape[-1:] != q.shape[:1]:
        return None
    k, cols = q.shape
    scale = np.broadcast_to(ctx.params[dq.inputs[1]], q.shape)
    zero = np.broadcast_to(ctx.params[dq.inputs[2]], q.shape).astype(np.int32)
    block = next((s for s in (256, 128, 64, 32, 16)
                  if _blocks_of(scale, s) and _blocks_of(zero, s)), None)
    if block is None:
        return None
    offset = 8 if str(q.dtype) == "int4" else 0  # (q + 8) - (z + 8): unsigned nibbles
    nb = -(-k // block)
    values = np.zeros((cols, nb * block), np.int32)
    values[:, :k] = q.astype(np.int32).T + offset
    inputs = [a, ctx.add_param(f"{name}.b", _pack_rows(values).reshape(cols, nb, block // 2)),
              ctx.add_param(f"{name}.scales",
                            np.ascontiguousarray(scale[::block].T, dtype=np.float32)),
              ctx.add_param(f"{name}.zero_points", _pack_rows(zero[::block].T + offset))]
    return [Node.make("matmul_nbits", name, inputs, (out,), k=k, bits=4,
                      block=block, zero_points="packed", bias=0)]


# What onnxruntime's quantizer writes for an embedding table [vocab, hidden]: gather
# axis 0, blocks along the hidden axis (1 = last), 4 bits, int4/uint4 tensors (the
# model builders: uint8 two values a byte, or 8 bits a byte), float32 scales.
_GATHER_LIMITS = (
    Limit("gather_axis other than 0", lambda v: v.attrs.get("gather_axis", 0) != 0),
    Limit("quantize_axis other than the last of a 2-D table",
          lambda v: v.attrs.get("quantize_axis", 1) not in (1, -1)),
    Limit("bits other than 4 and 8", lambda v: v.attrs.get("bits", 4) not in (4, 8)),
    Limit("scales other than float32",
          lambda v: len(v.inputs) > 2 and v.inputs[2] is not None and v.inputs[2][0] != 1))


def _gather_table(ctx, n, bits: int, block: int):
    """(data [V, row bytes] uint8, its values per row, zero points [V, bytes] uint8 or
    None, their kind) of a GatherBlockQuantized node, int4/uint4 tables packed two values
    a byte (int4: as unsigned, both data and zero points 8 more)."""
    data, zp = _const(ctx, n, 0, "data"), _const(ctx, n, 3, "zero_points")
    if data.ndim != 2:
        raise ModelError(f"node {n.name!r} (GatherBlockQuantized): data of rank {data.ndim} "
                         "(a 2-D table is supported)")
    if str(data.dtype) in ("int4", "uint4") and bits == 4:
        offset = 8 if str(data.dtype) == "int4" else 0
        values = _pack_rows(data.astype(np.int32) + offset)
        if zp is None and offset:
            return values, data.shape[1], None, "none"
        nb = -(-data.shape[1] // block)
        zp = np.zeros((data.shape[0], nb), np.int32) if zp is None else zp.astype(np.int32)
        return values, data.shape[1], _pack_rows(zp.reshape(data.shape[0], nb) + offset), \
            "packed"
    if data.dtype == np.uint8:
        cols = data.shape[1] * 8 // bits
        nb = -(-cols // block)
        if zp is not None:
            want = (data.shape[0], -(-nb * bits // 8))
            if zp.dtype != np.uint8 or zp.size != want[0] * want[1]:
                raise ModelError(f"node {n.name!r} (GatherBlockQuantized): zero_points "
                                 f"{zp.dtype} {list(zp.shape)}, expected uint8 {list(want)}")
            zp = zp.reshape(want)
        return data, cols, zp, "none" if zp is None else "packed"
    raise ModelError(f"node {n.name!r} (GatherBlockQuantized): data of {data.dtype} with "
                     f"bits {bits} (uint8, or int4/uint4 with bits 4, are supported)")


@onnx_op("com.microsoft.GatherBlockQuantized", 1, emits=("gather_nbits",),
         build_time_inputs=(0, 2, 3), limits=_GATHER_LIMITS)
def _gather_block_quantized(ctx, n):
    bits, block = int(n.attrs.get("bits", 4)), int(n.attrs.get("block_size", 128))
    axes = int(n.attrs.get("gather_axis", 0)), int(n.attrs.get("quantize_axis", 1))
    if bits not in (4, 8) or block < 16 or block & (block - 1) or axes[0] != 0 or \
            axes[1] not in (1, -1):
        raise ModelError(f"node {n.name!r} (GatherBlockQuantized): bits {bits}, block_size "
                         f"{block}, gather_axis {axes[0]}, quantize_axis {axes[1]} (bits 4 "
                         "or 8, block_size a power of two >= 16, gather_axis 0 and "
                         "quantize_axis 1 are supported)")
    data, cols, zp, kind = _gather_table(ctx, n, bits, block)
    scales = _const(ctx, n, 2, "scales")
    if scales.dtype != np.float32:
        raise ModelError(f"node {n.name!r} (GatherBlockQuantized): scales of {scales.dtype} "
                         "(float32 is supported)")
    inputs = [ctx.add_param(f"{n.name}.data", data), n.inputs[1],
              ctx.add_param(f"{n.name}.scales", scales.reshape(data.shape[0], -1))]
    if zp is not None:
        inputs.append(ctx.add_param(f"{n.name}.zero_points", zp))
    return [Node.make("gather_nbits", n.name, inputs, n.outputs[:1], bits=bits, block=block,
                      cols=cols, zero_points=kind)]
