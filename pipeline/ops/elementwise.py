"""The elementwise operators' definitions: shape rules, kinds, numpy references
and sample inputs.

Their lowerings: pipeline/kernels/elementwise.py
Their ONNX converters: pipeline/frontend/onnx/elementwise.py
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pipeline.dsl.minifloat import FLOAT8, MINIFLOATS
from pipeline.errors import ModelError
from pipeline.ir.graph import Node, TensorType
from pipeline.ops.registry import OpKind, broadcast_shape, register

NUMERIC = ("float32", "float64", "int64", "int32", "float16", "int8", "uint8", "int16",
           "uint16", "uint32", "uint64", *MINIFLOATS)


def _check(node: Node, types: list[TensorType], allowed: tuple[str, ...],
           same: bool = True) -> None:
    """ModelError naming the node if an input dtype is not allowed or they differ."""
    for t in types:
        if t.dtype not in allowed:
            raise ModelError(f"node {node.name!r} ({node.op}): input dtype {t.dtype} is not "
                             f"supported ({', '.join(allowed)} are)")
    if same and len({t.dtype for t in types}) > 1:
        raise ModelError(f"node {node.name!r} ({node.op}): input dtypes "
                         f"{[t.dtype for t in types]} differ")


def _broadcast_type(node: Node, types: list[TensorType], dtype: str) -> list[TensorType]:
    shape = broadcast_shape(*(t.shape for t in types), where=f"node {node.name!r}")
    return [TensorType(shape, dtype)]


def _binary(allowed: tuple[str, ...], result: str | None = None):
    """Shape rule: inputs of one allowed dtype; output broadcast, of `result` dtype
    (the input dtype if None)."""
    def infer(types, node):
        _check(node, types, allowed)
        return _broadcast_type(node, types, result or types[0].dtype)
    return infer


# Samples for tests/ops/test_registry_ops.py, (rng, float dtype) -> (inputs, attrs): the
# second operand broadcasts along the first's leading dim and stays away from 0.
def _floats(rng, dtype: str, shape: tuple[int, ...], low: float = -2.0, high: float = 2.0):
    return rng.uniform(low, high, shape).astype(dtype)


def _binary_sample(rng, dtype, low: float = -2.0, attrs=None):
    return [_floats(rng, dtype, (2, 3, 4), low), _floats(rng, dtype, (3, 1), 0.5)], attrs or {}


def _div_np(a, b):
    if a.dtype.kind == "f":
        return a / b
    return np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))  # truncate toward zero


register("identity", OpKind.ELEMENTWISE, lambda types, node: [types[0]], float64=True, uint64=True,
         sample=lambda rng, dtype: ([_floats(rng, dtype, (2, 3))], {}),
         numpy=lambda xs, node: [xs[0]])


ARITH = {  # op: (ONNX op_type, numpy)
    "add": ("Add", np.add), "sub": ("Sub", np.subtract), "mul": ("Mul", np.multiply),
    "div": ("Div", _div_np), "max": ("Max", np.maximum), "min": ("Min", np.minimum),
}


for _op, (_onnx, _np) in ARITH.items():
    register(_op, OpKind.ELEMENTWISE, _binary(NUMERIC), float64=True, sample=_binary_sample,
             uint64=True, numpy=lambda xs, node, f=_np: [f(xs[0], xs[1]).astype(xs[0].dtype)])


def _pow_infer(types, node):
    _check(node, types, NUMERIC, same=False)
    return _broadcast_type(node, types, types[0].dtype)


def _pow_np(xs, node):
    base, exponent = xs
    if base.dtype.kind == "f":
        return [np.power(base, exponent.astype(base.dtype))]
    return [np.power(base.astype(np.float64), exponent.astype(np.float64)).astype(base.dtype)]


register("pow", OpKind.ELEMENTWISE, _pow_infer, numpy=_pow_np, float64=True, uint64=True,
         sample=lambda rng, dtype: _binary_sample(rng, dtype, low=0.5))

register("mod", OpKind.ELEMENTWISE, _binary(NUMERIC), float64=True, uint64=True,
         sample=lambda rng, dtype: _binary_sample(rng, dtype, attrs={"fmod": 1}),
         numpy=lambda xs, node: [(np.fmod if node.attr("fmod") else np.mod)(xs[0], xs[1])])


def _prelu_infer(types, node):
    _check(node, types, ("float32", "float64", "float16"))
    out = _broadcast_type(node, types, types[0].dtype)
    if out[0].shape != types[0].shape:
        raise ModelError(f"node {node.name!r} (PRelu): slope {list(types[1].shape)} does not "
                         f"broadcast to the input {list(types[0].shape)}")
    return out


register("prelu", OpKind.ELEMENTWISE, _prelu_infer, float64=True, sample=_binary_sample,
         numpy=lambda xs, node: [np.where(xs[0] < 0, xs[0] * xs[1], xs[0])])


COMPARE = {  # op: (ONNX op_type, first opset, LLVM predicate, numpy)
    "equal": ("Equal", 7, "==", np.equal), "less": ("Less", 7, "<", np.less),
    "greater": ("Greater", 7, ">", np.greater),
    "less_equal": ("LessOrEqual", 12, "<=", np.less_equal),
    "greater_equal": ("GreaterOrEqual", 12, ">=", np.greater_equal),
}


for _op, (_onnx, _since, _pred, _np) in COMPARE.items():
    register(_op, OpKind.ELEMENTWISE, _binary(NUMERIC + (("bool",) if _op == "equal" else ()),
                                         "bool"), float64=True, uint64=True,
             sample=lambda rng, dtype: ([rng.integers(-2, 3, s).astype(dtype)  # some equal
                                         for s in ((2, 3, 4), (3, 1))], {}),
             numpy=lambda xs, node, f=_np: [f(xs[0], xs[1])])


LOGIC = {"and": ("And", "and_", np.logical_and), "or": ("Or", "or_", np.logical_or),
          "xor": ("Xor", "xor", np.logical_xor)}


for _op, (_onnx, _method, _np) in LOGIC.items():
    # bool values are 0 or 1, so the bitwise instructions are the logical ones.
    register(_op, OpKind.ELEMENTWISE, _binary(("bool",)),
             sample=lambda rng, dtype: ([rng.random((2, 3)) < 0.5, rng.random((1, 3)) < 0.5], {}),
             numpy=lambda xs, node, f=_np: [f(xs[0], xs[1])])


def _not_infer(types, node):
    _check(node, types, ("bool",))
    return [types[0]]


register("not", OpKind.ELEMENTWISE, _not_infer,
         sample=lambda rng, dtype: ([rng.random((2, 3)) < 0.5], {}),
         numpy=lambda xs, node: [np.logical_not(xs[0])])


_INTS = ("int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8")


def _int_sample(rng, dtype):
    return [rng.integers(0, 256, s).astype(np.uint8) for s in ((2, 3, 4), (3, 1))], {}


BITWISE = {"bitwise_and": ("BitwiseAnd", "and_", np.bitwise_and),
            "bitwise_or": ("BitwiseOr", "or_", np.bitwise_or),
            "bitwise_xor": ("BitwiseXor", "xor", np.bitwise_xor)}


for _op, (_onnx, _method, _np) in BITWISE.items():
    register(_op, OpKind.ELEMENTWISE, _binary(_INTS), sample=_int_sample, uint64=True,
             numpy=lambda xs, node, f=_np: [f(xs[0], xs[1])])


def _bitwise_not_infer(types, node):
    _check(node, types, _INTS)
    return [types[0]]


register("bitwise_not", OpKind.ELEMENTWISE, _bitwise_not_infer, uint64=True,
         sample=lambda rng, dtype: (_int_sample(rng, dtype)[0][:1], {}),
         numpy=lambda xs, node: [np.bitwise_not(xs[0])])


def _bit_shift_np(xs, node):
    x, s = xs
    bits = x.dtype.itemsize * 8
    inside = (s >= 0) & (s < bits)
    safe = np.where(inside, s, 0).astype(x.dtype)
    out = np.left_shift(x, safe) if node.attr("direction") == "LEFT" else np.right_shift(x, safe)
    fill = np.where((x < 0) & (node.attr("direction") == "RIGHT"), -1, 0).astype(x.dtype)
    return [np.where(inside, out, fill).astype(x.dtype)]


register("bit_shift", OpKind.ELEMENTWISE, _binary(_INTS), numpy=_bit_shift_np, uint64=True,
         sample=lambda rng, dtype: ([rng.integers(0, 256, (2, 3, 4)).astype(np.uint8),
                                     rng.integers(0, 10, (3, 1)).astype(np.uint8)],
                                    {"direction": "LEFT", "signed": 0}))


def _where_infer(types, node):
    _check(node, types[:1], ("bool",))
    _check(node, types[1:], NUMERIC + ("bool",))
    return _broadcast_type(node, types, types[1].dtype)


register("where", OpKind.ELEMENTWISE, _where_infer, float64=True, uint64=True,
         sample=lambda rng, dtype: ([rng.random((2, 3, 4)) < 0.5, _floats(rng, dtype, (2, 3, 4)),
                                     _floats(rng, dtype, (3, 1))], {}),
         numpy=lambda xs, node: [np.where(xs[0], xs[1], xs[2])])


def _cast_infer(types, node):
    _check(node, types, NUMERIC + ("bool", "int4", "uint4", "int2", "uint2"))
    return [TensorType(types[0].shape, node.attr("to"))]


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float32 `x` as float8_e8m0fnu: its exponent, rounded by the dropped mantissa
    (dsl/minifloat.py's rule; ml_dtypes' own cast rounds otherwise)."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    exp = (bits >> 23) & 0xFF
    if round_mode == "up":
        up = (bits & 0x7FFFFF) != 0
    elif round_mode == "nearest":
        up = ((bits & 0x400000) != 0) & (((bits & 0x3FFFFF) != 0) | (exp != 0))
    else:
        up = np.zeros(exp.shape, bool)
    up &= (exp != 0xFF) & (bits != 0x400000)  # 2^-127 is code 0
    if saturate:
        up &= exp != 0xFE
    return (exp + up).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)


def _cast_np(xs, node):
    x, to = xs[0], node.attr("to")
    if to == "float8_e8m0fnu":
        return [_to_e8m0(x.astype(np.float32), bool(node.attr("saturate", 1)),
                         node.attr("round_mode", "up"))]
    if to in FLOAT8 and node.attr("saturate", 1):  # ml_dtypes' casts do not saturate
        top = float(ml_dtypes.finfo(to).max)
        x = np.where(np.isnan(x), x, np.clip(x.astype(np.float32), -top, top))
    if np.dtype(to).kind in "bf" or to in MINIFLOATS or x.dtype.kind != "f":
        return [x.astype(to)]
    # float -> int truncates toward zero; narrow ints keep the low bits, as the kernel
    # does (through int64: numpy's direct float -> int8 cast is platform-defined)
    whole = np.trunc(x)
    return [whole.astype(np.int64).astype(to) if to not in ("int32", "int64", "uint64")
            else whole.astype(to)]


register("cast", OpKind.ELEMENTWISE, _cast_infer, float64=True, uint64=True,
         sample=lambda rng, dtype: ([_floats(rng, dtype, (2, 5), -5, 5)], {"to": "int32"}),
         numpy=_cast_np)
