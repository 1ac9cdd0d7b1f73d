"""Storage planning (TVM: GraphPlanMemory): intermediates share buffers.

Walk the nodes in execution order; an output takes the free storage whose
size is closest to its own (growing it if needed), and a tensor's storage is
freed after its last reader. Graph inputs, parameters and graph outputs each
keep a storage of their own. Outputs are allocated before inputs are freed,
so a kernel never writes into a buffer it is reading.
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


def _nbytes(t) -> int:
    return t.size * np.dtype(t.dtype).itemsize


def plan_memory(graph: Graph) -> MemoryPlan:
    sizes: list[int] = []
    sid: dict[str, int] = {}
    for name in (*graph.inputs, *graph.params):
        sid[name] = len(sizes)
        sizes.append(_nbytes(graph.types[name]))

    last_use = {}
    for k, node in enumerate(graph.nodes):
        for name in node.inputs:
            last_use[name] = k
    pinned = set(graph.outputs) | set(graph.inputs) | set(graph.params)
    free: list[int] = []
    shared: set[int] = set()
    intermediate = 0
    for k, node in enumerate(graph.nodes):
        for name in node.outputs:
            need = _nbytes(graph.types[name])
            intermediate += need
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
        for name in dict.fromkeys(node.inputs):
            if last_use.get(name) == k and name not in pinned:
                free.append(sid[name])
    return MemoryPlan(sid, tuple(sizes), sum(sizes[s] for s in shared), intermediate)
