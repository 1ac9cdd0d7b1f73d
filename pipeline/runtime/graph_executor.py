"""Run a compiled graph: TVM's executor-config JSON + kernels from a library.

Every kernel has the signature `int32_t func(void **args)`: args holds the
node's input buffers in order, then its output buffers; 0 means success.
Setup allocates storage and prepares each call's argument array once, so
`run()` is just a loop of ctypes calls.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.errors import FormatError, PipelineError, check_elements
from pipeline.runtime.params import load_params as _parse_params
from pipeline.runtime.threads import check_num_threads, default_num_threads, thread_setter

__all__ = ["GraphExecutor", "GraphModule"]

_ALIGN = 64
_DTYPES = {"float16", "float32", "float64", "int8", "int16", "int32", "int64",
           "uint8", "uint16", "uint32", "uint64", "bool"}
# Pseudo-kernels TVM's graph JSON may name: reshape-like ops whose output
# aliases the input's storage, and plain copies.
_NOP, _COPY = "__nop", "__copy"


def _aligned_bytes(nbytes: int) -> np.ndarray:
    """A zeroed uint8 buffer of nbytes whose data pointer is 64-byte aligned."""
    raw = np.zeros(nbytes + _ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start:start + nbytes]


def _attr_list(attrs: dict, key: str) -> list:
    try:
        return attrs[key][1]
    except (KeyError, IndexError, TypeError):
        raise FormatError(f"graph JSON: attrs[{key!r}] missing or malformed") from None


class GraphExecutor:
    """Executes one graph. Built by `Module["default"](device)`.

    graph_json: TVM graph JSON text (or the parsed dict); lookup: symbol ->
    ctypes function; params: {name: array} for the param "null" nodes;
    owner: any object to keep alive with the executor (the loaded library).
    """

    def __init__(self, graph_json: str | dict, lookup: Callable[[str], Any],
                 params: dict[str, np.ndarray] | None = None, owner: Any = None):
        self._owner = owner
        params = params or {}
        try:
            self._read_graph(graph_json, params)
        except PipelineError:
            raise
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError,
                OverflowError) as err:
            # Whatever shape of JSON a hand-made or damaged graph has, the user
            # gets one line, not a traceback from deep inside the setup.
            raise FormatError(f"graph JSON: malformed ({type(err).__name__}: {err})") from None
        for name, value in params.items():
            try:
                self._copy_in(name, self._param_eids[name], value)
            except ValueError as err:
                raise FormatError(f"graph JSON and params disagree: {err}") from None
        self._setup_op_execs(lookup)
        self._set_threads = thread_setter(lookup)
        self.num_threads = default_num_threads()

    def _read_graph(self, graph_json: str | dict, params: dict[str, np.ndarray]) -> None:
        """Parse and check the graph JSON, allocate storage, plan the op calls."""
        graph = json.loads(graph_json) if isinstance(graph_json, str) else graph_json
        if not isinstance(graph, dict):
            raise FormatError(f"graph JSON: expected an object, found {type(graph).__name__}")
        self._nodes = graph["nodes"]
        if not isinstance(self._nodes, list) or not all(
                isinstance(n, dict) and isinstance(n.get("name"), str) and "op" in n
                for n in self._nodes):
            raise FormatError("graph JSON: nodes must be a list of objects with name and op")
        row_ptr = graph["node_row_ptr"]
        if (not isinstance(row_ptr, list) or len(row_ptr) != len(self._nodes) + 1
                or not all(type(r) is int for r in row_ptr) or row_ptr[0] != 0
                or any(b < a for a, b in zip(row_ptr, row_ptr[1:], strict=False))):
            raise FormatError("graph JSON: node_row_ptr must be len(nodes) + 1 ascending "
                              "integers from 0")
        self._row_ptr = row_ptr
        self._setup_storage(graph["attrs"])
        unknown = set(params) - {n["name"] for n in self._nodes if n["op"] == "null"}
        if unknown:
            raise FormatError(f"params not used by the graph: {sorted(unknown)}")
        self._input_index: dict[str, int] = {}  # graph inputs, in arg_nodes order
        self._input_eids: list[int] = []
        self._param_eids: dict[str, int] = {}
        for nid in graph["arg_nodes"]:
            name = self._nodes[self._index(nid, len(self._nodes), "arg_nodes")]["name"]
            if name in params:
                self._param_eids[name] = row_ptr[nid]
            else:
                self._input_index[name] = len(self._input_index)
                self._input_eids.append(row_ptr[nid])
        if set(params) - set(self._param_eids):
            raise FormatError(f"graph JSON: params {sorted(set(params) - set(self._param_eids))} "
                              "are not among the graph's arg_nodes")
        self._output_eids = [self._entry(nid, idx, "heads") for nid, idx, *_ in graph["heads"]]
        self._check_arg_storage(graph["arg_nodes"])
        self._plan_ops()

    def _index(self, value: Any, size: int, what: str) -> int:
        if type(value) is not int or not 0 <= value < size:
            raise FormatError(f"graph JSON: {what}: index {value!r} out of range 0..{size - 1}")
        return value

    def _entry(self, nid: Any, idx: Any, what: str) -> int:
        """The entry id of output `idx` of node `nid`, both checked."""
        nid = self._index(nid, len(self._nodes), what)
        count = self._row_ptr[nid + 1] - self._row_ptr[nid]
        return self._row_ptr[nid] + self._index(idx, count, f"{what}: output of node {nid}")

    def _check_arg_storage(self, arg_nodes: list[int]) -> None:
        """Reject plans where a kernel writes into an input's or param's storage.

        Inputs and params must keep their values across runs, so sharing
        their storage is a memory-planning bug; catching it here turns silent
        wrong answers into an error. (__nop outputs alias without writing.)
        """
        owner: dict[int, str] = {}
        for nid in arg_nodes:
            sid, name = self._sids[self._row_ptr[nid]], self._nodes[nid]["name"]
            if sid in owner:
                raise FormatError(f"graph JSON: inputs {owner[sid]!r} and {name!r} share "
                                 f"storage {sid}")
            owner[sid] = name
        for nid, node in enumerate(self._nodes):
            if node["op"] == "null" or node.get("attrs", {}).get("func_name") == _NOP:
                continue
            for eid in range(self._row_ptr[nid], self._row_ptr[nid + 1]):
                if self._sids[eid] in owner:
                    raise FormatError(f"graph JSON: node {node['name']!r} writes storage "
                                     f"{self._sids[eid]}, which holds {owner[self._sids[eid]]!r}")

    def _setup_storage(self, attrs: dict) -> None:
        """One aligned buffer per storage id, sized for its largest entry; views per entry."""
        shapes = _attr_list(attrs, "shape")
        dtypes = _attr_list(attrs, "dltype")
        sids = _attr_list(attrs, "storage_id")
        n_entries = self._row_ptr[-1]
        if not len(shapes) == len(dtypes) == len(sids) == n_entries:
            raise FormatError(f"graph JSON: shape/dltype/storage_id must have {n_entries} "
                             "entries (one per node output)")
        for dt in dtypes:
            if not isinstance(dt, str) or dt not in _DTYPES:
                raise FormatError(f"graph JSON: unsupported dltype {dt!r}")
        if not all(type(sid) is int and sid >= 0 for sid in sids):
            raise FormatError("graph JSON: storage_id must be integers >= 0")
        self._sids = sids
        types = [np.dtype(dt) for dt in dtypes]
        # Checked before anything is allocated: no shape may exceed the element limit.
        sizes = [check_elements(s if isinstance(s, list) else [s], f"graph JSON: entry {e}")
                 * t.itemsize for e, (s, t) in enumerate(zip(shapes, types, strict=True))]
        check_elements([sum(sizes)], "graph JSON: all storage (bytes)")
        need: dict[int, int] = {}
        for sid, size in zip(sids, sizes, strict=True):
            need[sid] = max(need.get(sid, 0), size)
        self._storage = {sid: _aligned_bytes(size) for sid, size in need.items()}
        self._entries = [self._storage[sid][:size].view(t).reshape(shape)
                         for sid, size, t, shape in zip(sids, sizes, types, shapes, strict=True)]

    def _plan_ops(self) -> None:
        """(node id, function name, input entries, output entries) per op node, checked."""
        self._ops: list[tuple[int, str, list[int], list[int]]] = []
        for nid, node in enumerate(self._nodes):
            if node["op"] == "null":
                continue
            attrs = node.get("attrs", {})
            func_name = attrs.get("func_name")
            if not isinstance(func_name, str):
                raise FormatError(f"graph JSON: node {node['name']!r} has no func_name")
            in_eids = [self._entry(i, idx, f"node {node['name']!r} inputs")
                       for i, idx, *_ in node["inputs"]]
            out_eids = list(range(self._row_ptr[nid], self._row_ptr[nid + 1]))
            if int(attrs.get("num_inputs", len(in_eids))) != len(in_eids) or \
                    int(attrs.get("num_outputs", len(out_eids))) != len(out_eids):
                raise FormatError(f"graph JSON: node {node['name']!r} has {len(in_eids)} "
                                  f"inputs and {len(out_eids)} outputs, attrs say otherwise")
            if func_name == _COPY and (len(in_eids) != 1 or len(out_eids) != 1 or
                                       self._entries[in_eids[0]].shape !=
                                       self._entries[out_eids[0]].shape):
                raise FormatError(f"graph JSON: copy node {node['name']!r} needs one input "
                                  "and one output of one shape")
            self._ops.append((nid, func_name, in_eids, out_eids))

    def _setup_op_execs(self, lookup: Callable[[str], Any]) -> None:
        """Resolve every op node's kernel and fill its argument array once."""
        self._execs: list[tuple[Any, Any, int]] = []
        for nid, func_name, in_eids, out_eids in self._ops:
            if func_name == _NOP:
                continue
            if func_name == _COPY:
                src, dst = self._entries[in_eids[0]], self._entries[out_eids[0]]
                self._execs.append((lambda _a, s=src, d=dst: np.copyto(d, s) or 0, None, nid))
                continue
            func = lookup(func_name)
            func.restype = ctypes.c_int32
            eids = in_eids + out_eids
            args = (ctypes.c_void_p * len(eids))(*(self._entries[e].ctypes.data for e in eids))
            self._execs.append((func, args, nid))

    # -- the TVM graph executor interface -------------------------------------

    def set_num_threads(self, n: int) -> None:
        """Threads the parallel kernels use in this executor's runs (default: see
        pipeline.runtime.threads); ValueError unless n is an integer >= 1."""
        self.num_threads = check_num_threads(n, "set_num_threads")

    def node_calls(self) -> list[tuple[str, str, Callable[[], int]]]:
        """(node name, function name, call) per executed node, in run order: what a
        profiler times (pipeline.runtime.profile). Each call runs just that node and
        keeps this executor (whose buffers its arguments point into) alive."""
        return [(self._nodes[nid]["name"], self._nodes[nid]["attrs"].get("func_name", ""),
                 lambda f=func, a=args, _keep=self: f(a)) for func, args, nid in self._execs]

    def node_shapes(self, name: str) -> tuple[list[tuple], list[tuple]]:
        """(input shapes, output shapes) of the op node `name`."""
        nid = next(k for k, n in enumerate(self._nodes) if n["name"] == name)
        ins = [self._entries[self._row_ptr[i] + idx].shape for i, idx, *_ in
               self._nodes[nid]["inputs"]]
        outs = [self._entries[e].shape for e in range(self._row_ptr[nid],
                                                       self._row_ptr[nid + 1])]
        return ins, outs

    def run(self) -> None:
        """Execute every op node once, in graph order."""
        if self._set_threads is not None:
            self._set_threads(self.num_threads)
        for func, args, nid in self._execs:
            if func(args):
                node = self._nodes[nid]
                raise RuntimeError(f"node {node['name']!r} (function "
                                   f"{node['attrs'].get('func_name')!r}) returned an error")

    def _resolve(self, key: int | str) -> tuple[str, int]:
        """(name, entry id) for an input name, param name or graph-input index."""
        if isinstance(key, (int, np.integer)):
            names = list(self._input_index)
            if not 0 <= key < len(names):
                raise IndexError(f"input index {key} out of range: the graph has "
                                 f"{len(names)} inputs {names}")
            return names[key], self._input_eids[key]
        if key in self._input_index:
            return key, self._input_eids[self._input_index[key]]
        if key in self._param_eids:
            return key, self._param_eids[key]
        raise KeyError(f"no input named {key!r}; inputs: {list(self._input_index)}")

    def _copy_in(self, name: str, eid: int, value: Any) -> None:
        dst = self._entries[eid]
        value = np.asarray(value)
        if value.shape != dst.shape or value.dtype != dst.dtype:
            raise ValueError(f"input {name!r}: expected shape {list(dst.shape)} {dst.dtype}, "
                             f"given shape {list(value.shape)} {value.dtype}")
        np.copyto(dst, value)

    def set_input(self, key: int | str, value: Any) -> None:
        """Copy value into the input (or param) named key, or the key-th graph input.

        Raises ValueError naming the input if shape or dtype differ.
        """
        name, eid = self._resolve(key)
        self._copy_in(name, eid, value)

    def get_input(self, key: int | str) -> np.ndarray:
        """A copy of the current value of an input or param."""
        return self._entries[self._resolve(key)[1]].copy()

    def get_output(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        """A copy of output `index` (or copy it into `out` and return that)."""
        if not 0 <= index < len(self._output_eids):
            raise IndexError(f"output index {index} out of range: the graph has "
                             f"{len(self._output_eids)} outputs")
        src = self._entries[self._output_eids[index]]
        if out is None:
            return src.copy()
        np.copyto(out, src)
        return out

    def get_num_outputs(self) -> int:
        """Number of graph outputs (heads)."""
        return len(self._output_eids)

    def get_num_inputs(self) -> int:
        """Number of graph inputs (params not counted, unlike TVM)."""
        return len(self._input_index)

    def get_input_names(self) -> list[str]:
        """Graph input names in arg_nodes order (params excluded)."""
        return list(self._input_index)

    def get_input_info(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        """({name: shape}, {name: dtype}) for the graph inputs, as TVM returns it."""
        views = {n: self._entries[e] for n, e in
                 zip(self._input_index, self._input_eids, strict=True)}
        return ({n: v.shape for n, v in views.items()},
                {n: str(v.dtype) for n, v in views.items()})

    def load_params(self, params_bytes: bytes) -> None:
        """Set params (or inputs) from TVM param-dict bytes; unknown names raise KeyError."""
        params = _parse_params(params_bytes)
        known = set(self._param_eids) | set(self._input_index)
        unknown = sorted(set(params) - known)
        if unknown:
            raise KeyError(f"params not in the graph: {unknown}")
        for name, value in params.items():
            self.set_input(name, value)


class GraphModule:
    """TVM's graph_executor.GraphModule: `GraphModule(lib["default"](dev))`."""

    def __init__(self, module: GraphExecutor, num_threads: int | None = None):
        self.module = module
        if num_threads is not None:  # else the executor's default (see set_num_threads)
            module.set_num_threads(num_threads)

    def set_input(self, key: int | str | None = None, value: Any = None, **params: Any) -> None:
        """Set one input by name or graph-input index, and/or several by keyword."""
        if key is not None:
            self.module.set_input(key, value)
        for name, val in params.items():
            self.module.set_input(name, val)

    def set_num_threads(self, n: int) -> None:
        """Threads the parallel kernels use (default $PIPELINE_NUM_THREADS, else all cores)."""
        self.module.set_num_threads(n)

    def run(self, **inputs: Any) -> None:
        """Set the given inputs by keyword, then execute the graph."""
        if inputs:
            self.set_input(**inputs)
        self.module.run()

    def get_output(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        """A copy of output `index`."""
        return self.module.get_output(index, out)

    def get_input(self, key: int | str) -> np.ndarray:
        """A copy of an input's current value."""
        return self.module.get_input(key)

    def get_num_outputs(self) -> int:
        """Number of graph outputs."""
        return self.module.get_num_outputs()

    def get_num_inputs(self) -> int:
        """Number of graph inputs (params not counted)."""
        return self.module.get_num_inputs()

    def get_input_names(self) -> list[str]:
        """Graph input names in order."""
        return self.module.get_input_names()

    def get_input_info(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        """({name: shape}, {name: dtype}) for the graph inputs."""
        return self.module.get_input_info()

    def load_params(self, params_bytes: bytes) -> None:
        """Load TVM param-dict bytes (see pipeline.runtime.params)."""
        self.module.load_params(params_bytes)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        # TVM style: gmod["run"](), gmod["set_input"](...).
        return getattr(self, name)
