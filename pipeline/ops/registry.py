"""The operator registry: one OpDef per graph-IR operator.

An operator is defined once, in the module of its family (pipeline/ops/<family>.py),
with:
  - its shape rule (`infer`: input types + node -> output types),
  - its kind (OpKind), which decides fusion: elementwise ops become epilogues of
    the kernel before them; anchor ops start a kernel and accept an epilogue;
    opaque ops form a kernel of their own,
  - optionally `numpy`, used by constant folding (and, with `sample`, the
    reference tests/ops/test_registry_ops.py compares the kernel with),
  - whether its lowering handles float64 (`float64=True`); a float64 input to
    any other operator is a ModelError naming the node (infer_types),
  - whether it handles uint64 (`uint64=True`: it moves bits only, or its lowering
    picks unsigned instructions where its node's `unsigned` attribute, the positions
    of its uint64 inputs, says so); a uint64 input to any other is a ModelError.

Its lowering lives in pipeline/kernels/ (registered there), its ONNX converters in
pipeline/frontend/onnx/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from pipeline.errors import GraphError, ModelError
from pipeline.ir.graph import Node, TensorType


class OpKind(str, Enum):
    """How an operator fuses (the values are what specs and reports print)."""

    ELEMENTWISE = "elementwise"
    ANCHOR = "anchor"
    OPAQUE = "opaque"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: OpKind
    infer: Callable[[list[TensorType], Node], list[TensorType]]
    numpy: Callable | None = None   # (arrays: list[np.ndarray], node) -> list[np.ndarray]
    float64: bool = False           # the lowering is dtype-generic over float32/float64
    uint64: bool = False            # the lowering is exact for uint64 (module docstring)
    # (rng: np.random.Generator, dtype: "float32" | "float64") -> (arrays, attrs): small
    # valid inputs and attributes, for testing the kernel against `numpy`.
    sample: Callable | None = None


OPS: dict[str, OpDef] = {}


def register(name: str, kind: OpKind, infer, *, numpy=None, float64: bool = False,
             sample=None, uint64: bool = False) -> OpDef:
    """Add a graph-IR operator (its shape rule `infer`, numpy reference and sample
    inputs) to the registry and return its OpDef."""
    assert name not in OPS, f"operator {name} registered twice"
    OPS[name] = OpDef(name, OpKind(kind), infer, numpy, float64, uint64, sample)
    return OPS[name]


def get(name: str) -> OpDef:
    """The OpDef of graph operator `name`; GraphError if there is none."""
    try:
        return OPS[name]
    except KeyError:
        raise GraphError(f"unknown graph operator {name!r}") from None


def infer_types(node: Node, inputs: list[TensorType]) -> list[TensorType]:
    """Output types of `node` given its input types (fused nodes: of their body)."""
    if node.op == "fused":
        env = dict(zip(node.inputs, inputs, strict=True))
        for inner in node.attr("body"):
            outs = infer_types(inner, [env[i] for i in inner.inputs])
            env.update(zip(inner.outputs, outs, strict=True))
        return [env[o] for o in node.outputs]
    op = get(node.op)
    if not op.float64 and any(t.dtype == "float64" for t in inputs):
        raise ModelError(f"node {node.name!r} ({node.op}): float64 input is not supported "
                         "(this operator is float32 only)")
    if not op.uint64 and any(t.dtype == "uint64" for t in inputs):
        raise ModelError(f"node {node.name!r} ({node.op}): uint64 input is not supported "
                         "(its lowering would compare or convert it as signed)")
    return op.infer(inputs, node)


def broadcast_shape(*shapes: tuple[int, ...], where: str = "") -> tuple[int, ...]:
    """numpy broadcasting of shapes; GraphError naming `where` if incompatible."""
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        dims = {s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0} - {1}
        if len(dims) > 1:
            raise GraphError(f"{where}: shapes {list(shapes)} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def axis_attr(n, rank: int, default: int, key: str = "axis") -> int:
    """The ONNX node `n`'s axis attribute `key` (or `default`) made non-negative;
    ModelError naming the node if it is outside [-rank, rank)."""
    axis = int(n.attrs.get(key, default))
    if not -rank <= axis < rank:
        raise ModelError(f"node {n.name!r} ({n.op_type}): {key} {axis} out of range "
                         f"for rank {rank}")
    return axis % rank
