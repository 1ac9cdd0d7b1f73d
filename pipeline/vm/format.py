"""The `.ro` file: a VM executable serialized (writer and Python reader; the C
reader is pipeline/runtime/c/vm.c). Byte by byte in docs/vm.md. Integers are little
endian; str = u32 length, the UTF-8 bytes, a NUL byte; a type = str name, u8 dtype
(bytecode.DTYPES index), u8 ndim, u16 0, i64 shape[ndim] (a dimension -1 - k is
symbolic dimension k of the functions section's table; version 2 added that table).

    magic "PLVMEXE\\0" (8) | u32 version | u32 0 | u64 total length |
    u64 offset, u64 size of each section: functions, constants, kernels, bytecode |
    the sections | sha256 of everything before it (32)

    functions: u32 dims; per symbolic dimension: str name, i64 low, i64 high;
               u32 count; per function: str name, u32 params, u32 results,
               u32 registers, u32 0, u64 first instruction, u64 instructions,
               then a type per param and per result
    constants: u32 count; per constant: a type, u64 nbytes, u64 data offset from
               the file's start (a multiple of 64); then the data
    kernels:   u32 count; per kernel: str symbol
    bytecode:  per instruction: u16 opcode, u16 0, u32 operands, i64 operand[]

Offsets count from the file's start; the constants come last so that their data
sits 64-byte aligned when the file does (as it does packed into a library).
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from pipeline.errors import FormatError
from pipeline.ir.graph import nbytes as tensor_bytes
from pipeline.ir.nibbles import PACKED, pack_nibbles, unpack_nibbles
from pipeline.vm.bytecode import DTYPES, KINDS, OPCODES, Function, TensorType, decode, operands
from pipeline.vm.compile import Executable

__all__ = ["RO_MAGIC", "RO_SYMBOL", "RO_VERSION", "read_ro", "write_ro"]

RO_MAGIC = b"PLVMEXE\0"
RO_VERSION = 3
RO_SYMBOL = "__pipeline_vm_exec"  # the .ro packed into a VM library
_PREFIX = struct.Struct("<8sIIQ")
_TABLE = struct.Struct("<8Q")
_HEAD = _PREFIX.size + _TABLE.size
_DIGEST = 32
_ALIGN = 64


def _str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw + b"\0"


def _type(t: TensorType, dims: list[str] = ()) -> bytes:
    shape = [-1 - dims.index(d) if isinstance(d, str) else d for d in t.shape]
    return (_str(t.name) + struct.pack("<BBH", DTYPES.index(t.dtype), len(t.shape), t.kind)
            + struct.pack(f"<{len(shape)}q", *shape))


def _functions(exe: Executable) -> tuple[bytes, bytes]:
    """The functions and bytecode sections."""
    dims = list(exe.dims)
    table = [struct.pack("<I", len(dims))]
    table += [_str(d) + struct.pack("<qq", *exe.dims[d]) for d in dims]
    table.append(struct.pack("<I", len(exe.functions)))
    code, first = [], 0
    for fn in exe.functions:
        table.append(_str(fn.name) + struct.pack("<IIIIQQ", len(fn.params), len(fn.results),
                                                 fn.num_regs, 0, first, len(fn.code)))
        table += [_type(t, dims) for t in (*fn.params, *fn.results)]
        for ins in fn.code:
            words = operands(ins)
            code.append(struct.pack(f"<HHI{len(words)}q", OPCODES[type(ins)], 0, len(words),
                                    *words))
        first += len(fn.code)
    return b"".join(table), b"".join(code)


def _constants(exe: Executable, start: int) -> list[bytes]:
    """The constants section starting at file offset `start` (64-byte aligned)."""
    types = [TensorType(n, str(a.dtype), tuple(np.shape(a))) for n, a in exe.constants.items()]
    arrays = [pack_nibbles(a) if a.dtype in PACKED else np.ascontiguousarray(a)
              for a in map(np.asarray, exe.constants.values())]  # int4: two a byte
    table_size = 4 + sum(len(_type(t)) + 16 for t in types)
    at = start + table_size
    table, data = [struct.pack("<I", len(arrays))], []
    for t, a in zip(types, arrays, strict=True):
        pad = -at % _ALIGN
        at += pad
        table.append(_type(t) + struct.pack("<QQ", a.nbytes, at))
        data += [bytes(pad), a.tobytes()]
        at += a.nbytes
    return table + data


def write_ro(exe: Executable) -> bytes:
    """The .ro bytes of `exe` (verified first: FormatError if it is inconsistent)."""
    exe.verify()
    functions, code = _functions(exe)
    kernels = struct.pack("<I", len(exe.kernels)) + b"".join(_str(k) for k in exe.kernels)
    body = [functions, kernels, code]
    start = _HEAD + sum(map(len, body))
    pad = -start % _ALIGN
    constants = _constants(exe, start + pad)
    size_c = sum(map(len, constants))
    total = start + pad + size_c + _DIGEST
    offsets = [_HEAD, _HEAD + len(functions), _HEAD + len(functions) + len(kernels)]
    table = _TABLE.pack(offsets[0], len(functions), start + pad, size_c, offsets[1],
                        len(kernels), offsets[2], len(code))
    out = b"".join([_PREFIX.pack(RO_MAGIC, RO_VERSION, 0, total), table, *body, bytes(pad),
                    *constants])
    return out + hashlib.sha256(out).digest()


class _Reader:
    """A bounds-checked cursor; FormatError past the end."""

    def __init__(self, data: bytes, at: int, end: int, what: str):
        self.data, self.at, self.end, self.what = data, at, end, what

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.at + size > self.end:
            raise FormatError(f".ro {self.what} section truncated")
        self.at += size
        return struct.unpack_from(fmt, self.data, self.at - size)

    def str(self) -> str:
        (n,) = self.take("<I")
        raw = self.take(f"<{n}sB")
        if raw[1] != 0:
            raise FormatError(f".ro {self.what} section: a name is not NUL-terminated")
        return raw[0].decode("utf-8", "replace")

    def type(self, dims: list[str] = ()) -> TensorType:
        name = self.str()
        dtype, ndim, kind = self.take("<BBH")
        if dtype >= len(DTYPES) or kind >= len(KINDS):
            raise FormatError(f".ro {self.what} section: bad dtype {dtype} or kind {kind}")
        shape = self.take(f"<{ndim}q")
        if any(d < -len(dims) for d in shape):
            raise FormatError(f".ro {self.what} section: {name!r} has an unknown dimension")
        return TensorType(name, DTYPES[dtype], tuple(dims[-1 - d] if d < 0 else d
                                                     for d in shape), kind)


def _check_prefix(data: bytes, source: str) -> int:
    """The total length after checking magic, version and length; one-line errors."""
    if len(data) < _HEAD + _DIGEST or data[:8] != RO_MAGIC:
        raise FormatError(f"{source}: not a pipeline VM executable (expected magic "
                          f"{RO_MAGIC!r})")
    _, version, _, total = _PREFIX.unpack_from(data)
    if version != RO_VERSION:
        raise FormatError(f"{source}: VM executable format version {version}, this pipeline "
                          f"reads version {RO_VERSION}; rebuild it")
    if total != len(data):
        raise FormatError(f"{source}: VM executable truncated or corrupted: length {total}, "
                          f"{len(data)} bytes given")
    if hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
        raise FormatError(f"{source}: checksum mismatch: the VM executable is corrupted")
    return total


def read_ro(data: bytes | memoryview, source: str = ".ro") -> Executable:
    """The executable in .ro bytes: FormatError (one line, starting with `source`)
    for another magic or version, a wrong length or checksum, or bad content. Any
    buffer (a library's mapped .ro) is read in place: the constants are read-only
    arrays over it, not copies."""
    data = data if isinstance(data, bytes) else memoryview(data).cast("B")
    total = _check_prefix(data, source)
    try:
        return _read_sections(data, total, source)
    except (struct.error, ValueError, OverflowError, IndexError, TypeError) as err:
        if isinstance(err, FormatError):
            raise
        raise FormatError(f"{source}: VM executable corrupted ({type(err).__name__}: "
                          f"{err})") from None


def _read_sections(data: bytes, total: int, source: str) -> Executable:
    table = _TABLE.unpack_from(data, _PREFIX.size)
    sections = {}
    for k, name in enumerate(("functions", "constants", "kernels", "bytecode")):
        off, size = table[2 * k], table[2 * k + 1]
        if off < _HEAD or off + size > total - _DIGEST:
            raise FormatError(f"{source}: section {name} out of bounds")
        sections[name] = _Reader(data, off, off + size, name)
    r = sections["kernels"]
    kernels = tuple(r.str() for _ in range(r.take("<I")[0]))
    r = sections["constants"]
    constants = {}
    for _ in range(r.take("<I")[0]):
        t = r.type()
        nbytes, at = r.take("<QQ")
        count = int(np.prod(t.shape, dtype=np.int64))
        if nbytes != tensor_bytes(t.dtype, count) or at + nbytes > total - _DIGEST:
            raise FormatError(f"{source}: constant {t.name!r} corrupted")
        if np.dtype(t.dtype) in PACKED:
            raw = np.frombuffer(data, np.uint8, nbytes, at)
            constants[t.name] = unpack_nibbles(raw, t.dtype, t.shape)
            continue
        constants[t.name] = np.frombuffer(data, t.dtype, count, at).reshape(t.shape)
    r = sections["functions"]
    dims = {}
    for _ in range(r.take("<I")[0]):
        name = r.str()
        dims[name] = r.take("<qq")
        if not 0 <= dims[name][0] <= dims[name][1]:
            raise FormatError(f"{source}: dimension {name!r} has bad bounds {dims[name]}")
    exe = Executable(_read_functions(r, sections["bytecode"], list(dims)), constants,
                     kernels, dims)
    exe.verify()
    return exe


def _read_functions(r: _Reader, code: _Reader, dims: list[str]) -> tuple[Function, ...]:
    instructions = []
    while code.at < code.end:
        opcode, _, n = code.take("<HHI")
        instructions.append(decode(opcode, list(code.take(f"<{n}q"))))
    functions = []
    for _ in range(r.take("<I")[0]):
        name = r.str()
        n_params, n_results, regs, _, first, count = r.take("<IIIIQQ")
        params = tuple(r.type(dims) for _ in range(n_params))
        results = tuple(r.type(dims) for _ in range(n_results))
        if first + count > len(instructions):
            raise FormatError(f".ro function {name!r}: code out of bounds")
        functions.append(Function(name, params, results, regs,
                                  tuple(instructions[first:first + count])))
    return tuple(functions)
