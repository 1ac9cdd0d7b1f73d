"""The code digest of a shared library: sha256 of its code sections as linked.

What is hashed: every allocated, executable section with file contents
(.init, .plt, .plt.got, .text, .fini: the kernels and the glue the linker
adds), in file order, each as its name, size and bytes. These bytes are final
once `cc -shared` has run: position-independent code reaches other libraries
through the GOT, so the dynamic loader never writes into them, and the bytes
the loader maps are the bytes in the file. lib0.o's own .text would not do:
the static link still patches its call and data offsets.

The digest cannot be in devc.o (it is packed before the link), so the link
stamps it into the blob's trailer afterwards (stamp_code_digest, called by
pipeline/link/cc.py create_shared on its temporary output), and the loader
recomputes it from the file before dlopen (verify_code_digest), so damaged
code is refused before any of it runs. A VM library (docs/vm.md) has the slot
right after its .ro instead.

ELF64 little endian only, like pipeline/link/elf.py.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct

from pipeline.link.blob import (
    BLOB_CODE_DIGEST_SIZE,
    BLOB_PREFIX_SIZE,
    BLOB_SYMBOL,
    BlobError,
    read_blob_header_length,
)
from pipeline.link.elf import SECTION_HEADER, SHT_SYMTAB, SYMBOL
from pipeline.vm.format import RO_MAGIC, RO_SYMBOL

__all__ = ["blob_offset", "code_digest", "elf_sections", "stamp_code_digest",
           "symbol_offset", "verify_code_digest"]

_SHT_NOBITS, _SHT_DYNSYM = 8, 11
_SHF_ALLOC, _SHF_EXECINSTR = 0x2, 0x4


def elf_sections(data, source: str) -> list[tuple]:
    """(name, type, flags, addr, offset, size, link) of every section; BlobError if
    the file is not an ELF64 little-endian file with readable section headers."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise BlobError(f"{source}: not an ELF64 little-endian library")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize != SECTION_HEADER.size or not shnum or shoff + shnum * shentsize > len(data):
        raise BlobError(f"{source}: the library's section headers are missing or damaged")
    raw = [SECTION_HEADER.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    if shstrndx >= shnum:
        raise BlobError(f"{source}: the library's section headers are missing or damaged")
    names_at = raw[shstrndx][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return bytes(data[start:data.find(b"\0", start)]).decode("latin-1")

    return [(name(r[0]), r[1], r[2], r[3], r[4], r[5], r[6]) for r in raw]


def code_digest(data, source: str, sections: list[tuple] | None = None) -> bytes:
    """sha256 over the executable sections of the ELF library bytes `data`
    (`sections`: elf_sections(data) if the caller has them already)."""
    digest = hashlib.sha256()
    code = [s for s in sections or elf_sections(data, source)
            if s[2] & (_SHF_ALLOC | _SHF_EXECINSTR) == _SHF_ALLOC | _SHF_EXECINSTR
            and s[1] != _SHT_NOBITS]
    if not code:
        raise BlobError(f"{source}: the library has no code sections")
    for name, _, _, _, offset, size, _ in sorted(code, key=lambda s: s[4]):
        digest.update(f"{name} {size}\n".encode())
        digest.update(data[offset:offset + size])
    return digest.digest()


def blob_offset(data, sections: list[tuple]) -> int | None:
    """The file offset of BLOB_SYMBOL's bytes, from the dynamic or static symbol
    table; None if the library has no blob."""
    return symbol_offset(data, sections, BLOB_SYMBOL)


def symbol_offset(data, sections: list[tuple], symbol: str) -> int | None:
    """The file offset of the bytes of data symbol `symbol`; None if there is none."""
    want = symbol.encode()
    for _, kind, _, _, offset, size, link in sections:
        if kind not in (SHT_SYMTAB, _SHT_DYNSYM) or link >= len(sections):
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size - SYMBOL.size + 1, SYMBOL.size):
            st_name, _, _, shndx, value, _ = SYMBOL.unpack_from(data, at)
            start = strings + st_name
            if bytes(data[start:start + len(want) + 1]) != want + b"\0":
                continue
            if not 0 < shndx < len(sections):
                break
            home = sections[shndx]
            return home[4] + value - home[3]
    return None


def _digest_slot(data, sections: list[tuple], source: str) -> int | None:
    """The file offset of the blob's code-digest trailer, or of the one after a VM
    library's .ro (None: neither)."""
    start = blob_offset(data, sections)
    if start is None:
        return _ro_digest_slot(data, sections, source)
    total = read_blob_header_length(bytes(data[start:start + BLOB_PREFIX_SIZE]), source)
    if start + total > len(data):
        raise BlobError(f"{source}: blob truncated: header says {total} bytes but the library "
                        f"file ends before")
    return start + total - BLOB_CODE_DIGEST_SIZE


def _ro_digest_slot(data, sections: list[tuple], source: str) -> int | None:
    """A VM library's code-digest slot: the 32 bytes after the .ro in RO_SYMBOL
    (export.pack_ro); None if the library has no .ro."""
    start = symbol_offset(data, sections, RO_SYMBOL)
    if start is None:
        return None
    if bytes(data[start:start + len(RO_MAGIC)]) != RO_MAGIC:
        raise BlobError(f"{source}: {RO_SYMBOL} is not a pipeline VM executable")
    total = int.from_bytes(data[start + 16:start + 24], "little")
    if start + total + BLOB_CODE_DIGEST_SIZE > len(data):
        raise BlobError(f"{source}: VM executable truncated: it ends past the library file")
    return start + total


def stamp_code_digest(path: str | os.PathLike) -> bool:
    """Write the code digest into the blob of the freshly linked library at path;
    False (file untouched) if the library has no blob."""
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as data:
        sections = elf_sections(data, os.fspath(path))
        slot = _digest_slot(data, sections, os.fspath(path))
        if slot is None:
            return False
        data[slot:slot + BLOB_CODE_DIGEST_SIZE] = code_digest(data, os.fspath(path), sections)
        data.flush()
    return True


def verify_code_digest(path: str | os.PathLike, source: str) -> None:
    """BlobError naming `source` unless the library file's code matches the digest
    its blob records (checked on the file, before it is loaded)."""
    if os.path.getsize(path) < 64:
        raise BlobError(f"{source}: not an ELF64 little-endian library")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        sections = elf_sections(data, source)
        slot = _digest_slot(data, sections, source)
        if slot is None:
            raise BlobError(f"{source}: no {BLOB_SYMBOL} symbol; not a library exported by "
                            "pipeline, or devc.o was not linked in")
        recorded = bytes(data[slot:slot + BLOB_CODE_DIGEST_SIZE])
        if recorded == bytes(BLOB_CODE_DIGEST_SIZE):
            raise BlobError(f"{source}: the library records no code digest (not linked by "
                            "pipeline.link.cc.create_shared); load it with verify=False")
        if code_digest(data, source, sections) != recorded:
            raise BlobError(f"{source}: code digest mismatch: the library's code was changed "
                            "after the build; rebuild it")
