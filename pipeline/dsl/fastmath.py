"""Float math written in plain LLVM arithmetic (no libm call), so the loops that use
it vectorise."""

from __future__ import annotations

import math

import llvmlite.ir as ir

from pipeline.dsl.types import I32


def exp_f32(kb, x: ir.Value) -> ir.Value:
    """exp(x) of a float32 (or a float32 vector) `x`, built with KernelBuilder `kb`:
    x = n ln2 + r with |r| <= ln2 / 2, exp(r) = 1 + r + r^2 P(r) with the degree-5 P
    of Cephes expf (about 2 ulp), times 2**n built in the exponent bits. Exact edge
    values: 0 below -87.33 (where 2**n would be subnormal), +inf above 88.72, NaN kept."""
    b = kb.b
    lanes = x.type.count if isinstance(x.type, ir.VectorType) else None

    def f(c):  # the float32 constant c, splat when x is a vector
        return ir.Constant(x.type, [float(c)] * lanes if lanes else float(c))

    def i(c):
        return ir.Constant(ir.VectorType(I32, lanes) if lanes else I32,
                           [c] * lanes if lanes else c)

    xc = kb.fmin(kb.fmax(x, f(-87.33654)), f(88.72283905))
    n = kb.intrinsic("floor", kb.fadd(kb.fmul(xc, f(1.4426950408889634)), f(0.5)))
    # r = x - n ln2, with ln2 split in two so n * hi is exact.
    r = kb.fsub(kb.fsub(xc, kb.fmul(n, f(0.693359375))), kb.fmul(n, f(-2.12194440e-4)))
    p = f(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
              5.0000001201e-1):
        p = kb.fadd(kb.fmul(p, r), f(c))
    er = kb.fadd(kb.fadd(kb.fmul(kb.fmul(p, r), r), r), f(1.0))
    # n reaches 128 near the top of the range: 2**127, then one more doubling.
    top = b.fcmp_ordered(">", n, f(127.0))
    n = kb.fmin(n, f(127.0))
    bits = b.shl(b.add(b.fptosi(n, i(0).type), i(127)), i(23))
    y = kb.fmul(er, b.bitcast(bits, x.type))
    y = b.select(top, kb.fmul(y, f(2.0)), y)
    y = b.select(b.fcmp_ordered("<", x, f(-87.33654)), f(0.0), y)
    y = b.select(b.fcmp_ordered(">", x, f(88.72283905)), f(math.inf), y)
    return b.select(kb.isnan(x), x, y)
