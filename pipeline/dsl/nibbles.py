"""int4 and uint4 in kernels: stored two to a byte (element 2i in the low nibble of
byte i, as ONNX stores them), computed in i32 like the other narrow integers.

A load reads the element's byte and shifts its nibble down; a store changes only its
own nibble, with two atomic read-modify-writes (clear, then set) on the byte, so two
threads of a parallel kernel writing the two halves of one byte cannot lose either.
"""

from __future__ import annotations

import llvmlite.ir as ir

from pipeline.dsl.index import raw

I8 = ir.IntType(8)
I32 = ir.IntType(32)
SUB_BYTE = ("int4", "uint4")


def widen4(kb, v: ir.Value, dtype: str) -> ir.Value:
    """A byte (or vector of bytes) holding a `dtype` value in its low nibble, as i32:
    int4 sign-extended from bit 3, uint4 the nibble."""
    b = kb.b
    if dtype == "int4":
        return b.sext(b.ashr(b.shl(v, ir.Constant(v.type, 4)), ir.Constant(v.type, 4)),
                      _like(v, I32))
    return b.zext(b.and_(v, ir.Constant(v.type, 15)), _like(v, I32))


def _like(v: ir.Value, elem: ir.Type) -> ir.Type:
    return ir.VectorType(elem, v.type.count) if isinstance(v.type, ir.VectorType) else elem


def _byte(kb, buf, offset) -> tuple[ir.Value, ir.Value]:
    """(pointer to the byte of element `offset`, the nibble's shift as an i8)."""
    ptr = kb.b.gep(buf.ptr, [raw(offset // 2)], source_etype=I8, inbounds=True)
    return ptr, kb.b.trunc(raw((offset % 2) * 4), I8)


def load4(kb, buf, offset) -> ir.Value:
    """buf[offset] of an int4/uint4 buffer, as i32."""
    ptr, shift = _byte(kb, buf, offset)
    return widen4(kb, kb.b.lshr(kb.b.load(ptr, typ=I8), shift), buf.type.dtype)


def store4(kb, buf, offset, value: ir.Value) -> None:
    """buf[offset] = the low 4 bits of `value` (an i32), leaving the other nibble."""
    ptr, shift = _byte(kb, buf, offset)
    nibble = kb.b.and_(kb.b.trunc(value, I8), ir.Constant(I8, 15))
    keep = kb.b.xor(kb.b.shl(ir.Constant(I8, 15), shift), ir.Constant(I8, 255))
    kb.b.atomic_rmw("and", ptr, keep, "monotonic")
    kb.b.atomic_rmw("or", ptr, kb.b.shl(nibble, shift), "monotonic")


def vload4(kb, buf, offset, n: int) -> ir.Value:
    """n consecutive elements from `offset`, as an n-lane i32 vector (lane by lane)."""
    out = ir.Constant(ir.VectorType(I32, n), None)
    for k in range(n):
        out = kb.b.insert_element(out, load4(kb, buf, offset + k), ir.Constant(I32, k))
    return out


def vstore4(kb, buf, offset, value: ir.Value) -> None:
    for k in range(value.type.count):
        store4(kb, buf, offset + k, kb.b.extract_element(value, ir.Constant(I32, k)))
