"""The operator registry: one OpDef per graph-IR operator, plus ONNX converters.

An operator is defined once, in the module of its family (elementwise, nn,
linalg, shape), with:
  - its shape rule (`infer`: input types + node -> output types),
  - its kind, which decides fusion: "elementwise" ops become epilogues of the
    kernel before them; "anchor" ops start a kernel and accept an epilogue;
    "opaque" ops form a kernel of their own,
  - its lowering: `scalar` (elementwise: LLVM values in, one value out) or
    `lower` (anchor/opaque: writes loops with a KernelBuilder),
  - optionally `numpy`, used by constant folding (and, with `sample`, the
    reference tests/ops/test_registry_ops.py compares the kernel with),
  - whether its lowering handles float64 (`float64=True`); a float64 input to
    any other operator is a ModelError naming the node (infer_types),
  - and the ONNX converters that produce it, registered per (op_type, opset)
    with what the backend must know without running them: the graph ops they
    emit (float64 support follows from those ops), the inputs they need as
    build-time constants, and the operator features they do not implement
    (`Limit`). pipeline/tools/backend.py derives its skip reasons from these.
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
    # (rng: np.random.Generator, dtype: "float32" | "float64") -> (arrays, attrs): small
    # valid inputs and attributes, for testing the kernel against `numpy`.
    sample: Callable | None = None


@dataclass(frozen=True)
class NodeView:
    """What a Limit sees of one ONNX node: attributes (as onnx decodes them: strings
    are bytes), input names and the input and output types ONNX infers."""

    op_type: str
    opset: int
    attrs: dict
    names: tuple[str, ...]                         # input names, "" if absent
    inputs: tuple[tuple[int, tuple] | None, ...]   # (ONNX elem_type, dims), None if unknown
    outputs: tuple[tuple[int, tuple] | None, ...]

    def given(self, pos: int) -> bool:
        """Whether optional input `pos` is present."""
        return pos < len(self.names) and bool(self.names[pos])


@dataclass(frozen=True)
class Limit:
    """An operator feature a converter does not implement: `applies(node)` says whether
    an ONNX node uses it; the backend then skips the model with `reason`."""

    reason: str
    applies: Callable[[NodeView], bool]


@dataclass(frozen=True)
class Converter:
    """An ONNX converter for opsets >= `since` and what it declares about itself."""

    op_type: str
    since: int
    fn: Callable                         # (ctx, onnx_node) -> [Node]
    emits: tuple[str, ...]               # every graph op `fn` may produce
    build_time_inputs: tuple[int, ...]   # input positions it needs as constants
    limits: tuple[Limit, ...]            # features it does not implement

    @property
    def float64(self) -> bool:
        """Whether float64 tensors are supported: every op it emits lowers float64."""
        return all(get(op).float64 for op in self.emits)


OPS: dict[str, OpDef] = {}
# op_type -> its converters, oldest first
ONNX_CONVERTERS: dict[str, list[Converter]] = {}


def register(name: str, kind: str, infer, *, scalar=None, lower=None, numpy=None,
             float64: bool = False, sample=None) -> OpDef:
    """Add a graph-IR operator to the registry and return its OpDef."""
    assert kind in KINDS, kind
    assert name not in OPS, f"operator {name} registered twice"
    assert (scalar is not None) == (kind == "elementwise"), name
    OPS[name] = OpDef(name, kind, infer, scalar, lower, numpy, float64, sample)
    return OPS[name]


def onnx_op(op_type: str, since: int = 1, *, emits: tuple[str, ...],
            build_time_inputs: tuple[int, ...] = (), limits: tuple[Limit, ...] = ()):
    """Decorator: register an ONNX converter for opsets >= `since` that produces only
    graph ops in `emits`, reads the inputs at `build_time_inputs` as constants (a
    static-shape compiler needs them: they decide shapes or loop bounds) and does
    not implement the features in `limits`."""

    def deco(fn):
        entry = Converter(op_type, since, fn, tuple(emits), tuple(build_time_inputs),
                          tuple(limits))
        ONNX_CONVERTERS.setdefault(op_type, []).append(entry)
        ONNX_CONVERTERS[op_type].sort(key=lambda e: e.since)
        return fn

    return deco


def onnx_converter(op_type: str, opset: int) -> Converter | None:
    """The converter for `op_type` at `opset`: the newest one not newer than it."""
    best = None
    for entry in ONNX_CONVERTERS.get(op_type, ()):
        if entry.since <= opset:
            best = entry
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
