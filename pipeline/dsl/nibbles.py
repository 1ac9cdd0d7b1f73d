"""Sub-byte dtypes in kernels: int4, uint4 and float4_e2m1fn stored two to a byte
(element 2i in the low nibble of byte i, as ONNX stores them), int2 and uint2 four
(element 4i in the low two bits). The integers compute in i32 like the other narrow
integers, float4_e2m1fn in float32 (dsl/minifloat.py decodes and encodes its bits).

A load reads the element's byte and shifts its bits down; a store changes only its
own bits, with two atomic read-modify-writes (clear, then set) on the byte, so two
threads of a parallel kernel writing the two halves of one byte cannot lose either.
"""

from __future__ import annotations

import llvmlite.ir as ir

from pipeline.dsl.index import raw

I8 = ir.IntType(8)
I32 = ir.IntType(32)
# dtype -> bits per element
SUB_BYTE = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2, "float4_e2m1fn": 4}
SUB_BYTE_INTS = ("int4", "uint4", "int2", "uint2")


def widen4(kb, v: ir.Value, dtype: str) -> ir.Value:
    """A byte (or vector of bytes) holding a sub-byte integer in its low bits, as i32:
    int4 and int2 sign-extended from their top bit, uint4 and uint2 the bits."""
    b = kb.b
    bits = SUB_BYTE[dtype]
    if dtype.startswith("int"):
        up = ir.Constant(v.type, 8 - bits)
        return b.sext(b.ashr(b.shl(v, up), up), _like(v, I32))
    return b.zext(b.and_(v, ir.Constant(v.type, (1 << bits) - 1)), _like(v, I32))


def _like(v: ir.Value, elem: ir.Type) -> ir.Type:
    return ir.VectorType(elem, v.type.count) if isinstance(v.type, ir.VectorType) else elem


def _byte(kb, buf, offset) -> tuple[ir.Value, ir.Value]:
    """(pointer to the byte of element `offset`, the element's shift as an i8)."""
    bits = SUB_BYTE[buf.type.dtype]
    per = 8 // bits
    ptr = kb.b.gep(buf.ptr, [raw(offset // per)], source_etype=I8, inbounds=True)
    return ptr, kb.b.trunc(raw((offset % per) * bits), I8)


def load4(kb, buf, offset) -> ir.Value:
    """buf[offset] of a sub-byte buffer, in its compute type (kb.widen of its bits)."""
    ptr, shift = _byte(kb, buf, offset)
    mask = ir.Constant(I8, (1 << SUB_BYTE[buf.type.dtype]) - 1)
    return kb.widen(kb.b.and_(kb.b.lshr(kb.b.load(ptr, typ=I8), shift), mask),
                    buf.type.dtype)


def store4(kb, buf, offset, value: ir.Value) -> None:
    """buf[offset] = `value` (in the compute type; integers keep their low bits),
    leaving the byte's other elements."""
    ptr, shift = _byte(kb, buf, offset)
    mask = ir.Constant(I8, (1 << SUB_BYTE[buf.type.dtype]) - 1)
    if value.type != I32:  # float4_e2m1fn: its code
        value = kb._to_storage(value, I8, buf.type.dtype)
    nibble = kb.b.and_(kb.b.trunc(value, I8) if value.type != I8 else value, mask)
    keep = kb.b.xor(kb.b.shl(mask, shift), ir.Constant(I8, 255))
    kb.b.atomic_rmw("and", ptr, keep, "monotonic")
    kb.b.atomic_rmw("or", ptr, kb.b.shl(nibble, shift), "monotonic")


def vload4(kb, buf, offset, n: int) -> ir.Value:
    """n consecutive elements from `offset`, as an n-lane vector (lane by lane)."""
    out = ir.Constant(ir.VectorType(buf.elem, n), None)
    for k in range(n):
        out = kb.b.insert_element(out, load4(kb, buf, offset + k), ir.Constant(I32, k))
    return out


def vstore4(kb, buf, offset, value: ir.Value) -> None:
    for k in range(value.type.count):
        store4(kb, buf, offset + k, kb.b.extract_element(value, ir.Constant(I32, k)))
