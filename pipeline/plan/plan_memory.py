"""Storage planning (TVM: GraphPlanMemory): intermediates share buffers.

Walk the nodes in execution order; an output takes the free storage whose
size is closest to its own (growing it if needed), and a tensor's storage is
freed after its last reader. Graph inputs, parameters and graph outputs each
keep a storage of their own. Outputs are allocated before inputs are freed,
so a kernel never writes into a buffer it is reading.

A reshape (Reshape, Flatten, Squeeze, Unsqueeze: the same bytes in row-major order)
of an intermediate that is not a graph output is an alias: its output takes its
input's storage, which stays allocated until the last reader of either, and the
node runs nothing (its graph JSON function is `__nop`, see pipeline/link/plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.ir.graph import Graph


@dataclass(frozen=True)
class MemoryPlan:
    storage_id: dict[str, int]     # tensor name -> storage index
    storage_bytes: tuple[int, ...]  # size of each storage
    planned_bytes: int              # bytes of the storages holding intermediates
    intermediate_bytes: int         # sum of all intermediate tensors' bytes
    aliases: frozenset[str] = frozenset()  # reshape nodes that run nothing (module doc)


def _nbytes(t) -> int:
    return t.size * np.dtype(t.dtype).itemsize


def _is_reshape(node) -> bool:
    """A reshape alone (after fusion: a fused node whose body is one reshape)."""
    body = node.attr("body") if node.op == "fused" else (node,)
    return len(body) == 1 and body[0].op == "reshape" and len(node.inputs) == 1


def plan_memory(graph: Graph) -> MemoryPlan:
    """Storage ids and sizes for every tensor of `graph` (nodes in execution order)."""
    sizes: list[int] = []
    sid: dict[str, int] = {}
    for name in (*graph.inputs, *graph.params):
        sid[name] = len(sizes)
        sizes.append(_nbytes(graph.types[name]))
    pinned = set(graph.outputs) | set(graph.inputs) | set(graph.params)
    root: dict[str, str] = {}  # tensor -> the tensor whose storage it uses
    aliases = set()
    for node in graph.nodes:
        if _is_reshape(node) and node.inputs[0] not in pinned and \
                node.outputs[0] not in pinned:
            root[node.outputs[0]] = root.get(node.inputs[0], node.inputs[0])
            aliases.add(node.name)

    last_use = {}  # per storage-owning tensor: the last node reading it or an alias
    for k, node in enumerate(graph.nodes):
        for name in node.inputs:
            last_use[root.get(name, name)] = k
    free: list[int] = []
    shared: set[int] = set()
    intermediate = 0
    for k, node in enumerate(graph.nodes):
        for name in node.outputs:
            need = _nbytes(graph.types[name])
            intermediate += need
            if name in root:
                sid[name] = sid[root[name]]
                continue
            if free and name not in pinned:
                best = min(free, key=lambda s: abs(sizes[s] - need))
                free.remove(best)
                sizes[best] = max(sizes[best], need)
            else:
                best = len(sizes)
                sizes.append(need)
            sid[name] = best
            shared.add(best)
        # dict.fromkeys, not set: set order changes with the process's hash seed,
        # and the free list's order breaks ties above (reproducible bytes).
        for owner in dict.fromkeys(root.get(name, name) for name in node.inputs):
            if last_use.get(owner) == k and owner not in pinned:
                free.append(sid[owner])
    return MemoryPlan(sid, tuple(sizes), sum(sizes[s] for s in shared), intermediate,
                      frozenset(aliases))
