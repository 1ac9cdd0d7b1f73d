"""Per-kernel metadata of a library (TVM: the function metadata of relay.build):
read from its graph JSON, whose kernel nodes carry, as string attrs, the flops,
bytes_moved, stack_bytes (stack scratch, from the kernel's LLVM IR) and
constant_bytes of their call (written by pipeline.driver.build, estimated as
pipeline/lower/cost.py says).

    kernel_metadata(load_module("m.so").graph_json)

`pipeline info` prints it; the doit build writes it into kernels.json.

    library_sizes("m.so", graph_json) -> {"flash_bytes", "ram_bytes", "flash", "ram"}

measures a built shared library's flash and RAM (what the export task prints and
`pipeline info` and the report show): flash from the sections of the linked file,
RAM from its memory plan, inputs and outputs and the deepest kernel's stack.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from pipeline.link.elf import section_sizes


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


def memory_plan(graph_json: str) -> dict:
    """Bytes of the storages holding kernel outputs (what the executor allocates for
    them) vs the sum of those outputs."""
    doc = json.loads(graph_json)
    attrs, row_ptr = doc["attrs"], doc["node_row_ptr"]
    shapes, dtypes, sids = attrs["shape"][1], attrs["dltype"][1], attrs["storage_id"][1]
    offsets = attrs.get("storage_offset", ["list_int", [0] * len(sids)])[1]
    storage: dict[int, int] = {}
    total = 0
    for nid, node in enumerate(doc["nodes"]):
        if node["op"] == "null":
            continue
        for eid in range(row_ptr[nid], row_ptr[nid + 1]):
            size = math.prod(shapes[eid]) * np.dtype(dtypes[eid]).itemsize
            total += size
            storage[sids[eid]] = max(storage.get(sids[eid], 0), offsets[eid] + size)
    return {"planned_activation_bytes": sum(storage.values()), "intermediate_bytes": total}


def io_bytes(graph_json: str, param_names: set[str]) -> int:
    """Bytes of a graph's inputs (its argument nodes not named in `param_names`)
    and outputs."""
    doc = json.loads(graph_json)
    shapes, dtypes = doc["attrs"]["shape"][1], doc["attrs"]["dltype"][1]
    row_ptr, nodes = doc["node_row_ptr"], doc["nodes"]
    eids = [row_ptr[nid] for nid in doc["arg_nodes"] if nodes[nid]["name"] not in param_names]
    eids += [row_ptr[nid] + index for nid, index, *_ in doc["heads"]]
    return sum(math.prod(shapes[e]) * np.dtype(dtypes[e]).itemsize for e in eids)


def library_sizes(path: str, graph_json: str, param_names: set[str]) -> dict:
    """Flash and RAM of the shared library at `path` (an ELF .so) built from
    `graph_json` with params `param_names`, in bytes: flash = code + read-only data
    (the packed params among it) + initialised data, measured from the file's
    sections; RAM = the executor's workspace (the memory plan's storages) + the
    inputs and outputs + the deepest kernel's stack (its estimate, stack_bytes) +
    the writable data. ValueError for a file that is not little-endian ELF."""
    sections = section_sizes(Path(path).read_bytes())
    kernels = kernel_metadata(graph_json)
    deepest = max(kernels, key=lambda k: k["stack_bytes"] or 0, default=None)
    flash = {"code": sections["text"], "rodata": sections["rodata"], "data": sections["data"]}
    ram = {"workspace": memory_plan(graph_json)["planned_activation_bytes"],
           "io": io_bytes(graph_json, param_names),
           "stack": (deepest or {}).get("stack_bytes") or 0,
           "data": sections["data"] + sections["bss"]}
    return {"flash_bytes": sum(flash.values()), "ram_bytes": sum(ram.values()),
            "flash": flash, "ram": ram,
            "deepest_kernel": deepest["symbol"] if deepest else None}


def size_line(name: str, sizes: dict) -> str:
    """One line: a library's flash and RAM and what they are made of."""
    def kib(n: float) -> str:
        return f"{n / 1024:.1f} KiB"

    flash = ", ".join(f"{k} {kib(v)}" for k, v in sizes["flash"].items())
    ram = ", ".join(f"{k} {kib(v)}" for k, v in sizes["ram"].items())
    return (f"{name}: flash {kib(sizes['flash_bytes'])} ({flash}); "
            f"RAM {kib(sizes['ram_bytes'])} ({ram})")
