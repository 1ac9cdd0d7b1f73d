"""Constant folding and operator fusion."""

from __future__ import annotations

from pipeline.ir.dims import is_symbolic
from pipeline.ir.graph import Graph, Node
from pipeline.ops import OpKind, get
from pipeline.transform.context import PassConfig
from pipeline.transform.util import prune


def fold_constant(graph: Graph, params: dict, cfg: PassConfig):
    """Evaluate, at build time, every node whose inputs are all constants and
    whose operator has a numpy implementation; its outputs become parameters."""
    params = dict(params)
    outputs = set(graph.outputs)
    nodes = []
    for node in graph.nodes:
        impl = get(node.op).numpy if node.op != "fused" else None
        # a run-time size, or values from run-time dims (iota, dim_values, a trilu's k)
        symbolic = is_symbolic(node.attr("dims", ())) or any(
            is_symbolic(graph.types[o].shape) for o in node.outputs)
        if impl and all(i in params for i in node.inputs) and not outputs & set(node.outputs) \
                and not symbolic:
            values = impl([params[i] for i in node.inputs], node)
            for name, value in zip(node.outputs, values, strict=True):
                params[name] = value.astype(graph.types[name].dtype)
            continue
        nodes.append(node)
    return prune(graph.replace(nodes=tuple(nodes)), params)


def fuse_ops(graph: Graph, params: dict, cfg: PassConfig):
    """Group each anchor op (conv2d, dense, pool, ...) with the chain of
    elementwise ops that follows it, so activations are written once.

    An elementwise node joins the group that produced one of its inputs when
    that tensor has no other use, is not a graph output, has the node's output
    shape (the epilogue never broadcasts the running value), keeps its dtype
    unless the group is all elementwise, and the group is
    shorter than `FuseOps.max_depth`. Elementwise chains without an anchor
    form groups of their own. Each group becomes one `fused` node placed where
    its last member was, which keeps the order topological.
    """
    max_depth = cfg.option("FuseOps.max_depth")
    consumers = graph.consumers()
    outputs = set(graph.outputs)
    groups: list[list[Node]] = []
    open_group: dict[str, int] = {}  # tensor -> index of the group it ends
    for node in graph.nodes:
        kind = get(node.op).kind
        joined = False
        if kind == OpKind.ELEMENTWISE:
            for name in node.inputs:
                g = open_group.get(name)
                if (g is not None and len(consumers[name]) == 1 and name not in outputs
                        and graph.types[name].shape == graph.types[node.outputs[0]].shape
                        and len(groups[g]) < max_depth
                        and _keeps_dtype(groups[g][0], graph.types[name],
                                         graph.types[node.outputs[0]])):
                    groups[g] = _with_side_chains(graph, node, groups, g, open_group,
                                                  consumers, max_depth)
                    del open_group[name]
                    open_group[node.outputs[0]] = g
                    joined = True
                    break
        if not joined:
            groups.append([node])
            if kind != OpKind.OPAQUE:
                open_group[node.outputs[0]] = len(groups) - 1

    groups = [grp for grp in groups if grp]  # side chains merged away
    position = {id(n): k for k, n in enumerate(graph.nodes)}
    groups.sort(key=lambda g: position[id(g[-1])])
    fused = [_fused_node(g, k) for k, g in enumerate(groups)]
    return prune(graph.replace(nodes=tuple(fused)), params)


# Anchors that write each output once, from registers, and never read it back: an
# epilogue may change the dtype on the way (int8 conv -> DequantizeLinear -> Add ->
# QuantizeLinear).
_WRITES_ONCE = {"qconv2d_nchwc"}


def _with_side_chains(graph: Graph, node: Node, groups: list, g: int, open_group: dict,
                      consumers: dict, max_depth: int) -> list[Node]:
    """Group g with `node` appended, and before it every all-elementwise group that
    only `node` reads (its output of node's shape, not a graph output), which then
    runs in g's epilogue instead of a pass of its own: a residual Add's other operand
    DequantizeLinear'd (int8 ResNets) is read as its bytes, not written as floats and
    read back. The emptied groups are dropped by the caller."""
    body = groups[g]
    for name in node.inputs:
        h = open_group.get(name)
        if h is None or h == g or len(consumers[name]) != 1 or name in graph.outputs \
                or graph.types[name].shape != graph.types[node.outputs[0]].shape \
                or len(body) + len(groups[h]) >= max_depth \
                or any(get(n.op).kind != OpKind.ELEMENTWISE for n in groups[h]):
            continue
        body = body + groups[h]
        groups[h] = []
        del open_group[name]
    return body + [node]


def _keeps_dtype(anchor: Node, running, result) -> bool:
    """Whether an epilogue changing the dtype of the running value is possible:
    anchors that are not elementwise may accumulate in (and re-read) their output
    buffer, which then has the epilogue's dtype, so only same-dtype chains join them
    (or all-elementwise groups, or _WRITES_ONCE anchors)."""
    return (running.dtype == result.dtype or anchor.op in _WRITES_ONCE
            or get(anchor.op).kind == OpKind.ELEMENTWISE)


def _fused_node(body: list[Node], k: int) -> Node:
    inner = {o for n in body for o in n.outputs}
    inputs: list[str] = []
    for n in body:
        inputs.extend(i for i in n.inputs if i not in inner and i not in inputs)
    name = "fused_" + "_".join(n.op for n in body) + f"_{k}"
    return Node.make("fused", name, inputs, body[-1].outputs, body=tuple(body))
