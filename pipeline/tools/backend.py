"""The ONNX backend (onnx.backend.base): prepare a model with the real compiler, run it.

    rep = pipeline.tools.backend.prepare(model, "CPU", opt_level=3)
    outputs = rep.run([x, ...])          # inputs in graph-input order, or a dict

`prepare` imports the model, optimises it at the chosen opt level, compiles
every kernel with llvmlite, links a shared library with cc, dlopens it and
runs it in the graph executor. The module itself is an onnx backend module
(`prepare`, `run_model`, `run_node`, `supports_device`), so onnx's backend test
runner can drive it (tests/tools/test_onnx_backend.py).

Our compiler is static-shape: an input with a symbolic dimension, or an input
that an operator needs at build time (a Reshape's shape, Slice's starts, Pad's
pads...: its converter's `build_time_inputs`), is resolved at `run`: the model
is compiled for the concrete shapes and those inputs' values, and the result is
cached per distinct (shapes, values).

What we do not support follows from the converter registry (pipeline/frontend/onnx/,
declared once per converter with `onnx_op`): operators without a converter at
the model's opset, dtypes the IR lacks (pipeline/ir/graph.py ONNX_DTYPES),
float64 or uint64 on a converter that emits a graph op without such a lowering, and
the features a converter declares in `limits`. `unsupported(model)` names every
reason a model cannot be compiled; the conformance suite skips exactly those
models.
"""

from __future__ import annotations

import atexit
import itertools
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.backend.base import Backend, BackendRep

from pipeline.frontend.onnx.importer import (
    CONTROL_CONVERTERS,
    CONTROL_FLOW,
    default_opset,
    domain_opset,
)
from pipeline.frontend.onnx.registry import NodeView, onnx_converter
from pipeline.frontend.onnx.sequence_map import shapes_follow_iteration
from pipeline.ir.graph import ONNX_DTYPES
from pipeline.tools.value_inputs import expand_value_inputs, has_value_inputs

TARGET = "llvm -mcpu=native"
# The sequence and optional operators (frontend/onnx/sequence.py; Identity of such a
# value too): the VM runs them.
VM_VALUE_OPS = tuple(op for op in CONTROL_CONVERTERS if op not in (*CONTROL_FLOW, "Identity"))


def unsupported(model: onnx.ModelProto, limits: bool = True) -> list[str]:
    """Every reason `model` cannot be compiled, from the operator registry; [] if it is
    supported. limits=False leaves out the converters' declared limits (the
    conformance audit runs such models to check that no limit hides a pass)."""
    g = model.graph
    opset = default_opset(model)
    reasons: list[str] = []
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # a model ONNX cannot infer still gets its operators checked
        inferred = g
    types = {vi.name: vi.type for vi in [*inferred.value_info, *inferred.input,
                                         *inferred.output]}
    for init in g.initializer:
        types[init.name] = helper.make_tensor_type_proto(init.data_type, init.dims)
    for tp in types.values():
        tp = _element_type(tp)  # a sequence's or optional's: the VM holds those
        kind = tp.WhichOneof("value")
        if kind is None:  # untyped (ONNX could not infer it): the import will tell
            continue
        if kind != "tensor_type":
            reasons.append(f"{kind.removesuffix('_type')} values")
        elif tp.tensor_type.elem_type not in ONNX_DTYPES:
            reasons.append("dtype " + TensorProto.DataType.Name(tp.tensor_type.elem_type))
    inputs = {vi.name for vi in g.input} - {i.name for i in g.initializer}
    known = _known_values(g, _build_time_inputs(g, inputs, opset))
    for node in g.node:
        custom = node.domain not in ("", "ai.onnx")
        if custom and onnx_converter(f"{node.domain}.{node.op_type}",
                                     domain_opset(model, node.domain)) is None:
            reasons.append(f"domain {node.domain} ({node.op_type})")
            continue
        if node.op_type == "Constant" and not custom:
            continue
        if node.op_type in CONTROL_FLOW and not custom:  # the VM runs it
            reasons += _control_flow_reasons(node, opset, known)
            continue
        if node.op_type in VM_VALUE_OPS and not custom:  # sequences, optionals: the VM's
            reasons += _control_flow_reasons(node, opset, known)  # SequenceMap's body
            continue
        converter = onnx_converter(f"{node.domain}.{node.op_type}" if custom else node.op_type,
                                   domain_opset(model, node.domain) if custom else opset)
        if converter is None:
            reasons.append(f"{node.op_type} (opset {opset}): no converter")
            continue
        reasons += [f"{inner.op_type} (opset {opset}) in {node.op_type}'s {attr.name}: no "
                    "converter" for attr in node.attribute if attr.name in converter.subgraphs
                    for inner in attr.g.node if inner.op_type != "Constant"
                    and onnx_converter(inner.op_type, opset) is None]
        for allowed, elem, name in ((converter.float64, TensorProto.DOUBLE, "DOUBLE"),
                                    (converter.uint64, TensorProto.UINT64, "UINT64")):
            if not allowed and any(_elem_type(types.get(x)) == elem
                                   for x in (*node.input, *node.output) if x):
                reasons.append(f"{node.op_type}: dtype {name}")
        if not limits or not converter.limits:
            continue
        view = NodeView(node.op_type, opset,
                        {a.name: helper.get_attribute_value(a) for a in node.attribute},
                        tuple(node.input),
                        tuple(_tensor(types.get(i)) if i else None for i in node.input),
                        tuple(_tensor(types.get(o)) for o in node.output if o))
        reasons += [f"{node.op_type}: {lim.reason}" for lim in converter.limits
                    if lim.applies(view)]
    return sorted(set(reasons))


# Ops through which a Loop body's iteration number stays a value the importer follows
# (frontend/onnx/symbolic.py: a Slice from i to i + 1 has a static length).
_ITERATION_OPS = ("Add", "Sub", "Mul", "Unsqueeze", "Squeeze", "Reshape", "Identity", "Cast",
                  "Concat", "Gather", "Slice")
_RANDOM = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
           "Multinomial", "Bernoulli")  # never known at build time; nor VM_VALUE_OPS' values


def _known_values(g: onnx.GraphProto, frozen: set[str]) -> set[str]:
    """Names of `g` whose values are known at build time: initializers, Constants, the
    frozen inputs, Shape and Size (inputs are static per build), and what nodes compute
    from those alone (an If's outputs when its condition and what its branches read
    are: it is inlined)."""
    known = {i.name for i in g.initializer} | frozen
    for node in g.node:
        reads = set(node.input) | (_outer_reads(node) if node.op_type in CONTROL_FLOW
                                   else set())
        if node.op_type in ("Constant", "Shape", "Size") or (
                node.op_type not in (*_RANDOM, *VM_VALUE_OPS, "Loop", "Scan")
                and reads - {""} <= known):
            known.update(node.output)
    return known


def _outer_reads(node: onnx.NodeProto) -> set[str]:
    """The names the subgraphs of control-flow `node` read from outside themselves."""
    reads: set[str] = set()
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            body = attr.g
            inner = {i.name for i in body.input} | {i.name for i in body.initializer}
            for n in body.node:
                more = _outer_reads(n) if n.op_type in CONTROL_FLOW else set()
                reads |= (set(n.input) | more) - inner - {""}
                inner.update(n.output)
            reads |= {o.name for o in body.output} - inner
    return reads


def _control_flow_reasons(node: onnx.NodeProto, opset: int, known: set[str]) -> list[str]:
    """Why an If, Loop or Scan cannot be compiled (the VM runs them with static shapes,
    frontend/onnx/control.py): an operator of a subgraph without a converter, or one
    reading a build-time input the subgraph computes at run time (a Reshape of a loop-
    carried shape), other than a Slice or Range from the iteration number. `known`:
    the outer names known at build time."""
    reasons = []
    if node.op_type == "Scan" and opset < 9 and node.input and node.input[0]:
        reasons.append("Scan (opset 8): sequence_lens")
    for attr in node.attribute:
        if attr.type != onnx.AttributeProto.GRAPH:
            continue
        body = attr.g
        inner_known = known | {i.name for i in body.initializer}
        iteration = {body.input[0].name} if node.op_type == "Loop" and body.input else set()
        if iteration and set(node.input[:2]) - {""} <= known and shapes_follow_iteration(
                body, opset):  # unrolled: the iteration number a constant per copy
            inner_known |= iteration
        for inner in body.node:
            reads = set(inner.input) - {""}
            if inner.op_type in ("Constant", "Shape", "Size") or (
                    inner.op_type not in (*_RANDOM, *VM_VALUE_OPS, *CONTROL_FLOW)
                    and reads <= inner_known):
                inner_known.update(inner.output)
            elif inner.op_type in _ITERATION_OPS and reads <= inner_known | iteration:
                iteration.update(inner.output)
            if inner.op_type == "Constant":
                continue
            if inner.op_type in CONTROL_FLOW:
                reasons += _control_flow_reasons(inner, opset, inner_known)
                continue
            converter = onnx_converter(inner.op_type, opset)
            if inner.op_type in VM_VALUE_OPS:
                continue
            runtime = [] if converter is None else [
                inner.input[pos] for pos in converter.build_time_inputs
                if pos < len(inner.input) and inner.input[pos]
                and inner.input[pos] not in inner_known]
            if converter is None:
                reasons.append(f"{inner.op_type} (opset {opset}) in a subgraph: no converter")
            elif runtime and not _static_length(inner, iteration, inner_known):
                reasons.append(f"{inner.op_type} in a subgraph: a build-time input computed "
                               "at run time")
    return reasons


def _static_length(node: onnx.NodeProto, iteration: set[str], known: set[str]) -> bool:
    """Whether Slice or Range `node` in a Loop body likely has a static length: its two
    bounds both follow the iteration number (i to i + 1; a constant against i would
    grow with it), the rest known at build time. The import checks it exactly."""
    bounds, rest = ((node.input[1:3], node.input[3:5]) if node.op_type == "Slice"
                    else (node.input[0:2], node.input[2:3]) if node.op_type == "Range"
                    else ((), ("",)))
    return (len(bounds) == 2 and set(bounds) <= iteration
            and all(not r or r in known for r in rest))


def _element_type(tp):
    """The tensor type inside a sequence or optional type proto (else tp itself)."""
    while tp.WhichOneof("value") in ("sequence_type", "optional_type"):
        tp = (tp.sequence_type.elem_type if tp.HasField("sequence_type")
              else tp.optional_type.elem_type)
    return tp


def _elem_type(tp) -> int | None:
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return None
    return tp.tensor_type.elem_type


def _tensor(tp) -> tuple[int, tuple] | None:
    if tp is None or tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField(
            "shape"):
        return None
    dims = tuple(d.dim_value if d.HasField("dim_value") else None
                 for d in tp.tensor_type.shape.dim)
    return tp.tensor_type.elem_type, dims


# -- compile and run ------------------------------------------------------------

_LIBS: tempfile.TemporaryDirectory | None = None
_COUNTER = itertools.count()
# Kernel objects by kernel hash, shared by every model this process compiles:
# the conformance suites repeat many kernels (about 2,500 kernels, 940 distinct,
# in the node suite), and a hash names everything that decides the machine code.
_KERNELS: dict[str, bytes] = {}


def _lib_path() -> str:
    """A fresh .so path (dlopen caches libraries by path, so never reuse one)."""
    global _LIBS
    if _LIBS is None:
        _LIBS = tempfile.TemporaryDirectory(prefix="pipeline-backend-")
        atexit.register(_LIBS.cleanup)
    return os.path.join(_LIBS.name, f"model{next(_COUNTER)}.so")


def compile_model(model: onnx.ModelProto, opt_level: int = 3, target: str = TARGET,
                  shape: dict[str, tuple[int, ...]] | None = None,
                  freeze: dict[str, np.ndarray] | None = None):
    """Import, optimise, compile, link and load `model`; returns its GraphModule (a
    _VMModule for a model with If, Loop or Scan or an output shape that depends on
    values, which the VM runs: docs/vm.md)."""
    from pipeline.driver.build import build
    from pipeline.frontend import from_onnx
    from pipeline.runtime import GraphModule, load_module
    from pipeline.transform import PassContext
    from pipeline.vm.program import has_control_flow

    vm = any(n.op_type in (*CONTROL_FLOW, *VM_VALUE_OPS) for n in model.graph.node)
    graph, params = from_onnx(model, shape=shape, freeze=freeze, control_flow=vm)
    vm = vm or has_control_flow(graph)  # data-dependent shapes (NonZero, NMS...) too
    with PassContext(opt_level=opt_level):
        factory = build(graph, target=target, params=params, kernel_cache=_KERNELS,
                        executor="vm" if vm else "graph")
    path = factory.export_library(_lib_path())
    if vm:
        return _VMModule(path)
    module = load_module(path)
    os.unlink(path)  # the mapping stays valid; nothing else reads the file
    return GraphModule(module["default"]())


class _VMModule:
    """What PipelineRep.run calls of a GraphModule (run, get_output,
    get_num_outputs), over the VirtualMachine of a VM library."""

    def __init__(self, path: str):
        from pipeline.runtime.vm import VirtualMachine

        self.vm = VirtualMachine(path)
        os.unlink(path)  # loaded: the mapping stays valid
        self.outputs: list[np.ndarray] = []

    def run(self, **feeds: np.ndarray) -> None:
        self.outputs = self.vm.run(**feeds)

    def get_output(self, k: int) -> np.ndarray:
        return self.outputs[k]

    def get_num_outputs(self) -> int:
        return len(self.vm.executable.content.functions[0].results)


class PipelineRep(BackendRep):
    """A prepared model: compiled once if its inputs are static, else per distinct
    (input shapes, build-time input values) seen by `run`."""

    def __init__(self, model: onnx.ModelProto, opt_level: int = 3, target: str = TARGET):
        self.model = model
        self.opt_level = opt_level
        self.target = target
        inits = {i.name for i in model.graph.initializer}
        self.inputs = [vi for vi in model.graph.input if vi.name not in inits]
        self.input_names = [vi.name for vi in self.inputs]
        self.frozen = _build_time_inputs(model.graph, set(self.input_names),
                                         default_opset(model))
        self.values = has_value_inputs(self.inputs)  # sequences, optionals: value_inputs.py
        self.static = not self.frozen and not self.values and all(
            d.HasField("dim_value") for vi in self.inputs
            for d in vi.type.tensor_type.shape.dim)
        self._cache: dict[tuple, Any] = {}
        if self.static:
            self._cache[()] = compile_model(model, opt_level, target)

    def _module(self, feeds: dict[str, np.ndarray]):
        if self.static:
            return self._cache[()]
        if self.values:  # compiled per structure of the sequence and optional feeds
            model, flat, key = expand_value_inputs(self.model, feeds)
            if key not in self._cache:
                self._cache[key] = compile_model(
                    model, self.opt_level, self.target,
                    shape={n: a.shape for n, a in flat.items() if n not in self.frozen},
                    freeze={n: flat[n] for n in self.frozen})
            return self._cache[key], flat
        shapes = tuple((n, feeds[n].shape) for n in self.input_names if n not in self.frozen)
        values = tuple((n, feeds[n].dtype.str, feeds[n].shape, feeds[n].tobytes())
                       for n in self.input_names if n in self.frozen)
        key = (shapes, values)
        if key not in self._cache:
            self._cache[key] = compile_model(
                self.model, self.opt_level, self.target, shape=dict(shapes),
                freeze={n: feeds[n] for n in self.frozen})
        return self._cache[key]

    def run(self, inputs: Any, **kwargs: Any) -> list[np.ndarray]:
        """Outputs in graph-output order; `inputs` is a list in graph-input order,
        a dict by name, or a single array."""
        def value(v):  # a sequence (list) or an empty optional (None) stays as it is
            return v if self.values and (v is None or isinstance(v, list)) else np.asarray(v)

        if isinstance(inputs, dict):
            feeds = {k: value(v) for k, v in inputs.items()}
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) > len(self.input_names):
                raise ValueError(f"{len(inputs)} inputs given; the model's inputs are "
                                 f"{self.input_names}")
            feeds = {n: value(v) for n, v in zip(self.input_names, inputs, strict=False)}
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ValueError(f"missing inputs {missing}; the model's inputs are "
                             f"{self.input_names}")
        gmod = self._module(feeds)
        names = self.input_names
        if self.values:  # the library's inputs: value_inputs.py
            gmod, feeds = gmod
            names = list(feeds)
        gmod.run(**{n: feeds[n] for n in names if n not in self.frozen})
        return [gmod.get_output(k) for k in range(gmod.get_num_outputs())]


# Operators the VM runs with their shape-giving inputs at run time (docs/vm.md): not
# frozen when only graph outputs read their results (a static kernel could not).
_RUNTIME_SHAPES = ("TopK", "Range", "ConstantOfShape", "Expand", "Reshape", "Slice", "Tile")


def _build_time_inputs(graph: onnx.GraphProto, input_names: set[str],
                       opset: int) -> set[str]:
    """Graph inputs whose values a converter's build_time_inputs depend on (directly,
    or through the nodes computing them; Shape and Size read only their input's shape)."""
    every = _all_nodes(graph)  # subgraphs' too: ONNX names are unique across them
    converters = {node.op_type: onnx_converter(node.op_type, opset) for node in every}
    read = {name for node in every for name in node.input}
    main = {id(node) for node in graph.node}
    needed = {node.input[pos] for node in every if converters[node.op_type] is not None
              and not (node.op_type in _RUNTIME_SHAPES and id(node) in main
                       and read.isdisjoint(node.output))
              for pos in converters[node.op_type].build_time_inputs
              if pos < len(node.input) and node.input[pos]}
    # A Loop with scan outputs needs its trip count: their length (frontend/onnx/control.py).
    needed |= {node.input[0] for node in graph.node if node.op_type == "Loop" and node.input
               and node.input[0] and len(_body(node).output) > len(node.input) - 1}
    # A Loop unrolled for its iteration-dependent shapes needs its trip count and condition.
    needed |= {name for node in graph.node if node.op_type == "Loop"
               and shapes_follow_iteration(_body(node), opset) for name in node.input[:2] if name}
    # SplitToSequence's split decides its parts' shapes (frontend/onnx/sequence.py).
    needed |= {node.input[1] for node in graph.node if node.op_type == "SplitToSequence"
               and len(node.input) > 1 and node.input[1]}
    producer = {out: node for node in every for out in node.output}
    todo = list(needed)
    while todo:
        node = producer.get(todo.pop())
        if node is None or node.op_type in ("Shape", "Size"):
            continue
        reads = set(node.input) | (_outer_reads(node) if node.op_type in CONTROL_FLOW
                                   else set())
        for name in reads:
            if name and name not in needed:
                needed.add(name)
                todo.append(name)
    return needed & input_names


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of `graph` and of every subgraph in it, outer ones first."""
    nodes = list(graph.node)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                nodes += _all_nodes(attr.g)
    return nodes


def _body(node: onnx.NodeProto) -> onnx.GraphProto:
    """A Loop's body (an empty graph if it has none: the import will say so)."""
    return next((a.g for a in node.attribute if a.name == "body"), onnx.GraphProto())


class PipelineBackend(Backend):
    """onnx.backend.base.Backend over the compiler; device "CPU" only.

    Keyword options of prepare/run_model/run_node: opt_level (0..3, default 3)
    and target (default "llvm -mcpu=native").
    """

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device) and not unsupported(model)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> PipelineRep:
        if not cls.supports_device(device):
            raise ValueError(f"unsupported device {device!r}: only CPU is")
        return PipelineRep(model, int(kwargs.get("opt_level", 3)), kwargs.get("target", TARGET))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> list[np.ndarray]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> list[np.ndarray]:
        """Run one node on `inputs` (a list matching node.input, or a dict)."""
        if isinstance(inputs, dict):
            arrays = [np.asarray(inputs[n]) for n in node.input if n]
        else:
            arrays = [np.asarray(v) for v in inputs]
        names = [n for n in node.input if n]
        graph_inputs = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(names, arrays, strict=True)]
        graph_outputs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
        opset = kwargs.pop("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(
            helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs),
            opset_imports=[helper.make_opsetid("", opset)])
        return cls.run_model(model, dict(zip(names, arrays, strict=True)), device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().split(":")[0] == "CPU"


prepare = PipelineBackend.prepare
run_model = PipelineBackend.run_model
run_node = PipelineBackend.run_node
supports_device = PipelineBackend.supports_device
is_compatible = PipelineBackend.is_compatible
