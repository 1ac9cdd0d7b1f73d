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
instead of linked. The location is
`cache=DIR` on the doit command line, else $PIPELINE_KERNEL_CACHE, else
out/kernels. The action cache (ac/, cas/: pipeline.tasks.action_cache) lives
in the same folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import atomic_write
from pipeline.tasks import lazy

DEFAULT = os.path.join("out", "kernels")
ENV = "PIPELINE_KERNEL_CACHE"
SUFFIXES = (".json", ".ll", ".o", ".sha256")


def cache_dir(override: str | None = None) -> str:
    """The cache folder: the command-line override, the environment, or the default."""
    return os.path.normpath(override or os.environ.get(ENV) or DEFAULT)


def entry_path(root: str, kernel_hash: str, suffix: str) -> str:
    return os.path.join(root, kernel_hash + suffix)


def listed_kernels(kernels_json: str) -> list[dict]:
    """The kernels an entry's kernels.json lists: [{"hash", "symbol"}, ...] in link order."""
    return json.loads(Path(kernels_json).read_text())["kernels"]


def spec_path(specs_dir: str, kernel_hash: str) -> str:
    """Where optimize writes a kernel's spec (out/specs): the kernel task's input."""
    return os.path.normpath(os.path.join(specs_dir, kernel_hash + ".json"))


def ir_path(spec: str) -> str:
    """The LLVM IR beside a spec file (<hash>.ll next to <hash>.json): optimize
    renders each kernel once and writes it to out/specs, the kernel task compiles it."""
    return os.path.splitext(spec)[0] + ".ll"


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
        from pipeline.tasks.cluster import compile_remotely

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


def compile_spec(spec_json: str, ir: str | None = None) -> tuple[str, bytes, list[str]]:
    """A pure function: a kernel spec (JSON text) and its IR if rendered already
    (None: render it) -> (LLVM IR text, object bytes, the compiler's fallback
    notes). What a cluster worker runs (pipeline.tasks.cluster)."""
    from pipeline.codegen.compile import CompileWarning
    from pipeline.driver.build import compile_kernel
    from pipeline.lower.kernel import KernelSpec

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CompileWarning)
        text, obj = compile_kernel(KernelSpec.from_json(spec_json), ir)
    return text, obj, [str(w.message) for w in caught if issubclass(w.category, CompileWarning)]


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
    from pipeline.tasks.tiered import materialize

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
