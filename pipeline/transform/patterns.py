"""Exporters' spellings of ops we have as one kernel: FuseLayerNorm and FuseGelu.

FuseLayerNorm: the decomposed LayerNorm exporters emit, as one layer_norm op.

torch.onnx before opset 17, TensorFlow and hand-written graphs spell LayerNorm as

    m = ReduceMean(x, trailing axes)  d = Sub(x, m)  p = Pow(d, 2) (or Mul(d, d))
    v = ReduceMean(p, same axes)      s = Sqrt(Add(v, eps))     n = Div(d, s)
    [y = Mul(n, gamma)] [z = Add(y, beta)]

seven to nine kernels, two reductions and four passes over x. This pass replaces
the chain by layer_norm(x, gamma, beta, axis, epsilon) (ops/norm.py: one kernel,
statistics and the affine in one pass per row) when every intermediate has no
other use and is no graph output, eps is a constant scalar and gamma / beta are
constants that vary along the normalised dims only; anything else stays as it is.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from pipeline.ir.graph import Graph, Node, add_param
from pipeline.transform.context import PassConfig
from pipeline.transform.util import fuse_chains, sole_user


def fuse_layer_norm(graph: Graph, params: dict, cfg: PassConfig):
    """Rewrite each decomposed float32 LayerNorm (module doc) into one layer_norm node."""
    types, params = dict(graph.types), dict(params)

    def fuse(node: Node, consumers: dict, outputs: set):
        match = _match(node, graph, params, consumers, outputs)
        if match is None:
            return None
        chain, gamma, beta, axis, eps = match
        x = node.inputs[0]
        normalized = graph.types[x].shape[axis:]
        if gamma is None:
            gamma = add_param(types, params, f"{chain[-1].name}.ones",
                              np.ones(normalized, np.float32))
        inputs = [x, gamma] + ([beta] if beta is not None else [])
        return chain, Node.make("layer_norm", chain[-1].name, inputs, chain[-1].outputs,
                                axis=axis, epsilon=eps)

    return fuse_chains(graph, params, "reduce_mean", fuse, types)


def _match(mean: Node, graph: Graph, params: dict, consumers: dict, outputs: set):
    """(nodes in order, gamma, beta, axis, eps) of the chain starting at `mean`, or None."""
    x = mean.inputs[0]
    xt = graph.types[x]
    rank = len(xt.shape)
    axes = tuple(mean.attr("axes"))
    if xt.dtype != "float32" or not mean.attr("keepdims") or not axes or \
            axes != tuple(range(axes[0], rank)):
        return None

    def only_use(name: str, op: str, count: int = 1):
        """The single consumer of `name` (an `op`), if name has `count` uses and is
        no graph output."""
        users = consumers.get(name, [])
        if name in outputs or len(users) != count:
            return None
        hits = [u for u in users if u.op == op]
        return hits[0] if hits else None

    def other(node: Node, name: str) -> str:
        rest = [i for i in node.inputs if i != name]
        return rest[0] if len(rest) == 1 else name

    def scalar(name: str):
        value = params.get(name)
        return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None

    sub = only_use(mean.outputs[0], "sub")
    if sub is None or sub.inputs != (x, mean.outputs[0]):
        return None
    d = sub.outputs[0]
    users = list({id(u): u for u in consumers.get(d, [])}.values())  # Mul(d, d) once
    if d in outputs or len(users) != 2:
        return None
    square = next((u for u in users if u.op == "pow" and u.inputs[0] == d
                   and scalar(u.inputs[1]) == 2.0), None) or \
        next((u for u in users if u.op == "mul" and u.inputs == (d, d)), None)
    if square is None:
        return None
    div = next((u for u in users if u is not square), None)
    if div.op != "div" or div.inputs[0] != d:
        return None
    var = only_use(square.outputs[0], "reduce_mean")
    if var is None or tuple(var.attr("axes")) != axes or not var.attr("keepdims"):
        return None
    add = only_use(var.outputs[0], "add")
    if add is None:
        return None
    eps = scalar(other(add, var.outputs[0]))
    sqrt = only_use(add.outputs[0], "sqrt")
    if eps is None or sqrt is None or div.inputs[1] != sqrt.outputs[0] or \
            only_use(sqrt.outputs[0], "div") is not div:
        return None
    chain = [mean, sub, square, var, add, sqrt, div]
    normalized = xt.shape[axes[0]:]
    gamma = beta = None
    scale = only_use(div.outputs[0], "mul")
    if scale is not None and _affine(other(scale, div.outputs[0]), params, normalized):
        gamma = other(scale, div.outputs[0])
        chain.append(scale)
        shift = only_use(scale.outputs[0], "add")
        if shift is not None and _affine(other(shift, scale.outputs[0]), params, normalized):
            beta = other(shift, scale.outputs[0])
            chain.append(shift)
    if graph.types[chain[-1].outputs[0]] != xt:
        return None
    return chain, gamma, beta, axes[0], eps


def _affine(name: str, params: dict, normalized: tuple) -> bool:
    """A float32 constant that broadcasts along the normalised dims only."""
    value = params.get(name)
    if value is None or value.dtype != np.float32 or value.ndim > len(normalized):
        return False
    shape = (1,) * (len(normalized) - value.ndim) + value.shape
    return all(s in (1, n) for s, n in zip(shape, normalized, strict=True))


def fuse_gelu(graph: Graph, params: dict, cfg: PassConfig):
    """Rewrite the exact GELU torch exports, x * 0.5 * (1 + Erf(x / sqrt 2)) (or
    0.5 x first, Mul by 1/sqrt 2, either operand order), into one gelu(x) node of
    one input: FuseOps can then put it in the epilogue of the dense layer before
    it (x, read twice by the chain, could not join it)."""
    def fuse(node: Node, consumers: dict, outputs: set):
        match = _match_gelu(node, graph, params, consumers, outputs)
        if match is None:
            return None
        chain, x = match
        if graph.types[chain[-1].outputs[0]] != graph.types[x]:
            return None  # a constant of higher rank broadcast the result: keep the chain
        return chain, Node.make("gelu", chain[-1].name, [x], chain[-1].outputs,
                                approximate="none")

    return fuse_chains(graph, params, "erf", fuse)


def _match_gelu(erf: Node, graph: Graph, params: dict, consumers: dict, outputs: set):
    """(nodes in order, x) of the GELU chain around `erf`, or None."""
    only_use = partial(sole_user, consumers, outputs)

    def const(node: Node, name: str):
        """(the other input, its constant scalar value) of a binary `node`."""
        rest = [i for i in node.inputs if i != name]
        value = params.get(rest[0]) if len(rest) == 1 else None
        return (rest[0], float(value.reshape(-1)[0])) if value is not None and \
            value.size == 1 else (rest[0] if rest else None, None)

    def near(a, b) -> bool:
        return a is not None and abs(a - b) <= 1e-6 * abs(b)

    scaled = next((n for n in graph.nodes if erf.inputs[0] in n.outputs), None)
    if scaled is None or only_use(scaled.outputs[0]) is not erf:
        return None
    if scaled.op == "div" and near(_scalar(params, scaled.inputs[1]), math.sqrt(2)):
        x = scaled.inputs[0]
    elif scaled.op == "mul":
        x, c = (scaled.inputs[0], _scalar(params, scaled.inputs[1])) \
            if scaled.inputs[1] in params else (scaled.inputs[1],
                                                _scalar(params, scaled.inputs[0]))
        if not near(c, 1 / math.sqrt(2)):
            return None
    else:
        return None
    if graph.types[x].dtype != "float32":
        return None
    plus = only_use(erf.outputs[0])
    if plus is None or plus.op != "add" or not near(const(plus, erf.outputs[0])[1], 1.0):
        return None
    times = only_use(plus.outputs[0])
    if times is None or times.op != "mul":
        return None
    other, _ = const(times, plus.outputs[0])
    if other == x:  # x * (1 + erf) then * 0.5
        half = only_use(times.outputs[0])
        if half is None or half.op != "mul" or not near(const(half, times.outputs[0])[1], 0.5):
            return None
        return [scaled, erf, plus, times, half], x
    half = next((n for n in graph.nodes if other in n.outputs), None)  # (0.5 x) * (1 + erf)
    if half is None or half.op != "mul" or only_use(other) is not times or \
            const(half, x)[0] is None or x not in half.inputs or \
            not near(const(half, x)[1], 0.5):
        return None
    return [half, scaled, erf, plus, times], x


def _scalar(params: dict, name: str):
    value = params.get(name)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None
