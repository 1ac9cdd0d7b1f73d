"""Small graph-rewriting helpers shared by the passes."""

from __future__ import annotations

import numpy as np

from pipeline.ir.graph import Graph, TensorType


def prune(graph: Graph, params: dict[str, np.ndarray]) -> tuple[Graph, dict[str, np.ndarray]]:
    """Drop parameters and types no node or output uses any more."""
    used = {i for n in graph.nodes for i in n.inputs} | set(graph.outputs)
    kept = {k: v for k, v in params.items() if k in used}
    defined = {*graph.inputs, *kept, *(o for n in graph.nodes for o in n.outputs)}
    return graph.replace(params=tuple(sorted(kept)),
                         types={k: t for k, t in graph.types.items() if k in defined}), kept


def add_param(graph_types: dict, params: dict, hint: str, value: np.ndarray) -> str:
    """Register a new constant under a fresh name derived from `hint`."""
    name, k = hint, 0
    while name in params or name in graph_types:
        k += 1
        name = f"{hint}.{k}"
    params[name] = value
    graph_types[name] = TensorType(value.shape, str(value.dtype))
    return name


def rename_inputs(nodes, mapping: dict[str, str]):
    """Nodes with every input renamed through `mapping`."""
    return [n if not any(i in mapping for i in n.inputs)
            else n.__class__(n.op, n.name, tuple(mapping.get(i, i) for i in n.inputs),
                             n.outputs, n.attrs)
            for n in nodes]
