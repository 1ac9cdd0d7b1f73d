"""If, Loop and Scan: graph-IR nodes holding their subgraphs (the VM runs them,
docs/vm.md; only from_onnx(control_flow=True) imports them).

A subgraph becomes a Graph whose inputs are its formal inputs, then every outer
tensor it reads (captures; outer params and the subgraph's own constants among
them), and the node's inputs are its ONNX inputs, then those captures. Shapes stay
static: a Loop's scan outputs need a constant trip count (an early exit is a run-time
error: bytecode.Fail). A body sees the outer values known at build time (a shape
from Shape -> Concat) as the outer graph does; an If whose condition is one is
replaced by the branch it takes. Inside a Loop body the iteration number is a
symbolic value (frontend/onnx/symbolic.py), so a Slice from `i` to `i + 1` or a
Range from `i` to `i + 3` has a static length: its indices are computed from the
iteration tensor by ordinary nodes (`_iteration_indices`), and the gather kernel
checks them against the dimension.

    if:   inputs (cond, *captures); then_branch, else_branch: Graph (same inputs)
    loop: inputs ([M], [cond], *v_initial, *captures); body: Graph of inputs
          (iteration, cond, *v, *captures), outputs (cond, *v, *scan_outputs);
          has_trip_count, has_cond, n_carried, trip_count (-1: runtime M)
    scan: inputs (*state, *scan_inputs, *captures); body: Graph of inputs
          (*state, *scan_elements, *captures); n_state, n_scan_inputs
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline.errors import GraphError, ModelError, UnsupportedOperatorError
from pipeline.frontend.onnx.importer import (
    CONTROL_CONVERTERS,
    ImportContext,
    OnnxNode,
    _decode,
    _import_constant,
    _live,
    infer_types,
    vm_converter,
)
from pipeline.frontend.onnx.registry import onnx_converter
from pipeline.ir.dims import dim_terms, is_symbolic, symbols_of
from pipeline.ir.graph import ONNX_DTYPES, Graph, Node, TensorType, add_param, fresh_name
from pipeline.ops.dynamic import data_dependent
from pipeline.ops.sequence import join


@dataclass
class _Body:
    nodes: list[Node]
    formal: list[str]
    outputs: tuple[str, ...]
    captures: list[str]
    types: dict[str, TensorType]

    def graph(self, captures: list[str], outer: dict[str, TensorType]) -> Graph:
        """The subgraph taking `captures` after its formal inputs (an If's branches
        take the captures of both: `outer` types those the other one reads)."""
        inputs = (*self.formal, *captures)
        defined = {*inputs, *(o for n in self.nodes for o in n.outputs)}
        types = {**{c: outer[c] for c in captures}, **self.types}
        return Graph(inputs, (), self.outputs, tuple(self.nodes),
                     {k: t for k, t in types.items() if k in defined})


def _convert(ctx: ImportContext, onode: OnnxNode, source: str) -> list[Node]:
    by_vm = vm_converter(ctx, onode)
    if by_vm:
        return by_vm(ctx, onode, source)
    converter = onnx_converter(onode.op_type, onode.opset)
    if converter is None:
        raise UnsupportedOperatorError(f"unsupported operator {onode.op_type} (opset "
                                       f"{onode.opset}) at node {onode.name!r} in a subgraph")
    return converter.fn(ctx, onode)


def _sub_context(ctx: ImportContext, types: dict[str, TensorType]) -> ImportContext:
    """A context for a subgraph: ctx's params, and its values computable at build time
    (copies: the subgraph's own never reach the outer graph)."""
    sub = ImportContext(dict(ctx.params), types, ctx.opset)
    sub.pending, sub.values = dict(ctx.pending), dict(ctx.values)
    sub.symbolic = dict(ctx.symbolic)
    return sub


def _body(ctx: ImportContext, g: onnx.GraphProto, formal: list[TensorType], opset: int,
          where: str, source: str, iteration: bool = False) -> _Body:
    """Convert subgraph `g` whose inputs have the types `formal`, seeing the outer
    tensors of ctx; its constants join ctx's params (as captures). iteration: its
    first input is a Loop's iteration number (a symbolic value while converting)."""
    if len(g.input) != len(formal):
        raise ModelError(f"{where}: the subgraph takes {len(g.input)} inputs, "
                         f"{len(formal)} are given")
    names = [vi.name for vi in g.input]
    types = {**ctx.types, **dict(zip(names, formal, strict=True))}
    sub = _sub_context(ctx, types)
    symbol = None
    if iteration:
        symbol = "iteration_" + re.sub(r"\W", "_", names[0])
        sub.symbolic[names[0]] = np.full(formal[0].shape, symbol, dtype=object)
    for init in g.initializer:
        if init.name in ctx.params or init.name in ctx.types:
            raise ModelError(f"{where}: subgraph initializer {init.name!r} shadows an outer "
                             "tensor")
        sub.set_const(init.name, numpy_helper.to_array(init))
    nodes: list[Node] = []
    used: set[str] = set()
    for k, proto in enumerate(g.node):
        onode = _decode(proto, k, opset, used)
        if onode.op_type == "Constant":
            _import_constant(onode, sub, source)
            continue
        for node in _convert(sub, onode, source):
            out = _infer(node, types, nodes, symbol is not None, where)
            types.update(zip(node.outputs, out, strict=True))
            sub.track(node)
            nodes.append(node)
    if symbol is not None:
        nodes = _iteration_indices(sub, nodes, names[0], symbol, where)
    outputs = tuple(o.name for o in g.output)
    nodes = _live(nodes, outputs)
    inner = {*names, *(o for n in nodes for o in n.outputs)}
    reads = [i for n in nodes for i in n.inputs if i] + list(outputs)
    captures = list(dict.fromkeys(i for i in reads if i not in inner))
    missing = [c for c in captures if c not in types]
    if missing:
        raise ModelError(f"{where}: the subgraph reads {missing[0]!r}, which is defined "
                         "nowhere")
    return _rename_constants(ctx, sub, _Body(nodes, names, outputs, captures, types))


def _infer(node: Node, types: dict[str, TensorType], before: list[Node], iteration: bool,
           where: str) -> list[TensorType]:
    """The output types of body node `node`; ModelError naming it if its shape changes
    with the iteration number (`iteration`: a Loop body, whose iteration input is
    symbolic), or naming the data-dependent node of `before` (a Reshape to a shape the
    body computes) when a shape rule fails after one: a body's shapes are static."""
    try:
        out = infer_types(node, [types[i] for i in node.inputs])
    except GraphError as err:
        dynamic = [n for n in before if data_dependent(n) is not None]
        if not dynamic:
            raise
        raise ModelError(f"{where}: node {dynamic[0].name!r} ({dynamic[0].op}) has a shape "
                         "computed at run time, which a body's static shapes cannot take "
                         f"({err})") from None
    if iteration and (any(t.shape is not None and is_symbolic(t.shape) for t in out) or any(
            isinstance(v, tuple) and is_symbolic(v) for key, v in node.attrs
            if not (node.op == "iota" and key == "dims"))):
        raise ModelError(f"{where}: node {node.name!r} ({node.op}): a shape that "
                         "changes with the Loop's iteration number is not supported")
    return out


def _iteration_indices(ctx: ImportContext, nodes: list[Node], iteration: str, symbol: str,
                       where: str) -> list[Node]:
    """`nodes` of a Loop body whose iteration number was the symbolic value `symbol`:
    each `iota` starting at `a * symbol + b` with a static length L (a Slice's indices,
    a Range) becomes `iteration * a + (b + arange(L))`, read from the iteration tensor;
    ModelError naming the node for an iota of another start (a length or a shape
    that changes with the iteration: _body refuses it as it converts)."""
    result = []
    for node in nodes:
        attrs = dict(node.attrs)
        if node.op == "iota" and symbol in symbols_of(attrs["dims"]):
            start, length = attrs["dims"]
            terms = dict(dim_terms(start))
            scale = terms.pop((symbol,), 0)
            if terms.keys() - {()} or not isinstance(length, int):
                raise ModelError(f"{where}: node {node.name!r}: a range from {start} of "
                                 f"length {length} over the iteration number is not "
                                 "supported (only a static length from a*i+b)")
            steps = ctx.add_param(f"{node.name}/steps", (terms.get((), 0) + np.arange(
                length) * int(attrs["delta"])).astype(np.int64))
            made, base = [], iteration
            if scale != 1:
                factor = ctx.add_param(f"{node.name}/scale", np.array(scale, np.int64))
                made.append(Node.make("mul", f"{node.name}/scaled", (base, factor),
                                      (f"{node.name}/scaled",)))
                base = f"{node.name}/scaled"
            out = node.outputs[0]
            cast = attrs["dtype"] != "int64"
            made.append(Node.make("add", node.name, (base, steps),
                                  (f"{out}/int64",) if cast else (out,)))
            if cast:
                made.append(Node.make("cast", f"{node.name}/cast", (f"{out}/int64",),
                                      (out,), to=attrs["dtype"]))
            for m in made:
                ctx.types.update(zip(m.outputs, infer_types(
                    m, [ctx.types[i] for i in m.inputs]), strict=True))
            result += made
            continue
        result.append(node)
    return result


def _rename_constants(ctx: ImportContext, sub: ImportContext, body: _Body) -> _Body:
    """The subgraph's own constants it reads become params of the outer graph, under
    names no outer tensor has (two branches may each have a constant "k")."""
    renamed = {}
    for name in body.captures:
        value = sub.params.get(name)
        if value is not None and ctx.params.get(name) is not value:
            renamed[name] = add_param(ctx.types, ctx.params, name, value)
    if not renamed:
        return body

    def new(name: str) -> str:
        return renamed.get(name, name)

    nodes = [Node(n.op, n.name, tuple(new(i) for i in n.inputs), n.outputs, n.attrs)
             for n in body.nodes]
    types = {**body.types, **{renamed[k]: body.types[k] for k in renamed}}
    return _Body(nodes, body.formal, tuple(new(o) for o in body.outputs),
                 [new(c) for c in body.captures], types)


def _scalar(ctx: ImportContext, name: str, where: str, dtype: str) -> None:
    t = ctx.type(name)
    if t.dtype != dtype or t.size != 1:
        raise ModelError(f"{where}: input {name!r} must be one {dtype}, is {t.dtype} "
                         f"{list(t.shape)}")


def _declared(vi, default: TensorType) -> TensorType:
    """A subgraph input's declared type if complete (a Loop's iteration number may be
    declared [1] or []), else `default`."""
    dims = vi.type.tensor_type.shape.dim
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape") \
            or not all(d.HasField("dim_value") for d in dims):
        return default
    return TensorType(tuple(d.dim_value for d in dims),
                      ONNX_DTYPES.get(vi.type.tensor_type.elem_type, default.dtype))


def _if(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    where = f"node {n.name!r} (If)"
    _scalar(ctx, n.inputs[0], where, "bool")
    cond = ctx.const(n.inputs[0])
    if cond is not None:  # known at build time: the branch it takes, inline
        key = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        body = _body(ctx, n.attrs[key], [], n.opset, f"node {n.name!r} {key}", source)
        inlined = [Node(b.op, f"{n.name}/{b.name}", b.inputs, b.outputs, b.attrs)
                   for b in body.nodes]
        return inlined + [Node.make("identity", f"{n.name}/{out}", (src,), (out,))
                          for src, out in zip(body.outputs, n.outputs, strict=True) if out]
    branches = [_body(ctx, n.attrs[k], [], n.opset, f"node {n.name!r} {k}", source)
                for k in ("then_branch", "else_branch")]
    captures = list(dict.fromkeys(c for b in branches for c in b.captures))
    then, orelse = (b.graph(captures, ctx.types) for b in branches)
    want = [then.types[o] for o in then.outputs]
    if None in map(join, [orelse.types[o] for o in orelse.outputs], want):  # sequences:
        # their elements may differ in shape (ops/sequence.py join)
        raise ModelError(f"{where}: the branches return different shapes or dtypes "
                         "(needs dynamic shapes)")
    return [Node.make("if", n.name, (n.inputs[0], *captures), n.outputs,
                      then_branch=then, else_branch=orelse)]


def _loop(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    where = f"node {n.name!r} (Loop)"
    m, cond, init = n.inputs[0], n.inputs[1] if len(n.inputs) > 1 else "", n.inputs[2:]
    if m:
        _scalar(ctx, m, where, "int64")
    if cond:
        _scalar(ctx, cond, where, "bool")
    g = n.attrs["body"]
    if len(g.input) < 2:
        raise ModelError(f"{where}: the body takes {len(g.input)} inputs, at least 2 needed")
    formal = [_declared(g.input[0], TensorType((), "int64")),
              _declared(g.input[1], TensorType((), "bool")), *(ctx.type(v) for v in init)]
    body = _body(ctx, n.attrs["body"], formal, n.opset, f"node {n.name!r} body", source,
                 iteration=True)
    n_scan = len(body.outputs) - 1 - len(init)
    value = ctx.const(m) if m else None
    trip = int(value.reshape(-1)[0]) if value is not None else -1
    if n_scan and trip < 0:
        raise ModelError(f"{where}: scan outputs need a constant trip count (their length "
                         "would be known only at run time)")
    return [Node.make("loop", n.name, (*([m] if m else []), *([cond] if cond else []), *init,
                                       *body.captures),
                      n.outputs, body=body.graph(body.captures, ctx.types),
                      has_trip_count=int(bool(m)), has_cond=int(bool(cond)),
                      n_carried=len(init), trip_count=trip)]


def _scan(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    where = f"node {n.name!r} (Scan)"
    if n.opset < 9:
        return _scan8(ctx, n, source)
    k = int(n.attrs["num_scan_inputs"])
    state, scans = n.inputs[:len(n.inputs) - k], n.inputs[len(n.inputs) - k:]
    for key in ("scan_input_axes", "scan_output_axes", "scan_input_directions",
                "scan_output_directions"):
        if any(n.attrs.get(key, [])):
            raise ModelError(f"{where}: {key} other than 0 is not supported")
    lengths = {ctx.type(s).shape[0] for s in scans}
    if len(lengths) != 1:
        raise ModelError(f"{where}: the scan inputs differ in length {sorted(lengths)}")
    formal = [*(ctx.type(s) for s in state),
              *(TensorType(ctx.type(s).shape[1:], ctx.type(s).dtype) for s in scans)]
    body = _body(ctx, n.attrs["body"], formal, n.opset, f"node {n.name!r} body", source)
    return [Node.make("scan", n.name, (*state, *scans, *body.captures), n.outputs,
                      body=body.graph(body.captures, ctx.types), n_state=len(state),
                      n_scan_inputs=k)]


def _scan8(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    """Scan of opset 8: a batch axis first on every state and scan input, and an optional
    sequence_lens. A batch of 1 without sequence_lens is the opset-9 Scan of the
    inputs reshaped without it, its outputs reshaped back."""
    batches = {ctx.type(x).shape[0] for x in n.inputs[1:] if ctx.type(x).shape}
    if (n.inputs and n.inputs[0]) or batches != {1} or any(n.attrs.get("directions", [])):
        raise ModelError(f"node {n.name!r} (Scan, opset 8): only a batch of 1 without "
                         f"sequence_lens or directions is supported (batch {sorted(batches)})")
    nodes, inner = [], []
    for x in n.inputs[1:]:
        t = ctx.type(x)
        name = fresh_name(f"{x}.item", ctx.types, ctx.params)
        ctx.types[name] = TensorType(t.shape[1:], t.dtype)
        nodes.append(Node.make("reshape", f"{n.name}.{x}", (x,), (name,), shape=t.shape[1:]))
        inner.append(name)
    outs = [fresh_name(f"{o}.item", ctx.types, ctx.params) for o in n.outputs]
    scan = _scan(ctx, OnnxNode("Scan", n.name, tuple(inner), tuple(outs), n.attrs, 9), source)
    types = infer_types(scan[0], [ctx.type(i) for i in scan[0].inputs])
    back = [Node.make("reshape", f"{n.name}.{o}", (i,), (o,), shape=(1, *t.shape))
            for i, o, t in zip(outs, n.outputs, types, strict=True)]
    return [*nodes, *scan, *back]


CONTROL_CONVERTERS.update({"If": _if, "Loop": _loop, "Scan": _scan})


def inline_subgraph(ctx: ImportContext, g: onnx.GraphProto, inputs: list[str],
                    types: list[TensorType], where: str,
                    prefix: str) -> tuple[list[Node], list[str]]:
    """Subgraph `g` (a graph attribute of an operator, FlexAttention's score_mod)
    converted into nodes of the outer graph: its formal inputs read the outer tensors
    `inputs` (of `types`: the converter may be making them), the tensors it defines
    are renamed `prefix` + name. Returns the nodes and the outer names of its outputs."""
    body = _body(ctx, g, types, ctx.opset, where, where)
    renamed = dict(zip(body.formal, inputs, strict=True))
    renamed |= {o: prefix + o for n in body.nodes for o in n.outputs}

    def new(name: str) -> str:
        return renamed.get(name, name)

    nodes = [Node(n.op, prefix + n.name, tuple(new(i) for i in n.inputs),
                  tuple(new(o) for o in n.outputs), n.attrs) for n in body.nodes]
    return nodes, [new(o) for o in body.outputs]
