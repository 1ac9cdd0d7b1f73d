"""The graph executor's JSON in TVM's format (GraphExecutorCodegen).

Nodes: one "null" node per graph input and parameter, then one "tvm_op" node
per kernel call; every node has one output entry. attrs hold, per entry, the
shape, dltype and storage_id the executor allocates from, and (beyond TVM's
format, only when some tensor needs it) storage_offset: the byte offset of each
entry inside its storage (a slice of a concat written in place, plan_memory.py).
"""

from __future__ import annotations

import json

from pipeline.ir.graph import Graph
from pipeline.plan.plan_memory import MemoryPlan


def graph_json(graph: Graph, symbols: dict[str, str], plan: MemoryPlan,
               metadata: dict[str, dict[str, int]] | None = None,
               dims: dict[str, tuple[int, int]] | None = None) -> str:
    """Serialise `graph` (after fusion) for the executor.

    symbols: node name -> kernel symbol the node calls; metadata: node name ->
    {"flops", "bytes_moved", "stack_bytes", "constant_bytes"} of its call, kept in the node's
    attrs as strings (TVM's attrs are strings; its readers skip unknown ones).
    dims: the bounds of the symbolic dimensions its shapes name (a VM graph,
    docs/vm.md), kept under "dims".
    """
    nodes, entry_of = [], {}
    for name in (*graph.inputs, *graph.params):
        entry_of[name] = len(nodes)
        nodes.append({"op": "null", "name": name, "inputs": []})
    arg_nodes = list(range(len(nodes)))
    for node in graph.nodes:
        entry_of[node.outputs[0]] = len(nodes)
        nodes.append({
            "op": "tvm_op", "name": node.name,
            "attrs": {"func_name": symbols[node.name], "num_inputs": str(len(node.inputs)),
                      "num_outputs": "1", "flatten_data": "0",
                      **{k: str(v) for k, v in (metadata or {}).get(node.name, {}).items()}},
            "inputs": [[entry_of[i], 0, 0] for i in node.inputs],
        })
    names = [*graph.inputs, *graph.params, *(n.outputs[0] for n in graph.nodes)]
    doc = {
        "nodes": nodes,
        "arg_nodes": arg_nodes,
        "heads": [[entry_of[o], 0, 0] for o in graph.outputs],
        "node_row_ptr": list(range(len(nodes) + 1)),
        "attrs": {
            "shape": ["list_shape", [list(graph.types[n].shape) for n in names]],
            "dltype": ["list_str", [graph.types[n].dtype for n in names]],
            "storage_id": ["list_int", [plan.storage_id[n] for n in names]],
        },
    }
    if dims:
        doc["dims"] = {name: list(bounds) for name, bounds in sorted(dims.items())}
    if plan.offset:
        doc["attrs"]["storage_offset"] = ["list_int", [plan.offset.get(n, 0) for n in names]]
    return json.dumps(doc, indent=1, sort_keys=True)

