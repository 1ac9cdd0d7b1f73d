"""SequenceMap, and Loops over the elements of known sequences, unrolled.

A sequence built from known tensors (a SequenceConstruct: the ONNX backend's sequence
inputs) may hold tensors of different shapes; static kernels cannot run one loop
body over all of them, so the body is inlined once per element. SequenceMap imports
so; a Loop over such a sequence (ONNX's expansion of SequenceMap: trip count
SequenceLength, SequenceAt at the iteration number, results appended) is unrolled
when its elements differ in shape, else it runs as a VM loop (frontend/onnx/control.py).
A Loop whose shapes change with the iteration number (a Slice to i + 1 appended to a
sequence), which a VM loop cannot run, is unrolled likewise over a trip count known
at build time (unroll_counted), one copy per iteration.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from pipeline.errors import ModelError
from pipeline.frontend.onnx.control import _body
from pipeline.frontend.onnx.importer import (
    CONTROL_CONVERTERS,
    ImportContext,
    OnnxNode,
    infer_types,
)
from pipeline.frontend.onnx.registry import onnx_converter
from pipeline.ir.graph import ONNX_DTYPES, Graph, Node
from pipeline.ir.sequence import SequenceType, is_value


def _renamed(node: Node, names: dict[str, str], suffix: str = "") -> Node:
    """`node` (its name + `suffix`) with the tensors of `names` renamed, in the subgraphs
    of a control node too: they read the outer tensors they capture under the outer
    names (pipeline/vm/program.py), and ONNX names are unique across subgraphs."""
    attrs = tuple((k, v.replace(
        inputs=tuple(names.get(x, x) for x in v.inputs),
        params=tuple(names.get(x, x) for x in v.params),
        outputs=tuple(names.get(x, x) for x in v.outputs),
        nodes=tuple(_renamed(m, names) for m in v.nodes),
        types={names.get(x, x): t for x, t in v.types.items()}) if isinstance(v, Graph)
        else v) for k, v in node.attrs)
    return Node(node.op, node.name + suffix, tuple(names.get(i, i) for i in node.inputs),
                tuple(names.get(o, o) for o in node.outputs), attrs)


def _map(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    """SequenceMap of sequences whose elements are known tensors (a SequenceConstruct:
    the ONNX backend's sequence inputs): the body inlined once per element, its
    results gathered by SequenceConstruct (each element may have its own shape, so
    each copy of the body has its own kernels)."""
    seqs = [ctx.sequences.get(i) for i in n.inputs if isinstance(ctx.types[i], SequenceType)]
    if not seqs or None in seqs or len({len(s) for s in seqs}) != 1:
        raise ModelError(f"node {n.name!r} (SequenceMap): its sequences must be built from "
                         "known tensors (SequenceConstruct) and be of one length")
    g, nodes = n.attrs["body"], []
    results: list[list[str]] = [[] for _ in n.outputs]
    for j in range(len(seqs[0])):
        actual = [ctx.sequences[i][j] if isinstance(ctx.types[i], SequenceType) else i
                  for i in n.inputs]
        body = _body(ctx, g, [ctx.type(a) for a in actual], n.opset,
                     f"node {n.name!r} body", source)
        names = dict(zip(body.formal, actual, strict=True))
        for node in body.nodes:
            names.update({o: f"{n.name}.{j}.{o}" for o in node.outputs})
            nodes.append(_renamed(node, names, f".{j}"))
        for k, out in enumerate(body.outputs):
            results[k].append(names.get(out, out))
    for k, out in enumerate(n.outputs):
        ctx.sequences[out] = results[k]  # known elements again
        if results[k]:
            nodes.append(Node.make("sequence_construct", f"{n.name}.{k}", results[k], (out,)))
        else:
            dtype = ONNX_DTYPES[g.output[k].type.tensor_type.elem_type]
            nodes.append(Node.make("sequence_empty", f"{n.name}.{k}", (), (out,), dtype=dtype))
    return nodes


def _unroll_body(g: onnx.GraphProto, j: int, known: dict[str, list[str]]) -> onnx.GraphProto:
    """Loop body `g` for iteration j: the iteration number and condition constants
    (j, true), each SequenceAt of a known sequence at the iteration number an Identity of
    its element j; inputs the carried values only."""
    it, cond = g.input[0].name, g.input[1].name
    body = onnx.GraphProto()
    body.CopyFrom(g)
    del body.input[:2]
    del body.node[:]
    body.node.extend([
        helper.make_node("Constant", [], [it], value=helper.make_tensor(
            "i", onnx.TensorProto.INT64, list(g.input[0].type.tensor_type.shape.dim and [1]),
            [j])),
        helper.make_node("Constant", [], [cond], value=helper.make_tensor(
            "c", onnx.TensorProto.BOOL, [], [True]))])
    for node in g.node:
        if node.op_type == "SequenceAt" and node.input[0] in known and node.input[1] == it:
            node = helper.make_node("Identity", [known[node.input[0]][j]], list(node.output))
        body.node.append(node)
    return body


def _stays_true(g: onnx.GraphProto, n: OnnxNode, ctx: ImportContext) -> bool:
    """Whether Loop `n` (body `g`, no scan outputs) runs while its condition is known
    true at build time: the condition input absent or a constant true, and the body
    passing its condition through (an Identity), so every iteration runs."""
    cond = ctx.const(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else np.array(True)
    cond_out = next((x for x in g.node if x.output[:1] == [g.output[0].name]), None)
    return (cond is not None and bool(cond.reshape(-1)[0]) and cond_out is not None
            and cond_out.op_type == "Identity" and cond_out.input[0] == g.input[1].name
            and len(g.output) == len(n.inputs) - 1)


def unroll_loop(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node] | None:
    """A Loop over the elements of known sequences (ONNX's SequenceMap expansion: trip
    count SequenceLength, SequenceAt at the iteration number, results appended), whose
    elements differ in shape, unrolled: one copy of the body per element, so each has
    static kernels. None if `n` is not such a loop (it then runs as a VM loop)."""
    g = n.attrs["body"]
    known = {x: ctx.sequences[x] for node in g.node if node.op_type == "SequenceAt"
             for x in node.input[:1] if x in ctx.sequences}
    trip = ctx.const(n.inputs[0]) if n.inputs and n.inputs[0] else None
    if (not known or trip is None or not _stays_true(g, n, ctx)
            or len({tuple(ctx.type(e).shape) for s in known.values() for e in s}) < 2):
        return None
    return _unrolled(ctx, n, source, int(trip.reshape(-1)[0]), known)


def shapes_follow_iteration(body: onnx.GraphProto, opset: int) -> bool:
    """Whether Loop body `body` likely has a shape that changes with its iteration
    number: a converter's build-time input follows it (through tensor operators), other
    than a Slice or Range whose two bounds both do (i to i + 1: a static length,
    control.py). The ONNX backend freezes such a Loop's trip count and condition so
    that unroll_counted can unroll it."""
    iteration = {body.input[0].name} if body.input else set()
    for node in body.node:
        if set(node.input) & iteration and (node.op_type not in CONTROL_CONVERTERS
                                            or node.op_type == "Identity"):
            iteration.update(node.output)
        converter = onnx_converter(node.op_type, opset)
        bounds = {"Slice": node.input[1:3], "Range": node.input[0:2]}.get(node.op_type, [])
        if converter is not None and any(
                node.input[pos] in iteration for pos in converter.build_time_inputs
                if pos < len(node.input)) and not (len(bounds) == 2
                                                   and set(bounds) <= iteration):
            return True
    return False


# The most copies of a Loop body unroll_counted makes (each has its own kernels).
MAX_UNROLL = 64


def unroll_counted(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node] | None:
    """A Loop whose trip count is known at build time (at most MAX_UNROLL) and whose
    condition stays true, unrolled: one copy of the body per iteration, the iteration
    number a constant in each, so shapes that change with it (a Slice to i + 1) are
    static per copy. None if `n` is not such a loop."""
    g = n.attrs["body"]
    trip = ctx.const(n.inputs[0]) if n.inputs and n.inputs[0] else None
    if trip is None or not 0 <= int(trip.reshape(-1)[0]) <= MAX_UNROLL or not _stays_true(
            g, n, ctx):
        return None
    return _unrolled(ctx, n, source, int(trip.reshape(-1)[0]), {})


def _unrolled(ctx: ImportContext, n: OnnxNode, source: str, trip: int,
              known: dict[str, list[str]]) -> list[Node]:
    """Loop `n`'s body inlined `trip` times (_unroll_body: iteration j a constant, each
    SequenceAt of a `known` sequence its element j), the carried values threaded from
    one copy to the next and renamed to the Loop's outputs at the end."""
    g = n.attrs["body"]
    carried, nodes = list(n.inputs[2:]), []
    for j in range(trip):
        body = _body(ctx, _unroll_body(g, j, known), [ctx.types[c] for c in carried],
                     n.opset, f"node {n.name!r} body (iteration {j})", source)
        names = dict(zip(body.formal, carried, strict=True))
        for node in body.nodes:
            names.update({o: f"{n.name}.{j}.{o}" for o in node.outputs})
            nodes.append(_renamed(node, names, f".{j}"))
            # typed now: the next iteration's body is converted before _record runs
            ctx.types.update(zip(nodes[-1].outputs, infer_types(
                nodes[-1], [ctx.types[i] for i in nodes[-1].inputs]), strict=True))
        carried = [names.get(o, o) for o in body.outputs[1:]]
    for c, out in zip(carried, n.outputs, strict=True):
        nodes.append(Node.make("value_identity" if is_value(ctx.types.get(c)) else "identity",
                               f"{n.name}.{out}", (c,), (out,)))
    return nodes


_LOOP = CONTROL_CONVERTERS["Loop"]


def _loop(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    """Loop: unrolled over known sequences (unroll_loop), else control.py's VM loop;
    a body whose shapes change with the iteration number (which the VM loop refuses)
    unrolled over a known trip count (unroll_counted), else that refusal."""
    nodes = unroll_loop(ctx, n, source)
    if nodes is not None:
        return nodes
    try:
        return _LOOP(ctx, n, source)
    except ModelError:
        nodes = unroll_counted(ctx, n, source)
        if nodes is None:
            raise
        return nodes


CONTROL_CONVERTERS.update({"SequenceMap": _map, "Loop": _loop})
