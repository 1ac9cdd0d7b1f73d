"""Elementwise operators of several inputs, with numpy broadcasting: arithmetic
(Add, Sub, Mul, Div, Pow, Mod, Max, Min, PRelu, variadic Sum/Mean), comparisons,
logic, bitwise (BitwiseAnd/Or/Xor/Not, BitShift), Where and Cast; plus Identity and
Dropout.

Each is lowered as a scalar function of LLVM values; the builder's
dtype-aware helpers (arith, compare, cast) pick float or integer instructions
from the values' types, so one definition serves float32, float64, int64 and int32
(float16 and the narrow integers compute in float32 / int32 / int64:
pipeline/dsl/builder.py).
Comparisons and logic produce bool, stored as one byte holding 0 or 1. uint64 computes
in i64 like int64: a node's `unsigned` attribute (the positions of its uint64 inputs, set
by the converters) picks the unsigned division, compares and conversions.
Unary math and activations are in pipeline/kernels/unary.py.
"""

from __future__ import annotations

from pipeline.dsl.builder import FLOATS
from pipeline.dsl.minifloat import encode
from pipeline.kernels.registry import lowering

lowering("identity", scalar=lambda kb, a, node: a[0])


_ARITH = ("add", "sub", "mul", "div", "max", "min")  # kb.arith's operations
_COMPARE = {"equal": "==", "less": "<", "greater": ">", "less_equal": "<=",  # op: predicate
            "greater_equal": ">="}
_LOGIC = {"and": "and_", "or": "or_", "xor": "xor"}  # op: KernelBuilder method
_BITWISE = {"bitwise_and": "and_", "bitwise_or": "or_", "bitwise_xor": "xor"}


def unsigned(node, position: int | None = None) -> bool:
    """Whether `node`'s input at `position` (any input if None) is uint64."""
    positions = node.attr("unsigned", ())
    return bool(positions) if position is None else position in positions


for _op in _ARITH:
    lowering(_op, scalar=lambda kb, a, node, op=_op: kb.arith(op, a[0], a[1],
                                                              unsigned=unsigned(node)))


_FLOAT_NAMES = dict(zip(FLOATS, ("float32", "float64"), strict=True))


def _pow(kb, a, node):
    base, exponent = a
    if base.type in FLOATS:
        return kb.intrinsic("pow", base, kb.cast(exponent, _FLOAT_NAMES[base.type],
                                                 unsigned=unsigned(node, 1)))
    # Integer base: pow in double, truncated back, as onnxruntime's static_cast does.
    wide = [kb.cast(v, "float64", unsigned=unsigned(node, k)) for k, v in enumerate(a)]
    return kb.cast(kb.intrinsic("pow", *wide), "uint64" if unsigned(node, 0) else base.type)


lowering("pow", scalar=_pow)


def _mod(kb, a, node):
    """fmod=1: C fmod, the dividend's sign (frem, srem); fmod=0: a non-zero remainder
    takes the divisor's sign, as Python's % (floats too since opset 28: x % inf of
    the other sign is inf)."""
    x, y = a
    r = kb.arith("rem", x, y, unsigned=unsigned(node))
    if node.attr("fmod") or unsigned(node):  # unsigned: no signs to fix
        return r
    zero = kb.const(0, r.type)
    sign_r, sign_y = (kb.compare("<", v, zero) for v in (r, y))
    fix = kb.and_(kb.compare("!=", r, zero, ordered=True), kb.xor(sign_r, sign_y))
    return kb.select(fix, kb.arith("add", r, y, fast=False), r)


lowering("mod", scalar=_mod)

lowering("prelu", scalar=lambda kb, a, node: kb.select(
    kb.compare("<", a[0], kb.fconst(0.0, a[0])), kb.fmul(a[0], a[1]), a[0]))


for _op, _pred in _COMPARE.items():
    lowering(_op, scalar=lambda kb, a, node, p=_pred: kb.as_bool(
        kb.compare(p, a[0], a[1], unsigned=unsigned(node))))


for _op, _method in _LOGIC.items():
    # bool values are 0 or 1, so the bitwise instructions are the logical ones.
    lowering(_op, scalar=lambda kb, a, node, m=_method: getattr(kb, m)(a[0], a[1]))


lowering("not", scalar=lambda kb, a, node: kb.xor(a[0], kb.const(1, a[0].type)))


for _op, _method in _BITWISE.items():
    lowering(_op, scalar=lambda kb, a, node, m=_method: getattr(kb, m)(a[0], a[1]))


lowering("bitwise_not", scalar=lambda kb, a, node: kb.xor(a[0], kb.const(-1, a[0].type)))


def _bit_shift(kb, a, node):
    """x << s or x >> s (arithmetic for signed dtypes, `node.attr("signed")`). A shift s
    < 0 or at least the compute type's width gives what the sign fill alone gives
    (-1 for a right shift of a negative x, else 0), as BitShift-28 defines for s
    outside [0, bits of T); shifts between T's bits and the compute width come out
    the same way by themselves (bits past T are dropped when the result is narrowed)."""
    x, s = a
    signed, left = node.attr("signed"), node.attr("direction") == "LEFT"
    shifted = kb.b.shl(x, s) if left else (kb.b.ashr if signed else kb.b.lshr)(x, s)
    zero = kb.const(0, x.type)
    fill = kb.select(kb.compare("<", x, zero), kb.const(-1, x.type), zero) \
        if signed and not left else zero
    outside = kb.or_(kb.compare("<", s, kb.const(0, s.type)),
                     kb.compare(">=", s, kb.const(x.type.width, s.type)))
    return kb.select(outside, fill, shifted)


lowering("bit_shift", scalar=_bit_shift)

lowering("where", scalar=lambda kb, a, node: kb.select(kb.truth(a[0]), a[1], a[2]))


def _cast(kb, a, node):
    to, saturate = node.attr("to"), bool(node.attr("saturate", 1))
    if node.attr("round_mode", "up") != "up":  # float8_e8m0fnu's other roundings
        bits = encode(kb, kb.cast(a[0], "float32"), to, saturate, node.attr("round_mode"))
        return kb.widen(bits, to)
    return kb.cast(a[0], to, saturate=saturate, unsigned=unsigned(node))


lowering("cast", scalar=_cast)
