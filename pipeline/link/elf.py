"""A relocatable ELF object that defines one read-only data symbol (devc.o).

Written directly rather than through LLVM and an assembler: the data is most
of a model's bytes (the packed params) and only needs to be copied once. The
object has a data section, an empty .note.GNU-stack (no executable stack
needed), a symbol table with the one global object symbol, and the string
tables; `cc -shared` links it like any other object.
"""

from __future__ import annotations

import struct

__all__ = ["DATA_OFFSET", "MACHINES", "data_object", "machine_name", "read_machine",
           "section_sizes"]

DATA_OFFSET = 64  # the data's file offset: right after the ELF header, 64-byte aligned

# The System V gABI's numbering: the architectures data_object writes.
MACHINES = {"x86_64": 62, "aarch64": 183, "riscv64": 243}  # EM_X86_64, EM_AARCH64, EM_RISCV
# Names for e_machine values a library may carry, for errors about foreign libraries.
_NAMES = {**{v: k for k, v in MACHINES.items()}, 3: "i386", 8: "mips", 20: "ppc",
          21: "ppc64", 22: "s390x", 40: "arm", 258: "loongarch64"}
_SHF_ALLOC, _SHF_X86_64_LARGE = 0x2, 0x10000000
_SHT_PROGBITS, SHT_SYMTAB, _SHT_STRTAB = 1, 2, 3
# name type flags addr offset size link info align entsize
SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")
SYMBOL = struct.Struct("<IBBHQQ")  # name info other shndx value size


def read_machine(header: bytes) -> int | None:
    """e_machine from the first 20 bytes of a file; None if it is not ELF."""
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    return int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")


def machine_name(machine: int) -> str:
    """A readable architecture name for an e_machine value ("aarch64")."""
    return _NAMES.get(machine, f"ELF machine {machine}")


def data_object(symbol: str, chunks: list, triple: str, flags: int = 0) -> list:
    """The object file defining `symbol` over the bytes of `chunks` (bytes-like,
    in order), as a list of bytes-like pieces to write in order.

    flags: the ELF header's e_flags, which must equal what the target's compiler
    writes where the linker checks them (RISC-V's float ABI: Target.elf_flags()).
    On x86-64 the data goes in a large-data section (.lrodata, flag
    SHF_X86_64_LARGE): linkers place those after .data/.bss, so a >2 GB blob
    cannot push the kernels' small data out of reach of their PC-relative
    references. ValueError for a triple that is not x86-64, AArch64 or riscv64 ELF.
    """
    arch = triple.split("-")[0]
    if arch not in MACHINES or any(os_ in triple for os_ in ("darwin", "apple", "windows")):
        raise ValueError(f"cannot write a data object for {triple}: only little-endian "
                         f"ELF targets ({', '.join(MACHINES)}) are supported")
    size = sum(memoryview(chunk).nbytes for chunk in chunks)
    large = arch == "x86_64"
    data_name = f"{'.lrodata' if large else '.rodata'}.{symbol}".encode()
    shstrtab = b"\0" + data_name + b"\0.note.GNU-stack\0.symtab\0.strtab\0.shstrtab\0"
    name = {n: shstrtab.index(b"\0" + n + b"\0") + 1
            for n in (data_name, b".note.GNU-stack", b".symtab", b".strtab", b".shstrtab")}
    strtab = b"\0" + symbol.encode() + b"\0"
    # Symbol 0 is the null symbol; 1 is ours: global (1 << 4) object (1), in section 1.
    symtab = bytes(SYMBOL.size) + SYMBOL.pack(1, 0x11, 0, 1, 0, size)
    symtab_at = DATA_OFFSET + size + (-size) % 8
    strtab_at = symtab_at + len(symtab)
    shstrtab_at = strtab_at + len(strtab)
    headers_at = shstrtab_at + len(shstrtab) + (-(shstrtab_at + len(shstrtab))) % 8
    data_flags = _SHF_ALLOC | (_SHF_X86_64_LARGE if large else 0)
    sections = [
        bytes(SECTION_HEADER.size),
        SECTION_HEADER.pack(name[data_name], _SHT_PROGBITS, data_flags, 0, DATA_OFFSET, size,
                             0, 0, 64, 0),
        SECTION_HEADER.pack(name[b".note.GNU-stack"], _SHT_PROGBITS, 0, 0, symtab_at, 0,
                             0, 0, 1, 0),
        # link: the string table's index; info: the first global symbol.
        SECTION_HEADER.pack(name[b".symtab"], SHT_SYMTAB, 0, 0, symtab_at, len(symtab),
                             4, 1, 8, SYMBOL.size),
        SECTION_HEADER.pack(name[b".strtab"], _SHT_STRTAB, 0, 0, strtab_at, len(strtab),
                             0, 0, 1, 0),
        SECTION_HEADER.pack(name[b".shstrtab"], _SHT_STRTAB, 0, 0, shstrtab_at,
                             len(shstrtab), 0, 0, 1, 0),
    ]
    # ELF64, little endian, version 1, System V ABI; a relocatable (1) object.
    header = struct.pack("<4sBBBB8sHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, bytes(8), 1,
                         MACHINES[arch], 1, 0, 0, headers_at, flags, 64, 0, 0,
                         SECTION_HEADER.size, len(sections), len(sections) - 1)
    return [header, *chunks, bytes((-size) % 8), symtab, strtab, shstrtab,
            bytes(headers_at - shstrtab_at - len(shstrtab)), *sections]


# Section header fields by ELF class: (format, index of flags, of type, of size).
_SECTION_32 = struct.Struct("<IIIIIIIIII")
_SHF_WRITE, _SHF_EXECINSTR, _SHT_NOBITS = 0x1, 0x4, 8


def section_sizes(data: bytes) -> dict[str, int]:
    """Bytes of an ELF object's (or program's) allocated sections, summed by kind:
    {"text": code, "rodata": read-only data, "data": initialised writable data,
    "bss": zeroed writable data}, as `size -A` would add them up. Little-endian
    ELF32 and ELF64; ValueError for anything else."""
    if data[:4] != b"\x7fELF" or data[5] != 1:
        raise ValueError("not a little-endian ELF file")
    wide = data[4] == 2
    shoff = int.from_bytes(data[40:48] if wide else data[32:36], "little")
    at = 58 if wide else 46  # e_shentsize, e_shnum
    entsize, count = struct.unpack_from("<HH", data, at)
    header = SECTION_HEADER if wide else _SECTION_32
    sizes = {"text": 0, "rodata": 0, "data": 0, "bss": 0}
    for k in range(count):
        _, kind, flags, _, _, size, *_ = header.unpack_from(data, shoff + k * entsize)
        if not flags & _SHF_ALLOC:
            continue
        key = ("text" if flags & _SHF_EXECINSTR else "rodata" if not flags & _SHF_WRITE
               else "bss" if kind == _SHT_NOBITS else "data")
        sizes[key] += size
    return sizes
