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


def rename_inputs(node: Node, mapping: dict[str, str]) -> Node:
    """`node` with every input renamed through `mapping`."""
    if not any(i in mapping for i in node.inputs):
        return node
    return Node(node.op, node.name, tuple(mapping.get(i, i) for i in node.inputs),
                node.outputs, node.attrs)
