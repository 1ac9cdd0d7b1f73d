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
import numpy as np

from pipeline.dsl.builder import F32, FLOATS
from pipeline.errors import ModelError
from pipeline.ir.graph import ONNX_DTYPES, Node, TensorType
from pipeline.ops.registry import Limit, onnx_op, register

_INT_TOO = ("relu", "leaky_relu", "neg", "abs", "clip", "sign")
_erf_np = np.vectorize(math.erf, otypes=[np.float64])


def _unary_infer(types: list[TensorType], node: Node) -> list[TensorType]:
    dtype = types[0].dtype
    allowed = ("float32", "float64", "float16") + (
        ("int64", "int32", "int8", "uint8") if node.op in _INT_TOO else ())
    if dtype not in allowed:
        raise ModelError(f"node {node.name!r} ({node.op}): input dtype {dtype} is not "
                         f"supported ({', '.join(allowed)} are)")
    return [types[0]]


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
# tests/ops/test_ops_elementwise.py::test_erf_float32_polynomial_accuracy).
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


def _gelu_np(x, node):
    if node.attr("approximate") == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf_np(x / math.sqrt(2)))


def _softplus(kb, x):
    # max(x, 0) + log1p(exp(-|x|)): no overflow for large |x|.
    neg_abs = kb.neg(kb.intrinsic("fabs", x))
    return kb.fadd(kb.fmax(x, _f(kb, 0.0, x)),
                   kb.extern("log1pf", kb.intrinsic("exp", neg_abs)))


def _clip(kb, x, node):
    lo, hi = kb.const(node.attr("min"), x.type), kb.const(node.attr("max"), x.type)
    return kb.arith("min", kb.arith("max", x, lo), hi)


def _clip_np(x, node):
    return np.clip(x, node.attr("min"), node.attr("max"))


def _selu(kb, x, node):
    alpha, gamma = node.attr("alpha"), node.attr("gamma")
    neg = kb.fsub(kb.fmul(_f(kb, alpha, x), kb.intrinsic("exp", x)), _f(kb, alpha, x))
    return kb.fmul(_f(kb, gamma, x), kb.select(kb.compare("<=", x, _f(kb, 0.0, x)), neg, x))


def _selu_np(x, node):
    alpha, gamma = node.attr("alpha"), node.attr("gamma")
    return gamma * np.where(x <= 0, alpha * np.exp(x) - alpha, x)


def _abs(kb, x):
    if x.type in FLOATS:
        return kb.intrinsic("fabs", x)
    return _select_negative(kb, x, kb.neg(x), x)


# name: (scalar(kb, x, node), numpy(x, node)), evaluated in the input's dtype.
UNARY = {
    "relu": (lambda kb, x, n: kb.arith("max", x, kb.const(0, x.type)),
             lambda x, n: np.maximum(x, 0)),
    "leaky_relu": (lambda kb, x, n: _select_negative(
        kb, x, kb.arith("mul", kb.const(n.attr("alpha"), x.type), x), x),
        lambda x, n: np.where(x < 0, n.attr("alpha") * x, x)),
    "elu": (lambda kb, x, n: _select_negative(
        kb, x, kb.fmul(_f(kb, n.attr("alpha"), x), kb.fsub(kb.intrinsic("exp", x),
                                                          _f(kb, 1.0, x))),
        x), lambda x, n: np.where(x < 0, n.attr("alpha") * (np.exp(x) - 1), x)),
    "selu": (_selu, _selu_np),
    "sigmoid": (lambda kb, x, n: kb.fdiv(
        _f(kb, 1.0, x), kb.fadd(_f(kb, 1.0, x), kb.intrinsic("exp", kb.neg(x)))),
        lambda x, n: 1 / (1 + np.exp(-x))),
    "hard_sigmoid": (lambda kb, x, n: _hard_sigmoid(kb, x, n.attr("alpha"), n.attr("beta")),
                     lambda x, n: np.clip(n.attr("alpha") * x + n.attr("beta"), 0, 1)),
    "hard_swish": (lambda kb, x, n: kb.fmul(x, _hard_sigmoid(kb, x, 1 / 6, 0.5)),
                   lambda x, n: x * np.clip(x / 6 + 0.5, 0, 1)),
    "tanh": (lambda kb, x, n: kb.extern("tanhf", x), lambda x, n: np.tanh(x)),
    "exp": (lambda kb, x, n: kb.intrinsic("exp", x), lambda x, n: np.exp(x)),
    "log": (lambda kb, x, n: kb.intrinsic("log", x), lambda x, n: np.log(x)),
    "sqrt": (lambda kb, x, n: kb.intrinsic("sqrt", x), lambda x, n: np.sqrt(x)),
    "reciprocal": (lambda kb, x, n: kb.fdiv(_f(kb, 1.0, x), x), lambda x, n: 1 / x),
    "neg": (lambda kb, x, n: kb.neg(x),
            lambda x, n: -x),
    "abs": (lambda kb, x, n: _abs(kb, x), lambda x, n: np.abs(x)),
    "erf": (lambda kb, x, n: _erf(kb, x), lambda x, n: _erf_np(x)),
    "gelu": (lambda kb, x, n: _gelu(kb, x, n), _gelu_np),
    "softplus": (lambda kb, x, n: _softplus(kb, x),
                 lambda x, n: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))),
    "floor": (lambda kb, x, n: kb.intrinsic("floor", x), lambda x, n: np.floor(x)),
    "ceil": (lambda kb, x, n: kb.intrinsic("ceil", x), lambda x, n: np.ceil(x)),
    "round": (lambda kb, x, n: kb.intrinsic("roundeven", x), lambda x, n: np.round(x)),
    "clip": (lambda kb, x, n: _clip(kb, x, n), _clip_np),
}

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


def _shrink_np(x, node):
    lambd, bias = node.attr("lambd"), node.attr("bias")
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))


def _celu(kb, x, node):
    alpha = _f(kb, node.attr("alpha"), x)
    neg = kb.fmul(alpha, kb.fsub(kb.intrinsic("exp", kb.fdiv(x, alpha)), _f(kb, 1.0, x)))
    return kb.fadd(kb.fmax(x, _f(kb, 0.0, x)), kb.fmin(neg, _f(kb, 0.0, x)))


UNARY.update({
    "sign": (lambda kb, x, n: _sign(kb, x), lambda x, n: np.sign(x)),
    "softsign": (lambda kb, x, n: kb.fdiv(x, kb.fadd(_f(kb, 1.0, x), kb.intrinsic("fabs", x))),
                 lambda x, n: x / (1 + np.abs(x))),
    "thresholded_relu": (lambda kb, x, n: kb.select(
        kb.compare(">", x, _f(kb, n.attr("alpha"), x)), x, _f(kb, 0.0, x)),
        lambda x, n: np.where(x > n.attr("alpha"), x, 0)),
    "shrink": (_shrink, _shrink_np),
    "mish": (lambda kb, x, n: kb.fmul(x, kb.extern("tanhf", _softplus(kb, x))),
             lambda x, n: x * np.tanh(np.logaddexp(x, 0))),
    "celu": (_celu, lambda x, n: np.maximum(x, 0) + np.minimum(
        0, n.attr("alpha") * (np.exp(x / n.attr("alpha")) - 1))),
    "swish": (lambda kb, x, n: kb.fmul(x, UNARY["sigmoid"][0](
        kb, kb.fmul(_f(kb, n.attr("alpha"), x), x), n)),
        lambda x, n: x / (1 + np.exp(-n.attr("alpha") * x))),
})

# Trigonometric and hyperbolic: C math library calls (sinf, or sin on float64).
# name: (ONNX op_type, first opset, numpy)
TRIG = {"sin": ("Sin", 7, np.sin), "cos": ("Cos", 7, np.cos), "tan": ("Tan", 7, np.tan),
        "asin": ("Asin", 7, np.arcsin), "acos": ("Acos", 7, np.arccos),
        "atan": ("Atan", 7, np.arctan), "sinh": ("Sinh", 9, np.sinh),
        "cosh": ("Cosh", 9, np.cosh), "asinh": ("Asinh", 9, np.arcsinh),
        "acosh": ("Acosh", 9, np.arccosh), "atanh": ("Atanh", 9, np.arctanh)}
for _name, (_onnx, _since, _np) in TRIG.items():
    UNARY[_name] = (lambda kb, x, n, f=f"{_name}f": kb.extern(f, x), lambda x, n, f=_np: f(x))

# Sample input ranges (the function's domain; default [-2, 2]) for tests/ops/test_registry_ops.py.
_DOMAIN = {"log": (0.1, 3), "sqrt": (0.1, 3), "reciprocal": (0.5, 2), "acosh": (1.1, 3),
           "asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9), "tan": (-1.2, 1.2)}


def _sample(op: str):
    """Inputs and attributes (the ONNX defaults the converter copies) to test `op` on."""
    def sample(rng, dtype):
        attrs = {"min": -0.5, "max": 0.7} if op == "clip" else _ATTRS.get(op, {})
        return [rng.uniform(*_DOMAIN.get(op, (-2, 2)), (2, 3, 5)).astype(dtype)], attrs
    return sample


for _name, (_scalar, _numpy) in UNARY.items():
    register(_name, "elementwise", _unary_infer, float64=True, sample=_sample(_name),
             scalar=lambda kb, a, node, f=_scalar: f(kb, a[0], node),
             numpy=lambda xs, node, f=_numpy: [np.asarray(f(xs[0], node)).astype(xs[0].dtype)])


# -- ONNX converters -------------------------------------------------------------------

def _converter(op: str, defaults: dict):
    """A converter copying the ONNX attributes in `defaults` (with those defaults)."""
    def convert(ctx, n):
        attrs = {}
        for key, default in defaults.items():
            value = n.attrs.get(key, default)
            attrs[key] = value.decode() if isinstance(value, bytes) else float(value) \
                if isinstance(default, float) else value
        return [Node.make(op, n.name, n.inputs[:1], n.outputs[:1], **attrs)]
    return convert


# (op, ONNX op_type, first opset we convert, attributes with their ONNX defaults)
_ONNX = [
    ("relu", "Relu", 1, {}), ("leaky_relu", "LeakyRelu", 1, {"alpha": 0.01}),
    ("elu", "Elu", 1, {"alpha": 1.0}),
    ("selu", "Selu", 1, {"alpha": 1.67326319217681884765625,
                         "gamma": 1.05070102214813232421875}),
    ("sigmoid", "Sigmoid", 1, {}), ("hard_sigmoid", "HardSigmoid", 1,
                                    {"alpha": 0.2, "beta": 0.5}),
    ("hard_swish", "HardSwish", 14, {}), ("tanh", "Tanh", 1, {}), ("exp", "Exp", 1, {}),
    ("log", "Log", 1, {}), ("sqrt", "Sqrt", 1, {}), ("reciprocal", "Reciprocal", 1, {}),
    ("neg", "Neg", 1, {}), ("abs", "Abs", 1, {}), ("erf", "Erf", 9, {}),
    ("gelu", "Gelu", 20, {"approximate": "none"}), ("softplus", "Softplus", 1, {}),
    ("floor", "Floor", 1, {}), ("ceil", "Ceil", 1, {}), ("round", "Round", 11, {}),
    ("sign", "Sign", 9, {}), ("softsign", "Softsign", 1, {}),
    ("thresholded_relu", "ThresholdedRelu", 10, {"alpha": 1.0}),
    ("shrink", "Shrink", 9, {"bias": 0.0, "lambd": 0.5}), ("mish", "Mish", 18, {}),
    ("celu", "Celu", 12, {"alpha": 1.0}), ("swish", "Swish", 24, {"alpha": 1.0}),
]
_ONNX += [(_op, _onnx, _since, {}) for _op, (_onnx, _since, _) in TRIG.items()]
_ATTRS = {_op: _defaults for _op, _, _, _defaults in _ONNX}
for _op, _onnx, _since, _defaults in _ONNX:
    onnx_op(_onnx, _since, emits=(_op,))(_converter(_op, _defaults))


@onnx_op("Clip", 6, emits=("clip",))
def _clip_v6(ctx, n):
    return [Node.make("clip", n.name, n.inputs[:1], n.outputs[:1],
                      min=float(n.attrs.get("min", -3.4028234663852886e38)),
                      max=float(n.attrs.get("max", 3.4028234663852886e38)))]


@onnx_op("Clip", 11, emits=("clip",), build_time_inputs=(1, 2))
def _clip_v11(ctx, n):
    # min and max became optional inputs; we need them as build-time constants.
    dtype = np.dtype(ctx.type(n.inputs[0]).dtype)
    lowest, highest = (-np.inf, np.inf) if dtype.kind == "f" else \
        (np.iinfo(dtype).min, np.iinfo(dtype).max)
    bounds = []
    for pos, default in ((1, lowest), (2, highest)):
        name = n.inputs[pos] if len(n.inputs) > pos else ""
        if not name:
            bounds.append(default)
            continue
        value = ctx.const(name)
        if value is None:
            raise ModelError(f"node {n.name!r} (Clip): bound {name!r} must be a constant")
        bounds.append(value.item())
    return [Node.make("clip", n.name, n.inputs[:1], n.outputs[:1], min=bounds[0],
                      max=bounds[1])]


# -- IsNaN, IsInf: float in, bool out ---------------------------------------------------

def _predicate_infer(types, node):
    if types[0].dtype not in ("float32", "float64", "float16"):
        raise ModelError(f"node {node.name!r} ({node.op}): input dtype {types[0].dtype} is "
                         "not supported (float32, float64, float16 are)")
    return [TensorType(types[0].shape, "bool")]


def _isinf(kb, x, node):
    pos = kb.compare("==", x, _f(kb, math.inf, x))
    neg = kb.compare("==", x, _f(kb, -math.inf, x))
    flag = kb.const(0, pos.type)
    if node.attr("detect_positive"):
        flag = kb.or_(flag, pos)
    if node.attr("detect_negative"):
        flag = kb.or_(flag, neg)
    return kb.as_bool(flag)


def _isinf_np(xs, node):
    x = xs[0]
    return [(np.isposinf(x) & bool(node.attr("detect_positive")))
            | (np.isneginf(x) & bool(node.attr("detect_negative")))]


def _special_values(rng, dtype):
    return [np.array([[0.5, np.inf, -np.inf], [np.nan, -1.0, 3.0]], dtype)]


register("isnan", "elementwise", _predicate_infer, float64=True,
         scalar=lambda kb, a, node: kb.as_bool(kb.isnan(a[0])),
         numpy=lambda xs, node: [np.isnan(xs[0])],
         sample=lambda rng, dtype: (_special_values(rng, dtype), {}))
register("isinf", "elementwise", _predicate_infer, float64=True,
         scalar=lambda kb, a, node: _isinf(kb, a[0], node), numpy=_isinf_np,
         sample=lambda rng, dtype: (_special_values(rng, dtype),
                                    {"detect_negative": 0, "detect_positive": 1}))
onnx_op("IsNaN", 9, emits=("isnan",))(_converter("isnan", {}))
onnx_op("IsInf", 10, emits=("isinf",))(
    _converter("isinf", {"detect_negative": 1, "detect_positive": 1}))


# -- BitCast: the same bits read as another dtype of the same width ----------------------

def _bitcast_infer(types, node):
    source, to = types[0].dtype, node.attr("to")
    if source != node.attr("source") or np.dtype(source).itemsize != np.dtype(to).itemsize:
        raise ModelError(f"node {node.name!r} (BitCast): {source} and {to} differ in width")
    return [TensorType(types[0].shape, to)]


register("bitcast", "elementwise", _bitcast_infer, float64=True,
         scalar=lambda kb, a, node: kb.bitcast(a[0], node.attr("source"), node.attr("to")),
         numpy=lambda xs, node: [xs[0].view(node.attr("to"))],
         sample=lambda rng, dtype: ([rng.uniform(-3, 3, (2, 5)).astype(dtype)],
                                    {"source": dtype,
                                     "to": {"float32": "int32", "float64": "int64"}[dtype]}))


@onnx_op("BitCast", 26, emits=("bitcast",),
         limits=(Limit("to bool (bits other than 0 and 1)",
                       lambda n: n.attrs.get("to") == 9 and n.inputs[0] is not None
                       and n.inputs[0][0] != 9),))
def _bitcast(ctx, n):
    to = ONNX_DTYPES.get(int(n.attrs["to"]))
    source = ctx.type(n.inputs[0]).dtype
    if to is None or np.dtype(source).itemsize != np.dtype(to).itemsize:
        raise ModelError(f"node {n.name!r} (BitCast): cannot reinterpret {source} as "
                         f"{to or n.attrs['to']} (same-width {', '.join(ONNX_DTYPES.values())} "
                         "only)")
    if to == "bool" and source != "bool":
        raise ModelError(f"node {n.name!r} (BitCast): to bool is not supported (the bits "
                         "may be other than 0 and 1)")
    return [Node.make("bitcast", n.name, n.inputs[:1], n.outputs[:1], source=source, to=to)]
