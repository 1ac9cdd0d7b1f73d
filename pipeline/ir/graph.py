"""The graph IR: a frozen dataclass of typed tensors and operator nodes.

A Graph holds no weight values. Parameters are named tensors whose values live
beside the graph in a plain `dict[str, np.ndarray]`, so that the graph (and every
kernel hash derived from it) does not change when only weights change.

Nodes are kept in topological order. Attributes are stored as a sorted tuple of
(key, value) pairs whose values are ints, floats, strings or tuples of those, so
nodes are hashable and serialise to JSON without loss.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pipeline.errors import GraphError
from pipeline.ir.sequence import type_from_json

# The element types the IR has, by ONNX TensorProto code (FLOAT, DOUBLE, INT64, INT32,
# BOOL, FLOAT16, INT8, UINT8, INT16, UINT16, UINT32, UINT64, BFLOAT16, FLOAT8E4M3FN,
# FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ, UINT4, INT4, FLOAT4E2M1, FLOAT8E8M0, UINT2,
# INT2): the one table the ONNX import, Cast and
# the backend read. Plain ints, as the IR does not import onnx. The names are numpy's,
# ml_dtypes' for bfloat16 and float8 (ml_dtypes, which onnx needs, registers them with
# numpy). Kernels compute the narrow ones in a wider type: pipeline/dsl/builder.py.
ONNX_DTYPES = {1: "float32", 11: "float64", 7: "int64", 6: "int32", 9: "bool",
               10: "float16", 3: "int8", 2: "uint8", 5: "int16", 4: "uint16", 12: "uint32",
               13: "uint64", 16: "bfloat16", 17: "float8_e4m3fn", 18: "float8_e4m3fnuz",
               19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4", 22: "int4",
               23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2"}
DTYPES = tuple(ONNX_DTYPES.values())
# Bits per element. int4, uint4 and float4_e2m1fn are stored two to a byte (int2 and
# uint2 four, element 4i in the low two bits), as ONNX and DLPack store
# them (element 2i in the low nibble of byte i, 2i + 1 in the high one), in params,
# buffers and library inputs and outputs alike; numpy (ml_dtypes) holds them one a byte.
BITS = {"float32": 32, "float64": 64, "int64": 64, "int32": 32, "bool": 8, "float16": 16,
        "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "uint32": 32, "uint64": 64,
        "bfloat16": 16, "float8_e4m3fn": 8, "float8_e4m3fnuz": 8, "float8_e5m2": 8,
        "float8_e5m2fnuz": 8, "uint4": 4, "int4": 4, "float4_e2m1fn": 4,
        "float8_e8m0fnu": 8, "uint2": 2, "int2": 2}


def nbytes(dtype: str, count: int) -> int:
    """Bytes of `count` elements of `dtype` as buffers hold them (int4: packed)."""
    return (count * BITS[dtype] + 7) // 8


@dataclass(frozen=True)
class TensorType:
    """Shape and dtype of one tensor. A dimension is an int, or for the VM executor a
    symbolic one (a str: pipeline/ir/dims.py)."""

    shape: tuple[int | str, ...]
    dtype: str = "float32"

    @property
    def size(self) -> int:
        """The element count of a static shape (GraphError for a symbolic one: code
        that needs it does not handle symbols)."""
        n = 1
        for d in self.shape:
            if isinstance(d, str):
                raise GraphError(f"shape {list(self.shape)} is symbolic: no static size")
            n *= d
        return n

    @property
    def symbolic(self) -> bool:
        """Whether a dimension is symbolic."""
        return any(isinstance(d, str) for d in self.shape)

    def to_json(self) -> list:
        return [list(self.shape), self.dtype]


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a dense row-major tensor of `shape`."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def freeze_attrs(attrs: Mapping) -> tuple:
    """A dict of attributes as a sorted tuple of pairs, lists turned into tuples."""

    def freeze(v):
        if isinstance(v, (list, tuple)):
            return tuple(freeze(x) for x in v)
        if isinstance(v, Node):
            return v
        if hasattr(v, "item"):  # numpy scalar
            return v.item()
        return v

    return tuple(sorted((k, freeze(v)) for k, v in attrs.items()))


@dataclass(frozen=True)
class Node:
    """One operator application. `attrs` is a sorted tuple of (key, value)."""

    op: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple = ()

    @staticmethod
    def make(op: str, name: str, inputs: Iterable[str], outputs: Iterable[str],
             **attrs) -> Node:
        return Node(op, name, tuple(inputs), tuple(outputs), freeze_attrs(attrs))

    def attr(self, key: str, default=None):
        for k, v in self.attrs:
            if k == key:
                return v
        return default


@dataclass(frozen=True)
class Graph:
    """A typed dataflow graph.

    inputs:  names of the tensors the caller feeds, in order.
    params:  names of parameter tensors (values are kept outside the graph).
    outputs: names of the graph results, in order.
    nodes:   operator nodes, topologically sorted.
    types:   the TensorType of every tensor named anywhere above.
    """

    inputs: tuple[str, ...]
    params: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    types: Mapping[str, TensorType] = field(default_factory=dict)

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for name in n.inputs:
                users.setdefault(name, []).append(n)
        return users

    def replace(self, **changes) -> Graph:
        fields = {"inputs": self.inputs, "params": self.params, "outputs": self.outputs,
                  "nodes": self.nodes, "types": self.types, **changes}
        return Graph(**fields)

    def verify(self, infer_types=None) -> None:
        """Check the invariants every pass must keep; raise GraphError if broken.

        Every tensor is defined exactly once and before use and has a type; the
        subgraphs control-flow nodes hold (Graph attributes) are checked the same
        way, an error naming the node and the subgraph. Given
        `infer_types` (node, input types -> output types: pipeline.ops.infer_types,
        which the IR cannot import, being below the operators), every op must
        also be registered and its shape rule reproduce the recorded output types.
        """
        defined: set[str] = set()
        for name in (*self.inputs, *self.params):
            if name in defined:
                raise GraphError(f"tensor {name!r} is defined twice")
            if name not in self.types:
                raise GraphError(f"tensor {name!r} has no type")
            defined.add(name)
        for node in self.nodes:
            for name in node.inputs:
                if name and name not in defined:
                    raise GraphError(f"node {node.name!r} ({node.op}) uses {name!r} "
                                     "before it is defined")
            expected = (infer_types(node, [self.types[i] for i in node.inputs])
                        if infer_types is not None else [None] * len(node.outputs))
            for name, want in zip(node.outputs, expected, strict=True):
                if name in defined:
                    raise GraphError(f"tensor {name!r} is defined twice")
                if infer_types is None:
                    if name not in self.types:
                        raise GraphError(f"tensor {name!r} has no type")
                elif self.types.get(name) != want:
                    raise GraphError(f"node {node.name!r} ({node.op}): output {name!r} "
                                     f"recorded as {self.types.get(name)}, shape rule "
                                     f"gives {want}")
                defined.add(name)
        for name in self.outputs:
            if name not in defined:
                raise GraphError(f"graph output {name!r} is never defined")
        for node in self.nodes:  # an If's branches, a Loop's body: graphs of their own
            for key, value in node.attrs:
                if isinstance(value, Graph):
                    try:
                        value.verify(infer_types)
                    except GraphError as err:
                        raise GraphError(f"node {node.name!r} ({node.op}), subgraph {key}: "
                                         f"{err}") from None

    # -- serialisation: the import stage writes this, the optimize stage reads it --

    def to_json(self) -> str:
        """The graph as JSON text (subgraphs nested in their nodes' attributes)."""
        return json.dumps(_graph_to_json(self), sort_keys=True, indent=1)

    @staticmethod
    def from_json(text: str) -> Graph:
        """The graph of `to_json`'s text."""
        return _graph_from_json(json.loads(text))


def fresh_name(hint: str, *tables: dict) -> str:
    """`hint`, or `hint.<k>` for the first k that no table has as a key (a new
    tensor must not collide with one the model already has)."""
    name, k = hint, 0
    while any(name in t for t in tables):
        k += 1
        name = f"{hint}.{k}"
    return name


def add_param(types: dict, params: dict, hint: str, value) -> str:
    """Register constant `value` under a fresh name derived from `hint`, in both
    the type table and the params dict (the frontend and passes create params)."""
    name = fresh_name(hint, params, types)
    params[name] = value
    types[name] = TensorType(value.shape, str(value.dtype))
    return name


def _graph_to_json(graph: Graph) -> dict:
    return {
        "inputs": list(graph.inputs), "params": list(graph.params),
        "outputs": list(graph.outputs),
        "nodes": [_node_to_json(n) for n in graph.nodes],
        "types": {k: t.to_json() for k, t in sorted(graph.types.items())},
    }


def _graph_from_json(doc: dict) -> Graph:
    return Graph(
        inputs=tuple(doc["inputs"]), params=tuple(doc["params"]),
        outputs=tuple(doc["outputs"]),
        nodes=tuple(_node_from_json(n) for n in doc["nodes"]),
        types={k: _type_from_json(t) for k, t in doc["types"].items()},
    )


def _type_from_json(doc: list):
    if isinstance(doc[0], str):  # a sequence or an optional (pipeline/ir/sequence.py)
        return type_from_json(doc, _type_from_json)
    return TensorType(tuple(doc[0]), doc[1])


def _node_to_json(node: Node) -> dict:
    def enc(v):
        if isinstance(v, Node):
            return {"__node__": _node_to_json(v)}
        if isinstance(v, Graph):  # a control-flow node's subgraph
            return {"__graph__": _graph_to_json(v)}
        if isinstance(v, tuple):
            return [enc(x) for x in v]
        return v

    return {"op": node.op, "name": node.name, "inputs": list(node.inputs),
            "outputs": list(node.outputs), "attrs": {k: enc(v) for k, v in node.attrs}}


def _node_from_json(doc: dict) -> Node:
    def dec(v):
        if isinstance(v, dict) and "__node__" in v:
            return _node_from_json(v["__node__"])
        if isinstance(v, dict) and "__graph__" in v:
            return _graph_from_json(v["__graph__"])
        if isinstance(v, list):
            return tuple(dec(x) for x in v)
        return v

    return Node(doc["op"], doc["name"], tuple(doc["inputs"]), tuple(doc["outputs"]),
                tuple(sorted((k, dec(v)) for k, v in doc["attrs"].items())))
