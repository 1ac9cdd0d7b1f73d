"""Per-kernel metadata of a library (TVM: the function metadata of relay.build):
read from its graph JSON, whose kernel nodes carry, as string attrs, the flops,
bytes_moved, stack_bytes (stack scratch, from the kernel's LLVM IR) and
constant_bytes of their call (written by pipeline.driver.build, estimated as
pipeline/lower/cost.py says).

    kernel_metadata(load_module("m.so").graph_json)

`pipeline info` prints it; the doit build writes it into kernels.json.
"""

from __future__ import annotations

import json


def kernel_metadata(text: str) -> list[dict]:
    """Per kernel of a graph JSON (a library's, or the build's): its symbol, how many
    nodes call it, per call flops, bytes_moved and stack_bytes, and the constant
    (parameter) bytes of all its calls, in order of first call. Values a graph JSON written
    without metadata lacks are None."""
    found: dict[str, dict] = {}
    for node in json.loads(text)["nodes"]:
        if node["op"] != "tvm_op" or node["attrs"]["func_name"] == "__nop":
            continue
        attrs = node["attrs"]
        k = found.setdefault(attrs["func_name"], {
            "symbol": attrs["func_name"], "calls": 0,
            **{key: int(attrs[key]) if key in attrs else None
               for key in ("flops", "bytes_moved", "stack_bytes")},
            "constant_bytes": 0 if "constant_bytes" in attrs else None})
        k["calls"] += 1
        if k["constant_bytes"] is not None:
            k["constant_bytes"] += int(attrs["constant_bytes"])
    return list(found.values())
