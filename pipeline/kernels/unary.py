"""Unary math and activations: Relu, Sigmoid, Tanh, Erf, Gelu, Exp, Log, Clip...,
the trigonometric and hyperbolic functions (Sin ... Atanh), and the float
predicates IsNaN and IsInf (bool results), and BitCast (the bits read as another dtype).

Each is an elementwise op lowered as a scalar function of one LLVM value
(see pipeline/ops/registry.py). Functions LLVM has no intrinsic for (tanh,
log1p, and erf in float64) call the C math library, which every exported library
links; float32 erf (Erf, Gelu) is a polynomial in plain arithmetic, so its loops
vectorise (a libm call per element does not).
Every one accepts float32 and float64 (float64 calls the double libm
functions); Relu, LeakyRelu, Neg, Abs and Clip also accept int64/int32. Any
other input dtype is a ModelError naming the node.
"""

from __future__ import annotations

import math

import llvmlite.ir as ir

from pipeline.dsl.builder import F32, FLOATS
from pipeline.kernels.registry import lowering


def _f(kb, value: float, like):
    """The float constant `value` in the type of `like` (float32 or float64)."""
    return kb.fconst(value, like)


def _select_negative(kb, x, negative, positive):
    """`negative` where x < 0, else `positive`."""
    return kb.select(kb.compare("<", x, kb.const(0, x.type)), negative, positive)


def _hard_sigmoid(kb, x, alpha, beta):
    return kb.fmax(_f(kb, 0.0, x), kb.fmin(_f(kb, 1.0, x), kb.fadd(kb.fmul(_f(kb, alpha, x), x),
                                                                   _f(kb, beta, x))))


# float32 erf. Below _ERF_SPLIT: x * A(x^2); above: 1 - erfc(|x|) with erfc =
# exp(B(|x|)), B fitted to log(erfc) on [_ERF_SPLIT, 6] (|x| clamped to 6, where erf
# is 1 in float32 and erfc is taken as 0). The coefficients were fitted for this: least
# squares on 4000 Chebyshev nodes against math.erf / math.erfc in double (A weighted
# for relative error), degrees the smallest for which the float32 evaluation stays
# within ~2.5 ulp of math.erf on a dense grid, erfc within 1e-5 relative (see
# tests/test_ops_elementwise.py::test_erf_float32_polynomial_accuracy).
_ERF_SPLIT, _ERFC_ZERO = 0.921875, 6.0


_ERF_SMALL = (1.1283791491205695, -0.37612491161930584, 0.11281792950261349,
              -0.026765864871979822, 0.004992183424849639, -0.0005986210833393152)


_ERF_LOG_ERFC = (0.00028873689033612557, -1.1301864742948116, -0.6317284031972648,
                 -0.11039151980310502, 0.026766812956553383, -0.00496655645860741,
                 0.0006700091252707886, -6.137379815867455e-05, 3.3922824916876593e-06,
                 -8.501239823210938e-08)


def _horner(kb, coefficients, t):
    """sum(c[k] t^k), highest power first."""
    p = _f(kb, coefficients[-1], t)
    for c in coefficients[-2::-1]:
        p = kb.fadd(kb.fmul(p, t), _f(kb, c, t))
    return p


def _erf_erfc(kb, a):
    """(erf(a), erfc(a)) of a float32 a >= 0 (the polynomial form above)."""
    small = kb.fmul(a, _horner(kb, _ERF_SMALL, kb.fmul(a, a)))
    tail = kb.exp(_horner(kb, _ERF_LOG_ERFC, kb.fmin(a, _f(kb, _ERFC_ZERO, a))))
    tail = kb.select(kb.compare(">", a, _f(kb, _ERFC_ZERO, a)), _f(kb, 0.0, a), tail)
    below = kb.compare("<", a, _f(kb, _ERF_SPLIT, a))
    one = _f(kb, 1.0, a)
    return (kb.select(below, small, kb.fsub(one, tail)),
            kb.select(below, kb.fsub(one, small), tail))


def _is_f32(x) -> bool:
    """x is a float32 or a vector of float32 (the polynomial forms work lane-wise)."""
    return (x.type.element if isinstance(x.type, ir.VectorType) else x.type) == F32


def _erf(kb, x):
    """erf(x): the polynomial form above for float32 (NaN kept), libm's erf for float64."""
    if not _is_f32(x):
        return kb.extern("erff", x)
    erf, _ = _erf_erfc(kb, kb.intrinsic("fabs", x))
    return kb.select(kb.isnan(x), x, kb.intrinsic("copysign", erf, x))


def _gelu_erf(kb, x):
    """0.5 x (1 + erf(x / sqrt 2)); in float32 1 + erf(z) of a negative z is erfc(-z),
    so the negative tail keeps its relative accuracy (no 1 - 0.99... cancellation)."""
    z = kb.fmul(x, _f(kb, 1 / math.sqrt(2), x))
    if not _is_f32(x):
        return kb.fmul(kb.fmul(_f(kb, 0.5, x), x), kb.fadd(_f(kb, 1.0, x), _erf(kb, z)))
    erf, erfc = _erf_erfc(kb, kb.intrinsic("fabs", z))
    factor = kb.select(kb.compare("<", x, _f(kb, 0.0, x)), erfc, kb.fadd(_f(kb, 1.0, x), erf))
    return kb.select(kb.isnan(x), x, kb.fmul(kb.fmul(_f(kb, 0.5, x), x), factor))


def _gelu(kb, x, node):
    if node.attr("approximate") == "tanh":
        half_x = kb.fmul(_f(kb, 0.5, x), x)
        cube = kb.fmul(kb.fmul(x, x), x)
        inner = kb.fmul(_f(kb, math.sqrt(2 / math.pi), x),
                        kb.fadd(x, kb.fmul(_f(kb, 0.044715, x), cube)))
        t = kb.extern("tanhf", inner)
        return kb.fmul(half_x, kb.fadd(_f(kb, 1.0, x), t))
    return _gelu_erf(kb, x)


def _softplus(kb, x):
    # max(x, 0) + log1p(exp(-|x|)): no overflow for large |x|.
    neg_abs = kb.neg(kb.intrinsic("fabs", x))
    return kb.fadd(kb.fmax(x, _f(kb, 0.0, x)),
                   kb.extern("log1pf", kb.intrinsic("exp", neg_abs)))


def _clip(kb, x, node):
    lo, hi = kb.const(node.attr("min"), x.type), kb.const(node.attr("max"), x.type)
    return kb.arith("min", kb.arith("max", x, lo), hi)


def _selu(kb, x, node):
    alpha, gamma = node.attr("alpha"), node.attr("gamma")
    neg = kb.fsub(kb.fmul(_f(kb, alpha, x), kb.intrinsic("exp", x)), _f(kb, alpha, x))
    return kb.fmul(_f(kb, gamma, x), kb.select(kb.compare("<=", x, _f(kb, 0.0, x)), neg, x))


def _abs(kb, x):
    if x.type in FLOATS:
        return kb.intrinsic("fabs", x)
    return _select_negative(kb, x, kb.neg(x), x)


def _sign(kb, x):
    one, zero = kb.const(1, x.type), kb.const(0, x.type)
    minus = kb.const(-1, x.type)
    return kb.select(kb.compare(">", x, zero), one,
                       kb.select(kb.compare("<", x, zero), minus, x))  # keeps 0 and NaN


def _shrink(kb, x, node):
    lambd, bias = _f(kb, node.attr("lambd"), x), _f(kb, node.attr("bias"), x)
    low = kb.compare("<", x, kb.neg(lambd))
    high = kb.compare(">", x, lambd)
    return kb.select(low, kb.fadd(x, bias),
                       kb.select(high, kb.fsub(x, bias), _f(kb, 0.0, x)))


def _celu(kb, x, node):
    alpha = _f(kb, node.attr("alpha"), x)
    neg = kb.fmul(alpha, kb.fsub(kb.intrinsic("exp", kb.fdiv(x, alpha)), _f(kb, 1.0, x)))
    return kb.fadd(kb.fmax(x, _f(kb, 0.0, x)), kb.fmin(neg, _f(kb, 0.0, x)))


# name: scalar(kb, x, node), evaluated in the input's dtype.
UNARY = {
    "relu": lambda kb, x, n: kb.arith("max", x, kb.const(0, x.type)),
    "leaky_relu": lambda kb, x, n: _select_negative(
        kb, x, kb.arith("mul", kb.const(n.attr("alpha"), x.type), x), x),
    "elu": lambda kb, x, n: _select_negative(
        kb, x, kb.fmul(_f(kb, n.attr("alpha"), x), kb.fsub(kb.intrinsic("exp", x),
                                                          _f(kb, 1.0, x))),
        x),
    "selu": _selu,
    "sigmoid": lambda kb, x, n: kb.fdiv(
        _f(kb, 1.0, x), kb.fadd(_f(kb, 1.0, x), kb.intrinsic("exp", kb.neg(x)))),
    "hard_sigmoid": lambda kb, x, n: _hard_sigmoid(kb, x, n.attr("alpha"), n.attr("beta")),
    "hard_swish": lambda kb, x, n: kb.fmul(x, _hard_sigmoid(kb, x, 1 / 6, 0.5)),
    "tanh": lambda kb, x, n: kb.extern("tanhf", x),
    "exp": lambda kb, x, n: kb.intrinsic("exp", x),
    "log": lambda kb, x, n: kb.intrinsic("log", x),
    "sqrt": lambda kb, x, n: kb.intrinsic("sqrt", x),
    "reciprocal": lambda kb, x, n: kb.fdiv(_f(kb, 1.0, x), x),
    "neg": lambda kb, x, n: kb.neg(x),
    "abs": lambda kb, x, n: _abs(kb, x),
    "erf": lambda kb, x, n: _erf(kb, x),
    "gelu": lambda kb, x, n: _gelu(kb, x, n),
    "softplus": lambda kb, x, n: _softplus(kb, x),
    "floor": lambda kb, x, n: kb.intrinsic("floor", x),
    "ceil": lambda kb, x, n: kb.intrinsic("ceil", x),
    "round": lambda kb, x, n: kb.intrinsic("roundeven", x),
    "clip": lambda kb, x, n: _clip(kb, x, n),
    "sign": lambda kb, x, n: _sign(kb, x),
    "softsign": lambda kb, x, n: kb.fdiv(x, kb.fadd(_f(kb, 1.0, x), kb.intrinsic("fabs", x))),
    "thresholded_relu": lambda kb, x, n: kb.select(
        kb.compare(">", x, _f(kb, n.attr("alpha"), x)), x, _f(kb, 0.0, x)),
    "shrink": _shrink,
    "mish": lambda kb, x, n: kb.fmul(x, kb.extern("tanhf", _softplus(kb, x))),
    "celu": _celu,
    "swish": lambda kb, x, n: kb.fmul(x, UNARY["sigmoid"](
        kb, kb.fmul(_f(kb, n.attr("alpha"), x), x), n)),
}

# Trigonometric and hyperbolic: C math library calls (sinf, or sin on float64).
TRIG = ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")
for _name in TRIG:
    UNARY[_name] = lambda kb, x, n, f=f"{_name}f": kb.extern(f, x)


for _name, _scalar in UNARY.items():
    lowering(_name, scalar=lambda kb, a, node, f=_scalar: f(kb, a[0], node))


def _isinf(kb, x, node):
    pos = kb.compare("==", x, _f(kb, math.inf, x))
    neg = kb.compare("==", x, _f(kb, -math.inf, x))
    flag = kb.const(0, pos.type)
    if node.attr("detect_positive"):
        flag = kb.or_(flag, pos)
    if node.attr("detect_negative"):
        flag = kb.or_(flag, neg)
    return kb.as_bool(flag)


lowering("isnan", scalar=lambda kb, a, node: kb.as_bool(kb.isnan(a[0])))

lowering("isinf", scalar=lambda kb, a, node: _isinf(kb, a[0], node))

lowering("bitcast",
         scalar=lambda kb, a, node: kb.bitcast(a[0], node.attr("source"), node.attr("to")))
