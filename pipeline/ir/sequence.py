"""Sequence and optional values of the graph IR (ONNX's seq(...) and optional(...)),
which only the VM holds (docs/vm.md, "Sequences and optionals").

A sequence's elements share a dtype; `shape` is their common shape when every
element is known to have it, else None (a SplitToSequence of uneven parts, a Loop
appending slices of growing length): then no kernel may read an element, only
other sequence operators and graph outputs. An optional holds a tensor or a
sequence, or nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SequenceType:
    """A sequence of tensors of `dtype`, each of `shape` (None: shapes differ or are
    known only at run time)."""

    dtype: str
    shape: tuple[int, ...] | None = None

    @property
    def symbolic(self) -> bool:
        return False

    def to_json(self) -> list:
        return ["sequence", self.dtype, None if self.shape is None else list(self.shape)]


@dataclass(frozen=True)
class OptionalType:
    """An optional value: a tensor or a sequence of `value`'s type, or none."""

    value: object  # a TensorType (pipeline/ir/graph.py, which imports this) or SequenceType

    @property
    def symbolic(self) -> bool:
        return False

    def to_json(self) -> list:
        return ["optional", self.value.to_json()]


def type_from_json(doc: list, tensor_type) -> SequenceType | OptionalType:
    """The sequence or optional type of `to_json`'s list; `tensor_type` decodes a
    tensor's [shape, dtype]."""
    if doc[0] == "sequence":
        return SequenceType(doc[1], None if doc[2] is None else tuple(doc[2]))
    inner = doc[1]
    return OptionalType(type_from_json(inner, tensor_type) if isinstance(inner[0], str)
                        else tensor_type(inner))


def is_value(t) -> bool:
    """Whether `t` types a sequence or an optional (not a plain tensor)."""
    return isinstance(t, (SequenceType, OptionalType))
