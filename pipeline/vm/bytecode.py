"""The VM's instructions and functions (docs/vm.md).

Every instruction is an opcode and a list of signed 64-bit operands; registers are
numbered per function, a function's parameters are its first registers. The C
interpreter (pipeline/runtime/c/vm.c) reads the same encoding (format.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from pipeline.errors import FormatError
from pipeline.vm.sequence_ins import (
    SEQUENCE_OPCODES,
    HasValue,
    NoneValue,
    SeqAt,
    SeqConstruct,
    SeqErase,
    SeqInsert,
    SeqLength,
    SeqSplit,
)

__all__ = ["DTYPES", "FAILURES", "OPCODES", "AddDim", "AddImm", "AllocShaped", "AllocStorage",
           "AllocTensor", "AllocTensorDims", "Copy", "CopyAt", "Fail", "Function", "Goto", "If",
           "Instruction", "Invoke", "InvokePacked", "InvokePackedDims", "Less", "LoadConst",
           "Move", "MulDim", "Ret", "Scalar", "ShapeOf", "TensorType", "View", "ViewAt",
           "ViewDims", "ViewRows", "ViewShape", "decode", "verify", "KINDS", "SeqConstruct",
           "SeqInsert", "SeqAt", "SeqLength", "SeqErase", "SeqSplit", "NoneValue", "HasValue"]

# The dtype codes of the plan (pipeline/link/plan.py DTYPES; kept equal there).
DTYPES = ("float32", "float64", "int32", "int64", "bool", "float16", "int8", "int16",
          "uint8", "uint16", "uint32", "uint64",
          # appended (codes are never renumbered): ml_dtypes' names
          "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
          "uint4", "int4", "float4_e2m1fn", "float8_e8m0fnu", "uint2", "int2")


@dataclass(frozen=True)
class TensorType:
    """A parameter's or result's name, dtype and shape: ints, or symbolic dimensions
    (str names of the executable's `dims`); `kind` (KINDS) says whether it is a
    tensor, a sequence of such tensors (shape () if theirs differ) or an optional."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    kind: int = 0


# TensorType.kind: the .ro type's u16 (docs/vm.md)
KINDS = ("tensor", "sequence", "optional tensor", "optional sequence")


@dataclass(frozen=True)
class AllocStorage:
    """dst = a pooled buffer of nbytes bytes, aligned to `alignment`."""

    dst: int
    nbytes: int
    alignment: int = 64


@dataclass(frozen=True)
class AllocTensor:
    """dst = a tensor at byte `offset` of the storage in register `storage`."""

    dst: int
    storage: int
    offset: int
    dtype: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class LoadConst:
    """dst = constant `index` (a param of the constant section)."""

    dst: int
    index: int


@dataclass(frozen=True)
class InvokePacked:
    """Call kernel `kernel` (an index in the kernel names) with the data pointers of
    the tensors in `args`: its inputs, then the outputs it writes."""

    kernel: int
    args: tuple[int, ...]


@dataclass(frozen=True)
class Copy:
    """Copy the bytes of tensor `src` into tensor `dst` (same size; may overlap)."""

    dst: int
    src: int


@dataclass(frozen=True)
class View:
    """dst = tensor `src`'s memory from byte `offset`, seen with another dtype and
    shape (a reshape, a slice of a concat written in place); no copy."""

    dst: int
    src: int
    offset: int
    dtype: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Move:
    """dst = src (the same object)."""

    dst: int
    src: int


@dataclass(frozen=True)
class If:
    """Go to instruction `then` if the bool tensor `cond` holds true, else to `orelse`."""

    cond: int
    then: int
    orelse: int


@dataclass(frozen=True)
class Goto:
    """Go to instruction `target` of the function."""

    target: int


@dataclass(frozen=True)
class Invoke:
    """Call VM function `func` with registers `args`; its results go to `dsts`."""

    func: int
    args: tuple[int, ...]
    dsts: tuple[int, ...]


@dataclass(frozen=True)
class Scalar:
    """dst = a new scalar tensor of dtype `dtype` (an index in DTYPES: int64 or bool)
    holding `value` (a loop's counter, an absent condition)."""

    dst: int
    dtype: int
    value: int


@dataclass(frozen=True)
class AddImm:
    """dst = a new int64 scalar: the int64 scalar `src` plus `imm`."""

    dst: int
    src: int
    imm: int


@dataclass(frozen=True)
class Less:
    """dst = a new bool scalar: whether int64 scalar `a` < int64 scalar `b`."""

    dst: int
    a: int
    b: int


@dataclass(frozen=True)
class CopyAt:
    """Copy tensor `src` into tensor `dst` at byte offset row * (src's bytes), row the
    int64 scalar in register `row` (a Loop's or Scan's output row)."""

    dst: int
    src: int
    row: int


@dataclass(frozen=True)
class ViewAt:
    """dst = row `row` (an int64 scalar register) of tensor `src`, seen with dtype and
    shape: src's memory from row * that shape's bytes (a Scan's input row)."""

    dst: int
    src: int
    row: int
    dtype: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Fail:
    """Stop the run with error `reason` (FAILURES): what static shapes cannot hold."""

    reason: int


@dataclass(frozen=True)
class ViewShape:
    """dst = tensor `src`'s memory seen with its dtype and the shape held by the 1-d
    int64 tensor `shape` (a data-dependent result: a kernel wrote it at that shape
    into storage sized for its upper bound); fails if it does not fit src."""

    dst: int
    src: int
    shape: int


@dataclass(frozen=True)
class AllocShaped:
    """dst = a new tensor of dtype `dtype` and the shape held by the 1-d int64 tensor
    `shape`, its storage allocated now (Range, ConstantOfShape, Expand with runtime
    shapes); fails over $PIPELINE_MAX_TENSOR_ELEMENTS elements."""

    dst: int
    shape: int
    dtype: int


@dataclass(frozen=True)
class ViewRows:
    """dst = tensor `src` with dimension 0 set to dimension `axis` of tensor `like` (a
    row-wise kernel ran over the upper bound of a data-dependent input: its first
    rows are the result); fails if that is more than src's dimension 0."""

    dst: int
    src: int
    like: int
    axis: int


# Fail's reasons, by index (vm.c has the same list).
FAILURES = ("a Loop ended before its trip count: its scan outputs would be shorter than "
            "planned (needs dynamic shapes)",)


@dataclass(frozen=True)
class ShapeOf:
    """dst = a new int64 scalar: dimension `axis` of tensor `src` (binds a symbolic
    dimension from an input)."""

    dst: int
    src: int
    axis: int


@dataclass(frozen=True)
class MulDim:
    """dst = a new int64 scalar: a * b, each a dim operand (DIMS below)."""

    dst: int
    a: int
    b: int


@dataclass(frozen=True)
class AddDim:
    """dst = a new int64 scalar: a + b, each a dim operand (DIMS below)."""

    dst: int
    a: int
    b: int


# DIMS: in AllocTensorDims, ViewDims, InvokePackedDims and MulDim a dim operand d >= 0
# is that constant, d < 0 the int64 scalar in register -1 - d (a runtime dimension).


@dataclass(frozen=True)
class AllocTensorDims:
    """AllocTensor whose shape holds dim operands (DIMS): a tensor of runtime shape."""

    dst: int
    storage: int
    offset: int
    dtype: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ViewDims:
    """View whose shape holds dim operands (DIMS)."""

    dst: int
    src: int
    offset: int
    dtype: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class InvokePackedDims:
    """`int32_t kernel(void **args, const int64_t *dims)`: InvokePacked, plus the values
    of the kernel's symbolic dimensions (dim operands, DIMS) in its symbol order."""

    kernel: int
    args: tuple[int, ...]
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Ret:
    """Return the objects in `results`."""

    results: tuple[int, ...]


Instruction = (AllocStorage | AllocTensor | LoadConst | InvokePacked | Copy | View | Move | If
               | Goto | Invoke | Ret | Scalar | AddImm | Less | CopyAt | ViewAt | Fail | ShapeOf
               | MulDim | AllocTensorDims | ViewDims | InvokePackedDims | AddDim
               | ViewShape | AllocShaped | ViewRows | SeqConstruct | SeqInsert | SeqAt
               | SeqLength | SeqErase | SeqSplit | NoneValue | HasValue)
OPCODES: dict[type, int] = {AllocStorage: 1, AllocTensor: 2, LoadConst: 3, InvokePacked: 4,
                            Copy: 5, View: 6, Move: 7, If: 8, Goto: 9, Invoke: 10, Ret: 11,
                            Scalar: 12, AddImm: 13, Less: 14, CopyAt: 15, ViewAt: 16,
                            Fail: 17,
                            # 18-23: symbolic dimensions (docs/vm.md)
                            ShapeOf: 18, MulDim: 19, AllocTensorDims: 20,
                            ViewDims: 21, InvokePackedDims: 22, AddDim: 23,
                            # 30-39: data-dependent shapes (docs/vm.md)
                            ViewShape: 30, AllocShaped: 31, ViewRows: 32,
                            # 40-49: sequences and optionals (sequence_ins.py)
                            **SEQUENCE_OPCODES}
_BY_CODE = {code: kind for kind, code in OPCODES.items()}


def operands(ins: Instruction) -> list[int]:
    """The instruction's operands as encoded: fields in order, a tuple as its length
    then its items."""
    out: list[int] = []
    for f in fields(ins):
        value = getattr(ins, f.name)
        out += [len(value), *value] if isinstance(value, tuple) else [value]
    return out


def decode(opcode: int, words: list[int]) -> Instruction:
    """The instruction of `opcode` with operands `words` (operands' inverse);
    FormatError if they do not fit."""
    kind = _BY_CODE.get(opcode)
    if kind is None:
        raise FormatError(f"VM bytecode: unknown opcode {opcode}")
    values, at = [], 0
    for f in fields(kind):
        if at >= len(words):
            raise FormatError(f"VM bytecode: {kind.__name__} has too few operands")
        if f.type.startswith("tuple"):
            n = words[at]
            if not 0 <= n <= len(words) - at - 1:
                raise FormatError(f"VM bytecode: {kind.__name__}: bad length {n}")
            values.append(tuple(words[at + 1:at + 1 + n]))
            at += 1 + n
        else:
            values.append(words[at])
            at += 1
    if at != len(words):
        raise FormatError(f"VM bytecode: {kind.__name__} has {len(words) - at} extra operands")
    return kind(*values)


@dataclass(frozen=True)
class Function:
    """A VM function: its parameters (registers 0..len(params)-1), register count,
    code and the types of what it returns."""

    name: str
    params: tuple[TensorType, ...]
    results: tuple[TensorType, ...]
    num_regs: int
    code: tuple[Instruction, ...] = field(default=())


def _dim_regs(dims) -> list[int]:
    """The registers the runtime dimensions among dim operands (DIMS) read."""
    return [-1 - d for d in dims if d < 0]


def _regs(ins: Instruction) -> list[int]:
    """Every register the instruction reads or writes."""
    if isinstance(ins, InvokePacked):
        return list(ins.args)
    if isinstance(ins, InvokePackedDims):
        return [*ins.args, *_dim_regs(ins.dims)]
    if isinstance(ins, (AllocTensorDims, ViewDims)):
        return [ins.dst, getattr(ins, "storage", getattr(ins, "src", 0)), *_dim_regs(ins.shape)]
    if isinstance(ins, (MulDim, AddDim)):
        return [ins.dst, *_dim_regs((ins.a, ins.b))]
    if isinstance(ins, Invoke):
        return [*ins.args, *ins.dsts]
    if isinstance(ins, Ret):
        return list(ins.results)
    if isinstance(ins, SeqConstruct):
        return [ins.dst, *ins.items]
    if isinstance(ins, (SeqInsert, SeqAt, SeqErase)):  # a position -1: none given
        return [r for r in (ins.dst, ins.seq, getattr(ins, "item", 0), ins.position)
                if r != -1]
    names = {"dst", "src", "storage", "cond", "a", "b", "row", "shape", "like", "seq"}
    return [getattr(ins, f.name) for f in fields(ins)
            if f.name in names and isinstance(getattr(ins, f.name), int)]


def _check(fn: Function, k: int, ins: Instruction, functions: list[Function], n_kernels: int,
           n_constants: int) -> str | None:
    """What is wrong with instruction k of fn, or None."""
    if any(not 0 <= r < fn.num_regs for r in _regs(ins)):
        return f"register out of range 0..{fn.num_regs - 1}"
    if isinstance(ins, (AllocTensorDims, ViewDims)) and (
            not 0 <= ins.dtype < len(DTYPES) or ins.offset < 0 or len(ins.shape) > 32):
        return "bad dtype, shape or offset"
    if isinstance(ins, AllocShaped) and not 0 <= ins.dtype < len(DTYPES):
        return "bad dtype"
    if isinstance(ins, (ShapeOf, ViewRows, SeqSplit)) and not 0 <= ins.axis < 32:
        return "bad axis"
    if isinstance(ins, SeqSplit) and (ins.keepdims not in (0, 1) or min(ins.sizes, default=0) < 0):
        return "bad keepdims or sizes"
    if isinstance(ins, InvokePackedDims) and not 0 <= ins.kernel < n_kernels:
        return f"kernel {ins.kernel} of {n_kernels}"
    if isinstance(ins, (AllocTensor, View, ViewAt)) and (
            not 0 <= ins.dtype < len(DTYPES) or any(d < 0 for d in ins.shape)
            or getattr(ins, "offset", 0) < 0 or len(ins.shape) > 32):
        return "bad dtype, shape or offset"
    if isinstance(ins, Scalar) and DTYPES[ins.dtype:ins.dtype + 1] not in (("int64",),
                                                                         ("bool",)):
        return "a scalar is int64 or bool"
    if isinstance(ins, AllocStorage) and (ins.nbytes < 0 or ins.alignment not in (1, 64)):
        return "bad size or alignment"
    if isinstance(ins, Fail) and not 0 <= ins.reason < len(FAILURES):
        return f"unknown failure {ins.reason}"
    if isinstance(ins, LoadConst) and not 0 <= ins.index < n_constants:
        return f"constant {ins.index} of {n_constants}"
    if isinstance(ins, InvokePacked) and not 0 <= ins.kernel < n_kernels:
        return f"kernel {ins.kernel} of {n_kernels}"
    targets = ([ins.then, ins.orelse] if isinstance(ins, If)
               else [ins.target] if isinstance(ins, Goto) else [])
    if any(not 0 <= t < len(fn.code) for t in targets):
        return "jump out of the function"
    if isinstance(ins, Invoke):
        if not 0 <= ins.func < len(functions):
            return f"function {ins.func} of {len(functions)}"
        callee = functions[ins.func]
        if len(ins.args) != len(callee.params) or len(ins.dsts) != len(callee.results):
            return f"calls {callee.name} with the wrong number of arguments or results"
    if isinstance(ins, Ret) and len(ins.results) != len(fn.results):
        return f"returns {len(ins.results)} values, the function declares {len(fn.results)}"
    return None


def verify(functions: list[Function], n_kernels: int, n_constants: int) -> None:
    """Check every instruction of every function: registers, constant, kernel and
    function indices, jump targets and call arities in range, and each function
    ending in Ret or Goto. FormatError naming the function and instruction."""
    for fn in functions:
        if fn.num_regs < len(fn.params) or not fn.code:
            raise FormatError(f"VM function {fn.name!r}: no code, or fewer registers than "
                              "parameters")
        if not isinstance(fn.code[-1], (Ret, Goto, Fail)):
            raise FormatError(f"VM function {fn.name!r} does not end in Ret or Goto")
        for k, ins in enumerate(fn.code):
            problem = _check(fn, k, ins, functions, n_kernels, n_constants)
            if problem:
                raise FormatError(f"VM function {fn.name!r}, instruction {k} "
                                  f"({type(ins).__name__}): {problem}")
