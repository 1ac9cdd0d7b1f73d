"""Storage planning (TVM: GraphPlanMemory): intermediates share buffers.

Walk the nodes in execution order; an output takes the free storage whose
size is closest to its own (growing it if needed), and a tensor's storage is
freed after its last reader. Graph inputs, parameters and graph outputs each
keep a storage of their own. Outputs are allocated before inputs are freed,
so a kernel never writes into a buffer it is reading.

Two kinds of node run nothing (their graph JSON function is `__nop`, see
pipeline/link/plan.py); their outputs and inputs share bytes:
  - a reshape (Reshape, Flatten, Squeeze, Unsqueeze: the same bytes in row-major
    order) of an intermediate that is not a graph output: its output takes its
    input's storage;
  - a concat written in place: when every input is a contiguous piece of the output
    (all dims before the axis are 1, as in a channel concat of one image, plain or
    channel-blocked), each input is an intermediate of its own and lands on a
    64-byte boundary, each input lives at its offset inside the output's storage,
    so its producer writes its slice of the concat and nothing is copied. Chained
    concats (a DenseNet block) nest: every layer's output lands in the block's
    last concat.
A tensor therefore lives at (storage, byte offset) of the tensor that owns the
storage; the owner's storage is taken when the first tensor living in it is
produced and freed after the last reader of any of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.ir.dims import substitute
from pipeline.ir.graph import Graph, Node, nbytes

# The byte boundary of an in-place concat's slices: the executor aligns every storage
# to it (runtime/c/executor_internal.h ALIGN), so a kernel writing a slice sees an
# address as aligned as a storage of its own.
SLICE_ALIGN = 64


@dataclass(frozen=True)
class MemoryPlan:
    storage_id: dict[str, int]     # tensor name -> storage index
    storage_bytes: tuple[int, ...]  # size of each storage
    planned_bytes: int              # bytes of the storages holding intermediates
    intermediate_bytes: int         # sum of all intermediate tensors' bytes
    aliases: frozenset[str] = frozenset()  # nodes that run nothing (module doc)
    offset: dict[str, int] = field(default_factory=dict)  # tensor -> byte offset, if not 0


def _nbytes(t, bounds: dict[str, int] | None = None) -> int:
    """Bytes of a tensor of type t; a symbolic one at its upper `bounds`."""
    if bounds and t.symbolic:
        return nbytes(t.dtype, math.prod(substitute(t.shape, bounds)))
    return nbytes(t.dtype, t.size)


def _lone_body(node: Node) -> Node | None:
    """The op a node runs if it is one op (after fusion: a fused node of one op)."""
    body = node.attr("body") if node.op == "fused" else (node,)
    return body[0] if len(body) == 1 else None


def _concat_slices(graph: Graph, node: Node, parent: dict, pinned: set
                   ) -> list[tuple[str, int]] | None:
    """[(input, byte offset in the output)] if `node` is a concat that can be written
    in place (module doc), else None."""
    op = _lone_body(node)
    if op is None or op.op != "concat":
        return None
    out = graph.types[node.outputs[0]]
    axis = op.attr("axis") % len(out.shape)
    names = op.inputs
    if out.symbolic or any(graph.types[n].symbolic for n in names):
        return None  # slice offsets would depend on runtime dimensions
    if (math.prod(out.shape[:axis]) != 1 or node.outputs[0] in pinned
            or len(set(names)) != len(names)
            or any(n in pinned or n in parent for n in names)):
        return None
    slices, at = [], 0
    for name in names:
        if at % SLICE_ALIGN:
            return None
        slices.append((name, at))
        at += _nbytes(graph.types[name])
    return slices


def plan_memory(graph: Graph, bounds: dict[str, int] | None = None) -> MemoryPlan:
    """Storage ids, offsets and sizes for every tensor of `graph` (nodes in execution
    order). bounds: symbol -> upper bound, for a graph with symbolic dimensions (the
    VM's): its storages are sized for the largest shapes, allocated once."""
    sizes: list[int] = []
    sid: dict[str, int] = {}
    for name in (*graph.inputs, *graph.params):
        sid[name] = len(sizes)
        sizes.append(_nbytes(graph.types[name], bounds))
    pinned = set(graph.outputs) | set(graph.inputs) | set(graph.params)
    parent: dict[str, tuple[str, int]] = {}  # tensor -> (tensor it lives in, byte offset)
    aliases = set()
    for node in graph.nodes:
        op = _lone_body(node)
        if op is not None and op.op == "reshape" and len(node.inputs) == 1 and \
                node.inputs[0] not in pinned and node.outputs[0] not in pinned:
            parent[node.outputs[0]] = (node.inputs[0], 0)
            aliases.add(node.name)
        elif (slices := _concat_slices(graph, node, parent, pinned)) is not None:
            parent.update((name, (node.outputs[0], at)) for name, at in slices)
            aliases.add(node.name)

    def place(name: str) -> tuple[str, int]:
        """(the tensor owning the storage `name` lives in, byte offset in it)."""
        at = 0
        while name in parent:
            name, step = parent[name]
            at += step
        return name, at

    last_use = {}  # per storage owner: the last node reading any tensor living in it
    for k, node in enumerate(graph.nodes):
        for name in node.inputs:
            last_use[place(name)[0]] = k
    free: list[int] = []
    shared: set[int] = set()
    offset: dict[str, int] = {}
    intermediate = 0
    for k, node in enumerate(graph.nodes):
        for name in node.outputs:
            intermediate += _nbytes(graph.types[name], bounds)
            owner, at = place(name)
            if at:
                offset[name] = at
            if owner in sid:  # an alias, or a slice of a concat begun earlier
                sid[name] = sid[owner]
                continue
            need = _nbytes(graph.types[owner], bounds)
            if free and owner not in pinned:
                best = min(free, key=lambda s: abs(sizes[s] - need))
                free.remove(best)
                sizes[best] = max(sizes[best], need)
            else:
                best = len(sizes)
                sizes.append(need)
            sid[name] = sid[owner] = best
            shared.add(best)
        # dict.fromkeys, not set: set order changes with the process's hash seed,
        # and the free list's order breaks ties above (reproducible bytes).
        for owner in dict.fromkeys(place(name)[0] for name in node.inputs):
            if last_use.get(owner) == k and owner not in pinned:
                free.append(sid[owner])
    return MemoryPlan(sid, tuple(sizes), sum(sizes[s] for s in shared), intermediate,
                      frozenset(aliases), offset)
