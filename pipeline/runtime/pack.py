"""The packed blob stored in devc.o: graph JSON, params and metadata in one symbol.

Layout (integers little endian):

    magic "PLMBLOB\\0" (8) | u32 format version | u32 reserved 0 |
    u64 total blob length, including the checksum |
    u64 header length H | H bytes of UTF-8 JSON header (sorted keys, compact) |
    section bytes, concatenated | sha256 of everything before it (32)

The first 24 bytes are stable across format versions so that a reader can
learn the length (and reject a newer version) before touching the rest.
The JSON header holds the import tree, the section table (offsets from the
blob start), the kernel symbol names and the target string.

Only the pure-Python parts are imported by the runtime; emitting the object
file needs llvmlite, which is imported lazily.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from typing import Any

from pipeline.contrib.cc import atomic_write
from pipeline.errors import PipelineError

__all__ = [
    "BLOB_MAGIC", "BLOB_PREFIX_SIZE", "BLOB_SYMBOL", "BLOB_VERSION", "Blob", "BlobError",
    "emit_blob_object", "pack_blob", "read_blob_header_length", "unpack_blob", "write_devc",
]

BLOB_SYMBOL = "__pipeline_dev_mblob"
BLOB_MAGIC = b"PLMBLOB\0"
BLOB_VERSION = 1
BLOB_PREFIX_SIZE = 24  # magic + version + reserved + total length
_FIXED = struct.Struct("<8sIIQQ")  # the prefix plus the header length
_DIGEST = 32

IMPORT_TREE = {
    "modules": [{"type_key": "library"},
                {"type_key": "GraphExecutorFactory", "module_name": "default"}],
    "row_ptr": [0, 1, 1],
    "child_indices": [1],
}


class BlobError(PipelineError, ValueError):
    """A blob that cannot be trusted; the message starts with where it came from."""


@dataclass(frozen=True)
class Blob:
    """The verified contents of a blob."""

    graph_json: str
    params: bytes
    kernels: tuple[str, ...]
    target: str
    import_tree: dict[str, Any]


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


def pack_blob(graph_json: str, params: bytes, kernels: list[str], target: str) -> bytes:
    """Pack graph JSON text, param-dict bytes, kernel symbols and target into a blob."""
    sections = [("graph", graph_json.encode("utf-8")), ("params", bytes(params))]
    # Section offsets live in the header, whose length depends on the offsets'
    # digits: iterate until the header length stops changing (2-3 rounds).
    header_len = 0
    while True:
        offset = _FIXED.size + header_len
        table = []
        for name, data in sections:
            table.append({"name": name, "offset": offset, "size": len(data)})
            offset += len(data)
        header = _dumps({"import_tree": IMPORT_TREE, "sections": table,
                         "kernels": list(kernels), "target": target})
        if len(header) == header_len:
            break
        header_len = len(header)
    total = offset + _DIGEST
    parts = [_FIXED.pack(BLOB_MAGIC, BLOB_VERSION, 0, total, header_len), header,
             *(data for _, data in sections)]
    # Hash the parts in place and join once: params can be hundreds of MB.
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return b"".join([*parts, digest.digest()])


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
    if total < _FIXED.size + _DIGEST:
        raise BlobError(f"{source}: blob header is corrupted: total length {total} is too "
                        "small; rebuild the library")
    return total


def unpack_blob(data: bytes, source: str) -> Blob:
    """Verify and parse a blob; `source` names its origin in error messages.

    Magic, version, length and sha256 are checked before anything else is
    read. Raises BlobError with a one-line message on any problem.
    """
    total = read_blob_header_length(data[:BLOB_PREFIX_SIZE], source)
    if len(data) < total:
        raise BlobError(f"{source}: blob truncated: expected {total} bytes, found {len(data)}")
    if len(data) > total:
        raise BlobError(f"{source}: blob length mismatch: expected {total} bytes, found "
                        f"{len(data)}")
    view = memoryview(data)
    if hashlib.sha256(view[:-_DIGEST]).digest() != bytes(view[-_DIGEST:]):
        raise BlobError(f"{source}: checksum mismatch: the library is corrupted; rebuild it")
    # From here on the bytes are exactly what pack_blob wrote (or a deliberate
    # forgery, which we do not defend against), so errors below mean a bug.
    header_len = _FIXED.unpack_from(view)[4]
    try:
        header = json.loads(bytes(view[_FIXED.size:_FIXED.size + header_len]))
        sections = {}
        for entry in header["sections"]:
            start, size = entry["offset"], entry["size"]
            if start < _FIXED.size + header_len or start + size > total - _DIGEST:
                raise ValueError(f"section {entry['name']!r} out of bounds")
            sections[entry["name"]] = bytes(view[start:start + size])
        return Blob(graph_json=sections["graph"].decode("utf-8"), params=sections["params"],
                    kernels=tuple(header["kernels"]), target=header["target"],
                    import_tree=header["import_tree"])
    except (ValueError, KeyError, TypeError) as err:
        raise BlobError(f"{source}: malformed blob header: {err}") from None


def _asm_string(text: str) -> str:
    """Quote text for an assembler directive ("..." with \\ and \" escaped)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _ir_string(text: str) -> str:
    """Quote text for an LLVM IR string: everything unusual becomes \\XX hex."""
    out = []
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        out.append(ch if 0x20 <= byte < 0x7F and ch not in '"\\' else f"\\{byte:02X}")
    return '"' + "".join(out) + '"'


def _host_arch() -> str:
    import llvmlite.binding as llvm

    return llvm.get_process_triple().split("-")[0]


def emit_blob_object(blob: bytes, target: Any, tmp_dir: str | None = None) -> bytes:
    """Return an ELF relocatable object whose global constant BLOB_SYMBOL holds blob.

    `target` is a pipeline.codegen.target.Target (or a target string). The
    bytes never pass through LLVM IR: module-level inline assembly `.incbin`s a
    temporary file (in tmp_dir, default the system's), deleted afterwards, so
    a 100 MB blob costs about as much as copying it.
    """
    import llvmlite.binding as llvm

    from pipeline.codegen.target import parse_target

    if isinstance(target, str):
        target = parse_target(target)
    machine = target.target_machine()
    arch = target.triple.split("-")[0]
    # Module asm needs an asm parser for the target; llvmlite can only load
    # the host's, and LLVM aborts the whole process (no exception) without it.
    if arch != _host_arch():
        raise ValueError(f"cannot emit the blob object for {target.triple}: inline assembly "
                         f"needs an assembler for {arch}, only the host's is available")
    llvm.initialize_native_asmparser()
    # The blob is only reached through dlsym, never from code, so no code
    # model limits apply to it. On x86-64 it still goes in a large-data
    # section (.lrodata, flag "l"): linkers place those after .data/.bss, so
    # a >2 GB blob cannot push the kernels' small data out of the +-2 GB
    # reach of their PC-relative references. Other targets use .rodata.
    if arch == "x86_64":
        section = f'.section .lrodata.{BLOB_SYMBOL},"al",@progbits'
    else:
        section = f'.section .rodata.{BLOB_SYMBOL},"a",%progbits'
    fd, path = tempfile.mkstemp(prefix=".pipeline-blob-", suffix=".bin", dir=tmp_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        lines = [
            section,
            f".globl {BLOB_SYMBOL}",
            f".type {BLOB_SYMBOL},%object",
            ".p2align 6",
            f"{BLOB_SYMBOL}:",
            f".incbin {_asm_string(os.path.abspath(path))}",
            f".size {BLOB_SYMBOL}, {len(blob)}",
        ]
        text = f"target triple = {_ir_string(target.triple)}\n" + "".join(
            f"module asm {_ir_string(line)}\n" for line in lines)
        module = llvm.parse_assembly(text)
        module.verify()
        return machine.emit_object(module)
    finally:
        os.unlink(path)


def write_devc(blob: bytes, target: Any, path: str | os.PathLike) -> None:
    """Emit the blob object for target and write it atomically to path (devc.o)."""
    # Stage the blob next to the output: same disk, and /tmp may be a small tmpfs.
    folder = os.path.dirname(os.path.abspath(path))
    atomic_write(path, emit_blob_object(blob, target, tmp_dir=folder))
