"""Compile an executor plan (the graph JSON after the passes and the memory plan,
pipeline/plan/) and its params into VM functions: the `.ro` executable's content.

For a static graph the function `main` allocates each planned storage once (from
the VM's pool), places every tensor at its planned offset, loads the params from
the constant section, invokes the kernels in order and returns the graph outputs
in ONNX order. The kernels and the memory layout are the graph executor's, so the
VM runs the same machine code over the same bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from pipeline.errors import FormatError
from pipeline.ir.dims import dim_terms, is_symbol, is_symbolic, substitute, symbols_of
from pipeline.ir.graph import nbytes
from pipeline.vm.bytecode import (
    DTYPES,
    OPCODES,
    AddDim,
    AllocStorage,
    AllocTensor,
    AllocTensorDims,
    Copy,
    Function,
    Instruction,
    InvokePacked,
    InvokePackedDims,
    LoadConst,
    MulDim,
    Ret,
    ShapeOf,
    TensorType,
    View,
    ViewDims,
    decode,
    operands,
    verify,
)

__all__ = ["PROGRAM_KEY", "Executable", "compile_plan", "program_from_json", "program_json"]

_NOP, _COPY = "__nop", "__copy"


@dataclass(frozen=True)
class Executable:
    """What a .ro file holds: functions (main first), constants (name -> array, in
    LoadConst index order), the kernel symbols InvokePacked indexes and the bounds
    [low, high] of each symbolic dimension its types name."""

    functions: tuple[Function, ...]
    constants: dict[str, np.ndarray]
    kernels: tuple[str, ...]
    dims: dict[str, tuple[int, int]] = field(default_factory=dict)

    def verify(self) -> None:
        """bytecode.verify over the functions; FormatError if anything is off."""
        verify(list(self.functions), len(self.kernels), len(self.constants))
        for fn in self.functions:
            for t in (*fn.params, *fn.results):
                if any(isinstance(d, str) and d not in self.dims for d in t.shape):
                    raise FormatError(f"VM function {fn.name!r}: {t.name!r} has shape "
                                      f"{list(t.shape)}: a dimension without bounds")


def _nbytes(dtype: str, shape: list[int]) -> int:
    return nbytes(dtype, math.prod(shape))


class _Dims:
    """Runtime dimensions of one function: each symbol's register (ShapeOf of the
    first argument that has it) and the MulDim / AddDim code of expressions, in
    `code`."""

    def __init__(self, args: list[tuple[int, tuple]], next_reg: int):
        self.code: list[Instruction] = []
        self.reg: dict[str, int] = {}
        self.next = next_reg
        for r, shape in args:
            for axis, d in enumerate(shape):
                if is_symbol(d) and d not in self.reg:
                    self.reg[d] = self._new()
                    self.code.append(ShapeOf(self.reg[d], r, axis))

    def _new(self) -> int:
        self.next += 1
        return self.next - 1

    def operand(self, d) -> int:
        """The dim operand (bytecode DIMS) of dimension d."""
        if not isinstance(d, str):
            return int(d)
        if d not in self.reg:
            if is_symbol(d):
                raise FormatError(f"VM compile: dimension {d!r} is not known from the inputs")
            total = None
            for names, coeff in dim_terms(d):
                term = coeff
                for name in names:
                    term = self._binary(MulDim, term, self.operand(name))
                total = term if total is None else self._binary(AddDim, total, term)
            self.reg[d] = -1 - total
        return -1 - self.reg[d]

    def _binary(self, kind, a: int, b: int) -> int:
        """The dim operand of `kind`(a, b) (MulDim, AddDim), 1 * x folded."""
        if kind is MulDim and a == 1:
            return b
        dst = self._new()
        self.code.append(kind(dst, a, b))
        return -1 - dst

    def shape(self, shape) -> tuple[int, ...]:
        return tuple(self.operand(d) for d in shape)


def _entries(doc: dict) -> list[tuple[int, int, str, tuple[int, ...]]]:
    """(storage id, byte offset, dtype, shape) per entry (one output per node)."""
    attrs = doc["attrs"]
    sids, dtypes, shapes = (attrs[k][1] for k in ("storage_id", "dltype", "shape"))
    offsets = attrs["storage_offset"][1] if "storage_offset" in attrs else [0] * len(sids)
    return [(s, o, d, tuple(sh)) for s, o, d, sh in zip(sids, offsets, dtypes, shapes,
                                                          strict=True)]


def _tensors(entries: list, arg_of: dict[int, int], arg_entries: set[int],
             bounds: dict[str, int] | None = None
             ) -> tuple[list[Instruction], dict[int, int], _Dims]:
    """Storage and tensor instructions for every entry that is not an argument:
    one AllocStorage per planned storage (sized for its largest tensor, symbolic
    dimensions at their upper `bounds`), a View of the argument for an entry in an
    argument's storage (a reshape of an input), AllocTensor otherwise (their Dims
    forms for a symbolic shape). Returns them (after the ShapeOf of each symbol),
    entry -> register (arguments are registers 0..) and the function's dims."""
    reg = {e: r for r, e in enumerate(sorted(arg_entries, key=lambda e: arg_of[e]))}
    dims = _Dims([(reg[e], entries[e][3]) for e in sorted(arg_entries, key=lambda e: arg_of[e])],
                 len(reg))
    sizes: dict[int, int] = {}
    for e, (sid, offset, dtype, shape) in enumerate(entries):
        if e not in arg_entries:
            static = substitute(shape, bounds or {}) if is_symbolic(shape) else shape
            sizes[sid] = max(sizes.get(sid, 0), offset + _nbytes(dtype, list(static)))
    owner = {entries[e][0]: e for e in arg_entries}
    code: list[Instruction] = []
    storage: dict[int, int] = {}
    for sid in sorted(s for s in sizes if s not in owner):
        storage[sid] = dims._new()
        code.append(AllocStorage(storage[sid], sizes[sid]))
    for e, (sid, offset, dtype, shape) in enumerate(entries):
        if e in arg_entries:
            continue
        reg[e] = dims._new()
        dyn = is_symbolic(shape)
        if sid in owner:
            src = owner[sid]
            kind = ViewDims if dyn else View
            code.append(kind(reg[e], reg[src], offset - entries[src][1], DTYPES.index(dtype),
                             dims.shape(shape) if dyn else shape))
        else:
            kind = AllocTensorDims if dyn else AllocTensor
            code.append(kind(reg[e], storage[sid], offset, DTYPES.index(dtype),
                             dims.shape(shape) if dyn else shape))
    return dims.code + code, reg, dims


def compile_plan(graph_json: str, params: dict[str, np.ndarray],
                 kernels: list[str] | None = None,
                 dims: dict[str, tuple[int, int]] | None = None) -> Executable:
    """The executable of one graph JSON (text, pipeline/plan/graph_json.py) and its
    params: `main` takes the graph inputs in order and returns its outputs in order.
    kernels: the kernel symbols in link order (default: those the nodes call, sorted).
    dims: [low, high] per symbolic dimension of the graph (tensors are placed in
    storages sized at the highs; a kernel with symbols gets their runtime values).
    FormatError for a graph JSON the VM cannot run."""
    doc = json.loads(graph_json)
    dims = {k: tuple(v) for k, v in (dims or doc.get("dims") or {}).items()}
    nodes, row_ptr = doc["nodes"], doc["node_row_ptr"]
    if any(b - a != 1 for a, b in zip(row_ptr, row_ptr[1:], strict=False)):
        raise FormatError("VM compile: every node must have one output")
    entries = _entries(doc)
    args = list(doc["arg_nodes"])
    inputs = [nid for nid in args if nodes[nid]["name"] not in params]
    consts = [nid for nid in args if nodes[nid]["name"] in params]
    arg_of = {row_ptr[nid]: k for k, nid in enumerate([*inputs, *consts])}
    highs = {name: high for name, (_, high) in (dims or {}).items()}
    code, reg, runtime = _tensors(entries, arg_of, set(arg_of), highs)
    for k, nid in enumerate(consts):
        code.insert(k, LoadConst(reg[row_ptr[nid]], k))
    calls = [(nid, n) for nid, n in enumerate(nodes)
             if n["op"] != "null" and n["attrs"]["func_name"] != _NOP]
    symbols = sorted({n["attrs"]["func_name"] for _, n in calls} - {_COPY})
    kernels = list(kernels) if kernels is not None else symbols
    for nid, node in calls:
        ins = [reg[row_ptr[i]] for i, _, *_ in node["inputs"]]
        out = reg[row_ptr[nid]]
        func = node["attrs"]["func_name"]
        # the kernel's symbols in kernel_spec's order (pipeline/lower/kernel.py)
        names = symbols_of(*(entries[row_ptr[i]][3] for i, _, *_ in node["inputs"]),
                           entries[row_ptr[nid]][3])
        if func == _COPY:
            code.append(Copy(out, ins[0]))
        elif names:
            code.append(InvokePackedDims(kernels.index(func), (*ins, out),
                                         runtime.shape(names)))
        else:
            code.append(InvokePacked(kernels.index(func), (*ins, out)))
    heads = [row_ptr[nid] for nid, _, *_ in doc["heads"]]
    code.append(Ret(tuple(reg[e] for e in heads)))

    def typ(e: int, name: str) -> TensorType:
        return TensorType(name, entries[e][2], entries[e][3])

    main = Function("main", tuple(typ(row_ptr[nid], nodes[nid]["name"]) for nid in inputs),
                    tuple(typ(row_ptr[nid], nodes[nid]["name"]) for nid, _, *_ in doc["heads"]),
                    max(runtime.next, max(reg.values(), default=-1) + 1), tuple(code))
    constants = {nodes[nid]["name"]: np.asarray(params[nodes[nid]["name"]]) for nid in consts}
    exe = Executable((main,), constants, tuple(kernels), _with_derived(dims, main))
    exe.verify()
    return exe


def _with_derived(dims: dict, main: Function) -> dict[str, tuple[int, int]]:
    """The bounds of the symbols, plus those of each expression main's results have
    ("past+1": a Concat's), at the symbols' lows and highs (coefficients are > 0)."""
    out = dict(dims)
    for t in main.results:
        for d in t.shape:
            if isinstance(d, str) and d not in out:
                low, high = ({n: b[k] for n, b in dims.items()} for k in (0, 1))
                out[d] = (substitute((d,), low)[0], substitute((d,), high)[0])
    return out


# The doit build's optimize stage writes a program's functions as JSON (its params
# beside it), the devc stage the .ro from them: the key marking such a document.
PROGRAM_KEY = "vm_program"


def program_json(exe: Executable) -> str:
    """The functions, kernel symbols and constant names (in LoadConst order) of `exe`
    as JSON text; the constants' values are kept apart (program_from_json)."""
    def types(ts):
        return [[t.name, t.dtype, list(t.shape)] for t in ts]

    functions = [{"name": fn.name, "params": types(fn.params), "results": types(fn.results),
                  "num_regs": fn.num_regs,
                  "code": [[OPCODES[type(ins)], *operands(ins)] for ins in fn.code]}
                 for fn in exe.functions]
    doc = {PROGRAM_KEY: 1, "functions": functions, "kernels": list(exe.kernels),
           "constants": list(exe.constants)}
    return json.dumps(doc, indent=1)


def program_from_json(text: str, constants: dict[str, np.ndarray]) -> Executable:
    """The executable of program_json's text, with the constants' values by name;
    FormatError if a constant is missing or the program is inconsistent."""
    doc = json.loads(text)
    missing = [n for n in doc["constants"] if n not in constants]
    if missing:
        raise FormatError(f"VM program: constant {missing[0]!r} has no value")

    def types(ts):
        return tuple(TensorType(n, d, tuple(s)) for n, d, s in ts)

    functions = tuple(Function(f["name"], types(f["params"]), types(f["results"]),
                               f["num_regs"], tuple(decode(c[0], c[1:]) for c in f["code"]))
                      for f in doc["functions"])
    exe = Executable(functions, {n: np.asarray(constants[n]) for n in doc["constants"]},
                     tuple(doc["kernels"]))
    exe.verify()
    return exe
