"""The operator registry: one OpDef per graph-IR operator, plus ONNX converters.

An operator is defined once, in the module of its family (elementwise, nn,
linalg, shape), with:
  - its shape rule (`infer`: input types + node -> output types),
  - its kind, which decides fusion: "elementwise" ops become epilogues of the
    kernel before them; "anchor" ops start a kernel and accept an epilogue;
    "opaque" ops form a kernel of their own,
  - its lowering: `scalar` (elementwise: LLVM values in, one value out) or
    `lower` (anchor/opaque: writes loops with a KernelBuilder),
  - optionally `numpy`, used by constant folding,
  - whether its lowering handles float64 (`float64=True`); a float64 input to
    any other operator is a ModelError naming the node (infer_types),
  - and the ONNX converters that produce it, registered per (op_type, opset).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.errors import GraphError, ModelError
from pipeline.ir.graph import Node, TensorType

KINDS = ("elementwise", "anchor", "opaque")


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str
    infer: Callable[[list[TensorType], Node], list[TensorType]]
    scalar: Callable | None = None  # (kb, args: list[ir.Value], node) -> ir.Value
    lower: Callable | None = None   # (kb, node, ins: list[Buffer], out: Buffer, epilogue)
    numpy: Callable | None = None   # (arrays: list[np.ndarray], node) -> list[np.ndarray]
    float64: bool = False           # the lowering is dtype-generic over float32/float64


OPS: dict[str, OpDef] = {}
# op_type -> list of (since_version, converter); converters: (ctx, onnx_node) -> [Node]
ONNX_CONVERTERS: dict[str, list[tuple[int, Callable]]] = {}


def register(name: str, kind: str, infer, *, scalar=None, lower=None, numpy=None,
             float64: bool = False) -> OpDef:
    """Add a graph-IR operator to the registry and return its OpDef."""
    assert kind in KINDS, kind
    assert name not in OPS, f"operator {name} registered twice"
    assert (scalar is not None) == (kind == "elementwise"), name
    OPS[name] = OpDef(name, kind, infer, scalar, lower, numpy, float64)
    return OPS[name]


def onnx_op(op_type: str, since: int = 1):
    """Decorator: register an ONNX converter for opsets >= `since`."""

    def deco(fn):
        ONNX_CONVERTERS.setdefault(op_type, []).append((since, fn))
        ONNX_CONVERTERS[op_type].sort(key=lambda e: e[0])
        return fn

    return deco


def onnx_converter(op_type: str, opset: int) -> Callable | None:
    """The converter for `op_type` at `opset`: the newest one not newer than it."""
    best = None
    for since, fn in ONNX_CONVERTERS.get(op_type, ()):
        if since <= opset:
            best = fn
    return best


def get(name: str) -> OpDef:
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
