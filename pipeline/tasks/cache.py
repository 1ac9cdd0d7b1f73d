"""The kernel cache: compiled kernels stored under their content hash.

One entry per KernelSpec hash, in one folder shared by every model, target
and matrix entry (and by several checkouts or doit processes when the folder
is shared, e.g. in CI):
    <hash>.json    the spec (written by optimize)
    <hash>.ll      LLVM IR, for reading
    <hash>.o       the object
    <hash>.sha256  the checksum of the entry's hash and its object, written last: it
                   commits the entry
Every file is written atomically (temp file + rename), so a reader never sees
half a file; an object is linked only if its checksum matches, so a corrupted
or truncated entry, or a foreign one (another kernel's object and checksum
copied under this hash: the hash is in the checksum), is rebuilt from its spec
instead of linked. The location is
`cache=DIR` on the doit command line, else $PIPELINE_KERNEL_CACHE, else
out/kernels.
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.link.files import atomic_write

DEFAULT = os.path.join("out", "kernels")
ENV = "PIPELINE_KERNEL_CACHE"
SUFFIXES = (".json", ".ll", ".o", ".sha256")


def cache_dir(override: str | None = None) -> str:
    """The cache folder: the command-line override, the environment, or the default."""
    return os.path.normpath(override or os.environ.get(ENV) or DEFAULT)


def entry_path(root: str, kernel_hash: str, suffix: str) -> str:
    return os.path.join(root, kernel_hash + suffix)


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


def compile_entry(root: str, kernel_hash: str) -> dict:
    """Compile the spec <hash>.json into the entry: {"compiled": False} if a valid
    one was there already, {"compiled": True} otherwise, plus {"note": text} when
    the compile needed a fallback (pipeline.codegen.compile.CompileWarning).

    Another process sharing the cache may have compiled it already; then the
    object is reused. Concurrent compiles of one spec write identical bytes.
    """
    from pipeline.codegen.compile import CompileWarning
    from pipeline.driver.build import compile_kernel
    from pipeline.lower.kernel import KernelSpec

    if is_valid(root, kernel_hash):
        return {"compiled": False}
    spec_path = entry_path(root, kernel_hash, ".json")
    try:
        spec = KernelSpec.from_json(Path(spec_path).read_text())
    except FileNotFoundError:
        raise CacheError(f"{spec_path}: kernel spec missing from the cache (removed while "
                         "in use?); rerun the build to write it again") from None
    except (ValueError, KeyError, TypeError) as err:
        raise CacheError(f"{spec_path}: kernel spec unreadable ({type(err).__name__}: "
                         f"{err}); delete it and rerun the build") from None
    if spec.hash != kernel_hash:
        raise CacheError(f"{spec_path}: holds the spec of kernel {spec.hash}, not "
                         f"{kernel_hash}; delete it and rerun the build")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CompileWarning)
        text, obj = compile_kernel(spec)
    atomic_write(entry_path(root, kernel_hash, ".ll"), text.encode())
    atomic_write(entry_path(root, kernel_hash, ".o"), obj)
    atomic_write(entry_path(root, kernel_hash, ".sha256"), checksum(kernel_hash, obj).encode())
    notes = [str(w.message) for w in caught if issubclass(w.category, CompileWarning)]
    return {"compiled": True, **({"note": "; ".join(notes)} if notes else {})}


def object_for_link(root: str, kernel_hash: str) -> tuple[str, bool]:
    """(path of a valid object for `kernel_hash`, whether it had to be compiled now):
    a corrupted, truncated, foreign or missing entry is recompiled. Its time stamp
    is refreshed so garbage collection sees the use."""
    compiled = not is_valid(root, kernel_hash) and compile_entry(root, kernel_hash)["compiled"]
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
