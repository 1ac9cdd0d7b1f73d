"""The executor plan: the graph JSON and its memory plan as compact binary, the
form the C executor (pipeline/runtime/c/executor.c) reads, so it parses no JSON.

Layout (integers little endian; str = u32 length, the UTF-8 bytes, a NUL byte):

    u32 E, then E entries (one per node output of the graph JSON):
        u32 storage id, u8 dtype (index in DTYPES), u8 ndim, u16 0,
        u64 byte offset in the storage, i64 shape[ndim]
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

from pipeline.errors import FormatError, PipelineError, check_elements

__all__ = ["DTYPES", "encode_plan"]

DTYPES = ("float32", "float64", "int32", "int64", "bool", "float16", "int8", "int16",
          "uint8", "uint16", "uint32", "uint64",
          # appended (codes are never renumbered): ml_dtypes' names
          "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
          "uint4", "int4", "float4_e2m1fn", "float8_e8m0fnu", "uint2", "int2")
_NOP, _COPY = "__nop", "__copy"


def _str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw + b"\0"


def _attr_list(attrs: Any, key: str) -> list:
    try:
        value = attrs[key][1]
    except (KeyError, IndexError, TypeError):
        raise FormatError(f"graph JSON: attrs[{key!r}] missing or malformed") from None
    if not isinstance(value, list):
        raise FormatError(f"graph JSON: attrs[{key!r}] must be a list")
    return value


def _index(value: Any, size: int, what: str) -> int:
    """`value` if an int in 0..size-1 (Python's negative indexing would wrap)."""
    if type(value) is not int or not 0 <= value < size:
        raise FormatError(f"graph JSON: {what}: index {value!r} out of range 0..{size - 1}")
    return value


def encode_plan(graph_json: str | dict[str, Any]) -> bytes:
    """The executor plan of TVM-format graph JSON (text or parsed).

    The graph JSON may come from a hand-made or damaged file: any inconsistency
    is a one-line FormatError naming the key or node (LimitError for a shape over
    the element limit), never another exception.
    """
    try:
        return _encode(json.loads(graph_json) if isinstance(graph_json, str) else graph_json)
    except PipelineError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError,
            OverflowError, struct.error) as err:
        raise FormatError(f"graph JSON: malformed ({type(err).__name__}: {err})") from None


def _entry(row_ptr: list[int], nid: Any, idx: Any, what: str) -> int:
    """The entry id of output `idx` of node `nid`, both checked."""
    nid = _index(nid, len(row_ptr) - 1, what)
    return row_ptr[nid] + _index(idx, row_ptr[nid + 1] - row_ptr[nid],
                                 f"{what}: output of node {nid}")


def _encode(graph: Any) -> bytes:
    if not isinstance(graph, dict):
        raise FormatError(f"graph JSON: expected an object, found {type(graph).__name__}")
    nodes, row_ptr = graph["nodes"], graph["node_row_ptr"]
    if not isinstance(nodes, list) or not all(
            isinstance(n, dict) and isinstance(n.get("name"), str) and "op" in n
            for n in nodes):
        raise FormatError("graph JSON: nodes must be a list of objects with name and op")
    if (not isinstance(row_ptr, list) or len(row_ptr) != len(nodes) + 1
            or not all(type(r) is int for r in row_ptr) or row_ptr[0] != 0
            or any(b < a for a, b in zip(row_ptr, row_ptr[1:], strict=False))):
        raise FormatError("graph JSON: node_row_ptr must be len(nodes) + 1 ascending "
                          "integers from 0")
    shapes, dtypes, sids = (_attr_list(graph["attrs"], k)
                            for k in ("shape", "dltype", "storage_id"))
    offsets = (_attr_list(graph["attrs"], "storage_offset") if "storage_offset" in graph["attrs"]
               else [0] * len(sids))  # TVM's JSON has none: every entry at its storage's start
    if not len(shapes) == len(dtypes) == len(sids) == len(offsets) == row_ptr[-1]:
        raise FormatError(f"graph JSON: shape/dltype/storage_id/storage_offset must have "
                          f"{row_ptr[-1]} entries (one per node output)")
    out = [struct.pack("<I", len(shapes))]
    for e, (shape, dtype, sid, at) in enumerate(zip(shapes, dtypes, sids, offsets,
                                                    strict=True)):
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise FormatError(f"graph JSON: unsupported dltype {dtype!r}")
        if type(sid) is not int or sid < 0:
            raise FormatError("graph JSON: storage_id must be integers >= 0")
        if type(at) is not int or not 0 <= at < 1 << 63:
            raise FormatError(f"graph JSON: entry {e}: storage_offset {at!r} is not a byte "
                              "offset")
        if not isinstance(shape, list):
            raise FormatError(f"graph JSON: entry {e}: shape {shape!r} is not a list")
        check_elements(shape, f"graph JSON: entry {e}")  # the C side allocates it
        out.append(struct.pack(f"<IBBHQ{len(shape)}q", sid, DTYPES.index(dtype), len(shape), 0,
                               at, *shape))
    args, heads = graph["arg_nodes"], graph["heads"]
    out.append(struct.pack("<I", len(args)))
    for nid in args:
        nid = _index(nid, len(nodes), "arg_nodes")
        out.append(struct.pack("<I", row_ptr[nid]) + _str(nodes[nid]["name"]))
    out.append(struct.pack("<I", len(heads)))
    for nid, idx, *_ in heads:
        out.append(struct.pack("<I", _entry(row_ptr, nid, idx, "heads")) +
                   _str(nodes[nid]["name"]))
    ops = []
    for nid, node in enumerate(nodes):
        if node["op"] == "null":
            continue
        attrs = node.get("attrs", {})
        func = attrs.get("func_name")
        if not isinstance(func, str):
            raise FormatError(f"graph JSON: node {node['name']!r} has no func_name")
        ins = [_entry(row_ptr, i, idx, f"node {node['name']!r} inputs")
               for i, idx, *_ in node["inputs"]]
        outs = list(range(row_ptr[nid], row_ptr[nid + 1]))
        if int(attrs.get("num_inputs", len(ins))) != len(ins) or \
                int(attrs.get("num_outputs", len(outs))) != len(outs):
            raise FormatError(f"graph JSON: node {node['name']!r} has {len(ins)} inputs and "
                              f"{len(outs)} outputs, attrs say otherwise")
        if func == _NOP:
            continue
        if func == _COPY and (len(ins) != 1 or len(outs) != 1 or
                              shapes[ins[0]] != shapes[outs[0]]):
            raise FormatError(f"graph JSON: copy node {node['name']!r} needs one input and "
                              "one output of one shape")
        ops.append(struct.pack("<BBHH", int(func == _COPY), 0, len(ins), len(outs)) +
                   _str(node["name"]) + _str(func) +
                   struct.pack(f"<{len(ins) + len(outs)}I", *ins, *outs))
    out.append(struct.pack("<I", len(ops)))
    return b"".join(out + ops)
