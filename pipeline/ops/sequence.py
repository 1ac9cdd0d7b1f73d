"""Sequence and optional operators (ONNX's SequenceConstruct ... OptionalGetElement):
their graph ops and type rules. Only the VM runs them, with instructions, not
kernels (pipeline/vm/sequence.py), so like If/Loop/Scan they are not in
pipeline.ops.OPS; the importer's infer_types calls `sequence_types`.

    sequence_construct  (*tensors) -> seq
    sequence_empty      () -> seq                        attr dtype
    sequence_insert     (seq, tensor[, position]) -> seq
    sequence_at         (seq, position) -> tensor        (the elements' shape must be known)
    sequence_length     (seq) -> int64 scalar
    sequence_erase      (seq[, position]) -> seq
    split_to_sequence   (tensor) -> seq                  attrs axis, keepdims, split (sizes)
    optional            ([value]) -> optional            attr dtype, shape, is_sequence (empty)
    optional_has_element (optional) -> bool scalar       (no input: false)
    optional_get_element (optional) -> its value
    value_identity      (seq or optional) -> the same
"""

from __future__ import annotations

from pipeline.errors import GraphError
from pipeline.ir.graph import TensorType
from pipeline.ir.sequence import OptionalType, SequenceType

__all__ = ["SEQUENCE_OPS", "join", "join_branches", "sequence_types", "split_sizes"]

SEQUENCE_OPS = ("sequence_construct", "sequence_empty", "sequence_insert", "sequence_at",
                "sequence_length", "sequence_erase", "split_to_sequence", "optional",
                "optional_has_element", "optional_get_element", "value_identity")


def _common(dtype: str, shapes: list) -> SequenceType:
    """A sequence of `dtype` whose elements have `shapes` (None: one unknown)."""
    same = len(set(shapes)) == 1 and shapes[0] is not None
    return SequenceType(dtype, shapes[0] if same else None)


def _sequence(node, t) -> SequenceType:
    if not isinstance(t, SequenceType):
        raise GraphError(f"node {node.name!r} ({node.op}): input is {t}, not a sequence")
    return t


def split_sizes(length: int, split: tuple[int, ...]) -> list[int]:
    """The parts' lengths along the axis: `split`, or parts of 1 when it is empty."""
    if not split:
        return [1] * length
    if sum(split) != length or any(s < 0 for s in split):
        raise GraphError(f"split {list(split)} does not add up to the axis length {length}")
    return list(split)


def sequence_types(node, inputs: list) -> list:
    """The output type of sequence or optional op `node` given its input types."""
    op = node.op
    if op == "sequence_construct":
        if not inputs or len({t.dtype for t in inputs}) != 1:
            raise GraphError(f"node {node.name!r}: SequenceConstruct of no tensor or of "
                             "several dtypes")
        shapes = [tuple(t.shape) if node.attr("known", 1) else None for t in inputs]
        return [_common(inputs[0].dtype, shapes)]
    if op == "sequence_empty":
        return [SequenceType(node.attr("dtype"), None)]
    if op == "sequence_insert":
        seq, t = _sequence(node, inputs[0]), inputs[1]
        if t.dtype != seq.dtype:
            raise GraphError(f"node {node.name!r}: inserts {t.dtype} into a sequence of "
                             f"{seq.dtype}")
        return [SequenceType(seq.dtype, tuple(t.shape) if seq.shape == tuple(t.shape)
                             and node.attr("known", 1) else None)]
    if op == "sequence_at":
        seq = _sequence(node, inputs[0])
        if seq.shape is None:
            raise GraphError(f"node {node.name!r} (SequenceAt): the sequence's elements "
                             "differ in shape or are known only at run time")
        return [TensorType(seq.shape, seq.dtype)]
    if op == "sequence_length":
        _sequence(node, inputs[0])
        return [TensorType((), "int64")]
    if op in ("sequence_erase", "value_identity"):
        return [inputs[0]]
    if op == "split_to_sequence":
        t, axis = inputs[0], node.attr("axis")
        sizes = split_sizes(t.shape[axis], node.attr("split"))
        keep = node.attr("keepdims") or node.attr("split")
        shapes = [(*t.shape[:axis], *((s,) if keep else ()), *t.shape[axis + 1:])
                  for s in sizes]
        return [_common(t.dtype, shapes) if shapes else SequenceType(t.dtype, None)]
    if op == "optional":
        if inputs:
            return [OptionalType(inputs[0])]
        shape = node.attr("shape")
        inner = (SequenceType(node.attr("dtype"), shape) if node.attr("is_sequence")
                 else TensorType(shape, node.attr("dtype")))
        return [OptionalType(inner)]
    if op == "optional_has_element":
        return [TensorType((), "bool")]
    if op == "optional_get_element":
        t = inputs[0]
        return [t.value if isinstance(t, OptionalType) else t]
    raise GraphError(f"unknown sequence op {op!r}")


def join(a, b):
    """The type both `a` and `b` have (an If's branches returning sequences whose
    elements differ in shape: a sequence of unknown shapes), or None."""
    if a == b:
        return a
    if isinstance(a, SequenceType) and isinstance(b, SequenceType) and a.dtype == b.dtype:
        return SequenceType(a.dtype, None)
    if isinstance(a, OptionalType) and isinstance(b, OptionalType):
        inner = join(a.value, b.value)
        return None if inner is None else OptionalType(inner)
    return None


def join_branches(then, orelse) -> list:
    """An If's output types: its branch graphs' (`then`, `orelse`) results joined."""
    return [join(then.types[a], orelse.types[b])
            for a, b in zip(then.outputs, orelse.outputs, strict=True)]
