"""A tiny ONNX graph builder and the weight initialisers the model generators share.

Every generator builds its graph through `GraphBuilder`, so opset, IR version and
producer name are fixed in one place, and duplicate node or tensor names (easy to
write when names are composed from strings like "layer1.0.bn1") fail at build time
with a clear message instead of later in the checker or in the compiler.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13
IR_VERSION = 8
PRODUCER = "pipeline.models"


class GraphBuilder:
    """Collects inputs, outputs, initializers and nodes, then makes a ModelProto.

    Tensor names must be defined before use (graph input, initializer, or the output
    of an earlier node), so nodes come out in topological order by construction.
    """

    def __init__(self, name: str, opset: int = OPSET) -> None:
        self.name = name
        self.opset = opset
        self._inputs: list[onnx.ValueInfoProto] = []
        self._outputs: list[onnx.ValueInfoProto] = []
        self._initializers: list[onnx.TensorProto] = []
        self._nodes: list[onnx.NodeProto] = []
        self._tensors: set[str] = set()  # every tensor name defined so far
        self._node_names: set[str] = set()

    def _define(self, tensor: str) -> None:
        if tensor in self._tensors:
            raise ValueError(f"{self.name}: tensor {tensor!r} defined twice")
        self._tensors.add(tensor)

    def input(
        self, name: str, shape: Sequence[int], elem_type: int = TensorProto.FLOAT
    ) -> str:
        """Declare a graph input of a fixed shape (float32 unless `elem_type` says
        otherwise, e.g. TensorProto.INT64 for token ids); returns its name."""
        self._define(name)
        self._inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name: str, shape: Sequence[int]) -> None:
        """Declare an already-produced tensor as a float32 graph output of `shape`."""
        if name not in self._tensors:
            raise ValueError(f"{self.name}: output {name!r} is never produced")
        self._outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))

    def initializer(self, name: str, array: np.ndarray | Sequence[float] | float) -> str:
        """Store `array` as an initializer called `name`; returns the name.

        Integer arrays are stored as int64 (shapes, indices), everything else as float32.
        """
        self._define(name)
        array = np.asarray(array)
        dtype = np.int64 if np.issubdtype(array.dtype, np.integer) else np.float32
        self._initializers.append(numpy_helper.from_array(array.astype(dtype), name))
        return name

    def node(
        self,
        op_type: str,
        inputs: Sequence[str],
        name: str,
        output: str | None = None,
        **attrs: object,
    ) -> str:
        """Append a single-output node; returns the output tensor name.

        The output tensor is named after the node unless `output` is given, which keeps
        intermediate tensors as readable as the nodes ("layer1.0.bn1"). An input named
        "" is an omitted optional input, as ONNX spells it.
        """
        if name in self._node_names:
            raise ValueError(f"{self.name}: node name {name!r} used twice")
        missing = [t for t in inputs if t and t not in self._tensors]
        if missing:
            raise ValueError(f"{self.name}: node {name!r} reads undefined tensors {missing}")
        out = output if output is not None else name
        self._define(out)
        self._node_names.add(name)
        self._nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def build(self, initializers_as_inputs: bool = False) -> onnx.ModelProto:
        """Return the finished model (the builder's opset, 13 by default; IR version 8).

        With `initializers_as_inputs`, every initializer is also listed as a graph input,
        the way exporters that predate IR version 4 wrote models.
        """
        graph = helper.make_graph(
            self._nodes, self.name, self._inputs, self._outputs, self._initializers
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", self.opset)],
            ir_version=IR_VERSION,
            producer_name=PRODUCER,
        )
        return with_initializers_as_inputs(model) if initializers_as_inputs else model


def with_initializers_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return a copy of `model` whose graph inputs also list every initializer.

    Takes any ModelProto; the input model is not modified. Initializers already among
    the inputs are not listed twice. The extra inputs follow the original ones, in
    initializer order, which is where old PyTorch exporters put the parameters.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    listed = {vi.name for vi in out.graph.input}
    for init in out.graph.initializer:
        if init.name not in listed:
            out.graph.input.append(
                helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
            listed.add(init.name)
    return out


def he_normal(rng: np.random.Generator, shape: Sequence[int]) -> np.ndarray:
    """He-normal float32 weights for a conv [O, I, kh, kw] or a transB gemm [O, I].

    fan_in is the product of all dims but the first, in both layouts; std is
    sqrt(2 / fan_in), which keeps the second moment roughly constant through ReLUs.
    """
    fan_in = math.prod(shape[1:])
    w = rng.standard_normal(tuple(shape), dtype=np.float32)  # float32 draws: 3x faster
    w *= np.float32(math.sqrt(2.0 / fan_in))
    return w


def small_bias(rng: np.random.Generator, n: int, fan_in: int) -> np.ndarray:
    """float32 bias of length n, uniform in +-1/sqrt(fan_in) (PyTorch's Linear default)."""
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=n).astype(np.float32)


def as_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the float32 `model` that computes in float16 with float32 I/O.

    Every float32 initializer becomes float16 (round to nearest even); each float32
    graph input is cast to float16 by a Cast node named "<input>.to_fp16" and each
    float32 graph output is computed as "<output>.fp16" and cast back to float32
    by "<output>.to_fp32". The graph's nodes are otherwise unchanged (they must have
    no float32 attribute tensors), so weights and compute are half precision: what
    onnxconverter-common's float16 conversion with keep_io_types=True makes.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for init in g.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(init).astype(np.float16), init.name))
    renamed: dict[str, str] = {}
    casts_in = []
    for vi in g.input:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            renamed[vi.name] = f"{vi.name}.fp16"
            casts_in.append(helper.make_node("Cast", [vi.name], [renamed[vi.name]],
                                             name=f"{vi.name}.to_fp16",
                                             to=TensorProto.FLOAT16))
    casts_out = []
    for vi in g.output:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            renamed[vi.name] = f"{vi.name}.fp16"
            casts_out.append(helper.make_node("Cast", [renamed[vi.name]], [vi.name],
                                              name=f"{vi.name}.to_fp32",
                                              to=TensorProto.FLOAT))
    inputs = {vi.name for vi in g.input}
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in inputs and name in renamed:
                node.input[i] = renamed[name]
        for i, name in enumerate(node.output):
            if name in renamed:
                node.output[i] = renamed[name]
    nodes = [*casts_in, *g.node, *casts_out]
    del g.node[:]
    g.node.extend(nodes)
    return out
