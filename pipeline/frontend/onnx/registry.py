"""The ONNX converters: registered per (op_type, opset) with what the backend must
know without running them: the graph ops they emit (float64 and uint64 support
follow from those ops), the inputs they need as build-time constants, and the operator
features they do not implement (`Limit`). pipeline/tools/backend.py derives its
skip reasons from these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.ir.sequence import is_value
from pipeline.ops import get


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
    # graph attributes it inlines: their nodes go through their own converters, so the
    # graph ops those emit may appear among its results too
    subgraphs: tuple[str, ...] = ()

    def emits_for(self, attrs: dict, opset: int) -> set[str]:
        """The graph ops it may produce for a node of decoded attributes `attrs`: its
        emits, and what the converters (at `opset`) of the nodes of the graph
        attributes it inlines emit."""
        return set(self.emits) | {
            op for attr in self.subgraphs if attr in attrs for proto in attrs[attr].node
            for op in getattr(onnx_converter(proto.op_type, opset), "emits", ())}

    @property
    def float64(self) -> bool:
        """Whether float64 tensors are supported: every op it emits lowers float64."""
        return all(get(op).float64 for op in self.emits)

    @property
    def uint64(self) -> bool:
        """Whether uint64 tensors are supported: every op it emits lowers uint64."""
        return all(get(op).uint64 for op in self.emits)


# op_type -> its converters, oldest first
ONNX_CONVERTERS: dict[str, list[Converter]] = {}


def onnx_op(op_type: str, since: int = 1, *, emits: tuple[str, ...],
            build_time_inputs: tuple[int, ...] = (), limits: tuple[Limit, ...] = (),
            subgraphs: tuple[str, ...] = ()):
    """Decorator: register an ONNX converter for opsets >= `since` that produces only
    graph ops in `emits` (and those of the nodes of the graph attributes `subgraphs`
    it inlines), reads the inputs at `build_time_inputs` as constants (a
    static-shape compiler needs them: they decide shapes or loop bounds) and does
    not implement the features in `limits`."""

    def deco(fn):
        entry = Converter(op_type, since, fn, tuple(emits), tuple(build_time_inputs),
                          tuple(limits), tuple(subgraphs))
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




# If, Loop, Scan (frontend/onnx/control.py) and the sequence and optional operators
# (sequence.py): converters fn(ctx, onnx node, source) -> nodes, run by the VM.
CONTROL_CONVERTERS: dict = {}


def vm_converter(ctx, onode):
    """The converter of an If, Loop, Scan or sequence/optional node, or None (Identity
    is the VM's only on a sequence or an optional)."""
    if onode.op_type == "Identity" and not (onode.inputs and is_value(
            ctx.types.get(onode.inputs[0]))):
        return None
    return CONTROL_CONVERTERS.get(onode.op_type)
