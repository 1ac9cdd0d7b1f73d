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
from dataclasses import dataclass

import numpy as np

from pipeline.errors import FormatError
from pipeline.ir.graph import nbytes
from pipeline.vm.bytecode import (
    DTYPES,
    OPCODES,
    AllocStorage,
    AllocTensor,
    Copy,
    Function,
    Instruction,
    InvokePacked,
    LoadConst,
    Ret,
    TensorType,
    View,
    decode,
    operands,
    verify,
)

__all__ = ["PROGRAM_KEY", "Executable", "compile_plan", "program_from_json", "program_json"]

_NOP, _COPY = "__nop", "__copy"


@dataclass(frozen=True)
class Executable:
    """What a .ro file holds: functions (main first), constants (name -> array, in
    LoadConst index order) and the kernel symbols InvokePacked indexes."""

    functions: tuple[Function, ...]
    constants: dict[str, np.ndarray]
    kernels: tuple[str, ...]

    def verify(self) -> None:
        """bytecode.verify over the functions; FormatError if anything is off."""
        verify(list(self.functions), len(self.kernels), len(self.constants))


def _nbytes(dtype: str, shape: list[int]) -> int:
    return nbytes(dtype, int(np.prod(shape, dtype=np.int64)))


def _entries(doc: dict) -> list[tuple[int, int, str, tuple[int, ...]]]:
    """(storage id, byte offset, dtype, shape) per entry (one output per node)."""
    attrs = doc["attrs"]
    sids, dtypes, shapes = (attrs[k][1] for k in ("storage_id", "dltype", "shape"))
    offsets = attrs["storage_offset"][1] if "storage_offset" in attrs else [0] * len(sids)
    return [(s, o, d, tuple(sh)) for s, o, d, sh in zip(sids, offsets, dtypes, shapes,
                                                          strict=True)]


def _tensors(entries: list, arg_of: dict[int, int], arg_entries: set[int]
             ) -> tuple[list[Instruction], dict[int, int]]:
    """Storage and tensor instructions for every entry that is not an argument:
    one AllocStorage per planned storage (sized for its largest tensor), a View of
    the argument for an entry in an argument's storage (a reshape of an input),
    AllocTensor otherwise. Returns them and entry -> register (arguments are
    registers 0..)."""
    reg = {e: r for r, e in enumerate(sorted(arg_entries, key=lambda e: arg_of[e]))}
    sizes: dict[int, int] = {}
    for e, (sid, offset, dtype, shape) in enumerate(entries):
        if e not in arg_entries:
            sizes[sid] = max(sizes.get(sid, 0), offset + _nbytes(dtype, list(shape)))
    owner = {entries[e][0]: e for e in arg_entries}
    code: list[Instruction] = []
    storage: dict[int, int] = {}
    next_reg = len(reg)
    for sid in sorted(s for s in sizes if s not in owner):
        storage[sid] = next_reg
        code.append(AllocStorage(next_reg, sizes[sid]))
        next_reg += 1
    for e, (sid, offset, dtype, shape) in enumerate(entries):
        if e in arg_entries:
            continue
        reg[e] = next_reg
        if sid in owner:
            src = owner[sid]
            code.append(View(next_reg, reg[src], offset - entries[src][1], DTYPES.index(dtype),
                             shape))
        else:
            code.append(AllocTensor(next_reg, storage[sid], offset, DTYPES.index(dtype), shape))
        next_reg += 1
    return code, reg


def compile_plan(graph_json: str, params: dict[str, np.ndarray],
                 kernels: list[str] | None = None) -> Executable:
    """The executable of one graph JSON (text, pipeline/plan/graph_json.py) and its
    params: `main` takes the graph inputs in order and returns its outputs in order.
    kernels: the kernel symbols in link order (default: those the nodes call, sorted).
    FormatError for a graph JSON the VM cannot run."""
    doc = json.loads(graph_json)
    nodes, row_ptr = doc["nodes"], doc["node_row_ptr"]
    if any(b - a != 1 for a, b in zip(row_ptr, row_ptr[1:], strict=False)):
        raise FormatError("VM compile: every node must have one output")
    entries = _entries(doc)
    args = list(doc["arg_nodes"])
    inputs = [nid for nid in args if nodes[nid]["name"] not in params]
    consts = [nid for nid in args if nodes[nid]["name"] in params]
    arg_of = {row_ptr[nid]: k for k, nid in enumerate([*inputs, *consts])}
    code, reg = _tensors(entries, arg_of, set(arg_of))
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
        code.append(Copy(out, ins[0]) if func == _COPY
                    else InvokePacked(kernels.index(func), (*ins, out)))
    heads = [row_ptr[nid] for nid, _, *_ in doc["heads"]]
    code.append(Ret(tuple(reg[e] for e in heads)))

    def typ(e: int, name: str) -> TensorType:
        return TensorType(name, entries[e][2], entries[e][3])

    main = Function("main", tuple(typ(row_ptr[nid], nodes[nid]["name"]) for nid in inputs),
                    tuple(typ(row_ptr[nid], nodes[nid]["name"]) for nid, _, *_ in doc["heads"]),
                    max(reg.values(), default=-1) + 1, tuple(code))
    constants = {nodes[nid]["name"]: np.asarray(params[nodes[nid]["name"]]) for nid in consts}
    exe = Executable((main,), constants, tuple(kernels))
    exe.verify()
    return exe


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
