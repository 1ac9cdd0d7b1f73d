"""Shape values with symbolic dimensions at import (the VM's, pipeline/ir/dims.py).

Exporters compute a Reshape's target from the input's shape: Shape -> Gather ->
Unsqueeze -> Concat (torch.onnx's `x.view(x.size(0), x.size(1), heads, d)`). When the
shape has symbols, Shape's output is a *symbolic value*: a 1-D object array of ints
and symbol names, which the few operators that shuffle shape vectors evaluate at
build time (gather, reshape, concat, slice, transpose, an integer cast, and mul, div,
add, sub in the expression type of dims.py). Only Reshape takes such a value
(ImportContext.const(..., symbolic=True)) and, as symbolic static types, Range (an
`iota` of a symbolic length), Expand and ConstantOfShape (an `expand` to a symbolic
shape); any other node reading such a value as data reads it from a `dim_values`
node (`materialize`), whose kernel computes it from the runtime dimensions.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.ir.dims import dim_difference, dim_product, dim_quotient, dim_sum, symbols_of
from pipeline.ir.graph import Node
from pipeline.ops import get

__all__ = ["materialize", "symbolic_dims", "symbolic_numpy", "symbolic_range", "symbolic_slice"]

_MOVES = ("gather", "reshape", "concat", "slice", "transpose")


def _arith(op: str):
    """The element function of a binary op on dims; ValueError outside the type."""
    def apply(a, b):
        if op == "mul":
            return dim_product([a, b])
        if op == "div":
            q = dim_quotient(a, b)
            if q is None:
                raise ValueError(f"{a} / {b}")
            return q
        if op == "add":
            return dim_sum([a, b])
        d = dim_difference(a, b)
        if d is None:
            raise ValueError(f"{a} - {b}")
        return d
    return np.frompyfunc(apply, 2, 1)


def _equal(a, b) -> bool:
    """a == b for dims; ValueError when only the run knows (a symbol against a
    natural number: a dimension is never negative, so never -1)."""
    if isinstance(a, str) == isinstance(b, str):
        return a == b
    if int(b if isinstance(a, str) else a) < 0:
        return False
    raise ValueError(f"{a} == {b}")


def symbolic_numpy(node: Node, args: list[np.ndarray]) -> list[np.ndarray] | None:
    """`node`'s outputs for inputs some of which are symbolic values (object arrays),
    or None when it is not a shape computation this module evaluates."""
    if node.op in _MOVES:
        return [np.array(v, dtype=object) for v in get(node.op).numpy(args, node)]
    if node.op == "cast" and node.attr("to") in ("int64", "int32"):
        return [args[0]]
    if node.op == "equal":  # torch's Expand: Where(Equal(shape, -1), ones, shape)
        try:
            return [np.asarray(np.frompyfunc(_equal, 2, 1)(*args), dtype=object)]
        except ValueError:
            return None
    if node.op == "where":
        return [np.array(np.where(args[0].astype(bool), args[1], args[2]), dtype=object)]
    if node.op in ("mul", "div", "add", "sub"):
        try:
            return [np.asarray(_arith(node.op)(*(a.astype(object) for a in args)),
                               dtype=object)]
        except ValueError:
            return None
    return None


def symbolic_dims(value: np.ndarray) -> tuple:
    """A shape value's elements as dimensions: ints and expression strings."""
    return tuple(d if isinstance(d, str) else int(d) for d in np.asarray(value).reshape(-1))


def symbolic_range(n, start, limit, delta, dtype: str) -> Node:
    """The `iota` of ONNX Range node `n` whose start or limit is a symbolic scalar
    (`torch.arange(seq)`, `arange(past, past + seq)`): its length is limit - start,
    so delta must be 1; ModelError naming the node otherwise."""
    (start,), (limit,), (delta,) = (symbolic_dims(v) for v in (start, limit, delta))
    length = dim_difference(limit, start) if delta == 1 else None
    if length is None:
        raise ModelError(f"node {n.name!r} (Range): a range from {start} to {limit} by "
                         f"{delta} over symbolic dimensions is not supported (only a "
                         "step of 1 to a limit at least the start)")
    return Node.make("iota", n.name, (), n.outputs[:1], dims=(start, length), delta=1,
                     dtype=dtype)


def symbolic_slice(ctx, n) -> list[Node] | None:
    """ONNX Slice node `n` (opset >= 10) whose starts or ends are symbolic values
    (GPT-2's `bias[:, :, past:past + s, :past + s]`): per sliced axis a Gather of the
    `iota` of its indices, which the gather kernel checks against the dimension; None
    if no such value is involved. Steps must be 1 and the bounds in the dimension
    (clamping a symbolic bound is not expressible); else ModelError naming the node."""
    values = [ctx.const(i, True) if i else None for i in (*n.inputs[1:5], "", "", "")][:4]
    if any(v is None for v in values[:2]) or not any(
            v is not None and v.dtype == object for v in values):
        return None
    shape = ctx.type(n.inputs[0]).shape
    starts, ends = symbolic_dims(values[0]), symbolic_dims(values[1])
    axes = symbolic_dims(values[2]) if values[2] is not None else range(len(starts))
    steps = symbolic_dims(values[3]) if values[3] is not None else (1,) * len(starts)
    nodes, x = [], n.inputs[0]
    for k, (start, end, axis, step) in enumerate(zip(starts, ends, axes, steps, strict=True)):
        dim = shape[axis % len(shape)]
        end = dim if isinstance(end, int) and not isinstance(dim, str) and end > dim else end
        end = dim if isinstance(end, int) and end >= 2 ** 62 else end  # torch's "to the end"
        if start == 0 and end == dim:
            continue
        length = dim_difference(end, start)
        if step != 1 or length is None or any(isinstance(v, int) and v < 0 for v in (start, end)):
            raise ModelError(f"node {n.name!r} (Slice): slicing {start}:{end}:{step} of "
                             f"dimension {dim} over symbolic values is not supported (only "
                             "a step of 1 and bounds inside the dimension)")
        indices = f"{n.outputs[0]}/indices{k}"
        nodes.append(Node.make("iota", indices, (), (indices,), dims=(start, length),
                               delta=1, dtype="int64"))
        out = f"{n.outputs[0]}/axis{k}"
        nodes.append(Node.make("gather", out, (x, indices), (out,), axis=axis % len(shape)))
        x = out
    if not nodes:
        return [Node.make("identity", n.name, n.inputs[:1], n.outputs[:1])]
    last = nodes[-1]
    nodes[-1] = Node(last.op, n.name, last.inputs, n.outputs[:1], last.attrs)
    return nodes


def materialize(ctx, nodes: list[Node], inputs: tuple[str, ...]) -> list[Node]:
    """`nodes` with every input that is a symbolic shape value (`Add(arange(seq),
    past)`) read from a `dim_values` node computing it at run time, and every input
    folded to a constant read from a parameter (its producer may read a symbolic value
    and die); then each iota and dim_values node gets as inputs graph inputs carrying
    the symbols its output's shape lacks (the kernel's dims come from its types)."""
    made: dict[str, str] = {}
    result = []
    for node in nodes:
        if node.op not in ("iota", "dim_values") and all(
                ctx.const(o, True) is not None for o in node.outputs):
            result.append(node)  # folded at build time: dies or stays a constant
            continue
        renamed = []
        for name in node.inputs:
            value = None if name in inputs or name in ctx.params else ctx.const(name, True)
            if value is not None and name not in made:
                if value.dtype == object:
                    made[name] = f"{name}/dims"
                    ctx.types[made[name]] = ctx.type(name)
                    values = Node.make("dim_values", made[name], (), (made[name],),
                                       dims=symbolic_dims(value), shape=value.shape,
                                       dtype=ctx.type(name).dtype)
                    result.append(Node(values.op, values.name,
                                       tuple(_carriers(ctx, values, inputs)),
                                       values.outputs, values.attrs))
                else:
                    made[name] = ctx.add_param(name, value.astype(ctx.type(name).dtype))
            renamed.append(made.get(name, name))
        if "dims" in dict(node.attrs):  # iota, dim_values, a trilu's symbolic k
            renamed += _carriers(ctx, node, inputs)
        result.append(node if tuple(renamed) == node.inputs else Node(
            node.op, node.name, tuple(renamed), node.outputs, node.attrs))
    return result


def _carriers(ctx, node: Node, inputs: tuple[str, ...]) -> list[str]:
    """Graph inputs whose shapes hold the symbols of node's `dims` its output lacks."""
    needed = set(symbols_of(node.attr("dims"))) - set(
        symbols_of(ctx.type(node.outputs[0]).shape))
    carriers = []
    for name in inputs:
        found = needed & set(symbols_of(ctx.type(name).shape))
        if found:
            carriers.append(name)
            needed -= found
    return carriers
