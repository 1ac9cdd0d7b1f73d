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

devc.o, the object holding the blob, is a minimal ELF object written by
pipeline/contrib/elf.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

from pipeline.contrib.cc import atomic_write
from pipeline.contrib.elf import DATA_OFFSET, data_object
from pipeline.errors import PipelineError

__all__ = [
    "BLOB_MAGIC", "BLOB_PREFIX_SIZE", "BLOB_SYMBOL", "BLOB_VERSION", "Blob", "BlobError",
    "blob_chunks", "devc_checksum", "emit_blob_object", "pack_blob", "read_blob_header_length",
    "unpack_blob", "write_devc",
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
    return b"".join(blob_chunks(graph_json, params, kernels, target))


def blob_chunks(graph_json: str, params, kernels: list[str], target: str) -> list:
    """pack_blob's bytes as a list of chunks, `params` (any bytes-like object, e.g.
    a memory-mapped .params file) among them uncopied: write_devc streams them."""
    sections = [("graph", memoryview(graph_json.encode("utf-8"))),
                ("params", memoryview(params).cast("B"))]
    # Section offsets live in the header, whose length depends on the offsets'
    # digits: iterate until the header length stops changing (2-3 rounds).
    header_len = 0
    while True:
        offset = _FIXED.size + header_len
        table = []
        for name, data in sections:
            table.append({"name": name, "offset": offset, "size": data.nbytes})
            offset += data.nbytes
        header = _dumps({"import_tree": IMPORT_TREE, "sections": table,
                         "kernels": list(kernels), "target": target})
        if len(header) == header_len:
            break
        header_len = len(header)
    total = offset + _DIGEST
    parts = [_FIXED.pack(BLOB_MAGIC, BLOB_VERSION, 0, total, header_len), header,
             *(data for _, data in sections)]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return [*parts, digest.digest()]


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


def emit_blob_object(blob: bytes, target: Any) -> bytes:
    """Return an ELF relocatable object whose global constant BLOB_SYMBOL holds blob.

    `target` is a pipeline.codegen.target.Target or a target string; its triple
    picks the ELF machine (ValueError for targets pipeline.contrib.elf cannot write).
    """
    return b"".join(data_object(BLOB_SYMBOL, [blob], _triple(target)))


def _triple(target: Any) -> str:
    from pipeline.codegen.target import parse_target

    return (parse_target(target) if isinstance(target, str) else target).triple


def devc_checksum(path: str | os.PathLike) -> bytes:
    """The sha256 stored in the blob of a devc.o that write_devc wrote: a digest of
    graph, params, kernel list and target, read without hashing the blob again."""
    with open(path, "rb") as f:
        f.seek(DATA_OFFSET)
        total = read_blob_header_length(f.read(BLOB_PREFIX_SIZE), os.fspath(path))
        f.seek(DATA_OFFSET + total - _DIGEST)
        return f.read(_DIGEST)


def write_devc(blob: bytes | list, target: Any, path: str | os.PathLike) -> None:
    """Write the blob object for target atomically to path (devc.o); blob is the
    packed bytes or blob_chunks' list."""
    chunks = [blob] if isinstance(blob, bytes) else blob
    atomic_write(path, data_object(BLOB_SYMBOL, chunks, _triple(target)))
