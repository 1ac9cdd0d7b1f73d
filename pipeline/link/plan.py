"""The executor plan: the graph JSON and its memory plan as compact binary, the
form the C executor (pipeline/runtime/c/executor.c) reads, so it parses no JSON.

Layout (integers little endian; str = u32 length, the UTF-8 bytes, a NUL byte):

    u32 E, then E entries (one per node output of the graph JSON):
        u32 storage id, u8 dtype (index in DTYPES), u8 ndim, u16 0, i64 shape[ndim]
    u32 A, then A graph arguments (arg_nodes: inputs and params): u32 entry, str name
    u32 O, then O outputs (heads): u32 entry, str name of the producing node
    u32 N, then N nodes to run, in order:
        u8 kind (0 kernel, 1 copy), u8 0, u16 inputs, u16 outputs, str name,
        str function, u32 entry[inputs + outputs]

`__nop` nodes (an output aliasing its input's storage) run nothing and are left
out; `__copy` nodes become copies. Which arguments are params is decided by the
executor from the blob's param dict.
"""

from __future__ import annotations

import json
import struct
from typing import Any

__all__ = ["DTYPES", "encode_plan"]

DTYPES = ("float32", "float64", "int32", "int64", "bool", "float16", "int8", "int16",
          "uint8", "uint16", "uint32", "uint64")
_NOP, _COPY = "__nop", "__copy"


def _str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw + b"\0"


def _attr_list(attrs: dict, key: str) -> list:
    try:
        return attrs[key][1]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"graph JSON: attrs[{key!r}] missing or malformed") from None


def encode_plan(graph_json: str | dict[str, Any]) -> bytes:
    """The executor plan of TVM-format graph JSON (text or parsed); ValueError
    naming the key or node when the JSON is inconsistent."""
    graph = json.loads(graph_json) if isinstance(graph_json, str) else graph_json
    nodes, row_ptr = graph["nodes"], graph["node_row_ptr"]
    if len(row_ptr) != len(nodes) + 1:
        raise ValueError("graph JSON: node_row_ptr must have len(nodes) + 1 entries")
    shapes, dtypes, sids = (_attr_list(graph["attrs"], k)
                            for k in ("shape", "dltype", "storage_id"))
    if not len(shapes) == len(dtypes) == len(sids) == row_ptr[-1]:
        raise ValueError(f"graph JSON: shape/dltype/storage_id must have {row_ptr[-1]} "
                         "entries (one per node output)")
    out = [struct.pack("<I", len(shapes))]
    for shape, dtype, sid in zip(shapes, dtypes, sids, strict=True):
        if dtype not in DTYPES:
            raise ValueError(f"graph JSON: unsupported dltype {dtype!r}")
        out.append(struct.pack(f"<IBBH{len(shape)}q", sid, DTYPES.index(dtype), len(shape), 0,
                               *shape))
    out.append(struct.pack("<I", len(graph["arg_nodes"])))
    out += [struct.pack("<I", row_ptr[nid]) + _str(nodes[nid]["name"])
            for nid in graph["arg_nodes"]]
    out.append(struct.pack("<I", len(graph["heads"])))
    out += [struct.pack("<I", row_ptr[nid] + idx) + _str(nodes[nid]["name"])
            for nid, idx, *_ in graph["heads"]]
    ops = []
    for nid, node in enumerate(nodes):
        if node["op"] == "null":
            continue
        attrs = node.get("attrs", {})
        func = attrs.get("func_name", "")
        ins = [row_ptr[i] + idx for i, idx, *_ in node["inputs"]]
        outs = list(range(row_ptr[nid], row_ptr[nid + 1]))
        if int(attrs.get("num_inputs", len(ins))) != len(ins) or \
                int(attrs.get("num_outputs", len(outs))) != len(outs):
            raise ValueError(f"graph JSON: node {node['name']!r} has {len(ins)} inputs and "
                             f"{len(outs)} outputs, attrs say otherwise")
        if func == _NOP:
            continue
        ops.append(struct.pack("<BBHH", int(func == _COPY), 0, len(ins), len(outs)) +
                   _str(node["name"]) + _str(func) +
                   struct.pack(f"<{len(ins) + len(outs)}I", *ins, *outs))
    out.append(struct.pack("<I", len(ops)))
    return b"".join(out + ops)
