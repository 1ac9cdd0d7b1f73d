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

K and V repeated per query head group (LLaMA's repeat_kv: Unsqueeze, Expand, Reshape)
are read unrepeated, the group an attribute of the kernel.

Before that it fuses the rotary embedding exporters write for LLaMA-style models,

    x * cos + Concat(Neg(x[..., D/2:]), x[..., :D/2]) * sin      (rotate_half)

(two Slices, Neg, Concat, two Muls and an Add) into one rotary_embedding(x, cos,
sin) when cos and sin are constants whose two halves along D are equal (cat(freqs,
freqs), as every such model builds them): the kernel reads their first halves.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from pipeline.ir.graph import Graph, Node, add_param
from pipeline.ops.geometry import MAX_PANEL_FLOATS, panel_floats
from pipeline.transform.attention_split import fuse_split_attention, read_cache_parts
from pipeline.transform.context import PassConfig
from pipeline.transform.util import fuse_chains, sole_user

_IDENTITY = (0, 1, 2, 3)


def fuse_attention(graph: Graph, params: dict, cfg: PassConfig):
    """Rewrite each rotary embedding, then each attention chain (module doc), then each
    split KV-cache attention (transform/attention_split.py), into one rotary_embedding
    or attention node; then let attention read a KV cache and its new keys apart
    (read_cache_parts)."""
    graph, params = _fuse_rotary(graph, params)
    types, params = dict(graph.types), dict(params)

    def constant(hint: str, value: np.ndarray) -> str:
        return add_param(types, params, hint, value)

    def fuse(node: Node, consumers: dict, outputs: set):
        match = _match(node, graph, params, consumers, outputs, constant)
        if match is None:
            return None
        members, inputs, attrs = match
        last = members[-1]
        return members, Node.make("attention", last.name, inputs, last.outputs, **attrs)

    graph, params = fuse_chains(graph, params, "matmul", fuse, types)
    graph, params = fuse_split_attention(graph, params, _scalar, _fold_transposes)
    return read_cache_parts(graph), params


def _match(scores: Node, graph: Graph, params: dict, consumers: dict, outputs: set,
           constant):
    """(nodes replaced, inputs, attrs) of the chain from the scores MatMul, or None;
    constant(hint, value) names a new parameter (a mask made from a Where)."""
    types = graph.types
    user = partial(sole_user, consumers, outputs)

    if scores.attr("trans_a") or scores.attr("trans_b"):
        return None
    (q, kt), scale, prescaled = _prescaled(scores, graph, params, user)
    if any(len(types[t].shape) != 4 or types[t].dtype != "float32" for t in (q, kt)):
        return None
    members, mask = [*prescaled, scores], None
    cur = user(scores.outputs[0])
    if cur is not None and cur.op in ("div", "mul") and cur.inputs[0] == scores.outputs[0]:
        c = _scalar(params, cur.inputs[1])
        if c is None or (cur.op == "div" and c == 0.0):
            return None
        scale *= 1.0 / c if cur.op == "div" else c
        members.append(cur)
        cur = user(cur.outputs[0])
    prev = members[-1].outputs[0]
    if cur is not None and cur.op in ("add", "where"):
        mask = _mask(cur, prev, types, params, constant)
        if mask is None:
            return None
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
    if isinstance(d, str) or isinstance(dv, str):
        return None
    if (isinstance(sq, int) and isinstance(sk, int)  # symbolic: attention_dims.py, no panels
            and panel_floats(sq, d, sk, dv) > MAX_PANEL_FLOATS):
        return None
    # Fold the Transposes that only feed this chain; the one after it, if it is the
    # only reader of the result.
    inputs, attrs, folded = _fold_transposes(graph, user, (q, kt, v))
    repeated = [_repeated_heads(graph, user, name) for name in inputs[1:3]]
    if repeated[0] and repeated[1] and repeated[0][1] == repeated[1][1]:
        inputs[1:3] = [source for source, _, _ in repeated]
        folded += [node for _, _, nodes in repeated for node in nodes]
        attrs["group"] = repeated[0][1]
    out_perm = _IDENTITY
    after = user(context.outputs[0])
    if after is not None and after.op == "transpose":
        out_perm = tuple(after.attr("perm"))
        members.append(after)
    attrs.update(out_perm=out_perm, scale=scale)
    logical = (*types[q].shape[:3], dv)
    if types[members[-1].outputs[0]].shape != tuple(logical[p] for p in out_perm) or \
            types[members[len(prescaled) + 1].outputs[0]].shape != types[scores.outputs[0]].shape:
        return None  # a constant of higher rank broadcast the chain: keep it
    if mask is not None:
        inputs.append(mask)
    return folded + members, inputs, attrs


def _fold_transposes(graph: Graph, user, operands: tuple[str, str, str]):
    """(inputs, {q_perm, k_perm, v_perm}, Transposes folded) for Q, Kᵀ, V: a Transpose
    whose only reader is the chain is read through by the kernel's perm."""
    inputs, attrs, folded = [], {}, []
    for name, key in zip(operands, ("q_perm", "k_perm", "v_perm"), strict=True):
        src, perm = name, _IDENTITY
        producer = _producer(graph, name)
        if producer is not None and producer.op == "transpose" and user(name) is not None:
            src, perm = producer.inputs[0], tuple(producer.attr("perm"))
            folded.append(producer)
        inputs.append(src)
        attrs[key] = perm
    return inputs, attrs, folded


def _repeated_heads(graph: Graph, user, name: str):
    """(x, G, nodes) when `name` is x [B, H, S, D] with each head repeated G times in a
    row (repeat_kv: Unsqueeze(2), Expand to G, Reshape to [B, H * G, S, D]) and read
    only by this chain; else None."""
    merge = _producer(graph, name)
    spread = _producer(graph, merge.inputs[0]) if merge is not None and \
        merge.op == "reshape" and user(name) is not None else None
    split = _producer(graph, spread.inputs[0]) if spread is not None and \
        spread.op == "expand" and user(spread.outputs[0]) is merge else None
    if split is None or split.op != "reshape" or user(split.outputs[0]) is not spread:
        return None
    x = split.inputs[0]
    shape = graph.types[x].shape
    if len(shape) != 4 or tuple(split.attr("shape")) != (*shape[:2], 1, *shape[2:]):
        return None
    group = tuple(spread.attr("shape"))[2] if len(spread.attr("shape")) == 5 else 0
    if tuple(spread.attr("shape")) != (*shape[:2], group, *shape[2:]) or group < 2 or \
            tuple(merge.attr("shape")) != (shape[0], shape[1] * group, *shape[2:]):
        return None
    return x, group, [split, spread, merge]


def _scalar(params: dict, name: str):
    value = params.get(name)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def _prescaled(scores: Node, graph: Graph, params: dict, user):
    """((q, kt), scale, nodes): the scores' operands before a Mul by a constant scalar
    each may have (scaled_dot_product_attention scales both by sqrt(scale))."""
    operands, scale, nodes = [], 1.0, []
    for name in scores.inputs:
        node = _producer(graph, name)
        c = [_scalar(params, i) for i in node.inputs] if node is not None and \
            node.op == "mul" and user(name) is scores else [None, None]
        if c[1] is not None or c[0] is not None:
            k = 1 if c[1] is not None else 0
            operands.append(node.inputs[1 - k])
            scale *= c[k]
            nodes.append(node)
        else:
            operands.append(name)
    return operands, scale, nodes


def _mask(node: Node, prev: str, types: dict, params: dict, constant) -> str | None:
    """The additive mask of an Add of `prev` and a float32 tensor, or of a Where
    between `prev` and a constant fill under a constant condition (masked_fill: the
    mask is 0 where prev is kept, the fill elsewhere); None if it is neither."""
    if types[node.outputs[0]].shape != types[prev].shape:
        return None
    if node.op == "add":
        other = [i for i in node.inputs if i != prev]
        return other[0] if len(other) == 1 and types[other[0]].dtype == "float32" else None
    cond, a, b = node.inputs
    keep = params.get(cond)
    if keep is None or (a == prev) == (b == prev):
        return None
    fill = _scalar(params, b if a == prev else a)
    if fill is None:
        return None
    bias = np.where(keep, 0.0, fill) if a == prev else np.where(keep, fill, 0.0)
    return constant(f"{node.name}.mask", bias.astype(np.float32))


def _producer(graph: Graph, name: str) -> Node | None:
    return next((n for n in graph.nodes if name in n.outputs), None)


def _fuse_rotary(graph: Graph, params: dict):
    types, params = dict(graph.types), dict(params)

    def fuse(neg: Node, consumers: dict, outputs: set):
        match = _match_rotary(neg, graph, params, consumers, outputs)
        if match is None:
            return None
        chain, x, cos, sin = match
        half = types[x].shape[-1] // 2
        tables = [add_param(types, params, f"{chain[-1].name}.{tag}",
                            np.ascontiguousarray(params[t][..., :half]))
                  for tag, t in (("cos", cos), ("sin", sin))]
        return chain, Node.make("rotary_embedding", chain[-1].name, [x, *tables],
                                chain[-1].outputs, interleaved=0)

    return fuse_chains(graph, params, "neg", fuse, types)


def _match_rotary(neg: Node, graph: Graph, params: dict, consumers: dict, outputs: set):
    """(nodes in order, x, cos, sin) of the rotate_half chain around `neg`, or None."""
    user = partial(sole_user, consumers, outputs)
    upper = _producer(graph, neg.inputs[0])
    if upper is None or upper.op != "slice" or user(upper.outputs[0]) is not neg:
        return None
    x = upper.inputs[0]
    shape = graph.types[x].shape
    d = shape[-1]
    if graph.types[x].dtype != "float32" or d % 2 or not _half(upper, shape, d // 2):
        return None
    cat = user(neg.outputs[0])
    if cat is None or cat.op != "concat" or cat.attr("axis") != len(shape) - 1 or \
            len(cat.inputs) != 2 or cat.inputs[0] != neg.outputs[0]:
        return None
    lower = _producer(graph, cat.inputs[1])
    if lower is None or lower.op != "slice" or lower.inputs[0] != x or \
            user(lower.outputs[0]) is not cat or not _half(lower, shape, 0):
        return None
    times_sin = user(cat.outputs[0])
    if times_sin is None or times_sin.op != "mul":
        return None
    sin = next((i for i in times_sin.inputs if i != cat.outputs[0]), None)
    add = user(times_sin.outputs[0])
    if add is None or add.op != "add":
        return None
    times_cos = _producer(graph, next((i for i in add.inputs if i != times_sin.outputs[0]),
                                      ""))
    if times_cos is None or times_cos.op != "mul" or x not in times_cos.inputs or \
            user(times_cos.outputs[0]) is not add:
        return None
    cos = next((i for i in times_cos.inputs if i != x), x)
    if not all(_halves_equal(params.get(t), shape) for t in (cos, sin)) or \
            graph.types[add.outputs[0]].shape != shape:
        return None
    return [upper, neg, lower, cat, times_sin, times_cos, add], x, cos, sin


def _half(node: Node, shape: tuple, start: int) -> bool:
    """node slices the last axis of `shape` to [start, start + D/2), keeping the rest."""
    d = shape[-1]
    return tuple(node.attr("starts")) == (0,) * (len(shape) - 1) + (start,) and \
        set(node.attr("steps")) == {1} and tuple(node.attr("shape")) == (*shape[:-1], d // 2)


def _halves_equal(value, shape: tuple) -> bool:
    """A float32 constant broadcasting to `shape` whose two halves along the last axis
    are equal (so its first half serves both rotated halves)."""
    if value is None or value.dtype != np.float32 or value.ndim > len(shape) or \
            value.shape[-1] != shape[-1]:
        return False
    lead = (1,) * (len(shape) - value.ndim) + value.shape
    if any(a not in (1, b) for a, b in zip(lead, shape, strict=True)):
        return False
    half = shape[-1] // 2
    return bool(np.array_equal(value[..., :half], value[..., half:]))
