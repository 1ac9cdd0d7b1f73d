"""The instructions of sequence and optional nodes (pipeline/ops/sequence.py) in a
graph's VM function: each node is one instruction of pipeline/vm/sequence_ins.py
(docs/vm.md). `e` is pipeline/vm/program.py's emitter of the function."""

from __future__ import annotations

from pipeline.ir.graph import Node
from pipeline.ir.sequence import OptionalType, SequenceType
from pipeline.ops.sequence import split_sizes
from pipeline.vm import bytecode as bc

__all__ = ["emit_sequence", "value_kind"]


def value_kind(t) -> tuple[int, str, tuple]:
    """(bytecode.KINDS index, dtype, shape) of an IR type: a tensor, a sequence (its
    elements' dtype and shape, () if unknown) or an optional of either."""
    optional = isinstance(t, OptionalType)
    inner = t.value if optional else t
    if isinstance(inner, SequenceType):
        return 3 if optional else 1, inner.dtype, tuple(inner.shape or ())
    return 2 if optional else 0, inner.dtype, tuple(inner.shape)


def _pos(e, node: Node, k: int) -> int:
    return e.get(node.inputs[k]) if len(node.inputs) > k and node.inputs[k] else -1


def emit_sequence(e, node: Node) -> None:
    """Append the instruction of sequence or optional `node` to e.code; its output
    gets a fresh register."""
    dst, op = e.new(), node.op
    if op == "sequence_construct":
        ins = bc.SeqConstruct(dst, tuple(e.get(i) for i in node.inputs))
    elif op == "sequence_empty":
        ins = bc.SeqConstruct(dst, ())
    elif op == "sequence_insert":
        ins = bc.SeqInsert(dst, e.get(node.inputs[0]), e.get(node.inputs[1]), _pos(e, node, 2))
    elif op == "sequence_at":
        ins = bc.SeqAt(dst, e.get(node.inputs[0]), e.get(node.inputs[1]))
    elif op == "sequence_length":
        ins = bc.SeqLength(dst, e.get(node.inputs[0]))
    elif op == "sequence_erase":
        ins = bc.SeqErase(dst, e.get(node.inputs[0]), _pos(e, node, 1))
    elif op == "split_to_sequence":
        t = e.graph.types[node.inputs[0]]
        axis = node.attr("axis")
        sizes = split_sizes(t.shape[axis], node.attr("split"))
        keep = int(bool(node.attr("keepdims") or node.attr("split")))
        ins = bc.SeqSplit(dst, e.get(node.inputs[0]), axis, keep, tuple(sizes))
    elif op == "optional" and not node.inputs:
        ins = bc.NoneValue(dst)
    elif op == "optional_has_element":
        ins = bc.HasValue(dst, e.get(node.inputs[0]))
    else:  # optional of a value, optional_get_element, value_identity: the same object
        ins = bc.Move(dst, e.get(node.inputs[0]))
    e.code.append(ins)
    e.reg[node.outputs[0]] = dst
