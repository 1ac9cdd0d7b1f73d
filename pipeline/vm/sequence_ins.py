"""The VM's instructions for sequences and optionals (opcodes 40-49, docs/vm.md).

A register holds a tensor, a storage, a sequence (an immutable list of tensors:
every instruction making one makes a new one) or *none* (an empty optional); an
optional holding a value is that value itself. A position operand is the register
of an int64 (or int32) scalar, or -1 when the ONNX node has none.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HasValue", "NoneValue", "SeqAt", "SeqConstruct", "SeqErase", "SeqInsert",
           "SeqLength", "SeqSplit", "SEQUENCE_OPCODES"]


@dataclass(frozen=True)
class SeqConstruct:
    """dst = a new sequence of copies of the tensors in `items` (none: empty)."""

    dst: int
    items: tuple[int, ...]


@dataclass(frozen=True)
class SeqInsert:
    """dst = sequence `seq` with a copy of tensor `item` inserted before `position`
    (-1: appended; a negative value counts from the end)."""

    dst: int
    seq: int
    item: int
    position: int


@dataclass(frozen=True)
class SeqAt:
    """dst = element `position` of sequence `seq` (negative: from the end), no copy."""

    dst: int
    seq: int
    position: int


@dataclass(frozen=True)
class SeqLength:
    """dst = a new int64 scalar: the length of sequence `seq`."""

    dst: int
    seq: int


@dataclass(frozen=True)
class SeqErase:
    """dst = sequence `seq` without element `position` (-1: the last one)."""

    dst: int
    seq: int
    position: int


@dataclass(frozen=True)
class SeqSplit:
    """dst = a new sequence of the parts of tensor `src` along `axis`, part k
    `sizes[k]` long (copies); with `keepdims` 0 (parts of 1) the axis is dropped."""

    dst: int
    src: int
    axis: int
    keepdims: int
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class NoneValue:
    """dst = none (an empty optional)."""

    dst: int


@dataclass(frozen=True)
class HasValue:
    """dst = a new bool scalar: whether register `src` holds a value (not none)."""

    dst: int
    src: int


SEQUENCE_OPCODES: dict[type, int] = {SeqConstruct: 40, SeqInsert: 41, SeqAt: 42,
                                     SeqLength: 43, SeqErase: 44, SeqSplit: 45,
                                     NoneValue: 46, HasValue: 47}
