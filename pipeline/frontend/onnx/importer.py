"""ONNX -> graph IR (TVM: relay.frontend.from_onnx).

The import checks the whole model before converting anything: an unreadable
file, or any operator without a converter at the model's opset, stops it with
one error that names every offender. Initializers become parameters (also in
old-style models that list them among the graph inputs); ONNX shape inference
runs after input-shape overrides, and its shapes are checked against ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline.errors import (
    GraphError,
    ModelError,
    PipelineError,
    UnsupportedOperatorError,
    check_elements,
)
from pipeline.frontend.onnx.registry import CONTROL_CONVERTERS, onnx_converter, vm_converter
from pipeline.frontend.onnx.shapes import input_type, onnx_shape_inference
from pipeline.frontend.onnx.symbolic import materialize, symbolic_numpy
from pipeline.frontend.onnx.widen import widen
from pipeline.ir.dims import is_symbolic
from pipeline.ir.graph import DTYPES, ONNX_DTYPES, Graph, Node, TensorType, add_param
from pipeline.ops import get
from pipeline.ops import infer_types as infer_op_types
from pipeline.ops.dynamic import data_dependent
from pipeline.ops.sequence import SEQUENCE_OPS, join_branches, sequence_types
from pipeline.vm.program import CONTROL_OPS


@dataclass
class OnnxNode:
    """What a converter sees of one ONNX node: attributes already decoded."""

    op_type: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: dict
    opset: int

    def text(self, key: str, default: str, allowed: tuple[str, ...] | None = None) -> str:
        """String attribute `key` (ONNX stores bytes) or `default`; ModelError naming
        the node when `allowed` is given and the value is not in it."""
        value = self.attrs.get(key, default)
        value = value.decode() if isinstance(value, bytes) else value
        if allowed is not None and value not in allowed:
            raise ModelError(f"node {self.name!r} ({self.op_type}): {key} {value!r} is not "
                             f"supported ({', '.join(allowed)} are)")
        return value


# CONTROL_OPS, the graph ops holding subgraphs (frontend/onnx/control.py), are not in
# pipeline.ops.OPS (whose modules' sources are part of every kernel's version hash): no
# kernel lowers them; the VM runs them (pipeline/vm/program.py).


def _control_types(node: Node, inputs: list[TensorType]) -> list[TensorType]:
    """Output types of a control-flow node, from its subgraph's outputs: an If's are
    its branch's; a Loop's its loop-carried values, then its scan outputs stacked
    trip_count times; a Scan's its state, then its scan outputs stacked over the
    first scan input's leading dimension."""
    body = node.attr("then_branch") or node.attr("body")
    outs = [body.types[o] for o in body.outputs]
    if node.op == "if":  # sequences: their elements' shapes may differ by branch
        return join_branches(body, node.attr("else_branch"))
    if node.op == "loop":
        n, m = node.attr("n_carried"), node.attr("trip_count")
        return outs[1:1 + n] + [TensorType((m, *t.shape), t.dtype) for t in outs[1 + n:]]
    n = node.attr("n_state")
    length = inputs[n].shape[0]
    return outs[:n] + [TensorType((length, *t.shape), t.dtype) for t in outs[n:]]


def infer_types(node: Node, inputs: list[TensorType]) -> list[TensorType]:
    """pipeline.ops.infer_types, and the control-flow nodes' types (_control_types)."""
    if node.op in CONTROL_OPS:  # sequence ops among them: ops/sequence.py
        return (sequence_types if node.op in SEQUENCE_OPS else _control_types)(node, inputs)
    return infer_op_types(node, inputs)


def verify_graph(graph: Graph) -> None:
    """graph.verify with every shape rule, the control-flow nodes' included: it checks
    their subgraphs the same way (GraphError naming the node and subgraph)."""
    graph.verify(infer_types)


class ImportContext:
    """Types and constant values known so far, for converters to consult."""

    def __init__(self, params: dict[str, np.ndarray], types: dict[str, TensorType],
                 opset: int = 0):
        self.params = params
        self.types = types
        self.opset = opset  # the model's default-domain opset (a subgraph's nodes')
        # Outputs of converted nodes computable from constants, evaluated only if a
        # converter asks (a Reshape's shape from Shape -> Gather -> Concat, say).
        self.pending: dict[str, Node] = {}
        self.values: dict[str, np.ndarray] = {}
        self.symbolic: dict[str, np.ndarray] = {}  # shape values with symbols (symbolic.py)
        # Tensors typed with a bound: data-dependent results and what reads them
        # (a widening's narrowing cast, a row-wise op), not ONNX's shape (ops/dynamic.py)
        self.bounded: set[str] = set()
        self.sequences: dict[str, list[str]] = {}  # known elements: sequence.py

    def type(self, name: str) -> TensorType:
        return self.types[name]

    def const(self, name: str, symbolic: bool = False) -> np.ndarray | None:
        """The value of `name` if it is known at build time, else None; with
        `symbolic` also a shape value with symbolic dimensions (an object array)."""
        if name in self.params:
            return self.params[name]
        node = self.pending.pop(name, None)
        if node is not None:
            args = [self.const(i, True) for i in node.inputs]
            if any(a is None for a in args):
                return None
            dynamic = any(a.dtype == object for a in args)
            results = (symbolic_numpy(node, args) if dynamic else get(node.op).numpy(args, node))
            for out, value in zip(node.outputs if results else (), results or (), strict=True):
                self.pending.pop(out, None)
                value = np.asarray(value)
                if value.dtype == object and any(isinstance(v, str) for v in value.flat):
                    self.symbolic[out] = value
                else:
                    self.values[out] = value.astype(self.types[out].dtype)
        if name in self.symbolic:
            return self.symbolic[name] if symbolic else None
        return self.values.get(name)

    def track(self, node: Node) -> None:
        """Note `node`'s outputs as computable at build time if its op has a numpy
        implementation and its inputs are all constants or computable."""
        def known(name):
            return (name in self.params or name in self.pending or name in self.values
                    or name in self.symbolic)

        if node.op in CONTROL_OPS or any(  # run by the VM, never at build time
                isinstance(v, tuple) and is_symbolic(v) for _, v in node.attrs):
            return
        if get(node.op).numpy is not None and all(known(i) for i in node.inputs):
            self.pending.update(dict.fromkeys(node.outputs, node))

    def set_symbolic(self, name: str, shape: tuple) -> None:
        """Define tensor `name` as the shape value `shape` holding symbols."""
        self.symbolic[name] = np.array(shape, dtype=object)
        self.types[name] = TensorType((len(shape),), "int64")

    def set_const(self, name: str, value: np.ndarray) -> None:
        """Define tensor `name` as a build-time constant (Shape's output, say)."""
        self.params[name] = value
        self.types[name] = TensorType(value.shape, _dtype_name(value.dtype, name))

    def add_param(self, hint: str, value: np.ndarray) -> str:
        """Add a parameter the converter computed (e.g. a transposed weight)."""
        _dtype_name(value.dtype, hint)
        return add_param(self.types, self.params, hint, value)


def load_model(path: str | Path) -> onnx.ModelProto:
    """Read an ONNX file; ModelError naming the file if it is missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: model file not found")
    try:
        model = onnx.load(str(path))
    except Exception as err:  # protobuf raises DecodeError and friends
        raise ModelError(f"{path}: not a valid ONNX file ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else 'truncated?'})") from None
    if not model.graph.node:
        raise ModelError(f"{path}: the ONNX graph has no nodes (truncated or empty file?)")
    return model


def from_onnx(model: onnx.ModelProto | str | Path,
              shape: dict[str, tuple[int, ...]] | None = None,
              source: str | None = None,
              freeze: dict[str, np.ndarray] | None = None,
              control_flow: bool = False,
              symbolic: bool = False) -> tuple[Graph, dict[str, np.ndarray]]:
    """Import an ONNX model (or file path) into (graph, params).

    `shape` overrides or fixes input shapes by input name. `source` names the
    model in error messages (defaults to the file path). `freeze` turns graph
    inputs into constants with the given values (a static-shape compiler
    specialising on e.g. a Reshape's shape input); they leave the graph inputs.
    control_flow: import If, Loop and Scan as nodes holding their subgraphs
    (frontend/onnx/control.py), which only the VM runs (docs/vm.md); without it
    they are refused as unsupported operators.
    symbolic: keep an input's symbolic dimension (a dim_param, or a name in a `shape`
    override) as a named dimension (pipeline/ir/dims.py), which only the VM runs;
    without it such an input is refused unless `shape` fixes it.
    """
    if not isinstance(model, onnx.ModelProto):
        source = source or str(model)
        model = load_model(model)
    try:
        return _import(model, shape, source, freeze, control_flow, symbolic)
    except UnicodeDecodeError:
        # protobuf decodes string fields when they are read, not when parsed
        raise ModelError(f"{source or '<model>'}: a name or string in the model is not "
                         "valid UTF-8") from None


def _import(model: onnx.ModelProto, shape: dict[str, tuple[int, ...]] | None,
            source: str | None, freeze: dict[str, np.ndarray] | None,
            control_flow: bool = False,
            symbolic: bool = False) -> tuple[Graph, dict[str, np.ndarray]]:
    """from_onnx on a parsed model."""
    source = source or model.graph.name or "<model>"
    if freeze:
        model = _freeze_inputs(model, freeze, source)
    opset = default_opset(model)
    _check_supported(model, opset, source, control_flow)
    _check_element_types(model.graph, source)

    g = model.graph
    params = _initializers(g, source)
    types = {name: TensorType(v.shape, _dtype_name(v.dtype, name)) for name, v in params.items()}
    inputs = [vi for vi in g.input if vi.name not in params]
    shape = dict(shape or {})
    unknown = set(shape) - {vi.name for vi in inputs}
    if unknown:
        raise ModelError(f"{source}: shape given for unknown input(s) {sorted(unknown)}; "
                         f"inputs are {[vi.name for vi in inputs]}")
    for vi in inputs:
        types[vi.name] = input_type(vi, shape.get(vi.name), source, symbolic)
        check_elements(types[vi.name].shape, f"{source}: input {vi.name!r}")
    _check_defined(g, source)

    onnx_shapes = onnx_shape_inference(model, types, inputs, source)
    # Before any converter runs: one folding a constant (ConstantOfShape, Expand
    # of constants) would allocate the tensor first and check it after.
    producer = {out: node.name or f"#{k}" for k, node in enumerate(g.node) for out in node.output}
    for name, dims in onnx_shapes.items():
        check_elements(dims, f"{source}: node {producer.get(name, '?')!r} output {name!r}")
    ctx = ImportContext(params, types, opset)
    nodes = _convert_nodes(model, opset, ctx, onnx_shapes, source)

    outputs = tuple(o.name for o in g.output)
    if symbolic:  # shape values read as data: frontend/onnx/symbolic.py
        nodes = materialize(ctx, nodes, tuple(vi.name for vi in inputs))
    nodes = _constant_outputs(ctx, outputs) + _live(nodes, outputs)
    used = {i for n in nodes for i in n.inputs} | set(outputs)
    kept = {name: v for name, v in params.items() if name in used}
    input_names = tuple(vi.name for vi in inputs)
    defined = {*input_names, *kept, *(o for n in nodes for o in n.outputs)}
    graph = Graph(inputs=input_names, params=tuple(sorted(kept)), outputs=outputs,
                  nodes=tuple(nodes),
                  types={name: t for name, t in types.items() if name in defined})
    verify_graph(graph)
    return graph, kept


def _convert_nodes(model: onnx.ModelProto, opset: int, ctx: ImportContext,
                   onnx_shapes: dict[str, tuple[int, ...]], source: str) -> list[Node]:
    """Every node of the model through its converter, in order: the graph nodes they
    produce, each output's type recorded in ctx.types and checked against ONNX's."""
    g = model.graph
    nodes: list[Node] = []
    used_names: set[str] = set()
    for k, proto in enumerate(g.node):
        try:
            onode = _decode(proto, k, opset, used_names)
            if proto.domain not in ("", "ai.onnx"):
                onode.op_type = f"{proto.domain}.{proto.op_type}"
                onode.opset = domain_opset(model, proto.domain)
            if onode.op_type == "Constant":
                _import_constant(onode, ctx, source)
                continue
            by_vm = vm_converter(ctx, onode)
            converter = None if by_vm else onnx_converter(onode.op_type, opset)
            onode, before, after = (converter and widen(ctx, onode)) or (onode, [], [])
            for node in before:
                nodes.append(_record(node, ctx, onnx_shapes, onode.op_type))
            made = by_vm(ctx, onode, source) if by_vm else converter.fn(ctx, onode)
            allowed = converter.emits_for(onode.attrs, opset) if converter else set()
            for node in made:
                if converter and node.op not in allowed:  # the backend's float64 rule
                    raise GraphError(f"{source}: node {onode.name!r}: the {onode.op_type} "
                                     f"converter (opset {converter.since}) produced "
                                     f"{node.op!r}, which its onnx_op(emits=...) does not list")
                nodes.append(_record(node, ctx, onnx_shapes, onode.op_type))
            for node in after:
                nodes.append(_record(node, ctx, onnx_shapes, onode.op_type))
        except PipelineError as err:
            if str(err).startswith(source):
                raise
            raise type(err)(f"{source}: {err}") from None  # which file, too
        except Exception as err:
            # A node the converter's checks did not anticipate (an attribute of the
            # wrong type, a missing input): still one line naming the node.
            what = f"{proto.name or f'#{k}'!r} ({proto.op_type})"
            raise ModelError(f"{source}: node {what}: cannot import it "
                             f"({type(err).__name__}: {err})") from err
    return nodes


def _record(node: Node, ctx: ImportContext, onnx_shapes: dict, op_type: str) -> Node:
    """`node`, its output types inferred, checked against ONNX's shapes and recorded."""
    out_types = infer_types(node, [ctx.types[i] for i in node.inputs])
    if data_dependent(node) is not None or not ctx.bounded.isdisjoint(node.inputs):
        ctx.bounded.update(node.outputs)
    for name, t in zip(node.outputs, out_types, strict=True):
        check_elements(t.shape if isinstance(t, TensorType) else (),  # not a sequence
                       f"node {node.name!r} output {name!r}")
        want = onnx_shapes.get(name)
        if want is not None and want != t.shape and name not in ctx.bounded:
            raise ModelError(f"node {node.name!r} ({op_type}): output {name!r} has shape "
                             f"{list(t.shape)} here but {list(want)} by ONNX shape inference")
        ctx.types[name] = t
    ctx.track(node)
    return node


def _initializers(g: onnx.GraphProto, source: str) -> dict[str, np.ndarray]:
    """The initializers as arrays; their declared sizes are checked before reading."""
    params = {}
    for init in g.initializer:
        check_elements(list(init.dims), f"{source}: initializer {init.name!r}")
        try:
            params[init.name] = numpy_helper.to_array(init)
        except PipelineError:
            raise
        except Exception as err:  # raw data of the wrong size, an unknown data type
            raise ModelError(f"{source}: initializer {init.name!r} cannot be read "
                             f"({type(err).__name__}: {str(err).splitlines()[0]})") from None
    return params


def _check_defined(g: onnx.GraphProto, source: str) -> None:
    """ModelError unless every node input is a graph input, an initializer or the
    output of an earlier node: a cycle or a dangling input is named, not a KeyError."""
    defined = {vi.name for vi in g.input} | {i.name for i in g.initializer} | {""}
    later = {out: (k, node) for k, node in enumerate(g.node) for out in node.output}
    for k, node in enumerate(g.node):
        for name in node.input:
            if name in defined:
                continue
            what = f"{source}: node {node.name or f'#{k}'!r} ({node.op_type}): input {name!r}"
            if name in later:
                j, producer = later[name]
                raise ModelError(f"{what} is computed by node {producer.name or f'#{j}'!r} "
                                 f"{'after it' if j > k else 'itself'}: the graph has a "
                                 "cycle or is not in topological order")
            raise ModelError(f"{what} is not a graph input, an initializer or the output of "
                             "any node (a dangling input)")
        defined.update(node.output)
    missing = [o.name for o in g.output if o.name not in defined]
    if missing:
        raise ModelError(f"{source}: graph output(s) {missing} are computed by no node")


def _freeze_inputs(model: onnx.ModelProto, freeze: dict, source: str) -> onnx.ModelProto:
    """A copy of `model` whose inputs named in `freeze` are initializers with those values."""
    names = {vi.name for vi in model.graph.input} - {i.name for i in model.graph.initializer}
    unknown = sorted(set(freeze) - names)
    if unknown:
        raise ModelError(f"{source}: cannot freeze {unknown}: not graph inputs")
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for name, value in freeze.items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return model


def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default ONNX domain ("" or "ai.onnx"); 1 if unlisted."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 1


def domain_opset(model: onnx.ModelProto, domain: str) -> int:
    """The model's opset of a custom domain (com.microsoft); 1 if unlisted."""
    return next((imp.version for imp in model.opset_import if imp.domain == domain), 1)


def _check_supported(model: onnx.ModelProto, opset: int, source: str,
                     control_flow: bool = False) -> None:
    missing: dict[str, list[str]] = {}
    for k, node in enumerate(model.graph.node):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        if node.domain not in ("", "ai.onnx"):
            # Custom-domain operators have converters registered as "<domain>.<op>"
            # (the com.microsoft quantized operators, frontend/onnx/quant_ms.py).
            key = f"{node.domain}.{node.op_type}"
            if onnx_converter(key, domain_opset(model, node.domain)) is not None:
                continue
        elif node.op_type in CONTROL_CONVERTERS and (control_flow or node.op_type not in
                                                     CONTROL_FLOW):  # or sequence.py's
            continue
        elif node.op_type in CONTROL_FLOW:
            key = f"{node.op_type} (control flow: subgraphs are not compiled)"
        elif onnx_converter(node.op_type, opset) is None:
            key = f"{node.op_type} (opset {opset})"
        else:
            continue
        missing.setdefault(key, []).append(node.name or f"#{k}")
    if missing:
        listing = "; ".join(f"{op} at node(s) {', '.join(names[:5])}"
                            + (f" and {len(names) - 5} more" if len(names) > 5 else "")
                            for op, names in sorted(missing.items()))
        raise UnsupportedOperatorError(
            f"{source}: unsupported operator(s): {listing}. Supported operators are "
            "registered in pipeline/frontend/onnx/ (see pipeline.frontend.onnx.ONNX_CONVERTERS)")


# Operators that run subgraphs: only the VM runs them (from_onnx(control_flow=True));
# their converters are registry.py's CONTROL_CONVERTERS, fn(ctx, onnx node, source).
CONTROL_FLOW = ("If", "Loop", "Scan")


def _check_element_types(g: onnx.GraphProto, source: str) -> None:
    """ModelError naming the tensor and the first node using it if a graph input, an
    initializer or a Constant has an element type the IR lacks (bfloat16, float8,
    int4, string...)."""
    users: dict[str, str] = {}
    for k, node in enumerate(g.node):
        for name in node.input:
            users.setdefault(name, f"node {node.name or f'#{k}'!r} ({node.op_type})")
    tensors = [("input", vi.name, vi.type.tensor_type.elem_type) for vi in g.input
               if vi.type.HasField("tensor_type")]
    tensors += [("initializer", init.name, init.data_type) for init in g.initializer]
    tensors += [("Constant", node.output[0], a.t.data_type) for node in g.node
                if node.op_type == "Constant" and node.output
                for a in node.attribute if a.name == "value"]
    for kind, name, elem in tensors:
        if elem not in ONNX_DTYPES:
            used = users.get(name, "no node")
            raise ModelError(f"{source}: {kind} {name!r} (used by {used}) has unsupported "
                             f"element type {onnx.TensorProto.DataType.Name(elem)} "
                             f"({', '.join(DTYPES)} are)")


def _dtype_name(dtype, name: str) -> str:
    text = str(np.dtype(dtype))
    if text not in DTYPES:
        raise ModelError(f"tensor {name!r}: dtype {text} is not supported "
                         f"({', '.join(DTYPES)} are)")
    return text


def _decode(proto, k: int, opset: int, used_names: set[str]) -> OnnxNode:
    name = proto.name or f"{proto.op_type}_{k}"
    while name in used_names:
        name = f"{name}_{k}"
    used_names.add(name)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}
    return OnnxNode(proto.op_type, name, tuple(proto.input), tuple(proto.output), attrs, opset)


def _constant_outputs(ctx: ImportContext, outputs: tuple[str, ...]) -> list[Node]:
    """Identity nodes copying the graph outputs that are constants (a Shape of a
    static tensor, an initializer) out of a parameter: a kernel computes every output."""
    nodes = []
    for name in dict.fromkeys(outputs):
        if name in ctx.params:
            source = ctx.add_param(f"{name}.value", ctx.params.pop(name))
            nodes.append(Node.make("identity", f"{name}.copy", (source,), (name,)))
    return nodes


def _live(nodes: list[Node], outputs: tuple[str, ...]) -> list[Node]:
    """The nodes some graph output depends on: shape arithmetic whose value a
    converter consumed at build time (ImportContext.const) is left unused."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if needed & set(node.outputs):
            kept.append(node)
            needed.update(node.inputs)
    return kept[::-1]


def _import_constant(node: OnnxNode, ctx: ImportContext, source: str) -> None:
    """Constant nodes become parameters."""
    a = node.attrs
    if "value" in a:
        value = numpy_helper.to_array(a["value"])
    elif "value_float" in a or "value_int" in a:
        value = np.array(a.get("value_float", a.get("value_int")),
                         np.float32 if "value_float" in a else np.int64)
    elif "value_floats" in a or "value_ints" in a:
        value = np.array(a.get("value_floats", a.get("value_ints")),
                         np.float32 if "value_floats" in a else np.int64)
    else:
        raise ModelError(f"{source}: node {node.name!r} (Constant): unsupported value "
                         f"attribute {sorted(a)}")
    _dtype_name(value.dtype, node.name)  # an unsupported dtype names the node
    ctx.set_const(node.outputs[0], value)
