"""Small graph-rewriting helpers shared by the passes."""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import Graph, Node


def prune(graph: Graph, params: dict[str, np.ndarray]) -> tuple[Graph, dict[str, np.ndarray]]:
    """Drop parameters and types no node or output uses any more."""
    used = {i for n in graph.nodes for i in n.inputs} | set(graph.outputs)
    kept = {k: v for k, v in params.items() if k in used}
    defined = {*graph.inputs, *kept, *(o for n in graph.nodes for o in n.outputs)}
    return graph.replace(params=tuple(sorted(kept)),
                         types={k: t for k, t in graph.types.items() if k in defined}), kept


def sole_user(consumers: dict[str, list[Node]], outputs: set[str], name: str) -> Node | None:
    """The one node reading `name` (consumers: Graph.consumers()), if exactly one does
    and `name` is no graph output (in `outputs`): then a rewrite may absorb it."""
    users = consumers.get(name, [])
    return users[0] if len(users) == 1 and name not in outputs else None


def rename_inputs(node: Node, mapping: dict[str, str]) -> Node:
    """`node` with every input renamed through `mapping`."""
    if not any(i in mapping for i in node.inputs):
        return node
    return Node(node.op, node.name, tuple(mapping.get(i, i) for i in node.inputs),
                node.outputs, node.attrs)


def fuse_chains(graph: Graph, params: dict[str, np.ndarray], anchor: str, fuse,
                types: dict | None = None) -> tuple[Graph, dict[str, np.ndarray]]:
    """replace_chains with every chain `fuse(node, consumers, outputs)` finds from a
    node of op `anchor` (consumers: Graph.consumers(), outputs: the graph's output
    names): it returns (the chain's nodes, the node replacing them) or None; a node
    already in a chain starts none."""
    consumers, outputs = graph.consumers(), set(graph.outputs)
    chains, taken = [], set()
    for node in graph.nodes:
        if node.op != anchor or id(node) in taken:
            continue
        found = fuse(node, consumers, outputs)
        if found is not None:
            chains.append(found)
            taken |= set(map(id, found[0]))
    return replace_chains(graph, params, chains, types)


def replace_chains(graph: Graph, params: dict[str, np.ndarray],
                   chains: list[tuple[list[Node], Node]],
                   types: dict | None = None) -> tuple[Graph, dict[str, np.ndarray]]:
    """`graph` with each (chain, fused) applied: the chain's last node becomes `fused`
    (which keeps its outputs), the others are dropped; then pruned. `types`: the
    graph's types when the caller added some (add_param)."""
    if not chains:
        return graph, params
    replaced: dict[int, Node | None] = {}
    for chain, fused in chains:
        replaced |= dict.fromkeys(map(id, chain[:-1]))
        replaced[id(chain[-1])] = fused
    nodes = (replaced.get(id(n), n) for n in graph.nodes)
    return prune(graph.replace(nodes=tuple(n for n in nodes if n is not None),
                               types=graph.types if types is None else types), params)
