"""Elementwise operators of several inputs, with numpy broadcasting: arithmetic
(Add, Sub, Mul, Div, Pow, Mod, Max, Min, PRelu, variadic Sum/Mean), comparisons,
logic, bitwise (BitwiseAnd/Or/Xor/Not, BitShift), Where and Cast; plus Identity and
Dropout.

Each is lowered as a scalar function of LLVM values; the builder's
dtype-aware helpers (arith, compare, cast) pick float or integer instructions
from the values' types, so one definition serves float32, float64, int64 and int32
(float16 and the narrow integers compute in float32 / int32 / int64:
pipeline/dsl/builder.py).
Comparisons and logic produce bool, stored as one byte holding 0 or 1.
Unary math and activations are in pipeline/ops/unary.py.
"""

from __future__ import annotations

import numpy as np

from pipeline.dsl.builder import FLOATS
from pipeline.errors import ModelError
from pipeline.ir.graph import ONNX_DTYPES, Node, TensorType
from pipeline.ops.registry import Limit, broadcast_shape, onnx_op, register

NUMERIC = ("float32", "float64", "int64", "int32", "float16", "int8", "uint8", "int16",
           "uint16", "uint32")
# ONNX TensorProto element types we convert to, for Cast's `to`.


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


# -- identity ----------------------------------------------------------------------------

register("identity", "elementwise", lambda types, node: [types[0]], float64=True,
         sample=lambda rng, dtype: ([_floats(rng, dtype, (2, 3))], {}),
         scalar=lambda kb, a, node: a[0], numpy=lambda xs, node: [xs[0]])

onnx_op("Identity", 1, emits=("identity",))(
    lambda ctx, n: [Node.make("identity", n.name, n.inputs[:1], n.outputs[:1])])


@onnx_op("Dropout", 1, emits=("identity",), build_time_inputs=(1, 2),
         limits=(Limit("the training_mode input (random masks)", lambda n: n.given(2)),))
def _dropout(ctx, n):
    # Inference only: Dropout is the identity and its mask output is all ones
    # (bool since opset 10, the input's dtype before), a build-time constant.
    training = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
    if training is not None and (ctx.const(training) is None or bool(ctx.const(training))):
        raise ModelError(f"node {n.name!r} (Dropout): training mode is not supported "
                         f"(training_mode input {training!r} must be a constant false)")
    if len(n.outputs) > 1 and n.outputs[1]:
        x = ctx.type(n.inputs[0])
        ctx.set_const(n.outputs[1], np.ones(x.shape, bool if n.opset >= 10 else x.dtype))
    return [Node.make("identity", n.name, n.inputs[:1], n.outputs[:1])]


# -- arithmetic --------------------------------------------------------------------------

_ARITH = {  # op: (ONNX op_type, numpy)
    "add": ("Add", np.add), "sub": ("Sub", np.subtract), "mul": ("Mul", np.multiply),
    "div": ("Div", _div_np), "max": ("Max", np.maximum), "min": ("Min", np.minimum),
}
for _op, (_onnx, _np) in _ARITH.items():
    register(_op, "elementwise", _binary(NUMERIC), float64=True, sample=_binary_sample,
             scalar=lambda kb, a, node, op=_op: kb.arith(op, a[0], a[1]),
             numpy=lambda xs, node, f=_np: [f(xs[0], xs[1]).astype(xs[0].dtype)])


_FLOAT_NAMES = dict(zip(FLOATS, ("float32", "float64"), strict=True))


def _pow_infer(types, node):
    _check(node, types, NUMERIC, same=False)
    return _broadcast_type(node, types, types[0].dtype)


def _pow(kb, a, node):
    base, exponent = a
    if base.type in FLOATS:
        return kb.intrinsic("pow", base, kb.cast(exponent, _FLOAT_NAMES[base.type]))
    # Integer base: pow in double, truncated back, as onnxruntime's static_cast does.
    wide = [kb.cast(v, "float64") for v in (base, exponent)]
    return kb.cast(kb.intrinsic("pow", *wide), base.type)


def _pow_np(xs, node):
    base, exponent = xs
    if base.dtype.kind == "f":
        return [np.power(base, exponent.astype(base.dtype))]
    return [np.power(base.astype(np.float64), exponent.astype(np.float64)).astype(base.dtype)]


register("pow", "elementwise", _pow_infer, scalar=_pow, numpy=_pow_np, float64=True,
         sample=lambda rng, dtype: _binary_sample(rng, dtype, low=0.5))
onnx_op("Pow", 7, emits=("pow",))(
    lambda ctx, n: [Node.make("pow", n.name, n.inputs[:2], n.outputs[:1])])


def _mod(kb, a, node):
    """fmod=1: C fmod, the dividend's sign (frem, srem); fmod=0: a non-zero remainder
    takes the divisor's sign, as Python's % (floats too since opset 28: x % inf of
    the other sign is inf)."""
    x, y = a
    r = kb.arith("rem", x, y)
    if node.attr("fmod"):
        return r
    zero = kb.const(0, r.type)
    sign_r, sign_y = (kb.compare("<", v, zero) for v in (r, y))
    fix = kb.and_(kb.compare("!=", r, zero, ordered=True), kb.xor(sign_r, sign_y))
    return kb.select(fix, kb.arith("add", r, y, fast=False), r)


register("mod", "elementwise", _binary(NUMERIC), scalar=_mod, float64=True,
         sample=lambda rng, dtype: _binary_sample(rng, dtype, attrs={"fmod": 1}),
         numpy=lambda xs, node: [(np.fmod if node.attr("fmod") else np.mod)(xs[0], xs[1])])
onnx_op("Mod", 10, emits=("mod",))(
    lambda ctx, n: [Node.make("mod", n.name, n.inputs[:2], n.outputs[:1],
                              fmod=int(n.attrs.get("fmod", 0)))])


def _prelu_infer(types, node):
    _check(node, types, ("float32", "float64", "float16"))
    out = _broadcast_type(node, types, types[0].dtype)
    if out[0].shape != types[0].shape:
        raise ModelError(f"node {node.name!r} (PRelu): slope {list(types[1].shape)} does not "
                         f"broadcast to the input {list(types[0].shape)}")
    return out


register("prelu", "elementwise", _prelu_infer, float64=True, sample=_binary_sample,
         scalar=lambda kb, a, node: kb.select(kb.compare("<", a[0], kb.fconst(0.0, a[0])),
                                                kb.fmul(a[0], a[1]), a[0]),
         numpy=lambda xs, node: [np.where(xs[0] < 0, xs[0] * xs[1], xs[0])])
onnx_op("PRelu", 7, emits=("prelu",))(
    lambda ctx, n: [Node.make("prelu", n.name, n.inputs[:2], n.outputs[:1])])


@onnx_op("PRelu", 1, emits=("reshape", "prelu"))
def _prelu_v1(ctx, n):
    """Before opset 7 a 1-D slope of C values is per channel (axis 1), as old
    PyTorch exports use it: reshape it to [C, 1, ..] for numpy broadcasting."""
    x, slope = (ctx.type(i).shape for i in n.inputs[:2])
    if len(slope) != 1 or len(x) < 3 or slope[0] != x[1]:
        return [Node.make("prelu", n.name, n.inputs[:2], n.outputs[:1])]
    per_channel = f"{n.inputs[1]}__per_channel"
    return [Node.make("reshape", f"{n.name}__slope", n.inputs[1:2], (per_channel,),
                      shape=(slope[0],) + (1,) * (len(x) - 2)),
            Node.make("prelu", n.name, (n.inputs[0], per_channel), n.outputs[:1])]


def _variadic(op: str):
    """A converter for Sum/Max/Min/Mean of N inputs: a chain of N-1 binary ops
    (Mean then divides by N); a single input is an identity."""
    def convert(ctx, n):
        inputs = [i for i in n.inputs if i]
        final = n.outputs[0]
        mean = op == "mean"
        if len(inputs) == 1 and not mean:
            return [Node.make("identity", n.name, inputs, (final,))]
        nodes, acc = [], inputs[0]
        binary = "add" if mean else op
        for k, x in enumerate(inputs[1:], start=1):
            last = k == len(inputs) - 1 and not mean
            out = final if last else f"{final}__{op}{k}"
            nodes.append(Node.make(binary, n.name if last else f"{n.name}__{k}", (acc, x),
                                   (out,)))
            acc = out
        if mean:
            dtype = ctx.type(inputs[0]).dtype
            count = ctx.add_param(f"{n.name}__count", np.array(len(inputs), dtype))
            nodes.append(Node.make("div", n.name, (acc, count), (final,)))
        return nodes
    return convert


onnx_op("Sum", 1, emits=("identity", "add"))(_variadic("add"))
onnx_op("Max", 1, emits=("identity", "max"))(_variadic("max"))
onnx_op("Min", 1, emits=("identity", "min"))(_variadic("min"))
onnx_op("Mean", 1, emits=("add", "div"))(_variadic("mean"))
# Opset 7 replaced the legacy `broadcast`/`axis` attributes with numpy broadcasting.
for _op in ("add", "sub", "mul", "div"):
    onnx_op(_ARITH[_op][0], 7, emits=(_op,))(
        lambda ctx, n, op=_op: [Node.make(op, n.name, n.inputs[:2], n.outputs[:1])])


def _legacy_broadcast(op: str):
    """Add/Sub/Mul/Div/Pow before opset 7: with broadcast=1, B's dims line up with
    A's starting at `axis` (default: A's trailing dims, as numpy). Padding B's
    shape with trailing 1s turns that into numpy broadcasting."""

    def convert(ctx, n):
        a, b = n.inputs[:2]
        rank_a, b_shape = len(ctx.type(a).shape), ctx.type(b).shape
        trailing = 0
        if n.attrs.get("broadcast", 0) and "axis" in n.attrs:
            axis = int(n.attrs["axis"]) % max(rank_a, 1)
            trailing = rank_a - axis - len(b_shape)
            if trailing < 0:
                raise ModelError(f"node {n.name!r} ({n.op_type}): B {list(b_shape)} does not "
                                 f"fit A's rank {rank_a} at axis {axis}")
        nodes = []
        if trailing:
            shape = tuple(b_shape) + (1,) * trailing
            if ctx.const(b) is not None:
                b = ctx.add_param(f"{b}_bcast", ctx.const(b).reshape(shape))
            else:
                nodes.append(Node.make("reshape", f"{n.name}__bcast", (b,),
                                       (f"{n.outputs[0]}__b",), shape=shape))
                b = f"{n.outputs[0]}__b"
        return nodes + [Node.make(op, n.name, (a, b), n.outputs[:1])]

    return convert


for _op, _onnx in (("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"),
                   ("pow", "Pow")):
    onnx_op(_onnx, 1, emits=("reshape", _op))(_legacy_broadcast(_op))

# -- comparisons and logic (bool results) ---------------------------------------------------

_COMPARE = {  # op: (ONNX op_type, first opset, LLVM predicate, numpy)
    "equal": ("Equal", 7, "==", np.equal), "less": ("Less", 7, "<", np.less),
    "greater": ("Greater", 7, ">", np.greater),
    "less_equal": ("LessOrEqual", 12, "<=", np.less_equal),
    "greater_equal": ("GreaterOrEqual", 12, ">=", np.greater_equal),
}
for _op, (_onnx, _since, _pred, _np) in _COMPARE.items():
    register(_op, "elementwise", _binary(NUMERIC + (("bool",) if _op == "equal" else ()),
                                         "bool"), float64=True,
             sample=lambda rng, dtype: ([rng.integers(-2, 3, s).astype(dtype)  # some equal
                                         for s in ((2, 3, 4), (3, 1))], {}),
             scalar=lambda kb, a, node, p=_pred: kb.as_bool(kb.compare(p, a[0], a[1])),
             numpy=lambda xs, node, f=_np: [f(xs[0], xs[1])])
    onnx_op(_onnx, _since, emits=(_op,))(
        lambda ctx, n, op=_op: [Node.make(op, n.name, n.inputs[:2], n.outputs[:1])])

_LOGIC = {"and": ("And", "and_", np.logical_and), "or": ("Or", "or_", np.logical_or),
          "xor": ("Xor", "xor", np.logical_xor)}
for _op, (_onnx, _method, _np) in _LOGIC.items():
    # bool values are 0 or 1, so the bitwise instructions are the logical ones.
    register(_op, "elementwise", _binary(("bool",)),
             sample=lambda rng, dtype: ([rng.random((2, 3)) < 0.5, rng.random((1, 3)) < 0.5], {}),
             scalar=lambda kb, a, node, m=_method: getattr(kb, m)(a[0], a[1]),
             numpy=lambda xs, node, f=_np: [f(xs[0], xs[1])])
    onnx_op(_onnx, 7, emits=(_op,))(
        lambda ctx, n, op=_op: [Node.make(op, n.name, n.inputs[:2], n.outputs[:1])])


def _not_infer(types, node):
    _check(node, types, ("bool",))
    return [types[0]]


register("not", "elementwise", _not_infer,
         sample=lambda rng, dtype: ([rng.random((2, 3)) < 0.5], {}),
         scalar=lambda kb, a, node: kb.xor(a[0], kb.const(1, a[0].type)),
         numpy=lambda xs, node: [np.logical_not(xs[0])])
onnx_op("Not", 1, emits=("not",))(
    lambda ctx, n: [Node.make("not", n.name, n.inputs[:1], n.outputs[:1])])


# -- bitwise (integers, in their compute type: the store keeps the dtype's bits) ------------

_INTS = ("int64", "int32", "int16", "int8", "uint32", "uint16", "uint8")


def _int_sample(rng, dtype):
    return [rng.integers(0, 256, s).astype(np.uint8) for s in ((2, 3, 4), (3, 1))], {}


_BITWISE = {"bitwise_and": ("BitwiseAnd", "and_", np.bitwise_and),
            "bitwise_or": ("BitwiseOr", "or_", np.bitwise_or),
            "bitwise_xor": ("BitwiseXor", "xor", np.bitwise_xor)}
for _op, (_onnx, _method, _np) in _BITWISE.items():
    register(_op, "elementwise", _binary(_INTS), sample=_int_sample,
             scalar=lambda kb, a, node, m=_method: getattr(kb, m)(a[0], a[1]),
             numpy=lambda xs, node, f=_np: [f(xs[0], xs[1])])
    onnx_op(_onnx, 18, emits=(_op,))(
        lambda ctx, n, op=_op: [Node.make(op, n.name, n.inputs[:2], n.outputs[:1])])


def _bitwise_not_infer(types, node):
    _check(node, types, _INTS)
    return [types[0]]


register("bitwise_not", "elementwise", _bitwise_not_infer,
         sample=lambda rng, dtype: (_int_sample(rng, dtype)[0][:1], {}),
         scalar=lambda kb, a, node: kb.xor(a[0], kb.const(-1, a[0].type)),
         numpy=lambda xs, node: [np.bitwise_not(xs[0])])
onnx_op("BitwiseNot", 18, emits=("bitwise_not",))(
    lambda ctx, n: [Node.make("bitwise_not", n.name, n.inputs[:1], n.outputs[:1])])


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


def _bit_shift_np(xs, node):
    x, s = xs
    bits = x.dtype.itemsize * 8
    inside = (s >= 0) & (s < bits)
    safe = np.where(inside, s, 0).astype(x.dtype)
    out = np.left_shift(x, safe) if node.attr("direction") == "LEFT" else np.right_shift(x, safe)
    fill = np.where((x < 0) & (node.attr("direction") == "RIGHT"), -1, 0).astype(x.dtype)
    return [np.where(inside, out, fill).astype(x.dtype)]


register("bit_shift", "elementwise", _binary(_INTS), scalar=_bit_shift, numpy=_bit_shift_np,
         sample=lambda rng, dtype: ([rng.integers(0, 256, (2, 3, 4)).astype(np.uint8),
                                     rng.integers(0, 10, (3, 1)).astype(np.uint8)],
                                    {"direction": "LEFT", "signed": 0}))


@onnx_op("BitShift", 11, emits=("bit_shift",))
def _bit_shift_convert(ctx, n):
    signed = int(ctx.type(n.inputs[0]).dtype.startswith("int"))
    return [Node.make("bit_shift", n.name, n.inputs[:2], n.outputs[:1], signed=signed,
                      direction=n.text("direction", "", ("LEFT", "RIGHT")))]


def _where_infer(types, node):
    _check(node, types[:1], ("bool",))
    _check(node, types[1:], NUMERIC + ("bool",))
    return _broadcast_type(node, types, types[1].dtype)


register("where", "elementwise", _where_infer, float64=True,
         sample=lambda rng, dtype: ([rng.random((2, 3, 4)) < 0.5, _floats(rng, dtype, (2, 3, 4)),
                                     _floats(rng, dtype, (3, 1))], {}),
         scalar=lambda kb, a, node: kb.select(kb.truth(a[0]), a[1], a[2]),
         numpy=lambda xs, node: [np.where(xs[0], xs[1], xs[2])])
onnx_op("Where", 9, emits=("where",))(
    lambda ctx, n: [Node.make("where", n.name, n.inputs[:3], n.outputs[:1])])


# -- Cast --------------------------------------------------------------------------------

def _cast_infer(types, node):
    _check(node, types, NUMERIC + ("bool",))
    return [TensorType(types[0].shape, node.attr("to"))]


def _cast_np(xs, node):
    x, to = xs[0], node.attr("to")
    if np.dtype(to).kind in "bf" or x.dtype.kind != "f":
        return [x.astype(to)]
    # float -> int truncates toward zero; narrow ints keep the low bits, as the kernel
    # does (through int64: numpy's direct float -> int8 cast is platform-defined)
    whole = np.trunc(x)
    return [whole.astype(np.int64).astype(to) if to not in ("int32", "int64")
            else whole.astype(to)]


register("cast", "elementwise", _cast_infer, float64=True,
         sample=lambda rng, dtype: ([_floats(rng, dtype, (2, 5), -5, 5)], {"to": "int32"}),
         scalar=lambda kb, a, node: kb.cast(a[0], node.attr("to")), numpy=_cast_np)


def _cast_to(n, code: int) -> str:
    dtype = ONNX_DTYPES.get(code)
    if dtype is None:
        import onnx  # only for the message; ops load without onnx for kernel builds

        raise ModelError(f"node {n.name!r} ({n.op_type}): cast to "
                         f"{onnx.TensorProto.DataType.Name(code)} is not supported "
                         f"({', '.join(ONNX_DTYPES.values())} are)")
    return dtype


@onnx_op("Cast", 6, emits=("cast",))
def _cast(ctx, n):
    return [Node.make("cast", n.name, n.inputs[:1], n.outputs[:1],
                      to=_cast_to(n, int(n.attrs["to"])))]


@onnx_op("CastLike", 15, emits=("cast",))
def _cast_like(ctx, n):
    return [Node.make("cast", n.name, n.inputs[:1], n.outputs[:1],
                      to=ctx.type(n.inputs[1]).dtype)]
