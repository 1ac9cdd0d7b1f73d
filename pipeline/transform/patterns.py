"""Exporters' spellings of ops we have as one kernel: FuseLayerNorm and FuseGelu.

FuseLayerNorm also fuses the RMSNorm LLaMA-style models write (torch exports
`x * rsqrt(mean(x^2) + eps) * w` as Pow or Mul, ReduceMean, Add, Sqrt, then Div(1, .)
or Reciprocal and Mul, or Div(x, .)) into one rms_norm; FuseGelu also the tanh form
(module doc of fuse_gelu).

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

    def fuse_rms(node: Node, consumers: dict, outputs: set):
        match = _match_rms(node, graph, params, consumers, outputs)
        if match is None:
            return None
        chain, x, gamma, axis, eps = match
        if gamma is None:
            gamma = add_param(types, params, f"{chain[-1].name}.ones",
                              np.ones(graph.types[x].shape[axis:], np.float32))
        return chain, Node.make("rms_norm", chain[-1].name, [x, gamma], chain[-1].outputs,
                                axis=axis, epsilon=eps)

    graph, params = fuse_chains(graph, params, "reduce_mean", fuse, types)
    types = dict(graph.types)
    return fuse_chains(graph, params, "reduce_mean", fuse_rms, types)


def _match_rms(mean: Node, graph: Graph, params: dict, consumers: dict, outputs: set):
    """(nodes in order, x, gamma, axis, eps) of an RMSNorm chain around `mean`, or None."""
    only_use = partial(sole_user, consumers, outputs)
    square = _producer(graph, mean.inputs[0])
    if square is None or only_use(square.outputs[0]) is not mean:
        return None
    x = square.inputs[0]
    if not (square.op == "pow" and _scalar(params, square.inputs[1]) == 2.0 or
            square.op == "mul" and square.inputs == (x, x)):
        return None
    xt = graph.types[x]
    axes = tuple(mean.attr("axes"))
    if xt.dtype != "float32" or not mean.attr("keepdims") or not axes or \
            axes != tuple(range(axes[0], len(xt.shape))):
        return None
    add = only_use(mean.outputs[0])
    if add is None or add.op != "add":
        return None
    eps = _scalar(params, next((i for i in add.inputs if i != mean.outputs[0]), ""))
    sqrt = only_use(add.outputs[0])
    if eps is None or sqrt is None or sqrt.op != "sqrt":
        return None
    chain = [square, mean, add, sqrt]
    step = only_use(sqrt.outputs[0])
    if step is not None and step.op == "div" and step.inputs == (x, sqrt.outputs[0]):
        chain.append(step)
    else:  # 1 / sqrt (Div or Reciprocal), then x times it
        if step is None or not (step.op == "reciprocal" or step.op == "div" and
                                _scalar(params, step.inputs[0]) == 1.0):
            return None
        scale = only_use(step.outputs[0])
        if scale is None or scale.op != "mul" or set(scale.inputs) != {x, step.outputs[0]}:
            return None
        chain += [step, scale]
    gamma = None
    times = only_use(chain[-1].outputs[0])
    if times is not None and times.op == "mul":
        w = next((i for i in times.inputs if i != chain[-1].outputs[0]), None)
        if w is not None and _affine(w, params, xt.shape[axes[0]:]):
            gamma = w
            chain.append(times)
    if graph.types[chain[-1].outputs[0]] != xt:
        return None
    return chain, x, gamma, axes[0], eps


def _producer(graph: Graph, name: str) -> Node | None:
    return next((n for n in graph.nodes if name in n.outputs), None)


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
    it (x, read twice by the chain, could not join it). Likewise the tanh form,
    x * 0.5 * (1 + Tanh(sqrt(2 / pi) * (x + 0.044715 x^3))), x^3 as Pow or two Muls,
    into gelu(x, approximate="tanh")."""
    def fuse(node: Node, consumers: dict, outputs: set):
        match = (_match_gelu if node.op == "erf" else _match_gelu_tanh)(
            node, graph, params, consumers, outputs)
        if match is None:
            return None
        chain, x = match
        if graph.types[chain[-1].outputs[0]] != graph.types[x]:
            return None  # a constant of higher rank broadcast the result: keep the chain
        return chain, Node.make("gelu", chain[-1].name, [x], chain[-1].outputs,
                                approximate="none" if node.op == "erf" else "tanh")

    graph, params = fuse_chains(graph, params, "erf", fuse)
    return fuse_chains(graph, params, "tanh", fuse)


def _near(a, b) -> bool:
    return a is not None and abs(a - b) <= 1e-6 * abs(b)


def _const_operand(params: dict, node: Node, name: str):
    """(the other input, its constant scalar value or None) of a binary `node`."""
    rest = [i for i in node.inputs if i != name]
    return (rest[0] if rest else None), _scalar(params, rest[0]) if len(rest) == 1 else None


def _gelu_tail(graph: Graph, params: dict, only_use, inner: Node, x: str, head: list):
    """(nodes in order, x) of 0.5 * x * (1 + inner) after `inner` (erf or tanh of x),
    `head` the nodes computing inner's input; None if it is not that."""
    plus = only_use(inner.outputs[0])
    if plus is None or plus.op != "add" or \
            not _near(_const_operand(params, plus, inner.outputs[0])[1], 1.0):
        return None
    times = only_use(plus.outputs[0])
    if times is None or times.op != "mul":
        return None
    other, _ = _const_operand(params, times, plus.outputs[0])
    if other == x:  # x * (1 + inner) then * 0.5
        half = only_use(times.outputs[0])
        if half is None or half.op != "mul" or \
                not _near(_const_operand(params, half, times.outputs[0])[1], 0.5):
            return None
        return [*head, inner, plus, times, half], x
    half = _producer(graph, other)  # (0.5 x) * (1 + inner)
    if half is None or half.op != "mul" or only_use(other) is not times or \
            x not in half.inputs or not _near(_const_operand(params, half, x)[1], 0.5):
        return None
    return [half, *head, inner, plus, times], x


def _match_gelu(erf: Node, graph: Graph, params: dict, consumers: dict, outputs: set):
    """(nodes in order, x) of the GELU chain around `erf`, or None."""
    only_use = partial(sole_user, consumers, outputs)
    scaled = _producer(graph, erf.inputs[0])
    if scaled is None or only_use(scaled.outputs[0]) is not erf:
        return None
    if scaled.op == "div" and _near(_scalar(params, scaled.inputs[1]), math.sqrt(2)):
        x = scaled.inputs[0]
    elif scaled.op == "mul":
        x, c = (scaled.inputs[0], _scalar(params, scaled.inputs[1])) \
            if scaled.inputs[1] in params else (scaled.inputs[1],
                                                _scalar(params, scaled.inputs[0]))
        if not _near(c, 1 / math.sqrt(2)):
            return None
    else:
        return None
    if graph.types[x].dtype != "float32":
        return None
    return _gelu_tail(graph, params, only_use, erf, x, [scaled])


def _match_gelu_tanh(tanh: Node, graph: Graph, params: dict, consumers: dict, outputs: set):
    """(nodes in order, x) of the tanh GELU chain around `tanh`, or None."""
    only_use = partial(sole_user, consumers, outputs)

    def scaled_by(node: Node | None, value: float):
        """The other operand of `node` if it is a Mul by the constant `value` read only
        by its one user."""
        if node is None or node.op != "mul" or only_use(node.outputs[0]) is None:
            return None
        operand = next((i for i in node.inputs if i not in params), None)
        c = next((_scalar(params, i) for i in node.inputs if i in params), None)
        return operand if _near(c, value) else None

    outer = _producer(graph, tanh.inputs[0])
    total = scaled_by(outer, math.sqrt(2 / math.pi))
    sum_node = _producer(graph, total) if total else None
    if sum_node is None or sum_node.op != "add" or only_use(total) is not outer:
        return None
    for x, cubed in (sum_node.inputs, sum_node.inputs[::-1]):
        cube_scale = _producer(graph, cubed)
        cube = scaled_by(cube_scale, 0.044715)
        head = _cube_of(graph, params, only_use, cube, x) if cube else None
        if head is not None and only_use(cubed) is sum_node and \
                graph.types[x].dtype == "float32":
            return _gelu_tail(graph, params, only_use, tanh, x,
                              [*head, cube_scale, sum_node, outer])
    return None


def _cube_of(graph: Graph, params: dict, only_use, name: str, x: str) -> list | None:
    """The nodes computing `name` = x^3 (Pow(x, 3), x * (x * x) or (x * x) * x)."""
    node = _producer(graph, name)
    if node is None or only_use(name) is None:
        return None
    if node.op == "pow" and node.inputs[0] == x and _scalar(params, node.inputs[1]) == 3.0:
        return [node]
    if node.op != "mul" or x not in node.inputs:
        return None
    square = _producer(graph, next((i for i in node.inputs if i != x), x))
    if square is not None and square.op == "mul" and square.inputs == (x, x) and \
            only_use(square.outputs[0]) is node:
        return [square, node]
    return None


def _scalar(params: dict, name: str):
    value = params.get(name)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None
