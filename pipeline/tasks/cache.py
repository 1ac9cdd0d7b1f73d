"""The kernel cache: compiled kernels stored under their content hash.

One entry per KernelSpec hash, in one folder shared by every model, target
and matrix entry (and by several checkouts or doit processes when the folder
is shared, e.g. in CI):
    <hash>.json    the spec (a copy of out/specs/<hash>.json, which optimize writes and
                   the kernel task declares as its input: the cache may move)
    <hash>.ll      LLVM IR, for reading (compiled from out/specs/<hash>.ll, which
                   optimize renders once: ir_path)
    <hash>.o       the object
    <hash>.sha256  the checksum of the entry's hash and its object, written last: it
                   commits the entry
Every file is written atomically (temp file + rename), so a reader never sees
half a file; an object is linked only if its checksum matches, so a corrupted
or truncated entry, or a foreign one (another kernel's object and checksum
copied under this hash: the hash is in the checksum), is rebuilt from its spec
instead of linked. The location is `cache=DIR` on the doit command line, else
$PIPELINE_KERNEL_CACHE, else out/kernels (pipeline.tasks.paths.cache_dir). The
action cache (ac/, cas/: pipeline.tasks.action_cache) lives in the same folder.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import atomic_write
from pipeline.tasks import lazy
from pipeline.tasks.cluster import compile_remotely
from pipeline.tasks.compile_job import compile_spec
from pipeline.tasks.paths import ir_path
from pipeline.tasks.tiered import materialize

SUFFIXES = (".json", ".ll", ".o", ".sha256")


def entry_path(root: str, kernel_hash: str, suffix: str) -> str:
    return os.path.join(root, kernel_hash + suffix)


def read_ir(path: str, symbol: str) -> str | None:
    """The IR text at `path` if it is the module of kernel `symbol` (its ModuleID:
    a file copied under another kernel's hash is not), else None."""
    try:
        text = Path(path).read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return text if text.startswith(f'; ModuleID = "{symbol}"\n') else None


class CacheError(PipelineError):
    """A kernel-cache entry that cannot be rebuilt (its spec is missing or unreadable)."""


def checksum(kernel_hash: str, obj: bytes) -> str:
    """What <hash>.sha256 holds: sha256 over the entry's hash and its object bytes,
    so an entry copied under another hash does not validate."""
    return hashlib.sha256(kernel_hash.encode() + b"\n" + obj).hexdigest()


def is_valid(root: str, kernel_hash: str) -> bool:
    """True if the entry's object exists and matches its committed checksum."""
    obj, check = (entry_path(root, kernel_hash, s) for s in (".o", ".sha256"))
    try:
        return Path(check).read_text().strip() == checksum(kernel_hash,
                                                            Path(obj).read_bytes())
    except (FileNotFoundError, UnicodeDecodeError):
        return False


def entry_ir(root: str, kernel_hash: str, symbol: str) -> str | None:
    """The IR of a valid entry (kernel `symbol`), else None: what a warm lowering
    reads instead of rendering the kernel again."""
    return read_ir(entry_path(root, kernel_hash, ".ll"), symbol) \
        if is_valid(root, kernel_hash) else None


def compile_entry(root: str, kernel_hash: str, spec_path: str | None = None,
                  dask: str | None = None) -> dict:
    """Compile the spec at spec_path (default: the entry's own <hash>.json) into the
    entry, from the IR beside it (ir_path: what optimize rendered) when that is
    there, else rendering it. Returns {"compiled": False} if a valid entry was
    there already, {"compiled": True} otherwise ({"compiled": "cluster"} when the
    Dask scheduler at `dask` ran it), plus {"note": text} when the compile needed
    a fallback (pipeline.codegen.compile.CompileWarning).

    Another process sharing the cache may have compiled it already; then the
    object is reused. Concurrent compiles of one spec write identical bytes.
    """
    from pipeline.lower.kernel import KernelSpec

    spec_path = spec_path or entry_path(root, kernel_hash, ".json")
    if is_valid(root, kernel_hash):
        _copy_spec(root, kernel_hash, spec_path)
        return {"compiled": False}
    try:
        spec_text = Path(spec_path).read_text()
        spec = KernelSpec.from_json(spec_text)
    except FileNotFoundError:
        raise CacheError(f"{spec_path}: kernel spec missing from the cache (removed while "
                         "in use?); rerun the build to write it again") from None
    except (ValueError, KeyError, TypeError) as err:
        raise CacheError(f"{spec_path}: kernel spec unreadable ({type(err).__name__}: "
                         f"{err}); delete it and rerun the build") from None
    if spec.hash != kernel_hash:
        raise CacheError(f"{spec_path}: holds the spec of kernel {spec.hash}, not "
                         f"{kernel_hash}; delete it and rerun the build")
    if dask:  # the worker renders: its files are not ours
        text, obj, notes = compile_remotely(dask, spec_text)
    else:
        text, obj, notes = compile_spec(spec_text, read_ir(ir_path(spec_path), spec.symbol))
    _copy_spec(root, kernel_hash, spec_path)
    atomic_write(entry_path(root, kernel_hash, ".ll"), text.encode())
    atomic_write(entry_path(root, kernel_hash, ".o"), obj)
    atomic_write(entry_path(root, kernel_hash, ".sha256"), checksum(kernel_hash, obj).encode())
    lazy.drop(entry_path(root, kernel_hash, s) for s in SUFFIXES)
    return {"compiled": "cluster" if dask else True,
            **({"note": "; ".join(notes)} if notes else {})}


def _copy_spec(root: str, kernel_hash: str, spec_path: str) -> None:
    """Keep the spec with its entry (a corrupted object is recompiled from it)."""
    dst = entry_path(root, kernel_hash, ".json")
    if os.path.abspath(dst) != os.path.abspath(spec_path) and not os.path.exists(dst):
        atomic_write(dst, Path(spec_path).read_bytes())


def object_for_link(root: str, kernel_hash: str,
                    spec_path: str | None = None) -> tuple[str, bool]:
    """(path of a valid object for `kernel_hash`, whether it had to be compiled now):
    a corrupted, truncated, foreign or missing entry is recompiled. Its time stamp
    is refreshed so garbage collection sees the use."""
    if not is_valid(root, kernel_hash):  # a cache hit may have left it in the cache
        for suffix in (".o", ".sha256"):
            materialize(entry_path(root, kernel_hash, suffix), recompute=False)
    if not is_valid(root, kernel_hash) and spec_path:
        materialize(spec_path)
    compiled = (not is_valid(root, kernel_hash)
                and bool(compile_entry(root, kernel_hash, spec_path)["compiled"]))
    path = entry_path(root, kernel_hash, ".o")
    os.utime(path)
    return path, compiled


def collect_garbage(root: str, keep: set[str], max_age_days: float = 0.0) -> list[str]:
    """Remove entries not in `keep` and unused for `max_age_days`; returns the hashes.

    With a cache shared between checkouts, `keep` only knows this checkout's
    matrix: pass an age so entries other checkouts use recently survive.
    """
    if not os.path.isdir(root):
        return []
    cutoff = time.time() - max_age_days * 86400
    removed = []
    hashes = {Path(f).stem for f in os.listdir(root) if f.endswith(SUFFIXES)} - keep
    for h in sorted(hashes):
        paths = [entry_path(root, h, s) for s in SUFFIXES]
        newest = max((os.path.getmtime(p) for p in paths if os.path.exists(p)), default=0)
        if newest > cutoff:
            continue
        for p in paths:
            if os.path.exists(p):
                os.remove(p)
        removed.append(h)
    return removed
