"""Elementwise operators: unary, binary with numpy broadcasting, Clip, Identity.

Each is lowered as a scalar function; the code generator wraps it in loops
(as a kernel of its own) or applies it in the epilogue of the kernel before it.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.graph import Node
from pipeline.ops.registry import broadcast_shape, onnx_op, register


def _same_as_first(types, node):
    return [types[0]]


def _broadcast(types, node):
    shape = broadcast_shape(*(t.shape for t in types), where=f"node {node.name!r}")
    return [types[0].__class__(shape, types[0].dtype)]


# -- unary ------------------------------------------------------------------

register("identity", "elementwise", _same_as_first,
         scalar=lambda kb, a, node: a[0], numpy=lambda xs, node: [xs[0]])
register("relu", "elementwise", _same_as_first,
         scalar=lambda kb, a, node: kb.fmax(a[0], kb.f32(0.0)),
         numpy=lambda xs, node: [np.maximum(xs[0], 0)])
register("sigmoid", "elementwise", _same_as_first,
         scalar=lambda kb, a, node: kb.fdiv(
             kb.f32(1.0), kb.fadd(kb.f32(1.0), kb.intrinsic("exp", kb.b.fneg(a[0])))),
         numpy=lambda xs, node: [1 / (1 + np.exp(-xs[0]))])
register("clip", "elementwise", _same_as_first,
         scalar=lambda kb, a, node: kb.fmin(kb.fmax(a[0], kb.f32(node.attr("min"))),
                                            kb.f32(node.attr("max"))),
         numpy=lambda xs, node: [np.clip(xs[0], node.attr("min"), node.attr("max"))])


def _unary(op):
    return lambda ctx, n: [Node.make(op, n.name, n.inputs[:1], n.outputs[:1])]


onnx_op("Relu", 6)(_unary("relu"))
onnx_op("Sigmoid", 6)(_unary("sigmoid"))
onnx_op("Identity", 1)(_unary("identity"))


@onnx_op("Dropout", 1)
def _dropout(ctx, n):
    # Inference only: Dropout is the identity; a requested mask output is not supported.
    if len([o for o in n.outputs if o]) > 1:
        raise ModelError(f"node {n.name!r} (Dropout): the mask output is not supported")
    return [Node.make("identity", n.name, n.inputs[:1], n.outputs[:1])]


@onnx_op("Clip", 6)
def _clip_v6(ctx, n):
    return [Node.make("clip", n.name, n.inputs[:1], n.outputs,
                      min=float(n.attrs.get("min", -3.4028234663852886e38)),
                      max=float(n.attrs.get("max", 3.4028234663852886e38)))]


@onnx_op("Clip", 11)
def _clip_v11(ctx, n):
    # min and max became optional inputs; we need them as build-time constants.
    bounds = []
    for pos, default in ((1, -np.inf), (2, np.inf)):
        name = n.inputs[pos] if len(n.inputs) > pos else ""
        if not name:
            bounds.append(default)
            continue
        value = ctx.const(name)
        if value is None:
            raise ModelError(f"node {n.name!r} (Clip): bound {name!r} must be a constant")
        bounds.append(float(value))
    return [Node.make("clip", n.name, n.inputs[:1], n.outputs, min=bounds[0], max=bounds[1])]


# -- binary, numpy broadcasting ----------------------------------------------

_BINARY = {
    "add": (lambda kb, a, b: kb.fadd(a, b), np.add, "Add"),
    "sub": (lambda kb, a, b: kb.fsub(a, b), np.subtract, "Sub"),
    "mul": (lambda kb, a, b: kb.fmul(a, b), np.multiply, "Mul"),
    "div": (lambda kb, a, b: kb.fdiv(a, b), np.divide, "Div"),
}

for _op, (_emit, _np, _onnx) in _BINARY.items():
    register(_op, "elementwise", _broadcast,
             scalar=lambda kb, a, node, emit=_emit: emit(kb, a[0], a[1]),
             numpy=lambda xs, node, f=_np: [f(xs[0], xs[1]).astype(xs[0].dtype)])
    onnx_op(_onnx, 7)(lambda ctx, n, op=_op: [Node.make(op, n.name, n.inputs, n.outputs)])


@onnx_op("Sum", 6)
def _sum(ctx, n):
    """Sum of N inputs as a chain of N-1 adds (a single input is an identity)."""
    if len(n.inputs) == 1:
        return [Node.make("identity", n.name, n.inputs, n.outputs)]
    nodes, acc = [], n.inputs[0]
    for k, x in enumerate(n.inputs[1:], start=1):
        out = n.outputs[0] if k == len(n.inputs) - 1 else f"{n.outputs[0]}__sum{k}"
        nodes.append(Node.make("add", f"{n.name}__{k}" if out != n.outputs[0] else n.name,
                               (acc, x), (out,)))
        acc = out
    return nodes
