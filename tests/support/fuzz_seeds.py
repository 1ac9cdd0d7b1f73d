"""The graph the blob and .ro fuzzers start from: kernels named k_* (which the fuzz
targets resolve to a stub), a copy, an alias, params of two dtypes, every argument
kind."""

from __future__ import annotations

import json


def stub_graph_json(offsets: list[int] | None = None) -> str:
    """Graph JSON of that graph; `offsets`: the entries' storage_offset, if any."""
    shapes = [[2, 3], [3], [2, 3], [2, 3], [2, 3], [6], []]
    dtypes = ["float32", "int64", "float32", "float32", "float32", "float32", "bool"]
    nodes = [{"op": "null", "name": "x", "inputs": []},
             {"op": "null", "name": "idx", "inputs": []}]
    for name, func, ins in (("n0", "k_add", [0, 1]), ("n1", "__copy", [2]),
                            ("n2", "k_relu", [3]), ("n3", "__nop", [4]),
                            ("n4", "k_any", [5])):
        nodes.append({"op": "tvm_op", "name": name, "inputs": [[i, 0, 0] for i in ins],
                      "attrs": {"func_name": func, "num_inputs": str(len(ins)),
                                "num_outputs": "1"}})
    return json.dumps({
        "nodes": nodes, "arg_nodes": [0, 1], "heads": [[4, 0, 0], [6, 0, 0], [5, 0, 0]],
        "node_row_ptr": list(range(len(nodes) + 1)),
        "attrs": {"shape": ["list_shape", shapes], "dltype": ["list_str", dtypes],
                  "storage_id": ["list_int", [0, 1, 2, 3, 2, 2, 4]],
                  **({"storage_offset": ["list_int", offsets]} if offsets else {})}})
