"""The VM's Python API, modelled on TVM's `tvm.runtime.vm` (docs/vm.md):

    exe = Executable.load_exec(ro_bytes, "model.so")   # or Executable.load("model.so")
    vm = VirtualMachine(exe)                           # or VirtualMachine("model.so")
    outputs = vm.run(x)                                # numpy arrays, ONNX output order
    vm.set_input("main", x); outputs = vm.invoke("main")
    vm.set_input_zero_copy("x", a)     # a = empty_aligned(...): runs read it in place
    print(vm.benchmark("main", x, repeat=5))

A VM library (`executor: vm`) holds the kernels, the .ro (pipeline/vm/format.py,
under its own symbol) and the C interpreter (pipeline/runtime/c/vm.c), whose
pl_* API this module calls through ctypes. The .ro's checksum and content are
checked in Python before the C side reads it, as the graph executor's blob is.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from typing import Any

import numpy as np

from pipeline.errors import FormatError, PipelineError
from pipeline.link.integrity import verify_code_digest
from pipeline.runtime.graph_executor import (
    PACKED,
    _TensorInfo,
    from_library,
    library_size,
    to_library,
)
from pipeline.runtime.machine import check_machine
from pipeline.runtime.module import _check_segments
from pipeline.runtime.threads import limit_idle_spin
from pipeline.runtime.timing import BenchmarkResult, time_evaluator
from pipeline.vm import compile as vm_compile
from pipeline.vm.format import RO_SYMBOL, read_ro

__all__ = ["Executable", "VMError", "VirtualMachine", "is_vm_library"]

_PREFIX = 24  # magic, version, reserved, total length: format.py
_MAX_NDIM = 32  # runtime/c/vm.c MAX_NDIM: a register's most dimensions


class VMError(PipelineError, RuntimeError):
    """A VM run or input refused; the message is one line."""


def is_vm_library(path: str | os.PathLike) -> bool:
    """Whether the library file at `path` was built with `executor: vm` (it names
    the .ro symbol, which only a VM library's symbol table holds)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(RO_SYMBOL.encode() + b"\0") >= 0


def _load_library(path: str | os.PathLike) -> tuple[str, ctypes.CDLL]:
    """dlopen a VM library after the loader's checks (suffix, machine, truncation, the
    code digest the link stamped after its .ro)."""
    path = os.path.abspath(os.fspath(path))
    if not path.endswith(".so"):
        raise ValueError(f"cannot load {path}: a VM library is a .so file")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"library not found: {path}")
    check_machine(path, path)
    _check_segments(path, path)
    verify_code_digest(path, path)  # before dlopen: no byte of damaged code runs
    limit_idle_spin()
    try:
        return path, ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    except OSError as err:
        raise OSError(f"cannot load {path}: {err}") from None


def _packed_ro(lib: ctypes.CDLL, path: str) -> ctypes.Array:
    """The .ro packed into a VM library, where the library is mapped (not a copy: its
    constants are the model's weights; the VM copies them once into its own arena and
    gives the file's pages back)."""
    try:
        addr = ctypes.addressof(ctypes.c_char.in_dll(lib, RO_SYMBOL))
    except ValueError:
        raise FormatError(f"{path}: no {RO_SYMBOL} symbol: not a VM library (built with "
                          "executor: vm); load a graph library with load_module") from None
    total = int.from_bytes(ctypes.string_at(addr + 16, 8), "little")
    if total > os.path.getsize(path):
        raise FormatError(f"{path}: VM executable truncated: {total} bytes, the file has "
                          f"{os.path.getsize(path)}")
    return (ctypes.c_ubyte * max(total, _PREFIX)).from_address(addr)


class Executable:
    """A VM executable: the functions, constants and kernel names of a .ro (read and
    verified) with the VM library whose kernels and interpreter run it."""

    def __init__(self, ro: bytes | ctypes.Array, lib: ctypes.CDLL, path: str):
        # bytes (load_exec), or the library's own mapped .ro (load): the VM reads its
        # names in place, so it is kept as long as the executable
        self.ro = ro if isinstance(ro, ctypes.Array) else bytes(ro)
        self.content: vm_compile.Executable = read_ro(self.ro, path)
        self.lib, self.path = lib, path

    def ro_address(self) -> int:
        """Where the .ro's bytes are (valid as long as this executable)."""
        if isinstance(self.ro, ctypes.Array):
            return ctypes.addressof(self.ro)
        return ctypes.cast(ctypes.c_char_p(self.ro), ctypes.c_void_p).value

    @classmethod
    def load_exec(cls, ro_bytes: bytes, lib: str | os.PathLike) -> Executable:
        """The executable of `ro_bytes` (a .ro file's content) over the VM library
        `lib` (a path), whose kernels it calls (TVM: Executable.load_exec).
        FormatError for another magic or version or a corrupted file."""
        path, handle = _load_library(lib)
        return cls(ro_bytes, handle, path)

    @classmethod
    def load(cls, lib: str | os.PathLike) -> Executable:
        """The executable packed into the VM library `lib`."""
        path, handle = _load_library(lib)
        return cls(_packed_ro(handle, path), handle, path)

    def save(self) -> tuple[bytes, str]:
        """(the .ro bytes, the library path), as TVM's Executable.save."""
        return bytes(self.ro), self.path

    @property
    def kernels(self) -> tuple[str, ...]:
        return self.content.kernels

    @property
    def bytecode(self) -> str:
        """Every function's instructions, one a line."""
        lines = []
        for fn in self.content.functions:
            lines.append(f"def {fn.name}({', '.join(p.name for p in fn.params)}): "
                         f"{fn.num_regs} registers")
            lines += [f"  {k}: {ins}" for k, ins in enumerate(fn.code)]
        return "\n".join(lines)


def _bind(lib: ctypes.CDLL) -> dict[str, Any]:
    """The VM's C functions, typed."""
    p, i, s = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    types = {"pl_create_unchecked": (p, [ctypes.c_char_p, s]),
             "pl_vm_load": (p, [p, s, ctypes.c_char_p, s]),
             "pl_destroy": (None, [p]), "pl_last_error": (ctypes.c_char_p, [p]),
             "pl_num_inputs": (i, [p]), "pl_num_outputs": (i, [p]),
             "pl_input_info": (i, [p, i, ctypes.POINTER(_TensorInfo)]),
             "pl_output_info": (i, [p, i, ctypes.POINTER(_TensorInfo)]),
             "pl_set_input": (i, [p, i, p, s]), "pl_get_output": (i, [p, i, p, s]),
             "pl_set_input_shape": (i, [p, i, i, ctypes.POINTER(ctypes.c_int64)]),
             "pl_set_num_threads": (i, [p, i]), "pl_run": (i, [p]),
             "pl_output_count": (i, [p, i]),
             "pl_output_item_info": (i, [p, i, i, ctypes.POINTER(_TensorInfo)]),
             "pl_get_output_item": (i, [p, i, i, p, s])}
    api = {}
    for name, (restype, argtypes) in types.items():
        try:
            fn = lib[name]
        except AttributeError:
            raise FormatError(f"{lib._name}: no {name}: not a VM library") from None
        fn.restype, fn.argtypes = restype, argtypes
        api[name] = fn
    return api


def _references(slots: list, k: int) -> int:
    """sys.getrefcount of slots[k], counted the same way wherever it is called."""
    item = slots[k]
    return sys.getrefcount(item)


# _references of an object only its list refers to (Python versions count a call's
# own references differently: measured, not assumed)
_SOLE = _references([object()], 0)

# Outputs from this size on are handed over (pl_vm_take_outputs) rather than copied:
# a lease costs ~2 us from Python, the copy of 64 KiB about as much when both run
# warm; after a step that streamed the caches (a big decoder's), copying its 32 KiB
# of logits cost 14-18 us more than leasing them (calls interleaved, one process).
_TAKE_BYTES = 16 << 10


class _Lease:
    """The base of an output array over a storage the VM handed over: gives the
    storage back to the VM's pool when the array (and every view of it) is freed, from
    whichever thread frees it. Holds the VirtualMachine, which must outlive it."""

    __slots__ = ("__array_interface__", "vm", "token")

    def __del__(self):
        vm = self.vm
        if vm._handle:
            vm._give_back(vm._handle, self.token)


class VirtualMachine:
    """Runs a VM executable: VirtualMachine(exe) or VirtualMachine("model.so") (the
    .ro packed in the library). Each VM has its own storage pool and copy of the
    constants; one VM must not be used by two threads at once."""

    def __init__(self, lib_or_exe: Executable | str | os.PathLike, device: Any = None):
        del device  # the CPU: accepted for TVM's VirtualMachine(exe, dev) signature
        exe = lib_or_exe if isinstance(lib_or_exe, Executable) else Executable.load(lib_or_exe)
        self.executable = exe
        self._api = _bind(exe.lib)
        err = ctypes.create_string_buffer(512)
        self._handle = self._api["pl_vm_load"](exe.ro_address(), len(exe.ro), err, len(err))
        if not self._handle:
            raise FormatError(f"{exe.path}: {err.value.decode(errors='replace')}")
        main = exe.content.functions[0]
        self._params = main.params
        self._inputs: list[np.ndarray | None] = [None] * len(main.params)
        # Per output, made once: the info struct pl_output_info fills, a reference to
        # it, and the numpy dtype (the declared one, which a run keeps). Outputs are
        # read after every run, and building these per run cost a decode step of the
        # test decoder a quarter of its time.
        self._values = {k for k, result in enumerate(main.results) if result.kind}
        self._last: list[np.ndarray | None] = [None] * len(main.results)  # _output_array
        self._out_slots = []
        for result in main.results:
            info = _TensorInfo()
            dtype = np.dtype(result.dtype)  # and its type string (None: ml_dtypes' types)
            self._out_slots.append((info, ctypes.byref(info), dtype,
                                    dtype.str if dtype.isbuiltin == 1 else None))
        # All the shapes in one call: a row of 1 + _MAX_NDIM int64 per output (its
        # rank, its dimensions); None in a library built before pl_vm_output_shapes.
        self._shape_rows = np.zeros((len(main.results), 1 + _MAX_NDIM), np.int64)
        self._shape_address = self._shape_rows.ctypes.data
        try:
            self._shapes_of = exe.lib["pl_vm_output_shapes"]
            self._shapes_of.restype = ctypes.c_int
            self._shapes_of.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        except AttributeError:
            self._shapes_of = None
        self._take = self._leases(exe.lib, len(main.results))

    def _leases(self, lib: ctypes.CDLL, n: int) -> Any:
        """pl_vm_take_outputs bound to two arrays of n pointers (its data and token
        rows), and pl_vm_give_back; None in a library built before them."""
        try:
            take, self._give_back = lib["pl_vm_take_outputs"], lib["pl_vm_give_back"]
        except AttributeError:
            return None
        p = ctypes.c_void_p
        take.restype, take.argtypes = ctypes.c_int, [p, p, p, ctypes.c_size_t, ctypes.c_size_t]
        self._give_back.restype, self._give_back.argtypes = None, [p, p]
        self._taken = np.zeros((2, n), np.uintp)  # where each output is, its storage
        # (its rows' addresses once: ndarray.ctypes costs microseconds a call)
        self._taken_rows = (self._taken.ctypes.data,
                            self._taken.ctypes.data + self._taken.itemsize * n, n)
        return take

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._api["pl_destroy"](handle)

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise VMError(self._api["pl_last_error"](self._handle).decode(errors="replace"))

    def _function(self, func_name: str) -> None:
        if func_name != "main":
            raise VMError(f"function {func_name!r}: only 'main' is callable; the executable's "
                          f"other functions are subgraph bodies")

    def set_input(self, func_name: str = "main", *args: Any, **kwargs: Any) -> None:
        """Inputs of `func_name` by position, then by name; each checked for its
        dtype and shape (VMError naming the input)."""
        self._function(func_name)
        names = [p.name for p in self._params]
        if len(args) > len(names):
            raise VMError(f"{func_name} takes {len(names)} inputs, {len(args)} given")
        given = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name not in names:
                raise VMError(f"{func_name} has no input {name!r}; inputs: {names}")
            given[name] = value
        for name, value in given.items():
            k = names.index(name)
            array = np.asarray(value)  # (ascontiguousarray makes a scalar 1-d)
            if not array.flags.c_contiguous:
                array = array.copy()
            self._set_shape(k, array)
            raw = to_library(array)  # int4 / uint4: packed two to a byte
            self._check(self._api["pl_set_input"](self._handle, k, raw.ctypes.data, raw.nbytes))
            array = raw
            self._inputs[k] = array

    def _set_shape(self, k: int, array: np.ndarray) -> None:
        """Check `array` against main's input `k` (_check_input) and give the VM its
        shape (pl_set_input_shape), which the next set_input(_zero_copy) sizes by."""
        self._check_input(self._params[k], array)
        shape = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
        self._check(self._api["pl_set_input_shape"](self._handle, k, array.ndim, shape))

    def _check_input(self, want, array: np.ndarray) -> None:
        """VMError (one line naming the input) unless `array` has the input's dtype,
        rank and static dimensions, and each symbolic one within its bounds."""
        bounds = self.executable.content.dims
        declared = [f"{d} ({bounds[d][0]}..{bounds[d][1]})" if isinstance(d, str) else str(d)
                    for d in want.shape]
        expected = f"expected {want.dtype} [{', '.join(declared)}]"
        if array.dtype != np.dtype(want.dtype) or array.ndim != len(want.shape) or any(
                not isinstance(d, str) and d != n for d, n in zip(want.shape, array.shape,
                                                                  strict=True)):
            raise VMError(f"input {want.name!r}: {expected}, given {array.dtype} "
                          f"{list(array.shape)}")
        for d, n in zip(want.shape, array.shape, strict=True):
            if isinstance(d, str) and not bounds[d][0] <= n <= bounds[d][1]:
                raise VMError(f"input {want.name!r}: dimension {d!r} = {n} is outside its "
                              f"bounds {bounds[d][0]}..{bounds[d][1]}")

    def set_input_zero_copy(self, name: str, value: np.ndarray) -> None:
        """Make `value`'s buffer main's input `name` without copying it, as the graph
        executor's set_input_zero_copy: every run reads the array as it is then,
        until the next set_input or set_input_zero_copy of that input; the array is
        kept alive meanwhile and never written. It must have the input's dtype and
        shape (a symbolic dimension within its bounds: the VM then takes that
        shape), be C-contiguous and 64-byte aligned (pipeline.runtime.empty_aligned
        makes one): VMError naming the input otherwise."""
        names = [p.name for p in self._params]
        if name not in names:
            raise VMError(f"main has no input {name!r}; inputs: {names}")
        if not isinstance(value, np.ndarray) or not value.flags.c_contiguous or \
                value.dtype in PACKED:
            raise VMError(f"input {name!r}: a zero-copy input must be a C-contiguous numpy "
                          "array (not int4 or uint4, which the library holds packed)")
        k = names.index(name)
        self._check_input(self._params[k], value)
        if value.nbytes == 0:  # nothing to borrow (an empty KV cache): numpy's pointer
            self.set_input("main", **{name: value})  # of an empty array is not aligned
            return
        if value.ctypes.data % 64:
            raise VMError(f"input {name!r}: a zero-copy array must be 64-byte aligned (its "
                          f"data is at {value.ctypes.data:#x}); allocate it with "
                          "pipeline.runtime.empty_aligned")
        try:
            fn = self.executable.lib["pl_set_input_zero_copy"]
        except AttributeError:
            raise VMError(f"{self.executable.path}: built before the VM had zero-copy "
                          "inputs; rebuild it") from None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        self._set_shape(k, value)  # first: the VM sizes the buffer by the shape
        self._check(fn(self._handle, k, value.ctypes.data, value.nbytes))
        self._inputs[k] = value  # the VM reads it from now on

    def invoke(self, func_name: str = "main", *args: Any, **kwargs: Any) -> list[np.ndarray]:
        """Run `func_name` (inputs as set_input takes them, or set before) and
        return its outputs, in ONNX output order, as numpy arrays of their own: big
        ones are the VM's storages handed over, not copies (_outputs), which come back
        to the VM when the arrays are freed; a decode loop may give a present KV
        output to the next step as set_input_zero_copy's past without a copy."""
        if args or kwargs:
            self.set_input(func_name, *args, **kwargs)
        self._function(func_name)
        missing = [p.name for p, x in zip(self._params, self._inputs, strict=True) if x is None]
        if missing:
            raise VMError(f"inputs not set: {missing}")
        self._check(self._api["pl_run"](self._handle))
        if self._values:  # a sequence or an optional among them: each on its own
            return [self._value(k) if k in self._values else self._output(k)
                    for k in range(len(self._out_slots))]
        return self._outputs()

    def run(self, *args: Any, **kwargs: Any) -> list[np.ndarray]:
        """invoke("main", ...)."""
        return self.invoke("main", *args, **kwargs)

    def _read(self, info_call, get_call) -> np.ndarray:
        """One tensor: info_call(info struct) fills its shape and dtype, get_call(address,
        nbytes) copies its bytes (a tensor output, or an item of a sequence output)."""
        info = _TensorInfo()
        self._check(info_call(ctypes.byref(info)))
        shape, dtype = tuple(info.shape[d] for d in range(info.ndim)), np.dtype(info.dtype.decode())
        out = np.empty(library_size(shape, dtype), np.uint8)
        self._check(get_call(out.ctypes.data, out.nbytes))
        return from_library(out, shape, dtype)

    def _output(self, k: int) -> np.ndarray:
        """Output k, a tensor, read on its own."""
        api, handle = self._api, self._handle
        return self._read(lambda info: api["pl_output_info"](handle, k, info),
                          lambda at, n: api["pl_get_output"](handle, k, at, n))

    def _output_shapes(self) -> list[tuple[int, ...]]:
        """Each output's shape after a run: one pl_vm_output_shapes call, or (a
        library built before it) pl_output_info per output."""
        rows = self._shape_rows
        if self._shapes_of is not None:
            if self._shapes_of(self._handle, self._shape_address, rows.size):
                self._check(-1)
            return [tuple(row[1:1 + row[0]]) for row in rows.tolist()]
        shapes = []
        for k, (info, ref, *_) in enumerate(self._out_slots):
            self._api["pl_output_info"](self._handle, k, ref)
            shapes.append(tuple(info.shape[:info.ndim]))
        return shapes

    def _outputs(self) -> list[np.ndarray]:
        """Main's outputs of the last run at their runtime shapes: those of _TAKE_BYTES
        or more that are alone in a storage of the VM's own are that storage, handed
        over (_lease); the others are copied into arrays of their own."""
        # (the Python here runs after a step that may have streamed the caches full of
        # weights: every call and object costs a few times what it does warm, and a big
        # decoder's step paid ~0.15 ms for its 9 outputs before this was trimmed)
        handle, get = self._handle, self._api["pl_get_output"]
        shapes, taken = self._output_shapes(), ((0,) * len(self._out_slots),) * 2
        if self._take is not None:
            if self._take(handle, *self._taken_rows, _TAKE_BYTES):
                self._check(-1)
            taken = self._taken.tolist()
        outputs = []
        for k, (shape, data, token) in enumerate(zip(shapes, *taken, strict=True)):
            _, _, dtype, typestr = self._out_slots[k]
            if data:
                outputs.append(self._lease(data, token, shape, dtype, typestr))
                continue
            if dtype in PACKED:  # int4 / uint4: packed in the library
                raw = np.empty(library_size(shape, dtype), np.uint8)
                self._check(get(handle, k, raw.ctypes.data, raw.nbytes))
                outputs.append(from_library(raw, shape, dtype))
                continue
            out = self._output_array(k, shape, dtype)
            # (the address through ctypes.c_char: 0.7 us where out.ctypes takes ~3; but
            # ml_dtypes' types, bfloat16 and float8, cannot be exported as a buffer)
            if out.nbytes and get(handle, k, ctypes.addressof(ctypes.c_char.from_buffer(out))
                                  if dtype.isbuiltin == 1 else out.ctypes.data, out.nbytes):
                self._check(-1)
            outputs.append(out)
        return outputs

    def _output_array(self, k: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An array to copy output k into: the one the last run returned when the
        caller has let go of it (only self._last refers to it: no view, no name) and
        the shape is the same, else a new one. A new array's pages are new to the
        process: glibc gives a big freed array back to the kernel and the next run's
        copy faulted it in again, page by page (a fifth of a big decoder's 4-bit step,
        when its KV cache was copied: a library built before pl_vm_take_outputs)."""
        if _references(self._last, k) == _SOLE:  # (before a local name refers to it)
            old = self._last[k]
            if old.shape == shape:
                return old
        self._last[k] = out = np.empty(shape, dtype)
        return out

    def _lease(self, data: int, token: int, shape: tuple[int, ...], dtype: np.dtype,
               typestr: str | None) -> np.ndarray:
        """A writable array over the storage `token` the VM handed over (its bytes at
        `data`), given back when the array is freed (_Lease); typestr: dtype's type
        string, None for ml_dtypes' types, which have none."""
        lease = _Lease()
        lease.vm, lease.token = self, token
        if typestr is None:  # bytes, viewed as the dtype
            lease.__array_interface__ = {"data": (data, False), "version": 3, "typestr": "|u1",
                                         "shape": (int(np.prod(shape)) * dtype.itemsize,)}
            return np.asarray(lease).view(dtype).reshape(shape)
        lease.__array_interface__ = {"data": (data, False), "shape": shape, "version": 3,
                                     "typestr": typestr}
        return np.asarray(lease)

    def _value(self, k: int) -> np.ndarray | list[np.ndarray] | None:
        """Output k, a sequence or an optional (bytecode KINDS): a list of arrays, None
        (an empty optional) or an array (an optional holding a tensor)."""
        count = self._api["pl_output_count"](self._handle, k)
        if count == -2:
            return None
        if count < 0:
            return self._output(k)
        api, handle = self._api, self._handle
        return [self._read(lambda info, j=j: api["pl_output_item_info"](handle, k, j, info),
                           lambda at, n, j=j: api["pl_get_output_item"](handle, k, j, at, n))
                for j in range(count)]

    def set_num_threads(self, num_threads: int) -> None:
        """Threads of the parallel kernels (0: libgomp's own choice)."""
        self._check(self._api["pl_set_num_threads"](self._handle, num_threads))

    def benchmark(self, func_name: str = "main", *args: Any, number: int = 10,
                  repeat: int = 1, min_repeat_ms: float = 0, **kwargs: Any) -> BenchmarkResult:
        """Time `func_name` on the given (or set) inputs as TVM's VirtualMachine.benchmark:
        `repeat` results, each the mean seconds of `number` runs (time_evaluator)."""
        if args or kwargs:
            self.set_input(func_name, *args, **kwargs)
        self._function(func_name)
        return time_evaluator(lambda: self._check(self._api["pl_run"](self._handle)),
                              number, repeat, min_repeat_ms)()
