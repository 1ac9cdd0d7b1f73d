"""One static workspace for the AOT executor: every intermediate tensor at a fixed
byte offset (TVM's USMP greedy-by-size), planned from the graph JSON.

The graph JSON's storages (plan_memory.py) already share bytes between tensors
whose lives do not overlap, and alias the tensors that run nothing (a reshape, the
slices of an in-place concat). The graph executor allocates each storage apart;
here the storages become "buffers" placed in one block:

- a buffer is a set of entries of one storage whose lives overlap (the aliases of
  one tensor: they must keep their relative offsets), living from the first node
  writing one of them to the last node reading one; one storage holds several
  buffers one after the other in time;
- buffers are placed one by one, each at the lowest 16-byte boundary where it
  overlaps no placed buffer whose life overlaps its own, in three orders (largest
  first, earliest first, largest size x life first); the smallest workspace wins.

A node's inputs and its output are alive at that node together, so a kernel
never writes over what it reads. `lower_bound` is the most bytes alive at once
(the largest set of simultaneously live buffers): no placement does better.
Graph inputs, outputs and params are not in the workspace (the caller's buffers
and the constants).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.ir.graph import nbytes

# Buffers start on this boundary: what the kernels' vector loads like on every
# target (they assume no alignment, so it is speed only), at little cost in bytes.
ALIGN = 16


@dataclass(frozen=True)
class WorkspacePlan:
    offset: dict[int, int]  # graph JSON entry id -> byte offset in the workspace
    size: int               # bytes of the workspace
    lower_bound: int        # the most bytes of intermediates alive at one node


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def entry_bytes(shape: list[int], dtype: str) -> int:
    """Bytes of one graph JSON entry."""
    return nbytes(dtype, int(np.prod(shape, dtype=np.int64)))


def _lives(graph: dict, kept: set[int]) -> dict[int, list[int]]:
    """{entry: [first node writing it, last node reading it]} for the entries not in
    `kept` (node index in graph["nodes"] order)."""
    row_ptr, life = graph["node_row_ptr"], {}
    for nid, node in enumerate(graph["nodes"]):
        if node["op"] == "null":
            continue
        for e in range(row_ptr[nid], row_ptr[nid + 1]):
            if e not in kept:
                life[e] = [nid, nid]
        for src, idx, *_ in node["inputs"]:
            e = row_ptr[src] + idx
            if e in life:
                life[e][1] = max(life[e][1], nid)
    return life


def _buffers(graph: dict, life: dict[int, list[int]]) -> list[dict]:
    """The buffers (module doc): {"entries", "start", "end", "size"} each."""
    attrs = graph["attrs"]
    sids, shapes, dtypes = (attrs[k][1] for k in ("storage_id", "shape", "dltype"))
    offsets = _storage_offsets(graph)
    by_storage: dict[int, list[int]] = {}
    for e in sorted(life, key=lambda e: (life[e][0], e)):
        by_storage.setdefault(sids[e], []).append(e)
    buffers = []
    for entries in by_storage.values():
        group: dict | None = None
        for e in entries:
            start, end = life[e]
            top = offsets[e] + entry_bytes(shapes[e], dtypes[e])
            if group is not None and start <= group["end"]:
                group["entries"].append(e)
                group["end"] = max(group["end"], end)
                group["size"] = max(group["size"], top)
                continue
            group = {"entries": [e], "start": start, "end": end, "size": top}
            buffers.append(group)
    return buffers


def plan_workspace(graph: dict) -> WorkspacePlan:
    """The workspace of the graph JSON `graph` (parsed), its inputs, params and
    outputs left out (they are the caller's buffers and the constants)."""
    row_ptr = graph["node_row_ptr"]
    kept = {row_ptr[n] for n in graph["arg_nodes"]} | {row_ptr[n] + i
                                                       for n, i, *_ in graph["heads"]}
    buffers = _buffers(graph, _lives(graph, kept))
    # Greedy by size is near the bound on most graphs, not all (two big buffers at
    # offset 0 can push a small one that lives between them up): the best of a few
    # orders, each a fast first-fit, ties broken by the order's position.
    orders = (lambda b: (-b["size"], b["start"]), lambda b: (b["start"], -b["size"]),
              lambda b: (-b["size"] * (b["end"] - b["start"] + 1), b["start"]))
    placed = min((_place(sorted(buffers, key=order)) for order in orders),
                 key=lambda p: max((hi for _, hi, _ in p), default=0))
    offsets = _storage_offsets(graph)
    offset = {e: at + offsets[e] for at, _, buf in placed for e in buf["entries"]}
    nodes = len(graph["nodes"])
    alive = [sum(b["size"] for b in buffers if b["start"] <= k <= b["end"])
             for k in range(nodes)]
    return WorkspacePlan(offset, _round_up(max((hi for _, hi, _ in placed), default=0)),
                         max(alive, default=0))


def _place(buffers: list[dict]) -> list[tuple[int, int, dict]]:
    """First fit, in the given order: each buffer at the lowest ALIGN boundary clear
    of the placed buffers whose lives overlap its own. [(offset, end, buffer)]."""
    placed: list[tuple[int, int, dict]] = []
    for buf in buffers:
        clash = sorted((lo, hi) for lo, hi, other in placed
                       if other["start"] <= buf["end"] and buf["start"] <= other["end"])
        at = 0
        for lo, hi in clash:  # first fit between the clashing buffers, lowest first
            if at + buf["size"] <= lo:
                break
            at = max(at, _round_up(hi))
        placed.append((at, at + buf["size"], buf))
    return placed


def _storage_offsets(graph: dict) -> list[int]:
    """Each entry's byte offset inside its storage (0 where the JSON gives none)."""
    attrs = graph["attrs"]
    return attrs.get("storage_offset", [None, [0] * len(attrs["storage_id"][1])])[1]
