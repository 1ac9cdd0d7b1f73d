"""The unary operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/unary.py
Their ONNX converters: pipeline/frontend/onnx/unary.py
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import BITS, Node, TensorType
from pipeline.ops.registry import OpKind, register

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


def _gelu_np(x, node):
    if node.attr("approximate") == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf_np(x / math.sqrt(2)))


def _clip_np(x, node):
    return np.clip(x, node.attr("min"), node.attr("max"))


def _selu_np(x, node):
    alpha, gamma = node.attr("alpha"), node.attr("gamma")
    return gamma * np.where(x <= 0, alpha * np.exp(x) - alpha, x)


def _shrink_np(x, node):
    lambd, bias = node.attr("lambd"), node.attr("bias")
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))


# name: numpy(x, node), evaluated in the input's dtype.
UNARY = {
    "relu": lambda x, n: np.maximum(x, 0),
    "leaky_relu": lambda x, n: np.where(x < 0, n.attr("alpha") * x, x),
    "elu": lambda x, n: np.where(x < 0, n.attr("alpha") * (np.exp(x) - 1), x),
    "selu": _selu_np,
    "sigmoid": lambda x, n: 1 / (1 + np.exp(-x)),
    "hard_sigmoid": lambda x, n: np.clip(n.attr("alpha") * x + n.attr("beta"), 0, 1),
    "hard_swish": lambda x, n: x * np.clip(x / 6 + 0.5, 0, 1),
    "tanh": lambda x, n: np.tanh(x),
    "exp": lambda x, n: np.exp(x),
    "log": lambda x, n: np.log(x),
    "sqrt": lambda x, n: np.sqrt(x),
    "reciprocal": lambda x, n: 1 / x,
    "neg": lambda x, n: -x,
    "abs": lambda x, n: np.abs(x),
    "erf": lambda x, n: _erf_np(x),
    "gelu": _gelu_np,
    "softplus": lambda x, n: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),
    "floor": lambda x, n: np.floor(x),
    "ceil": lambda x, n: np.ceil(x),
    "round": lambda x, n: np.round(x),
    "clip": _clip_np,
    "sign": lambda x, n: np.sign(x),
    "softsign": lambda x, n: x / (1 + np.abs(x)),
    "thresholded_relu": lambda x, n: np.where(x > n.attr("alpha"), x, 0),
    "shrink": _shrink_np,
    "mish": lambda x, n: x * np.tanh(np.logaddexp(x, 0)),
    "celu": lambda x, n: np.maximum(x, 0) + np.minimum(
        0, n.attr("alpha") * (np.exp(x / n.attr("alpha")) - 1)),
    "swish": lambda x, n: x / (1 + np.exp(-n.attr("alpha") * x)),
}


# Trigonometric and hyperbolic: C math library calls (sinf, or sin on float64).
# name: (ONNX op_type, first opset, numpy)
TRIG = {"sin": ("Sin", 7, np.sin), "cos": ("Cos", 7, np.cos), "tan": ("Tan", 7, np.tan),
        "asin": ("Asin", 7, np.arcsin), "acos": ("Acos", 7, np.arccos),
        "atan": ("Atan", 7, np.arctan), "sinh": ("Sinh", 9, np.sinh),
        "cosh": ("Cosh", 9, np.cosh), "asinh": ("Asinh", 9, np.arcsinh),
        "acosh": ("Acosh", 9, np.arccosh), "atanh": ("Atanh", 9, np.arctanh)}
for _name, (_onnx, _since, _np) in TRIG.items():
    UNARY[_name] = lambda x, n, f=_np: f(x)


# Sample input ranges (the function's domain; default [-2, 2]) for tests/ops/test_registry_ops.py.
_DOMAIN = {"log": (0.1, 3), "sqrt": (0.1, 3), "reciprocal": (0.5, 2), "acosh": (1.1, 3),
           "asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9), "tan": (-1.2, 1.2)}


def _sample(op: str):
    """Inputs and attributes (the ONNX defaults the converter copies) to test `op` on."""
    def sample(rng, dtype):
        attrs = {"min": -0.5, "max": 0.7} if op == "clip" else _ATTRS.get(op, {})
        return [rng.uniform(*_DOMAIN.get(op, (-2, 2)), (2, 3, 5)).astype(dtype)], attrs
    return sample


for _name, _numpy in UNARY.items():
    register(_name, OpKind.ELEMENTWISE, _unary_infer, float64=True, sample=_sample(_name),
             numpy=lambda xs, node, f=_numpy: [np.asarray(f(xs[0], node)).astype(xs[0].dtype)])


# (op, ONNX op_type, first opset we convert, attributes with their ONNX defaults): what
# the converters (pipeline/frontend/onnx/unary.py) register, and the samples' attributes.
ONNX_UNARY = [
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
ONNX_UNARY += [(_op, _onnx, _since, {}) for _op, (_onnx, _since, _) in TRIG.items()]


_ATTRS = {_op: _defaults for _op, _, _, _defaults in ONNX_UNARY}


def _predicate_infer(types, node):
    if types[0].dtype not in ("float32", "float64", "float16"):
        raise ModelError(f"node {node.name!r} ({node.op}): input dtype {types[0].dtype} is "
                         "not supported (float32, float64, float16 are)")
    return [TensorType(types[0].shape, "bool")]


def _isinf_np(xs, node):
    x = xs[0]
    return [(np.isposinf(x) & bool(node.attr("detect_positive")))
            | (np.isneginf(x) & bool(node.attr("detect_negative")))]


def _special_values(rng, dtype):
    return [np.array([[0.5, np.inf, -np.inf], [np.nan, -1.0, 3.0]], dtype)]


register("isnan", OpKind.ELEMENTWISE, _predicate_infer, float64=True,
         numpy=lambda xs, node: [np.isnan(xs[0])],
         sample=lambda rng, dtype: (_special_values(rng, dtype), {}))

register("isinf", OpKind.ELEMENTWISE, _predicate_infer, float64=True,
         numpy=_isinf_np,
         sample=lambda rng, dtype: (_special_values(rng, dtype),
                                    {"detect_negative": 0, "detect_positive": 1}))


def _bitcast_infer(types, node):
    source, to = types[0].dtype, node.attr("to")
    if source != node.attr("source") or BITS[source] != BITS[to]:
        raise ModelError(f"node {node.name!r} (BitCast): {source} and {to} differ in width")
    return [TensorType(types[0].shape, to)]


register("bitcast", OpKind.ELEMENTWISE, _bitcast_infer, float64=True,
         numpy=lambda xs, node: [xs[0].view(node.attr("to"))],
         sample=lambda rng, dtype: ([rng.uniform(-3, 3, (2, 5)).astype(dtype)],
                                    {"source": dtype,
                                     "to": {"float32": "int32", "float64": "int64"}[dtype]}))
