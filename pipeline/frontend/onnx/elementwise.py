"""ONNX converters to the elementwise operators (defined in pipeline/ops/elementwise.py).

uint64 computes in i64 like int64; the ops whose result differs (division, compares,
max/min, conversions) learn which of their inputs are uint64 from an `unsigned`
attribute (`unsigned_inputs`) and pick unsigned instructions (kernels/elementwise.py).
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.registry import Limit, onnx_op
from pipeline.ir.graph import ONNX_DTYPES, Node
from pipeline.ops.elementwise import ARITH, BITWISE, COMPARE, LOGIC


def unsigned_inputs(ctx, inputs) -> dict:
    """{"unsigned": positions of the uint64 tensors among `inputs`} for Node.make, or
    {} if there are none (so other dtypes' nodes, and kernel hashes, stay as they were)."""
    positions = tuple(k for k, name in enumerate(inputs)
                      if name and ctx.type(name).dtype == "uint64")
    return {"unsigned": positions} if positions else {}


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


onnx_op("Pow", 7, emits=("pow",))(
    lambda ctx, n: [Node.make("pow", n.name, n.inputs[:2], n.outputs[:1],
                              **unsigned_inputs(ctx, n.inputs[:2]))])

onnx_op("Mod", 10, emits=("mod",))(
    lambda ctx, n: [Node.make("mod", n.name, n.inputs[:2], n.outputs[:1],
                              fmod=int(n.attrs.get("fmod", 0)),
                              **unsigned_inputs(ctx, n.inputs[:2]))])

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
                                   (out,), **unsigned_inputs(ctx, inputs[:2])))
            acc = out
        if mean:
            dtype = ctx.type(inputs[0]).dtype
            count = ctx.add_param(f"{n.name}__count", np.array(len(inputs), dtype))
            nodes.append(Node.make("div", n.name, (acc, count), (final,),
                                   **unsigned_inputs(ctx, inputs[:2])))
        return nodes
    return convert


onnx_op("Sum", 1, emits=("identity", "add"))(_variadic("add"))

onnx_op("Max", 1, emits=("identity", "max"))(_variadic("max"))

onnx_op("Min", 1, emits=("identity", "min"))(_variadic("min"))

onnx_op("Mean", 1, emits=("add", "div"))(_variadic("mean"))


# Opset 7 replaced the legacy `broadcast`/`axis` attributes with numpy broadcasting.
for _op in ("add", "sub", "mul", "div"):
    onnx_op(ARITH[_op][0], 7, emits=(_op,))(
        lambda ctx, n, op=_op: [Node.make(op, n.name, n.inputs[:2], n.outputs[:1],
                                          **unsigned_inputs(ctx, n.inputs[:2]))])


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
        return nodes + [Node.make(op, n.name, (a, b), n.outputs[:1],
                                  **unsigned_inputs(ctx, n.inputs[:2]))]

    return convert


for _op, _onnx in (("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"),
                   ("pow", "Pow")):
    onnx_op(_onnx, 1, emits=("reshape", _op))(_legacy_broadcast(_op))


for _op, (_onnx, _since, _pred, _np) in COMPARE.items():
    onnx_op(_onnx, _since, emits=(_op,))(
        lambda ctx, n, op=_op: [Node.make(op, n.name, n.inputs[:2], n.outputs[:1],
                                          **unsigned_inputs(ctx, n.inputs[:2]))])


for _op, (_onnx, _method, _np) in LOGIC.items():
    # bool values are 0 or 1, so the bitwise instructions are the logical ones.
    onnx_op(_onnx, 7, emits=(_op,))(
        lambda ctx, n, op=_op: [Node.make(op, n.name, n.inputs[:2], n.outputs[:1])])


onnx_op("Not", 1, emits=("not",))(
    lambda ctx, n: [Node.make("not", n.name, n.inputs[:1], n.outputs[:1])])


for _op, (_onnx, _method, _np) in BITWISE.items():
    onnx_op(_onnx, 18, emits=(_op,))(
        lambda ctx, n, op=_op: [Node.make(op, n.name, n.inputs[:2], n.outputs[:1])])


onnx_op("BitwiseNot", 18, emits=("bitwise_not",))(
    lambda ctx, n: [Node.make("bitwise_not", n.name, n.inputs[:1], n.outputs[:1])])


@onnx_op("BitShift", 11, emits=("bit_shift",))
def _bit_shift_convert(ctx, n):
    signed = int(ctx.type(n.inputs[0]).dtype.startswith("int"))
    return [Node.make("bit_shift", n.name, n.inputs[:2], n.outputs[:1], signed=signed,
                      direction=n.text("direction", "", ("LEFT", "RIGHT")))]


onnx_op("Where", 9, emits=("where",))(
    lambda ctx, n: [Node.make("where", n.name, n.inputs[:3], n.outputs[:1])])


def _cast_to(n, code: int) -> str:
    dtype = ONNX_DTYPES.get(code)
    if dtype is None:
        import onnx  # only for the message; ops load without onnx for kernel builds

        raise ModelError(f"node {n.name!r} ({n.op_type}): cast to "
                         f"{onnx.TensorProto.DataType.Name(code)} is not supported "
                         f"({', '.join(ONNX_DTYPES.values())} are)")
    return dtype


def _cast_node(ctx, n, to: str) -> Node:
    """cast to `to`; a float8 target keeps Cast's saturate attribute (opset 19) when 0."""
    extra = {"saturate": 0} if to.startswith("float8") and not n.attrs.get("saturate", 1) \
        else {}
    mode = n.text("round_mode", "up", ("up", "down", "nearest"))  # opset 24
    if to == "float8_e8m0fnu" and mode != "up":
        extra["round_mode"] = mode
    return Node.make("cast", n.name, n.inputs[:1], n.outputs[:1], to=to, **extra,
                     **unsigned_inputs(ctx, n.inputs[:1]))


@onnx_op("Cast", 6, emits=("cast",))
def _cast(ctx, n):
    return [_cast_node(ctx, n, _cast_to(n, int(n.attrs["to"])))]


@onnx_op("CastLike", 15, emits=("cast",))
def _cast_like(ctx, n):
    return [_cast_node(ctx, n, ctx.type(n.inputs[1]).dtype)]
