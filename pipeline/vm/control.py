"""The instructions of If, Loop and Scan nodes in a graph's VM function.

Every function takes `e`, pipeline/vm/program.py's emitter of that function:
e.get(name) and e.reg (registers by tensor name), e.new() (a fresh register), e.code
(the instructions so far), e.body(node, key, n_formal) (a subgraph's function and
the registers of its captures) and e.graph (for the types)."""

from __future__ import annotations

from pipeline.ir.graph import Node, nbytes
from pipeline.vm import bytecode as bc

__all__ = ["emit_control"]

_INT64, _BOOL = bc.DTYPES.index("int64"), bc.DTYPES.index("bool")


def emit_control(e, node: Node) -> None:
    """Append the code of control-flow `node` to e.code; its outputs get registers."""
    {"if": _if, "loop": _loop, "scan": _scan}[node.op](e, node)


def _if(e, node: Node) -> None:
    cond = e.get(node.inputs[0])
    then_fn, then_args = e.body(node, "then_branch", 0)
    else_fn, else_args = e.body(node, "else_branch", 0)
    dsts = tuple(e.new() for _ in node.outputs)
    at = len(e.code)
    e.code += [None, bc.Invoke(then_fn, tuple(then_args), dsts), None,
               bc.Invoke(else_fn, tuple(else_args), dsts)]
    e.code[at] = bc.If(cond, at + 1, at + 3)
    e.code[at + 2] = bc.Goto(len(e.code))
    e.reg.update(zip(node.outputs, dsts, strict=True))


def _scan_buffers(e, names) -> list[int]:
    """A tensor for each scan output (all its rows), allocated before the loop."""
    regs = []
    for name in names:
        t = e.graph.types[name]
        storage, reg = e.new(), e.new()
        e.code += [bc.AllocStorage(storage, nbytes(t.dtype, t.size)),
                   bc.AllocTensor(reg, storage, 0, bc.DTYPES.index(t.dtype), tuple(t.shape))]
        regs.append(reg)
    return regs


def _moved(e, regs) -> list[int]:
    """Fresh registers holding `regs`' objects: the loop's own, updated each turn."""
    out = [e.new() for _ in regs]
    e.code += [bc.Move(d, s) for d, s in zip(out, regs, strict=True)]
    return out


def _loop(e, node: Node) -> None:
    n, trip = node.attr("n_carried"), node.attr("trip_count")
    inputs = list(node.inputs)
    m = e.get(inputs.pop(0)) if node.attr("has_trip_count") else None
    cond_in = e.get(inputs.pop(0)) if node.attr("has_cond") else None
    carried = _moved(e, [e.get(x) for x in inputs[:n]])
    body, captures = e.body(node, "body", 2 + n)
    scans = _scan_buffers(e, node.outputs[n:]) if trip >= 0 else []
    cond, i = e.new(), e.new()
    e.code += [bc.Move(cond, cond_in) if cond_in is not None else bc.Scalar(cond, _BOOL, 1),
               bc.Scalar(i, _INT64, 0)]
    top, exits = len(e.code), []
    if m is not None:
        less = e.new()
        exits.append(len(e.code) + 1)
        e.code += [bc.Less(less, i, m), None]
    if cond_in is not None:
        exits.append(len(e.code))
        e.code.append(None)
    res = [e.new() for _ in range(1 + n + len(scans))]
    e.code.append(bc.Invoke(body, (i, cond, *carried, *captures), tuple(res)))
    e.code += [bc.CopyAt(s, res[1 + n + k], i) for k, s in enumerate(scans)]
    e.code += [bc.Move(c, res[1 + k]) for k, c in enumerate(carried)]
    if cond_in is not None:
        e.code.append(bc.Move(cond, res[0]))
    e.code += [bc.AddImm(i, i, 1), bc.Goto(top)]
    for at in exits:  # each test jumps on into the loop, or out past its end
        test = e.code[at - 1].dst if isinstance(e.code[at - 1], bc.Less) else cond
        e.code[at] = bc.If(test, at + 1, len(e.code))
    if scans and cond_in is not None:  # stopped early: the rows planned were not all made
        end, left = len(e.code), e.new()
        e.code += [bc.Less(left, i, m), bc.If(left, end + 2, end + 3), bc.Fail(0)]
    e.reg.update(zip(node.outputs, [*carried, *scans], strict=True))


def _scan(e, node: Node) -> None:
    n, k = node.attr("n_state"), node.attr("n_scan_inputs")
    state = _moved(e, [e.get(x) for x in node.inputs[:n]])
    seqs = [e.get(x) for x in node.inputs[n:n + k]]
    body, captures = e.body(node, "body", n + k)
    outs = _scan_buffers(e, node.outputs[n:])
    rows = [e.graph.types[x] for x in node.inputs[n:n + k]]
    i, length, less = e.new(), e.new(), e.new()
    e.code += [bc.Scalar(i, _INT64, 0), bc.Scalar(length, _INT64, rows[0].shape[0])]
    top = len(e.code)
    e.code += [bc.Less(less, i, length), None]
    elems = [e.new() for _ in seqs]
    e.code += [bc.ViewAt(x, s, i, bc.DTYPES.index(t.dtype), tuple(t.shape[1:]))
               for x, s, t in zip(elems, seqs, rows, strict=True)]
    res = [e.new() for _ in range(n + len(outs))]
    e.code.append(bc.Invoke(body, (*state, *elems, *captures), tuple(res)))
    e.code += [bc.CopyAt(o, res[n + j], i) for j, o in enumerate(outs)]
    e.code += [bc.Move(s, res[j]) for j, s in enumerate(state)]
    e.code += [bc.AddImm(i, i, 1), bc.Goto(top)]
    e.code[top + 1] = bc.If(less, top + 2, len(e.code))
    e.reg.update(zip(node.outputs, [*state, *outs], strict=True))
