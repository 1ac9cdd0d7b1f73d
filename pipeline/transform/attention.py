"""FuseAttention: scaled dot-product attention as one `attention` kernel (ops/attention.py).

Exporters write self-attention as

    [Transpose] Q, [Transpose] Kᵀ, [Transpose] V       (heads split from [B, S, H, D])
    S = MatMul(Q, Kᵀ) -> [Div or Mul by a constant scalar] -> [Add mask]
      -> Softmax(last axis) -> MatMul(., V) -> [Transpose]   (heads merged again)

five to nine kernels, two of them batched products on tiny matrices and up to four
transposes that only move data. This pass replaces the chain from the first MatMul
to the second (and the Transposes around it whose results nothing else reads) by one
attention node that reads Q, K, V in their original layouts and writes the merged
layout directly. It applies to float32 rank-4 operands with equal batch and head
dims whose stack panels fit (attention.MAX_PANEL_FLOATS); anything else is left.
"""

from __future__ import annotations

from functools import partial

from pipeline.ir.graph import Graph, Node
from pipeline.ops.geometry import MAX_PANEL_FLOATS, panel_floats
from pipeline.transform.context import PassConfig
from pipeline.transform.util import fuse_chains, sole_user

_IDENTITY = (0, 1, 2, 3)


def fuse_attention(graph: Graph, params: dict, cfg: PassConfig):
    """Rewrite each attention chain (module doc) into one attention node."""
    def fuse(node: Node, consumers: dict, outputs: set):
        match = _match(node, graph, params, consumers, outputs)
        if match is None:
            return None
        members, inputs, attrs = match
        last = members[-1]
        return members, Node.make("attention", last.name, inputs, last.outputs, **attrs)

    return fuse_chains(graph, params, "matmul", fuse)


def _match(scores: Node, graph: Graph, params: dict, consumers: dict, outputs: set):
    """(nodes replaced, inputs, attrs) of the chain from the scores MatMul, or None."""
    types = graph.types
    user = partial(sole_user, consumers, outputs)

    def scalar(name: str):
        value = params.get(name)
        return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None

    if scores.attr("trans_a") or scores.attr("trans_b"):
        return None
    q, kt = scores.inputs
    if any(len(types[t].shape) != 4 or types[t].dtype != "float32" for t in (q, kt)):
        return None
    members, scale, mask = [scores], 1.0, None
    cur = user(scores.outputs[0])
    if cur is not None and cur.op in ("div", "mul") and cur.inputs[0] == scores.outputs[0]:
        c = scalar(cur.inputs[1])
        if c is None or (cur.op == "div" and c == 0.0):
            return None
        scale = 1.0 / c if cur.op == "div" else c
        members.append(cur)
        cur = user(cur.outputs[0])
    if cur is not None and cur.op == "add":
        prev = members[-1].outputs[0]
        other = [i for i in cur.inputs if i != prev]
        if len(other) != 1 or types[cur.outputs[0]].shape != types[prev].shape or \
                types[other[0]].dtype != "float32":
            return None
        mask = other[0]
        members.append(cur)
        cur = user(cur.outputs[0])
    if cur is None or cur.op != "softmax" or cur.attr("axis") != 3 or cur.attr("flatten"):
        return None
    members.append(cur)
    context = user(cur.outputs[0])
    if context is None or context.op != "matmul" or context.inputs[0] != cur.outputs[0] or \
            context.attr("trans_a") or context.attr("trans_b"):
        return None
    v = context.inputs[1]
    if len(types[v].shape) != 4 or types[v].dtype != "float32":
        return None
    members.append(context)
    batch = types[scores.outputs[0]].shape[:2]
    if types[q].shape[:2] != batch or types[kt].shape[:2] != batch or \
            types[v].shape[:2] != batch:
        return None  # broadcast batch or head dims: leave it to matmul
    (_, _, sq, d), (_, _, _, sk), dv = types[q].shape, types[kt].shape, types[v].shape[3]
    if panel_floats(sq, d, sk, dv) > MAX_PANEL_FLOATS:
        return None
    # Fold the Transposes that only feed this chain; the one after it, if it is the
    # only reader of the result.
    inputs, attrs, folded = [], {}, []
    for name, key in ((q, "q_perm"), (kt, "k_perm"), (v, "v_perm")):
        src, perm = name, _IDENTITY
        producer = _producer(graph, name)
        if producer is not None and producer.op == "transpose" and \
                user(name) is not None:
            src, perm = producer.inputs[0], tuple(producer.attr("perm"))
            folded.append(producer)
        inputs.append(src)
        attrs[key] = perm
    out_perm = _IDENTITY
    after = user(context.outputs[0])
    if after is not None and after.op == "transpose":
        out_perm = tuple(after.attr("perm"))
        members.append(after)
    attrs.update(out_perm=out_perm, scale=scale)
    logical = (*types[q].shape[:3], dv)
    if types[members[-1].outputs[0]].shape != tuple(logical[p] for p in out_perm) or \
            types[members[1].outputs[0]].shape != types[scores.outputs[0]].shape:
        return None  # a constant of higher rank broadcast the chain: keep it
    if mask is not None:
        inputs.append(mask)
    return folded + members, inputs, attrs


def _producer(graph: Graph, name: str) -> Node | None:
    return next((n for n in graph.nodes if name in n.outputs), None)
