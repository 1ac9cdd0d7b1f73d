"""bfloat16 and the four float8 formats of ONNX: decoding their stored bits to float32
and encoding float32 to them, as LLVM integer arithmetic on scalars or vectors.

Kernels compute these dtypes in float32 (dsl/types.py): a load decodes (exact), a
store encodes, rounding to nearest even. Neither LLVM's `bfloat` type nor the CPUs
we target have float8 conversions, so both directions are written out in integer
operations, lane-wise, which LLVM vectorises like any other arithmetic.

The float8 formats (sign, E exponent bits, M mantissa bits, exponent bias):
  float8_e4m3fn    E4 M3 bias 7:  no infinities, NaN = S.1111.111, max 448
  float8_e4m3fnuz  E4 M3 bias 8:  no infinities, no -0, NaN = 0x80, max 240
  float8_e5m2      E5 M2 bias 15: IEEE-like (inf = S.11111.00), max 57344
  float8_e5m2fnuz  E5 M2 bias 16: no infinities, no -0, NaN = 0x80, max 57344
A value beyond the largest finite one becomes that value when saturating (ONNX Cast
and QuantizeLinear with saturate=1, the default; infinities too), else infinity
(e5m2) or NaN (the others), as the ONNX specification's table says.

float4_e2m1fn (E2 M1 bias 1, stored in the low nibble: no infinities or NaN, max 6)
encodes like them, always saturating; a NaN becomes a zero of the opposite sign (what
ml_dtypes, and so onnx.reference, gives). float8_e8m0fnu is an exponent alone: code e
is 2^(e - 127), 0xFF NaN, no sign and no zero. Encoding it keeps float32's exponent,
rounded up, down or to nearest by the dropped mantissa (ONNX Cast's round_mode), a
NaN or infinity becoming 0xFF; saturate keeps 0xFE from rounding up to NaN. (2^-127,
code 0's value, encodes to 0 in every mode, so a loaded value stores back unchanged.)
"""

from __future__ import annotations

import llvmlite.ir as ir

F32 = ir.FloatType()
I32 = ir.IntType(32)

# dtype -> (mantissa bits, bias, largest finite magnitude code, kind)
FLOAT8 = {"float8_e4m3fn": (3, 7, 0x7E, "fn"), "float8_e4m3fnuz": (3, 8, 0x7F, "fnuz"),
          "float8_e5m2": (2, 15, 0x7B, "ieee"), "float8_e5m2fnuz": (2, 16, 0x7F, "fnuz")}
FLOAT4 = {"float4_e2m1fn": (1, 1, 0x7, "fn4")}
E8M0 = "float8_e8m0fnu"
MINIFLOATS = ("bfloat16", *FLOAT8, *FLOAT4, E8M0)
# the float types Quantize/DequantizeLinear take (x / scale rounded by the encoding)
QFLOATS = (*FLOAT8, *FLOAT4)


def _like(typ: ir.Type, elem: ir.Type) -> ir.Type:
    """`elem`, as a vector of as many lanes as `typ` has when `typ` is a vector."""
    return ir.VectorType(elem, typ.count) if isinstance(typ, ir.VectorType) else elem


def decode(kb, v: ir.Value, dtype: str) -> ir.Value:
    """The stored bits `v` (i16 for bfloat16, i8 for float8; scalar or vector) of
    `dtype` as float32 (exact)."""
    b = kb.b
    i32, f32 = _like(v.type, I32), _like(v.type, F32)
    u = b.zext(v, i32)
    if dtype == "bfloat16":
        return b.bitcast(b.shl(u, ir.Constant(i32, 16)), f32)
    if dtype == E8M0:  # 2^(u - 127); u = 0 is float32's subnormal 2^-127
        value = b.select(b.icmp_unsigned("==", u, ir.Constant(i32, 0)),
                         ir.Constant(i32, 0x400000), b.shl(u, ir.Constant(i32, 23)))
        return b.select(b.icmp_unsigned("==", u, ir.Constant(i32, 0xFF)),
                        ir.Constant(f32, float("nan")), b.bitcast(value, f32))
    man_bits, bias, _, kind = {**FLOAT8, **FLOAT4}[dtype]
    top = 0x8 if kind == "fn4" else 0x80  # the sign bit
    m = b.and_(u, ir.Constant(i32, top - 1))
    exp = b.lshr(m, ir.Constant(i32, man_bits))
    # a normal number: the exponent and mantissa bits moved into place, rebiased
    normal = b.bitcast(b.add(b.shl(m, ir.Constant(i32, 23 - man_bits)),
                             ir.Constant(i32, (127 - bias) << 23)), f32)
    # a subnormal one: mantissa * 2^(1 - bias - M), exactly
    man = b.and_(m, ir.Constant(i32, (1 << man_bits) - 1))
    sub = b.fmul(b.uitofp(man, f32), ir.Constant(f32, 2.0 ** (1 - bias - man_bits)))
    mag = b.select(b.icmp_unsigned("==", exp, ir.Constant(i32, 0)), sub, normal)
    negative = b.icmp_unsigned(">=", u, ir.Constant(i32, top))
    value = b.select(negative, b.fneg(mag), mag)
    if kind == "fn4":
        return value
    # a NaN keeps its sign (bits 0xFF stay 0xFF through a decode and an encode)
    nan = b.select(negative, ir.Constant(f32, -float("nan")), ir.Constant(f32, float("nan")))
    if kind == "ieee":
        top = b.icmp_unsigned("==", exp, ir.Constant(i32, 31))
        inf = b.select(negative, ir.Constant(f32, float("-inf")), ir.Constant(f32, float("inf")))
        special = b.select(b.icmp_unsigned("==", man, ir.Constant(i32, 0)), inf, nan)
        return b.select(top, special, value)
    is_nan = (b.icmp_unsigned("==", m, ir.Constant(i32, 0x7F)) if kind == "fn"
              else b.icmp_unsigned("==", u, ir.Constant(i32, 0x80)))
    return b.select(is_nan, nan, value)


def encode(kb, x: ir.Value, dtype: str, saturate: bool = False,
           round_mode: str = "up") -> ir.Value:
    """The float32 `x` (scalar or vector) rounded to nearest even into `dtype`'s bits
    (i16 for bfloat16, i8 for float8 and float4); see the module docstring for overflow
    and for float8_e8m0fnu, which rounds by `round_mode` (up, down, nearest)."""
    b = kb.b
    i32 = _like(x.type, I32)
    bits = b.bitcast(x, i32)
    if dtype == E8M0:
        return _encode_e8m0(kb, bits, saturate, round_mode)
    is_nan = b.fcmp_unordered("uno", x, x)
    if dtype == "bfloat16":
        odd = b.and_(b.lshr(bits, ir.Constant(i32, 16)), ir.Constant(i32, 1))
        rounded = b.lshr(b.add(b.add(bits, ir.Constant(i32, 0x7FFF)), odd),
                         ir.Constant(i32, 16))
        quiet = b.or_(b.lshr(bits, ir.Constant(i32, 16)), ir.Constant(i32, 0x40))
        return b.trunc(b.select(is_nan, quiet, rounded), _like(x.type, ir.IntType(16)))
    man_bits, bias, max_code, kind = {**FLOAT8, **FLOAT4}[dtype]
    top = 0x8 if kind == "fn4" else 0x80  # the sign bit
    sign = b.and_(b.lshr(bits, ir.Constant(i32, 32 - top.bit_length())), ir.Constant(i32, top))
    abits = b.and_(bits, ir.Constant(i32, 0x7FFFFFFF))
    a = b.bitcast(abits, x.type)
    shift = 23 - man_bits
    # normal range: round the float32 mantissa to M bits (to even), then rebias
    odd = b.and_(b.lshr(abits, ir.Constant(i32, shift)), ir.Constant(i32, 1))
    r = b.add(b.add(abits, ir.Constant(i32, (1 << (shift - 1)) - 1)), odd)
    normal = b.sub(b.lshr(r, ir.Constant(i32, shift)),
                   ir.Constant(i32, (127 - bias) << man_bits))
    # below the smallest normal: a multiple of the subnormal step, rounded to even
    scaled = b.fmul(a, ir.Constant(x.type, 2.0 ** (bias - 1 + man_bits)))
    sub = b.fptoui(kb.intrinsic("roundeven", scaled), i32)
    tiny = b.fcmp_ordered("<", a, ir.Constant(x.type, 2.0 ** (1 - bias)))
    code = b.select(tiny, sub, normal)
    over = b.icmp_signed(">", code, ir.Constant(i32, max_code))  # infinities included
    if kind == "fn4":  # saturating always; NaN: a zero of the other sign
        signed = b.or_(code, sign)
        nan = b.xor(sign, ir.Constant(i32, top))
        saturate = True
    elif kind == "fnuz":  # one zero, no sign; NaN is 0x80
        signed = b.select(b.icmp_signed("==", code, ir.Constant(i32, 0)),
                          ir.Constant(i32, 0), b.or_(code, sign))
        nan = ir.Constant(i32, 0x80)
    else:  # NaN: S.1111.111 (e4m3fn), S.11111.10 (e5m2, as ml_dtypes and onnx write it)
        signed = b.or_(code, sign)
        nan = b.or_(sign, ir.Constant(i32, 0x7E if kind == "ieee" else 0x7F))
    if saturate:
        big = b.or_(sign, ir.Constant(i32, max_code))
    else:
        big = b.or_(sign, ir.Constant(i32, 0x7C)) if kind == "ieee" else nan
    out = b.select(is_nan, nan, b.select(over, big, signed))
    return b.trunc(out, _like(x.type, ir.IntType(8)))


def _encode_e8m0(kb, bits: ir.Value, saturate: bool, round_mode: str) -> ir.Value:
    """float32 `bits` (i32, scalar or vector) as float8_e8m0fnu's code (i8): the
    exponent, rounded by `round_mode` as onnx.numpy_helper.to_float8e8m0 does."""
    b = kb.b
    i32 = bits.type
    exp = b.and_(b.lshr(bits, ir.Constant(i32, 23)), ir.Constant(i32, 0xFF))
    if round_mode == "up":
        up = b.icmp_unsigned("!=", b.and_(bits, ir.Constant(i32, 0x7FFFFF)),
                             ir.Constant(i32, 0))
    elif round_mode == "nearest":  # guard bit set, and a lower bit or a nonzero exponent
        guard = b.icmp_unsigned("!=", b.and_(bits, ir.Constant(i32, 0x400000)),
                                ir.Constant(i32, 0))
        rest = b.icmp_unsigned("!=", b.and_(bits, ir.Constant(i32, 0x3FFFFF)),
                               ir.Constant(i32, 0))
        up = b.and_(guard, b.or_(rest, b.icmp_unsigned("!=", exp, ir.Constant(i32, 0))))
    else:
        up = b.icmp_unsigned("!=", exp, exp)  # down: never
    if saturate:  # 0xFE stays (0xFF is NaN)
        up = b.and_(up, b.icmp_unsigned("!=", exp, ir.Constant(i32, 0xFE)))
    special = b.icmp_unsigned("==", exp, ir.Constant(i32, 0xFF))
    # 2^-127 exactly is code 0 (what decode gives for it: kernels store what they
    # loaded by encoding it again), where onnx's "up" would give 1
    code0 = b.icmp_unsigned("==", bits, ir.Constant(i32, 0x400000))
    up = b.and_(up, b.not_(b.or_(special, code0)))
    code = b.add(exp, b.zext(up, i32))
    return b.trunc(code, _like(i32, ir.IntType(8)))
