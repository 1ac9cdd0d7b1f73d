"""The action cache: every stage's outputs stored under a key of what decides them.

A stage (one doit task's action) is decided by its input files' contents (which
include the compiler sources it runs: the task's derived source deps), its
arguments (paths, options, the target) and, for tasks that run the target's
compiler, the toolchain identity. `action_key` hashes all of it; the cache
location is not part of it (the key of a stage is the same in every checkout).

Layout, in the kernel cache folder (`cache=DIR`, the first tier), as in Bazel's
HTTP remote-cache protocol (pipeline.tasks.remote is the second tier):
    ac/<key>       a JSON manifest: output name -> {"sha256", "size"}
    cas/<sha256>   each output's bytes
Blobs are written before the manifest that names them, each by atomic rename,
so a reader finds a complete entry or none; concurrent writers of one key write
the same bytes. A blob is verified against its digest before any output is
restored from it: a damaged one is a miss (and removed), never an output.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from pipeline.files import atomic_write, temp_output
from pipeline.tasks import lazy

_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def _memo(path: str) -> tuple[str, int, int, int]:
    st = os.stat(path)
    return os.path.abspath(path), st.st_ino, st.st_mtime_ns, st.st_size


def remember(path: str, digest: str) -> None:
    """Record that `path`, as it is now, hashes to `digest` (known from its source:
    bytes verified in memory, or the blob it was linked from), so neither the
    restore nor the next stage's key hashes it again."""
    _DIGESTS[_memo(path)] = digest


def file_digest(path: str) -> str:
    """sha256 of a file, memoised per (path, inode, mtime, size) for this process;
    for an output left in the cache (pipeline.tasks.lazy), the digest it stands for."""
    try:
        memo = _memo(path)
    except FileNotFoundError:
        marked = lazy.digest(path)
        if marked is None:
            raise
        return marked
    if memo not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        _DIGESTS[memo] = h.hexdigest()
    return _DIGESTS[memo]


def action_key(stage: str, args: list, inputs: list[str], extra: dict) -> str:
    """The key of one stage run: sha256 over the stage's name, its arguments (JSON),
    the sha256 of every input file (paths relative, as the tasks list them) and
    `extra` (the toolchain identity, or anything else decided outside the files)."""
    doc = {"v": 1, "stage": stage, "args": args, "extra": extra,
           "inputs": {p: file_digest(p) for p in sorted(set(inputs))}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


class LocalStore:
    """ac/ and cas/ under `root` (the local tier)."""

    def __init__(self, root: str):
        self.root = root

    def manifest_path(self, key: str) -> str:
        return os.path.join(self.root, "ac", key)

    def blob_path(self, digest: str) -> str:
        return os.path.join(self.root, "cas", digest)

    def get_manifest(self, key: str) -> dict | None:
        """The manifest stored under `key`, or None (absent or unreadable)."""
        try:
            doc = json.loads(Path(self.manifest_path(key)).read_text())
            return doc if isinstance(doc.get("outputs"), dict) else None
        except (FileNotFoundError, ValueError, UnicodeDecodeError):
            return None

    def has_blob(self, digest: str) -> bool:
        return os.path.exists(self.blob_path(digest))

    def verified_blob(self, digest: str) -> str | None:
        """The blob's path if it exists and its bytes hash to `digest`; a damaged
        blob is removed (the next store writes it again) and None returned."""
        path = self.blob_path(digest)
        if not os.path.exists(path):
            return None
        if file_digest(path) != digest:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return None
        return path

    def put_blob_bytes(self, digest: str, data: bytes) -> None:
        """Store bytes the caller has verified to hash to `digest`."""
        if not self.has_blob(digest):
            atomic_write(self.blob_path(digest), data)
            remember(self.blob_path(digest), digest)

    def put_blob_file(self, digest: str, path: str) -> None:
        """Store a file's bytes as blob `digest`: a hard link when the file system
        allows (outputs are only ever replaced by rename, never edited in place),
        else a copy."""
        if not self.has_blob(digest):
            _link_or_copy(path, self.blob_path(digest))

    def put_manifest(self, key: str, manifest: dict) -> None:
        atomic_write(self.manifest_path(key), json.dumps(manifest, sort_keys=True).encode())


def _link_or_copy(src: str, dst: str) -> None:
    """Place src's bytes at dst atomically; dst keeps its mtime if already equal."""
    with temp_output(dst) as tmp:
        os.unlink(tmp)
        try:
            os.link(src, tmp)
        except OSError:  # another file system, or no hard links
            shutil.copyfile(src, tmp)


def manifest_of(outputs: dict[str, str]) -> dict:
    """The manifest for outputs (name -> path) as they are now on disk."""
    return {"outputs": {name: {"sha256": file_digest(p), "size": os.path.getsize(p),
                               # pipeline-run must come back runnable
                               **({"executable": True} if os.access(p, os.X_OK) else {})}
                        for name, p in sorted(outputs.items())}}


def place(blob: str, path: str, output: dict) -> None:
    """Put the verified blob's bytes at `path` (output: its manifest entry)."""
    _link_or_copy(blob, path)
    if output.get("executable"):
        os.chmod(path, 0o755)
    remember(path, output["sha256"])


def store(local: LocalStore, key: str, outputs: dict[str, str]) -> dict:
    """Record the outputs of a stage that just ran under `key`; returns the manifest."""
    manifest = manifest_of(outputs)
    for name, o in manifest["outputs"].items():
        local.put_blob_file(o["sha256"], outputs[name])
    local.put_manifest(key, manifest)
    return manifest


def prune(root: str, keys: set[str], blobs: set[str], max_age_days: float) -> tuple[int, int]:
    """Remove the manifests under ac/ whose key is not in `keys` and that were not
    used (written or hit) within `max_age_days`, then the blobs under cas/ that
    no remaining manifest names and that are not in `blobs`. Returns the counts.
    Only names are unlinked: bytes another hard link holds stay with it."""
    store, cutoff = LocalStore(root), time.time() - max_age_days * 86400
    ac_dir, cas_dir = os.path.join(root, "ac"), os.path.join(root, "cas")
    kept, entries, removed = set(blobs), 0, 0
    for key in sorted(os.listdir(ac_dir)) if os.path.isdir(ac_dir) else ():
        path = store.manifest_path(key)
        manifest = store.get_manifest(key)
        if key in keys or (manifest and os.path.getmtime(path) > cutoff):
            kept |= {o["sha256"] for o in (manifest or {"outputs": {}})["outputs"].values()}
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            entries += 1
    for digest in sorted(os.listdir(cas_dir)) if os.path.isdir(cas_dir) else ():
        if digest not in kept:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(store.blob_path(digest))
                removed += 1
    return entries, removed
