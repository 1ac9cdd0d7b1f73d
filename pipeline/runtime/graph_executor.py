"""Run a compiled graph through the C executor linked into its library.

The executor (pipeline/runtime/c/executor.c, API pipeline_runtime.h) reads the
blob's binary plan, allocates storage, binds the params and runs the kernels;
this module is a thin ctypes layer over it with TVM's graph executor interface.
Shapes, dtypes and names are read once at creation, so set_input checks its
arguments in Python (ValueError naming the input) before C copies them.
Beyond running: zero-copy inputs, params shared between executors, timing
(benchmark, time_evaluator: pipeline/runtime/timing.py); the debug executor is
pipeline/runtime/debug_executor.py.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.errors import FormatError
from pipeline.ir.nibbles import PACKED, pack_nibbles, packed_nbytes, unpack_nibbles
from pipeline.runtime.params import load_params as _parse_params
from pipeline.runtime.params import param_names
from pipeline.runtime.threads import check_num_threads, default_num_threads
from pipeline.runtime.timing import BenchmarkResult, time_evaluator

__all__ = ["ALIGNMENT", "GraphExecutor", "GraphModule", "check_device", "empty_aligned"]

# What a zero-copy input must be aligned to: TVM's kAllocAlignment, the executor's ALIGN.
ALIGNMENT = 64


class _TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p),
                ("ndim", ctypes.c_int32), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("nbytes", ctypes.c_size_t)]


_P, _I, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
# name -> (restype, argtypes) of the C API functions used here.
_API = {
    # Not pl_create: the loader checked the blob's sha256 (runtime/blob.py unpack_blob).
    "pl_create_unchecked": (_P, [ctypes.c_char_p, _S]),
    "pl_destroy": (None, [_P]),
    "pl_last_error": (ctypes.c_char_p, [_P]),
    "pl_num_inputs": (_I, [_P]), "pl_num_params": (_I, [_P]), "pl_num_outputs": (_I, [_P]),
    "pl_input_info": (_I, [_P, _I, ctypes.POINTER(_TensorInfo)]),
    "pl_output_info": (_I, [_P, _I, ctypes.POINTER(_TensorInfo)]),
    "pl_set_input": (_I, [_P, _I, _P, _S]), "pl_get_input": (_I, [_P, _I, _P, _S]),
    "pl_get_output": (_I, [_P, _I, _P, _S]),
    "pl_set_num_threads": (_I, [_P, _I]), "pl_run": (_I, [_P]),
    "pl_runs_alone": (ctypes.c_uint, [_P]),
    "pl_num_nodes": (_I, [_P]), "pl_node_name": (ctypes.c_char_p, [_P, _I]),
    "pl_node_func": (ctypes.c_char_p, [_P, _I]),
    "pl_run_timed": (_I, [_P, ctypes.POINTER(ctypes.c_double)]),
    "pl_storage_bytes": (_S, [_P]),
    "pl_get_input_index": (_I, [_P, ctypes.c_char_p]),
    "pl_set_input_zero_copy": (_I, [_P, _I, _P, _S]), "pl_share_input": (_I, [_P, _P, _I]),
    "pl_input_data": (_P, [_P, _I]),
    "pl_run_node": (_I, [_P, _I, ctypes.POINTER(ctypes.c_double)]),
    "pl_node_output_info": (_I, [_P, _I, _I, ctypes.POINTER(_TensorInfo)]),
    "pl_get_node_output": (_I, [_P, _I, _I, _P, _S]),
}


def check_device(device: Any) -> None:
    """Accept None, "cpu"/"llvm" or a TVM-like device with device_type 1 (CPU)."""
    if device is None or (isinstance(device, str) and device.lower() in ("cpu", "llvm")):
        return
    if getattr(device, "device_type", None) == 1:
        return
    raise ValueError(f"unsupported device {device!r}: only the CPU is supported")


def empty_aligned(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous array whose data is ALIGNMENT-byte aligned, as
    set_input_zero_copy needs (numpy itself guarantees only 16)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def library_size(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of a library tensor of `shape` and `dtype` (int4 and uint4 packed)."""
    count = int(np.prod(shape, dtype=np.int64))
    return packed_nbytes(dtype, count) if dtype in PACKED else count * dtype.itemsize


def to_library(value: np.ndarray) -> np.ndarray:
    """`value` (checked for shape and dtype) as the library holds it: C-contiguous,
    int4 and uint4 packed two to a byte."""
    return pack_nibbles(value) if value.dtype in PACKED else np.ascontiguousarray(value)


def from_library(raw: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A library tensor's bytes (uint8) as an array of `shape` and `dtype`."""
    if dtype in PACKED:
        return unpack_nibbles(raw, dtype, shape)
    return raw.view(dtype).reshape(shape)


def bind_api(lib: ctypes.CDLL) -> dict[str, Any]:
    """The C API functions of a loaded library, typed; AttributeError if it has none."""
    api = {}
    for name, (restype, argtypes) in _API.items():
        fn = lib[name]
        fn.restype, fn.argtypes = restype, argtypes
        api[name] = fn
    return api


def _tensors(api: dict, handle: int, kind: str, count: int) -> list[tuple[str, tuple, np.dtype]]:
    """(name, shape, dtype) of inputs ("input") or outputs ("output") 0..count-1."""
    out = []
    info = _TensorInfo()
    for i in range(count):
        api[f"pl_{kind}_info"](handle, i, ctypes.byref(info))
        out.append((info.name.decode(), tuple(info.shape[k] for k in range(info.ndim)),
                    np.dtype(info.dtype.decode())))
    return out


class GraphExecutor:
    """Executes one graph. Built by `Module["default"](device)`.

    api: the library's typed C API (bind_api); graph_json: its TVM graph JSON,
    read only for node shapes (profiling); owner: the object to keep alive with
    the executor (the loaded library). Each executor has its own storage and copy
    of the params. FormatError (a ValueError) with the C reader's message if the
    blob is refused.
    """

    def __init__(self, api: dict[str, Any], graph_json: str, owner: Any = None):
        self._api, self._graph_json, self._owner = api, graph_json, owner
        self._node_shapes: dict | None = None  # node_shapes parses the JSON once
        self._zero_copy: dict[int, np.ndarray] = {}  # arrays the executor reads in place
        err = ctypes.create_string_buffer(512)
        self._h = api["pl_create_unchecked"](err, len(err))
        if not self._h:
            raise FormatError(f"{getattr(owner, 'path', 'library')}: "
                              f"{err.value.decode(errors='replace')}")
        n_in, n_params = api["pl_num_inputs"](self._h), api["pl_num_params"](self._h)
        self._slots = _tensors(api, self._h, "input", n_in + n_params)
        self._slot_index = {name: i for i, (name, _, _) in enumerate(self._slots)}
        self._input_names = [name for name, _, _ in self._slots[:n_in]]
        self._outputs = _tensors(api, self._h, "output", api["pl_num_outputs"](self._h))
        self.set_num_threads(default_num_threads())

    def __del__(self):
        if getattr(self, "_h", None):
            self._api["pl_destroy"](self._h)
            self._h = None

    def _error(self) -> str:
        return self._api["pl_last_error"](self._h).decode(errors="replace")

    # -- the TVM graph executor interface -------------------------------------

    def set_num_threads(self, n: int) -> None:
        """Threads the parallel kernels use in this executor's runs (default: see
        pipeline.runtime.threads); ValueError unless n is an integer >= 1."""
        self.num_threads = check_num_threads(n, "set_num_threads")
        self._api["pl_set_num_threads"](self._h, self.num_threads)

    @property
    def runs_alone(self) -> int:
        """Runs since the thread count was set that used one thread: with more than
        one, run() measures its time both ways and runs the faster (C: pl_run)."""
        return self._api["pl_runs_alone"](self._h)

    @property
    def graph_json(self) -> str:
        """The graph JSON (TVM's format) this executor runs."""
        return self._graph_json

    def node_names(self) -> list[tuple[str, str]]:
        """(node name, function name) per executed node, in run order."""
        api = self._api
        return [(api["pl_node_name"](self._h, k).decode(), api["pl_node_func"](self._h, k).decode())
                for k in range(api["pl_num_nodes"](self._h))]

    def run_timed(self) -> list[float]:
        """Run once, node by node; each node's wall time in seconds, in run order."""
        times = (ctypes.c_double * self._api["pl_num_nodes"](self._h))()
        if self._api["pl_run_timed"](self._h, times):
            raise RuntimeError(self._error())
        return list(times)

    def run_node(self, k: int) -> float:
        """Run executed node k alone (the nodes before it must have run); its wall
        time in seconds."""
        seconds = ctypes.c_double()
        if self._api["pl_run_node"](self._h, k, ctypes.byref(seconds)):
            raise RuntimeError(self._error())
        return seconds.value

    def node_outputs(self, k: int) -> list[np.ndarray]:
        """Copies of executed node k's outputs as they are now."""
        outs, info = [], _TensorInfo()
        while not self._api["pl_node_output_info"](self._h, k, len(outs), ctypes.byref(info)):
            out = np.empty(tuple(info.shape[d] for d in range(info.ndim)), info.dtype.decode())
            if self._api["pl_get_node_output"](self._h, k, len(outs), out.ctypes.data, out.nbytes):
                raise RuntimeError(self._error())
            outs.append(out)
        return outs

    def node_shapes(self, name: str) -> tuple[list[tuple], list[tuple]]:
        """(input shapes, output shapes) of the op node `name` (from the graph JSON)."""
        if self._node_shapes is None:  # parsed once: profiling asks for every node
            self._node_shapes = self._shapes_by_node()
        return self._node_shapes[name]

    def _shapes_by_node(self) -> dict[str, tuple[list[tuple], list[tuple]]]:
        graph = json.loads(self._graph_json)
        row_ptr, shapes = graph["node_row_ptr"], graph["attrs"]["shape"][1]
        return {node["name"]: ([tuple(shapes[row_ptr[i] + idx]) for i, idx, *_ in node["inputs"]],
                               [tuple(shapes[e]) for e in range(row_ptr[k], row_ptr[k + 1])])
                for k, node in enumerate(graph["nodes"])}

    def storage_bytes(self) -> int:
        """Bytes of planned storage this executor holds (inputs, params, intermediates)."""
        return self._api["pl_storage_bytes"](self._h)

    def run(self) -> None:
        """Execute every op node once, in graph order."""
        if self._api["pl_run"](self._h):
            raise RuntimeError(self._error())

    def _resolve(self, key: int | str) -> int:
        """The slot of an input name, param name or index (graph inputs, then params,
        as TVM numbers them: get_input_index)."""
        if isinstance(key, (int, np.integer)):
            if not 0 <= key < len(self._slots):
                raise IndexError(f"input index {key} out of range: the graph has "
                                 f"{len(self._input_names)} inputs {self._input_names} and "
                                 f"{len(self._slots) - len(self._input_names)} params")
            return int(key)
        if key in self._slot_index:
            return self._slot_index[key]
        raise KeyError(f"no input named {key!r}; inputs: {self._input_names}")

    def set_input(self, key: int | str, value: Any) -> None:
        """Copy value into the input (or param) named key, or the key-th graph input.

        Raises ValueError naming the input and the shape the library was built for
        (a library is built for one batch size) if shape or dtype differ.
        """
        slot = self._resolve(key)
        name, shape, dtype = self._slots[slot]
        value = np.asarray(value)
        if value.shape != shape or value.dtype != dtype:
            raise ValueError(f"input {name!r}: the library was built for shape {list(shape)} "
                             f"{dtype}, given shape {list(value.shape)} {value.dtype}")
        value = to_library(value)
        self._api["pl_set_input"](self._h, slot, value.ctypes.data, value.nbytes)

    def get_input(self, key: int | str) -> np.ndarray:
        """A copy of the current value of an input or param."""
        slot = self._resolve(key)
        _, shape, dtype = self._slots[slot]
        out = np.empty(library_size(shape, dtype), np.uint8)
        self._api["pl_get_input"](self._h, slot, out.ctypes.data, out.nbytes)
        return from_library(out, shape, dtype)

    def get_output(self, index: int, out: np.ndarray | None = None) -> np.ndarray:
        """A copy of output `index` (or copy it into `out` and return that)."""
        if not 0 <= index < len(self._outputs):
            raise IndexError(f"output index {index} out of range: the graph has "
                             f"{len(self._outputs)} outputs")
        _, shape, dtype = self._outputs[index]
        direct = out is not None and out.shape == shape and out.dtype == dtype and \
            out.flags.c_contiguous and out.flags.writeable and dtype not in PACKED
        dst = out if direct else np.empty(library_size(shape, dtype), np.uint8)
        self._api["pl_get_output"](self._h, index, dst.ctypes.data, dst.nbytes)
        if direct:
            return dst
        dst = from_library(dst, shape, dtype)
        if out is None:
            return dst
        np.copyto(out, dst)
        return out

    def get_num_outputs(self) -> int:
        """Number of graph outputs (heads)."""
        return len(self._outputs)

    def get_num_inputs(self) -> int:
        """Number of graph inputs (params not counted, unlike TVM)."""
        return len(self._input_names)

    def get_input_names(self) -> list[str]:
        """Graph input names in arg_nodes order (params excluded)."""
        return list(self._input_names)

    def get_input_info(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        """({name: shape}, {name: dtype}) for the graph inputs, as TVM returns it."""
        inputs = self._slots[:len(self._input_names)]
        return ({n: s for n, s, _ in inputs}, {n: str(d) for n, _, d in inputs})

    def load_params(self, params_bytes: bytes) -> None:
        """Set params (or inputs) from TVM param-dict bytes; unknown names raise KeyError."""
        params = _parse_params(params_bytes)
        unknown = sorted(set(params) - set(self._slot_index))
        if unknown:
            raise KeyError(f"params not in the graph: {unknown}")
        for name, value in params.items():
            self.set_input(name, value)

    # -- the rest of TVM's runtime API ----------------------------------------

    def get_input_index(self, name: str) -> int:
        """The index of an input or param (set_input, get_input take it); -1 if the
        graph has none of that name, as TVM returns."""
        if not isinstance(name, str):
            raise TypeError(f"get_input_index: the input key must be a string, got {name!r}")
        return self._api["pl_get_input_index"](self._h, name.encode())

    def get_output_info(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        """({name: shape}, {name: dtype}) for the graph outputs, keyed by the name of
        the node producing each, as TVM returns it (two outputs of one node: one key)."""
        return ({n: s for n, s, _ in self._outputs}, {n: str(d) for n, _, d in self._outputs})

    def set_input_zero_copy(self, key: int | str, value: np.ndarray) -> None:
        """Make `value`'s buffer the input (or param) named key, or the key-th graph
        input, without copying it: every run reads the array as it is then, until
        the next set_input_zero_copy or set_input of that input (which copies into
        the executor's own storage again). The array is kept alive meanwhile; the
        executor never writes it.

        It must have the input's shape and dtype, be C-contiguous and ALIGNMENT
        (64) bytes aligned (empty_aligned makes one): TypeError or ValueError
        naming the input otherwise."""
        slot = self._resolve(key)
        name, shape, dtype = self._slots[slot]
        if not isinstance(value, np.ndarray):
            raise TypeError(f"input {name!r}: set_input_zero_copy needs a numpy array, got "
                            f"{type(value).__name__}")
        if value.shape != shape or value.dtype != dtype:
            raise ValueError(f"input {name!r}: expected shape {list(shape)} {dtype}, given "
                             f"shape {list(value.shape)} {value.dtype} (zero-copy cannot convert)")
        if not value.flags.c_contiguous or dtype in PACKED:
            raise ValueError(f"input {name!r}: a zero-copy array must be C-contiguous "
                             "(and not int4 or uint4, which the library holds packed)")
        if value.ctypes.data % ALIGNMENT:
            raise ValueError(f"input {name!r}: a zero-copy array must be {ALIGNMENT}-byte aligned "
                             f"(its data is at {value.ctypes.data:#x}); allocate it with "
                             "pipeline.runtime.empty_aligned")
        if self._api["pl_set_input_zero_copy"](self._h, slot, value.ctypes.data, value.nbytes):
            raise ValueError(self._error())
        self._zero_copy[slot] = value  # the executor reads it from now on

    def share_params(self, other: GraphExecutor | GraphModule, params_bytes: bytes) -> None:
        """Use `other`'s storage for the params (or inputs) named in `params_bytes` (a
        TVM param dict; only its names are used), without copying, as TVM's
        share_params: a param set through one executor is seen by both. Names the
        graph does not have are skipped, as TVM does. `other` must come from the same
        library (ValueError otherwise); its storage outlives it as long as needed."""
        other = other.module if isinstance(other, GraphModule) else other
        if not isinstance(other, GraphExecutor):
            raise TypeError(f"share_params: expected a GraphExecutor or GraphModule, got "
                            f"{type(other).__name__}")
        for name in param_names(params_bytes):
            index = self.get_input_index(name)
            if index >= 0 and self._api["pl_share_input"](self._h, other._h, index):
                raise ValueError(self._error())

    def input_data_address(self, key: int | str) -> int:
        """The address the input or param lives at now (its storage, a zero-copy
        array, or another executor's storage after share_params)."""
        return self._api["pl_input_data"](self._h, self._resolve(key)) or 0

    def run_from_inputs(self, **inputs: Any) -> list[np.ndarray]:
        """Set the given inputs, run, and return copies of every output (what TVM's
        benchmark times with end_to_end=True)."""
        for name, value in inputs.items():
            self.set_input(name, value)
        self.run()
        return [self.get_output(k) for k in range(len(self._outputs))]

    def time_evaluator(self, func_name: str, dev: Any = None, number: int = 10, repeat: int = 1,
                       min_repeat_ms: float = 0, limit_zero_time_iterations: int = 100,
                       ) -> Callable[..., BenchmarkResult]:
        """TVM's Module.time_evaluator for "run" or "run_from_inputs": a function taking
        that function's arguments and returning a BenchmarkResult (semantics:
        pipeline.runtime.timing.time_evaluator)."""
        check_device(dev)
        funcs = {"run": self.run, "run_from_inputs": self.run_from_inputs}
        if func_name not in funcs:
            raise ValueError(f"time_evaluator: no function {func_name!r}; available: "
                             f"{sorted(funcs)}")
        return time_evaluator(funcs[func_name], number, repeat, min_repeat_ms,
                              limit_zero_time_iterations)


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
        for name, value in inputs.items():  # not set_input(**inputs): inputs named key, value
            self.module.set_input(name, value)
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

    def get_input_index(self, name: str) -> int:
        """The index of an input or param name, -1 if there is none (TVM)."""
        return self.module.get_input_index(name)

    def get_output_info(self) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
        """({name: shape}, {name: dtype}) for the graph outputs."""
        return self.module.get_output_info()

    def set_input_zero_copy(self, key: int | str | None = None, value: np.ndarray | None = None,
                            **params: np.ndarray) -> None:
        """Use 64-byte aligned C-contiguous arrays as inputs without copying them: one
        by name or index, and/or several by keyword (as set_input)."""
        if key is not None:
            self.module.set_input_zero_copy(key, value)
        for name, array in params.items():
            self.module.set_input_zero_copy(name, array)

    def share_params(self, other: GraphModule | GraphExecutor, params_bytes: bytes) -> None:
        """Share the params named in params_bytes with `other` (same library), no copy."""
        self.module.share_params(other, params_bytes)

    def debug_get_output(self, node: int | str, out: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError("debug_get_output needs the debug executor: "
                                  "pipeline.runtime.debug_executor.create(...)")

    def benchmark(self, device: Any = None, func_name: str = "run", repeat: int = 5,
                  number: int = 5, min_repeat_ms: float | None = None, end_to_end: bool = False,
                  **kwargs: Any) -> BenchmarkResult:
        """Time func_name (TVM's GraphModule.benchmark): `repeat` results, each the mean
        of `number` calls, `number` raised until a repeat takes min_repeat_ms. kwargs
        are inputs, set once before timing; with end_to_end, setting them and copying
        every output out is timed too (func_name is then ignored)."""
        min_repeat_ms = 0 if min_repeat_ms is None else min_repeat_ms
        if end_to_end:
            return self.module.time_evaluator("run_from_inputs", device, number, repeat,
                                              min_repeat_ms)(**kwargs)
        if kwargs:
            self.set_input(**kwargs)
        return self.module.time_evaluator(func_name, device, number, repeat, min_repeat_ms)()

    def __getitem__(self, name: str) -> Callable[..., Any]:
        # TVM style: gmod["run"](), gmod["set_input"](...).
        return getattr(self, name)
