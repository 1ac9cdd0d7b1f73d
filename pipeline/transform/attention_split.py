"""FuseAttention's split KV-cache form: attention whose scores are computed in two
parts, the cached keys unmasked and the new keys masked, joined along the key axis
before the Softmax (tests/support/decoder_models.py writes it so, which needs no
Range over a symbolic length):

    old = MatMul(Q, Transpose(K_past))          [B, H, Sq, past]
    new = MatMul(Q, Transpose(K_new)) [+ mask]  [B, H, Sq, Sq]
    Softmax(Concat(old, new, axis=-1)) -> MatMul(., V_all) -> [Transpose]

with K_all = Concat(K_past, K_new, axis=2) computed anyway (the present cache) and
V_all holding as many keys as the scores. That is attention over K_all and V_all
whose mask covers only the last keys (attribute mask_keys="last", ops/attention.py),
one `attention` node instead of two scalar batched products, a Concat of the scores
and a Softmax over a runtime length (kernels/runtime_dims.py) when the lengths are
symbolic. A Mul of Q by a constant scalar read only by the two products becomes the
kernel's scale. Only for a symbolic key length (the VM's runtime-length kernel,
kernels/attention_dims.py, reads such a mask); a static graph keeps its products.

Then (read_cache_parts) an attention over a runtime key count whose K and V are each
a Concat of the cache and the new keys reads the two parts (attribute appended):
the Concats stay for the present outputs, but the attention no longer reads their
copy, so their writes need not be in the cache (kernels/runtime_dims.py streams
them past it when nothing else reads them).
"""

from __future__ import annotations

from functools import partial

from pipeline.ir.graph import Graph, Node
from pipeline.transform.util import fuse_chains, sole_user

_TRANSPOSED = (0, 1, 3, 2)


def fuse_split_attention(graph: Graph, params: dict, scalar, fold_transposes):
    """graph with each split attention (module doc) as one attention node; scalar(params,
    name) reads a constant scalar, fold_transposes(graph, user, (q, kt, v)) gives the
    inputs and perms reading through Transposes (transform/attention.py)."""

    def fuse(softmax: Node, consumers: dict, outputs: set):
        user = partial(sole_user, consumers, outputs)
        found = _match(softmax, graph, params, consumers, user, scalar)
        if found is None:
            return None
        members, (q, k_all, v_all, mask), scale = found
        inputs, attrs, folded = fold_transposes(graph, user, (q, k_all, v_all))
        attrs.update(k_perm=_TRANSPOSED, scale=scale, out_perm=(0, 1, 2, 3))
        after = user(members[-1].outputs[0])
        if after is not None and after.op == "transpose":
            attrs["out_perm"] = tuple(after.attr("perm"))
            members.append(after)
        if mask is not None:
            inputs.append(mask)
            attrs["mask_keys"] = "last"
        last = members[-1]
        return folded + members, Node.make("attention", last.name, inputs, last.outputs,
                                           **attrs)

    return fuse_chains(graph, params, "softmax", fuse)


def read_cache_parts(graph: Graph) -> Graph:
    """graph with each attention over a runtime key count whose K and V are each a
    Concat of two tensors along the key axis, split at the same key, reading those
    tensors (attribute appended, ops/attention.py) instead of the Concats'."""
    types = graph.types
    made = {o: n for n in graph.nodes for o in n.outputs}

    def parts(name: str, axis: int) -> tuple[str, ...] | None:
        concat = made.get(name)
        if concat is None or concat.op != "concat" or len(concat.inputs) != 2 or \
                concat.attr("axis") % len(types[name].shape) != axis:
            return None
        return concat.inputs

    nodes, cut = [], set()  # cut: the Concats' outputs the attentions no longer read
    for node in graph.nodes:
        if node.op == "attention" and not node.attr("appended", False):
            k_axis, v_axis = node.attr("k_perm")[3], node.attr("v_perm")[2]
            k, v = parts(node.inputs[1], k_axis), parts(node.inputs[2], v_axis)
            if k is not None and v is not None and isinstance(
                    types[node.inputs[1]].shape[k_axis], str) and \
                    types[k[0]].shape[k_axis] == types[v[0]].shape[v_axis]:
                cut.update(node.inputs[1:3])
                node = Node.make("attention", node.name, (
                    node.inputs[0], k[0], v[0], *node.inputs[3:], k[1], v[1]), node.outputs,
                    **dict(node.attrs), appended=True)
        nodes.append(node)
    read = graph.replace(nodes=tuple(nodes)).consumers()
    return graph.replace(nodes=tuple(
        Node.make(n.op, n.name, n.inputs, n.outputs, **dict(n.attrs), streamed=True)
        if n.outputs[0] in cut and not read.get(n.outputs[0]) else n for n in nodes))


def _match(softmax: Node, graph: Graph, params: dict, consumers: dict, user, scalar):
    """(nodes replaced in order, (q, K_all, V_all, mask or None), scale) or None."""
    types, producer = graph.types, partial(_producer, graph)
    joined = producer(softmax.inputs[0])
    if softmax.attr("axis") != 3 or softmax.attr("flatten") or joined is None or \
            joined.op != "concat" or joined.attr("axis") != 3 or len(joined.inputs) != 2 or \
            user(joined.outputs[0]) is not softmax or \
            not isinstance(types[joined.outputs[0]].shape[3], str):
        return None
    old = _product(producer(joined.inputs[0]), producer, user, joined)
    new_add = producer(joined.inputs[1])
    mask = None
    if new_add is not None and new_add.op == "add" and user(new_add.outputs[0]) is joined:
        kinds = [getattr(producer(i), "op", None) == "matmul" for i in new_add.inputs]
        if kinds.count(True) != 1:
            return None
        product, mask = (new_add.inputs[kinds.index(b)] for b in (True, False))
        new = _product(producer(product), producer, user, new_add)
        if new is None or types[mask].dtype != "float32" or \
                types[new_add.outputs[0]].shape != types[product].shape:
            return None
        new = (new[0], new[1], [*new[2], new_add])
    else:
        new = _product(new_add, producer, user, joined)
    if old is None or new is None or old[0].inputs[0] != new[0].inputs[0]:
        return None
    context = user(softmax.outputs[0])
    if context is None or context.op != "matmul" or context.inputs[0] != softmax.outputs[0] or \
            context.attr("trans_a") or context.attr("trans_b"):
        return None
    v_all = context.inputs[1]
    k_all = next((c.outputs[0] for c in consumers.get(old[1], [])
                  if c.op == "concat" and c.attr("axis") == 2 and
                  tuple(c.inputs) == (old[1], new[1])), None)
    if k_all is None or len(types[v_all].shape) != 4 or types[v_all].dtype != "float32" or \
            types[v_all].shape[2] != types[joined.outputs[0]].shape[3] or \
            types[k_all].shape[:2] != types[v_all].shape[:2]:
        return None
    q, scale, scaled = old[0].inputs[0], 1.0, []
    mul = producer(q)
    if mul is not None and mul.op == "mul" and {n.name for n in consumers.get(q, [])} == \
            {old[0].name, new[0].name} and q not in graph.outputs:
        c = [scalar(params, i) for i in mul.inputs]
        if c[1] is not None or c[0] is not None:
            k = 1 if c[1] is not None else 0
            q, scale, scaled = mul.inputs[1 - k], c[k], [mul]
    if len(types[q].shape) != 4 or types[q].dtype != "float32":
        return None
    members = [*scaled, *old[2], *new[2], joined, softmax, context]
    return members, (q, k_all, v_all, mask), scale


def _product(node: Node | None, producer, user, reader: Node):
    """(the MatMul, K, [Transpose, MatMul]) when `node` is MatMul(Q, Transpose(K,
    0 1 3 2)) read only by `reader`, its Transpose read only by it; else None."""
    if node is None or node.op != "matmul" or node.attr("trans_a") or node.attr("trans_b") \
            or user(node.outputs[0]) is not reader:
        return None
    flip = producer(node.inputs[1])
    if flip is None or flip.op != "transpose" or tuple(flip.attr("perm")) != _TRANSPOSED or \
            user(flip.outputs[0]) is not node:
        return None
    return node, flip.inputs[0], [flip, node]


def _producer(graph: Graph, name: str) -> Node | None:
    return next((n for n in graph.nodes if name in n.outputs), None)
