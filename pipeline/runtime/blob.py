"""The blob reader: verify and parse the blob a library carries (format and
writer: pipeline/link/blob.py, whose prefix check this shares).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pipeline.link.blob import (
    BLOB_CODE_DIGEST_SIZE,
    BLOB_DIGEST_SIZE,
    BLOB_FIXED,
    BLOB_PREFIX_SIZE,
    BLOB_TABLE,
    BlobError,
    read_blob_header_length,
)

__all__ = ["Blob", "BlobError", "read_blob_header_length", "unpack_blob"]


@dataclass(frozen=True)
class Blob:
    """The verified contents of a blob."""

    graph_json: str
    params: memoryview  # a view of the blob's bytes: 100 MB of weights are not copied
    kernels: tuple[str, ...]
    target: str
    import_tree: dict[str, Any]


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
    end = total - BLOB_CODE_DIGEST_SIZE  # the checksummed part ends with its checksum
    if hashlib.sha256(view[:end - BLOB_DIGEST_SIZE]).digest() != bytes(
            view[end - BLOB_DIGEST_SIZE:end]):
        raise BlobError(f"{source}: checksum mismatch: the library is corrupted; rebuild it")
    # From here on the bytes are exactly what pack_blob wrote (or a deliberate
    # forgery, which we do not defend against), so errors below mean a bug.
    header_len = BLOB_FIXED.unpack_from(view)[4]
    head = BLOB_FIXED.size + BLOB_TABLE.size
    try:
        header = json.loads(bytes(view[head:head + header_len]))
        sections = {}
        for entry in header["sections"]:
            start, size = entry["offset"], entry["size"]
            if (not isinstance(start, int) or not isinstance(size, int) or size < 0
                    or start < head + header_len
                    or start + size > end - BLOB_DIGEST_SIZE):
                raise ValueError(f"section {entry['name']!r} out of bounds")
            sections[entry["name"]] = view[start:start + size]
        return Blob(graph_json=str(sections["graph"], "utf-8"), params=sections["params"],
                    kernels=tuple(header["kernels"]), target=header["target"],
                    import_tree=header["import_tree"])
    except (ValueError, KeyError, TypeError, RecursionError) as err:
        raise BlobError(f"{source}: malformed blob header: {err}") from None
