"""The packed blob stored in devc.o (graph JSON, executor plan, params and metadata
in one symbol): its format and its writer. Readers: pipeline/runtime/blob.py
(Python) and pipeline/runtime/c/executor.c (the executor linked into every library).

Layout (integers little endian):

    magic "PLMBLOB\\0" (8) | u32 format version | u32 reserved 0 |
    u64 total blob length, including the checksum and code digest |
    u64 header length H |
    u64 offset, u64 size of each section: graph, params, plan (48) |
    H bytes of UTF-8 JSON header (sorted keys, compact) |
    section bytes, concatenated | sha256 of everything before it (32) |
    code digest (32)

The first 24 bytes are stable across format versions so that a reader can
learn the length (and reject a newer version) before touching the rest.
Offsets count from the blob start. The binary section table is what the C
executor reads (it parses no JSON); the JSON header repeats it for tools, with
the import tree, the kernel symbol names and the target string. The sections:
the TVM graph JSON, the param dict (pipeline/runtime/params.py) and the
executor plan (pipeline/link/plan.py).

Version 4's plan gives every tensor a byte offset in its storage (a concat written
in place). Version 3 had both the section table with the plan and the code digest
(two version-2 formats existed on separate branches: one with the table, one
with the digest; version 1 had neither).

The code digest is the sha256 of the library's code sections as
linked (pipeline/link/integrity.py): devc.o carries zeros there, and the link
(pipeline/link/cc.py create_shared) fills it in, so it sits outside the blob's
own checksum. The loader recomputes it to refuse a library whose code bytes
changed after the build. Version 1 had no code digest.

devc.o, the object holding the blob, is a minimal ELF object written by
pipeline/link/elf.py, or (target option `pack: c`, and any target our ELF
writer cannot serve) the target compiler's object of a C file: write_devc_c.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from typing import Any

from pipeline.errors import PipelineError
from pipeline.files import atomic_write
from pipeline.link.elf import DATA_OFFSET, data_object
from pipeline.link.plan import encode_plan

__all__ = [
    "BLOB_CODE_DIGEST_SIZE", "BLOB_DIGEST_SIZE", "BLOB_FIXED", "BLOB_MAGIC",
    "BLOB_PREFIX_SIZE", "BLOB_SECTIONS", "BLOB_SYMBOL", "BLOB_TABLE", "BLOB_VERSION",
    "BlobError", "blob_chunks", "devc_checksum", "emit_blob_object", "pack_blob",
    "read_blob_header_length", "write_devc", "write_devc_c",
]

BLOB_SYMBOL = "__pipeline_dev_mblob"
BLOB_MAGIC = b"PLMBLOB\0"
BLOB_VERSION = 4
BLOB_PREFIX_SIZE = 24  # magic + version + reserved + total length
BLOB_FIXED = struct.Struct("<8sIIQQ")  # the prefix plus the header length
BLOB_SECTIONS = ("graph", "params", "plan")  # the order of the section table
BLOB_TABLE = struct.Struct("<6Q")  # (offset, size) per section, after BLOB_FIXED
BLOB_DIGEST_SIZE = 32
BLOB_CODE_DIGEST_SIZE = 32  # the trailer the link stamps

IMPORT_TREE = {
    "modules": [{"type_key": "library"},
                {"type_key": "GraphExecutorFactory", "module_name": "default"}],
    "row_ptr": [0, 1, 1],
    "child_indices": [1],
}


class BlobError(PipelineError, ValueError):
    """A blob that cannot be trusted; the message starts with where it came from."""


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


def pack_blob(graph_json: str, params: bytes, kernels: list[str], target: str) -> bytes:
    """Pack graph JSON text, param-dict bytes, kernel symbols and target into a blob."""
    return b"".join(blob_chunks(graph_json, params, kernels, target))


def _byte_views(data) -> list[memoryview]:
    """A bytes-like object, or a list or tuple of them, as flat byte views (no copy)."""
    chunks = data if isinstance(data, (list, tuple)) else [data]
    return [memoryview(chunk).cast("B") for chunk in chunks]


def blob_chunks(graph_json: str, params, kernels: list[str], target: str) -> list:
    """pack_blob's bytes as a list of chunks, `params` among them uncopied:
    write_devc streams them. `params` is the param-dict bytes as one bytes-like
    object (e.g. a memory-mapped .params file) or a list of bytes-like chunks
    (runtime.params.param_chunks' list, over the arrays' own memory)."""
    sections = [("graph", _byte_views(graph_json.encode("utf-8"))),
                ("plan", _byte_views(encode_plan(graph_json))),
                ("params", _byte_views(params))]
    # Section offsets live in the header, whose length depends on the offsets'
    # digits: iterate until the header length stops changing (2-3 rounds).
    header_len = 0
    while True:
        offset = BLOB_FIXED.size + BLOB_TABLE.size + header_len
        table = []
        for name, views in sections:
            size = sum(v.nbytes for v in views)
            table.append({"name": name, "offset": offset, "size": size})
            offset += size
        header = _dumps({"import_tree": IMPORT_TREE, "sections": table,
                         "kernels": list(kernels), "target": target})
        if len(header) == header_len:
            break
        header_len = len(header)
    total = offset + BLOB_DIGEST_SIZE + BLOB_CODE_DIGEST_SIZE
    where = {entry["name"]: (entry["offset"], entry["size"]) for entry in table}
    parts = [BLOB_FIXED.pack(BLOB_MAGIC, BLOB_VERSION, 0, total, header_len),
             BLOB_TABLE.pack(*(v for name in BLOB_SECTIONS for v in where[name])), header,
             *(view for _, views in sections for view in views)]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return [*parts, digest.digest(), bytes(BLOB_CODE_DIGEST_SIZE)]


def read_blob_header_length(first_bytes: bytes, source: str = "blob") -> int:
    """Return the total blob length (checksum included) from its first 24 bytes.

    Checks the magic and the format version first; raises BlobError otherwise.
    """
    if len(first_bytes) < BLOB_PREFIX_SIZE:
        raise BlobError(f"{source}: blob truncated: expected at least {BLOB_PREFIX_SIZE} "
                        f"bytes, found {len(first_bytes)}")
    magic, version, _reserved, total = struct.unpack_from("<8sIIQ", first_bytes)
    if magic != BLOB_MAGIC:
        raise BlobError(f"{source}: not a pipeline blob: expected magic {BLOB_MAGIC!r}, "
                        f"found {magic!r}")
    if version != BLOB_VERSION:
        raise BlobError(f"{source}: blob from format version {version}, this runtime reads "
                        f"version {BLOB_VERSION}; rebuild the library")
    if total < (BLOB_FIXED.size + BLOB_TABLE.size + BLOB_DIGEST_SIZE
                + BLOB_CODE_DIGEST_SIZE):
        raise BlobError(f"{source}: blob header is corrupted: total length {total} is too "
                        "small; rebuild the library")
    return total


def emit_blob_object(blob: bytes, triple: str) -> bytes:
    """Return an ELF relocatable object whose global constant BLOB_SYMBOL holds blob.

    `triple` (the target's LLVM triple, Target.triple) picks the ELF machine
    (ValueError for triples pipeline.link.elf cannot write).
    """
    return b"".join(data_object(BLOB_SYMBOL, [blob], triple))


def devc_checksum(path: str | os.PathLike) -> bytes:
    """The sha256 stored in the blob of a devc.o: a digest of graph, params,
    kernel list and target, read without hashing the blob again. The blob sits
    at DATA_OFFSET in write_devc's objects; in a compiler's (write_devc_c) it is
    found by its magic. BlobError if there is none or it is cut short."""
    source = os.fspath(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        start = DATA_OFFSET
        if m[start:start + len(BLOB_MAGIC)] != BLOB_MAGIC:
            start = m.find(BLOB_MAGIC)
        if start < 0:
            raise BlobError(f"{source}: no pipeline blob in this object")
        end = start + read_blob_header_length(m[start:start + BLOB_PREFIX_SIZE], source)
        if end > len(m):
            raise BlobError(f"{source}: blob truncated: it ends at byte {end} of a "
                            f"{len(m)}-byte file")
        # The blob ends with its sha256, then the code digest slot the link fills in.
        end -= BLOB_CODE_DIGEST_SIZE
        return bytes(m[end - BLOB_DIGEST_SIZE:end])


def write_devc(blob: bytes | list, triple: str, path: str | os.PathLike,
               flags: int = 0, symbol: str = BLOB_SYMBOL) -> None:
    """Write the blob object for the target triple atomically to path (devc.o);
    blob is the packed bytes or blob_chunks' list; flags the ELF e_flags
    (Target.elf_flags(): RISC-V's float ABI); symbol: the data's name (a VM
    library's .ro goes under another)."""
    chunks = [blob] if isinstance(blob, bytes) else blob
    atomic_write(path, data_object(symbol, chunks, triple, flags))


def write_devc_c(blob: bytes | list, path: str | os.PathLike,
                 symbol: str = BLOB_SYMBOL) -> None:
    """Write the blob as a C file (atomically) defining the same symbol as
    write_devc: `const unsigned char BLOB_SYMBOL[n]`, 64-byte aligned, read-only.
    Any target's C compiler turns it into its own object format (TVM's
    PackImportsToC). The bytes are hex escapes in string literals, which
    compilers parse far faster than a list of integers."""
    chunks = [blob] if isinstance(blob, bytes) else blob
    views = _byte_views(chunks)
    size = sum(v.nbytes for v in views)
    atomic_write(path, _c_lines(views, size, symbol))


def _c_lines(views: list[memoryview], size: int, symbol: str):
    yield (f"/* The packed model of a pipeline library (pipeline/link/blob.py): {size} "
           "bytes. */\n"
           f"__attribute__((aligned(64), used)) const unsigned char {symbol}[{size}] =\n"
           ).encode()
    for view in views:
        for at in range(0, view.nbytes, 4096):
            # hex digits never contain "x": bytes 1 2 -> "01x02" -> "\x01\x02"
            text = view[at:at + 4096].hex("x").replace("x", "\\x")
            yield f'"\\x{text}"\n'.encode()
    yield b";\n"
