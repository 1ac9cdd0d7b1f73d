"""The LLVM types a kernel computes and stores each dtype in, and Buffer, one kernel
argument (a pointer and the static TensorType of what it points to)."""

from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from pipeline.dsl.minifloat import E8M0, FLOAT8, MINIFLOATS  # noqa: F401 (builder's)
from pipeline.dsl.nibbles import SUB_BYTE, SUB_BYTE_INTS
from pipeline.ir.graph import TensorType, row_major_strides

I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()
FLOATS = (F32, F64)
PTR = ir.PointerType()
# Reassociation lets LLVM vectorise reductions; contraction allows FMA. Both
# change rounding at the 1e-7 level, well inside validation tolerances. We do
# not allow nnan/ninf: models may legitimately carry inf through max/relu.
FAST = ("reassoc", "contract", "nsz")

I8 = ir.IntType(8)
HALF = ir.HalfType()

# What a kernel computes each dtype in (the type of loaded values, constants and
# temporaries). The narrow dtypes compute wider: float16 in float32 (x86 and RISC-V
# have no half arithmetic worth using here; F16C / aarch64 convert in one
# instruction), int8/uint8/int16/uint16 in i32 and uint32 in i64 (sign- or
# zero-extended, so signed compares, division and sitofp are right for all). Loads
# widen, stores narrow (round to nearest even, integers wrap), and `narrow` rounds a
# computed value to its dtype. uint64 computes in i64 too: the ops that lower it
# (ops/registry.py `uint64=True`) pick unsigned instructions by a node attribute.
# bfloat16 and the float8 formats compute in float32 too, stored as their bits (i16,
# i8): loads decode and stores encode them in integer arithmetic (dsl/minifloat.py).
# float8_e8m0fnu and float4_e2m1fn too. int4, uint4, int2 and uint2 compute in i32;
# they and float4_e2m1fn are stored two or four to a byte (dsl/nibbles.py: a storage
# type of i8 here, which their loads and stores index by half or quarter).
LLVM_TYPES = {"float32": F32, "float64": F64, "int64": I64, "int32": I32, "bool": I8,
              "float16": F32, "int8": I32, "uint8": I32, "int16": I32, "uint16": I32,
              "uint32": I64, "uint64": I64, **dict.fromkeys(MINIFLOATS, F32),
              **dict.fromkeys(SUB_BYTE_INTS, I32)}
# How each dtype is stored in a buffer.
STORAGE_TYPES = {**LLVM_TYPES, "float16": HALF, "int8": I8, "uint8": I8,
                 "int16": ir.IntType(16), "uint16": ir.IntType(16), "uint32": I32,
                 "bfloat16": ir.IntType(16), **dict.fromkeys(FLOAT8, I8), E8M0: I8,
                 **dict.fromkeys(SUB_BYTE, I8)}
NARROW = ("float16", "int8", "uint8", "int16", "uint16", "uint32", *MINIFLOATS,
          *SUB_BYTE_INTS)
_SIGNED = ("int8", "int16")  # the narrow integers loads sign-extend (others: zero)


def _align(typ: ir.Type) -> int:
    """The alignment vector loads and stores of storage type `typ` promise: one
    element, at most 4 bytes (the base pointers' alignment is not assumed)."""
    if typ == HALF:
        return 2
    return min(4, max(1, typ.width // 8)) if isinstance(typ, ir.IntType) else 4


@dataclass
class Buffer:
    """One kernel argument: a pointer plus the static type of what it points to."""

    ptr: ir.Value
    type: TensorType

    @property
    def elem(self) -> ir.Type:
        """The type values of this buffer are computed in (loads give it)."""
        return LLVM_TYPES[self.type.dtype]

    @property
    def storage(self) -> ir.Type:
        """The element type in memory (half, i8 for the narrow dtypes)."""
        return STORAGE_TYPES[self.type.dtype]

    @property
    def strides(self) -> tuple[int, ...]:
        return row_major_strides(self.type.shape)
