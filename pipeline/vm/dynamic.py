"""The instructions of operators whose output shape depends on values (NonZero,
NonMaxSuppression, Unique, TopK with a runtime k, Range / ConstantOfShape / Expand
with runtime shapes: pipeline/ops/dynamic.py) in a graph's VM function, and what
may read their results.

Each such node becomes (e, pipeline/vm/program.py's emitter of the function):
  - held at its bound: the value kernel writes into storage planned at the bound
    (a function of its own), the shape kernel computes the runtime shape, and
    `ViewShape` gives the result register that shape over the same bytes;
  - allocated at run time: the shape kernel first, `AllocShaped` allocates the
    result at that shape, the value kernel (given the shape) fills it.
A result whose rows are its only runtime dimension (NMS, Unique, TopK along axis 0)
may feed row-wise ops (elementwise, Gather, a Reshape keeping the rows): the
segment of ordinary nodes runs over the bound and `ViewRows` keeps its first rows.
Any other reader is refused at compile time with one line; graph outputs take any.
"""

from __future__ import annotations

import dataclasses
import math

from pipeline.errors import UnsupportedOperatorError
from pipeline.ir.graph import Graph, Node, TensorType
from pipeline.ops import OpKind, get
from pipeline.ops.dynamic import data_dependent
from pipeline.vm import bytecode as bc

__all__ = ["emit_data", "row_outputs"]


def _refuse(node: Node, name: str, why: str) -> UnsupportedOperatorError:
    return UnsupportedOperatorError(
        f"node {node.name!r} ({node.op}) reads {name!r}, whose shape depends on values: "
        f"{why} (only graph outputs, elementwise ops, Gather and row-keeping Reshapes take "
        "such a tensor yet)")


def _kernel_graph(node: Node, inputs: list[str], out: str, types: dict) -> Graph:
    """A graph of the one node `node` reading `inputs` (all graph inputs)."""
    return Graph(tuple(inputs), (), (out,), (node,),
                 {k: v for k, v in types.items() if k in (*inputs, out)})


def _call(e, node: Node, inputs: list[str], regs: list[int], out: str, types: dict) -> int:
    """Invoke a planned function of the one node; the register of its result."""
    e.count += 1
    fn = e.p.plan_function(_kernel_graph(node, inputs, out, types), {},
                           f"{e.name}/{node.name}.{e.count}")
    (dst,) = e.call(fn, regs, [out])
    return dst


def emit_data(e, node: Node) -> None:
    """Append the code of data-dependent `node` to e.code; its output gets a register
    holding its runtime shape."""
    info = data_dependent(node)
    inputs = [i for i in node.inputs if i]
    for i in inputs:
        if i in e.dynamic:
            raise _refuse(node, i, "a data-dependent operator needs a static input")
    regs = [e.get(i) for i in inputs]
    (out,) = node.outputs
    t = e.graph.types[out]
    shape_name = f"{out}__shape"
    types = {**{i: e.graph.types[i] for i in inputs}, out: t,
             shape_name: TensorType((len(t.shape),), "int64")}
    shape_node = Node.make(info.shape_op, f"{node.name}__shape",
                           (out,) if info.from_output else tuple(inputs), (shape_name,),
                           **dict(node.attrs))
    if info.at_bound:
        bound = _call(e, node, inputs, regs, out, types)
        shape = _call(e, shape_node, [out] if info.from_output else inputs,
                      [bound] if info.from_output else regs, shape_name, types)
        view = e.new()
        e.code.append(bc.ViewShape(view, bound, shape))
        e.reg[out], e.bound[out] = view, bound
        # the result's only runtime dimension is its first: NMS, Unique's 1-d outputs
        # and its values along axis 0, TopK along axis 0
        rows_only = node.op == "nms" or len(t.shape) == 1 or (
            node.op in ("unique", "topk_values", "topk_indices") and node.attr("axis") == 0)
        e.dynamic[out] = (view, 0) if rows_only else None
        return
    shape = _call(e, shape_node, inputs, regs, shape_name, types)
    value = dataclasses.replace(node, inputs=(*inputs, shape_name))
    _text, _params, symbols = e.p.lower(_kernel_graph(value, [*inputs, shape_name], out,
                                                      types), {})
    dst = e.new()
    e.code += [bc.AllocShaped(dst, shape, bc.DTYPES.index(t.dtype)),
               bc.InvokePacked(e.p.kernel_index(symbols[0]), (*regs, shape, dst))]
    e.reg[out] = dst
    e.dynamic[out] = None  # no bound storage: nothing may run over it


def _follows(node: Node, types: dict, rows: dict) -> str | None:
    """The input whose rows `node`'s output rows follow, if `node` is row-wise in its
    data-dependent inputs (`rows`: those with runtime rows); else raise."""
    dyn = [i for i in node.inputs if i in rows]
    if not dyn:
        return None
    out = types[node.outputs[0]]
    if len({rows[i] for i in dyn}) > 1:
        raise _refuse(node, dyn[1], "two data-dependent inputs may differ in length")
    if get(node.op).kind == OpKind.ELEMENTWISE and node.op != "expand":
        for i in node.inputs:
            s = types[i].shape
            if i in rows and s != out.shape:
                raise _refuse(node, i, "it is broadcast")
            if i not in rows and len(s) == len(out.shape) and s and s[0] != 1:
                raise _refuse(node, dyn[0], f"{i!r} has rows of its own")
        return dyn[0]
    if node.op == "gather":
        data, indices = node.inputs[:2]
        if data in rows and indices not in rows and node.attr("axis") != 0:
            return data
        if indices in rows and data not in rows and node.attr("axis") == 0:
            return indices
        raise _refuse(node, dyn[0], "a Gather along its runtime rows")
    if node.op == "reshape":
        src = types[node.inputs[0]].shape
        if src and out.shape and src[0] == out.shape[0] and \
                math.prod(src[1:]) == math.prod(out.shape[1:]):
            return node.inputs[0]
        raise _refuse(node, dyn[0], "a Reshape that changes its rows")
    raise _refuse(node, dyn[0], f"{node.op} is not row-wise")


def row_outputs(e, nodes: list[Node], outputs: list[str]) -> dict[str, tuple[int, int]]:
    """For the segment `nodes`: each output whose rows follow a data-dependent
    input's, with (register, axis) holding its runtime row count; UnsupportedOperator
    Error for a node that cannot read such an input."""
    rows: dict[str, tuple[int, int]] = {}
    for node in nodes:
        for i in node.inputs:
            if i in e.dynamic and i not in rows:
                if e.dynamic[i] is None:
                    raise _refuse(node, i, "its runtime dimensions are not only its rows")
                rows[i] = e.dynamic[i]
        src = _follows(node, e.graph.types, rows)
        if src is not None:
            rows.update(dict.fromkeys(node.outputs, rows[src]))
    return {o: rows[o] for o in outputs if o in rows}
