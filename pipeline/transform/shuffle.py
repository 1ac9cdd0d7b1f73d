"""FoldChannelShuffle: ShuffleNet's channel shuffle becomes where a conv stores, not a copy.

Exporters write the shuffle of g groups as
    Reshape [N, C, H, W] -> [N, g, C/g, H, W] -> Transpose (0, 2, 1, 3, 4) -> Reshape [N, C, H, W]
which moves channel k*m + j (group k, m = C/g) to j*g + k. When the tensor shuffled
comes from a conv2d_pointwise (AlterOpLayout's grouped 1x1 convs) through ops that
commute with a channel permutation (elementwise ops of that one tensor and scalar
constants: the ReLU after it), the conv gets `shuffle_groups` = g and writes each
output channel straight to its shuffled plane (ops/conv_pointwise.py); the reshapes and
the transpose go, and the chain's last op writes the shuffled tensor's name.
Runs after AlterOpLayout, which makes the conv2d_pointwise nodes, and before FuseOps.
"""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import Graph, Node
from pipeline.ops import OpKind, get
from pipeline.transform.context import PassConfig
from pipeline.transform.util import prune, sole_user

SHUFFLE_PERM = (0, 2, 1, 3, 4)


def _shuffle_groups(graph: Graph, first: Node, consumers, outputs) -> tuple[int, Node] | None:
    """(g, the last reshape) if `first` starts a channel shuffle of g groups."""
    transpose = sole_user(consumers, outputs, first.outputs[0])
    if first.op != "reshape" or transpose is None or transpose.op != "transpose" \
            or tuple(transpose.attr("perm")) != SHUFFLE_PERM:
        return None
    last = sole_user(consumers, outputs, transpose.outputs[0])
    x, split = graph.types[first.inputs[0]].shape, graph.types[first.outputs[0]].shape
    if last is None or last.op != "reshape" or len(x) != 4 or \
            graph.types[last.outputs[0]].shape != x or \
            split != (x[0], split[1], x[1] // split[1], *x[2:]):
        return None
    return split[1], last


def _commutes(node: Node, params: dict) -> bool:
    """An elementwise op of one activation and scalar constants: it treats every
    channel alike, so it may run before or after a channel permutation."""
    if node.op == "fused" or get(node.op).kind != OpKind.ELEMENTWISE or len(node.outputs) != 1:
        return False
    acts = [i for i in node.inputs if i not in params]
    return len(acts) == 1 and all(np.size(params[i]) == 1 for i in node.inputs
                                  if i in params)


def fold_channel_shuffle(graph: Graph, params: dict, cfg: PassConfig):
    """(graph, params) with every foldable channel shuffle folded (module doc)."""
    consumers, outputs = graph.consumers(), set(graph.outputs)
    producer = {o: n for n in graph.nodes for o in n.outputs}
    replace: dict[int, Node | None] = {}
    for first in graph.nodes:
        found = _shuffle_groups(graph, first, consumers, outputs)
        if found is None:
            continue
        groups, last = found
        chain, name = [], first.inputs[0]  # back from the shuffled tensor to the conv
        while (node := producer.get(name)) is not None and _commutes(node, params) \
                and sole_user(consumers, outputs, name) is not None:
            chain.append(node)
            name = [i for i in node.inputs if i not in params][0]
        conv = producer.get(name)
        if conv is None or conv.op != "conv2d_pointwise" or conv.attr("shuffle_groups", 1) != 1 \
                or sole_user(consumers, outputs, name) is None or id(conv) in replace:
            continue
        conv = Node.make(conv.op, conv.name, conv.inputs, conv.outputs,
                         **dict(conv.attrs), shuffle_groups=groups)
        producing = chain[0] if chain else conv  # now writes the shuffled tensor's name
        renamed = Node(producing.op, producing.name, producing.inputs, last.outputs,
                       producing.attrs)
        replace[id(producer[first.inputs[0]])] = renamed
        if chain:
            replace[id(producer[name])] = conv
        for node in (first, consumers[first.outputs[0]][0], last):
            replace[id(node)] = None
    if not replace:
        return graph, params
    nodes = tuple(replace.get(id(n), n) for n in graph.nodes)
    return prune(graph.replace(nodes=tuple(n for n in nodes if n is not None)), params)
