"""ONNX sequence and optional operators: graph ops of pipeline/ops/sequence.py, run
by the VM's sequence instructions (pipeline/vm/sequence.py, docs/vm.md). Registered
beside If/Loop/Scan (importer CONTROL_CONVERTERS): their values are not tensors, so
no kernel converter applies.

SequenceMap, and Loops over known sequences: sequence_map.py.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import ModelError
from pipeline.frontend.onnx.importer import CONTROL_CONVERTERS, ImportContext, OnnxNode
from pipeline.ir.graph import ONNX_DTYPES, Node, TensorType
from pipeline.ir.sequence import OptionalType, SequenceType, is_value


def _position(ctx: ImportContext, n: OnnxNode, pos: int) -> list[str]:
    """The optional position input `pos` of n, checked to be one int32/int64 scalar."""
    if len(n.inputs) <= pos or not n.inputs[pos]:
        return []
    t = ctx.type(n.inputs[pos])
    if t.dtype not in ("int32", "int64") or t.size != 1:
        raise ModelError(f"node {n.name!r} ({n.op_type}): position must be one int32 or "
                         f"int64, is {t.dtype} {list(t.shape)}")
    return [n.inputs[pos]]


def _construct(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    ctx.sequences[n.outputs[0]] = list(n.inputs)
    return [Node.make("sequence_construct", n.name, n.inputs, n.outputs,
                      known=_static(ctx, n.inputs))]


def _static(ctx: ImportContext, names) -> int:
    """1 if no tensor of `names` is typed by a bound only (a data-dependent result, or a
    value read from one: importer ctx.bounded): then an element's type is its shape."""
    return int(ctx.bounded.isdisjoint(names))


def _empty(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    dtype = ONNX_DTYPES.get(int(n.attrs.get("dtype", 1)))
    if dtype is None:
        raise ModelError(f"node {n.name!r} (SequenceEmpty): unsupported dtype "
                         f"{n.attrs.get('dtype')}")
    ctx.sequences[n.outputs[0]] = []
    return [Node.make("sequence_empty", n.name, (), n.outputs, dtype=dtype)]


def _insert(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    at = _position(ctx, n, 2)
    known = ctx.sequences.get(n.inputs[0])
    where = ctx.const(at[0]) if at else np.array(len(known or ()))
    if known is not None and where is not None:  # the elements stay known
        k = int(where)
        known = list(known)
        known.insert(k + len(known) + 1 if k < 0 else k, n.inputs[1])
        ctx.sequences[n.outputs[0]] = known
    return [Node.make("sequence_insert", n.name, (n.inputs[0], n.inputs[1], *at), n.outputs,
                      known=_static(ctx, n.inputs[1:2]))]


def _at(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    at = _position(ctx, n, 1)
    known, where = ctx.sequences.get(n.inputs[0]), ctx.const(at[0]) if at else None
    if known is not None and where is not None and -len(known) <= int(where) < len(known):
        # a known element: that tensor itself, with its own shape
        return [Node.make("value_identity", n.name, (known[int(where)],), n.outputs)]
    return [Node.make("sequence_at", n.name, (n.inputs[0], *at), n.outputs)]


def _length(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    known = ctx.sequences.get(n.inputs[0])
    if known is not None:  # a build-time constant (a Loop over it may unroll: unroll_loop)
        ctx.set_const(n.outputs[0], np.array(len(known), np.int64))
        return []
    return [Node.make("sequence_length", n.name, n.inputs[:1], n.outputs)]


def _erase(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    return [Node.make("sequence_erase", n.name, (n.inputs[0], *_position(ctx, n, 1)),
                      n.outputs)]


def _split(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    t = ctx.type(n.inputs[0])
    axis = int(n.attrs.get("axis", 0))
    if not -len(t.shape) <= axis < len(t.shape):
        raise ModelError(f"node {n.name!r} (SplitToSequence): axis {axis} out of range")
    axis %= len(t.shape)
    split: tuple[int, ...] = ()
    if len(n.inputs) > 1 and n.inputs[1]:
        value = ctx.const(n.inputs[1])
        if value is None:
            raise ModelError(f"node {n.name!r} (SplitToSequence): split must be a constant")
        length = t.shape[axis]
        if value.ndim == 0:  # parts of that size, the last one shorter
            size = int(value)
            if size <= 0:
                raise ModelError(f"node {n.name!r} (SplitToSequence): split {size} <= 0")
            split = tuple(min(size, length - s) for s in range(0, length, size))
        else:
            split = tuple(int(v) for v in value)
    if not _static(ctx, n.inputs[:1]):
        raise ModelError(f"node {n.name!r} (SplitToSequence): its input's shape depends on "
                         "values")
    return [Node.make("split_to_sequence", n.name, n.inputs[:1], n.outputs, axis=axis,
                      keepdims=int(n.attrs.get("keepdims", 1)), split=split)]


def _concat(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    """ConcatFromSequence of a sequence of known tensors: a Concat of them (each
    reshaped with a new axis first for new_axis 1); another sequence's result would
    have a shape known only at run time, which no kernel reads yet."""
    known = ctx.sequences.get(n.inputs[0])
    if not known:
        raise ModelError(f"node {n.name!r} (ConcatFromSequence): the sequence must be built "
                         "from known tensors (SequenceConstruct or SequenceInsert)")
    new = int(n.attrs.get("new_axis", 0))
    rank = len(ctx.type(known[0]).shape) + new
    axis = int(n.attrs["axis"])
    if not -rank <= axis < rank:
        raise ModelError(f"node {n.name!r} (ConcatFromSequence): axis {axis} out of range")
    axis %= rank
    nodes, parts = [], list(known)
    if new:
        for k, x in enumerate(known):
            shape = ctx.type(x).shape
            parts[k] = f"{n.outputs[0]}.part{k}"
            nodes.append(Node.make("reshape", f"{n.name}.{k}", (x,), (parts[k],),
                                   shape=(*shape[:axis], 1, *shape[axis:])))
    return [*nodes, Node.make("concat", n.name, parts, n.outputs, axis=axis)]


def _declared(tp) -> TensorType | SequenceType | None:
    """The IR type of an ONNX TypeProto of a tensor or a sequence of tensors."""
    kind = tp.WhichOneof("value")
    if kind == "sequence_type":
        inner = _declared(tp.sequence_type.elem_type)
        return None if inner is None else SequenceType(inner.dtype, None)
    if kind != "tensor_type" or tp.tensor_type.elem_type not in ONNX_DTYPES:
        return None
    dims = tp.tensor_type.shape.dim
    shape = tuple(d.dim_value if d.HasField("dim_value") else 0 for d in dims)
    return TensorType(shape, ONNX_DTYPES[tp.tensor_type.elem_type])


def _optional(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    if n.inputs and n.inputs[0]:
        return [Node.make("optional", n.name, n.inputs[:1], n.outputs)]
    declared = _declared(n.attrs["type"]) if "type" in n.attrs else None
    if declared is None:
        raise ModelError(f"node {n.name!r} (Optional): an empty optional needs a tensor or "
                         "sequence type")
    seq = isinstance(declared, SequenceType)
    return [Node.make("optional", n.name, (), n.outputs, dtype=declared.dtype,
                      shape=() if seq else declared.shape, is_sequence=int(seq))]


def _has_element(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    if not n.inputs or not n.inputs[0]:  # no input: an empty optional
        name = ctx.add_param(f"{n.outputs[0]}.none", np.array(False))
        return [Node.make("value_identity", n.name, (name,), n.outputs)]
    if not isinstance(ctx.types.get(n.inputs[0]), OptionalType):  # a plain value: present
        name = ctx.add_param(f"{n.outputs[0]}.some", np.array(True))
        return [Node.make("value_identity", n.name, (name,), n.outputs)]
    return [Node.make("optional_has_element", n.name, n.inputs[:1], n.outputs)]


def _get_element(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    return [Node.make("optional_get_element", n.name, n.inputs[:1], n.outputs)]


def _identity(ctx: ImportContext, n: OnnxNode, source: str) -> list[Node]:
    """Identity of a sequence or an optional (a tensor's has its own converter)."""
    return [Node.make("value_identity", n.name, n.inputs[:1], n.outputs)]


def value_input(ctx: ImportContext, n: OnnxNode) -> bool:
    """Whether n's first input is a sequence or an optional (Identity of one is ours)."""
    return bool(n.inputs) and is_value(ctx.types.get(n.inputs[0]))


CONTROL_CONVERTERS.update({

    "SequenceConstruct": _construct, "SequenceEmpty": _empty, "SequenceInsert": _insert,
    "SequenceAt": _at, "SequenceLength": _length, "SequenceErase": _erase,
    "SplitToSequence": _split, "ConcatFromSequence": _concat, "Optional": _optional,
    "OptionalHasElement": _has_element, "OptionalGetElement": _get_element,
    "Identity": _identity,
})
