"""Load an exported library (.so, one relocatable .o, or a .tar of objects) and
hand out its graph executor.

The library carries everything in itself: kernels as exported functions, the
graph JSON, executor plan and params in the blob symbol (format:
pipeline/link/blob.py) and the C graph executor that runs them (its pl_* API).
The blob is verified (magic, version, length, sha256) before anything in it is
used, and the library's code against the digest the blob records before dlopen.
"""

from __future__ import annotations

import ctypes
import os
import struct
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipeline.errors import FormatError
from pipeline.link.blob import BLOB_PREFIX_SIZE, BLOB_SYMBOL
from pipeline.link.cc import create_shared
from pipeline.link.integrity import verify_code_digest
from pipeline.runtime.blob import Blob, BlobError, read_blob_header_length, unpack_blob
from pipeline.runtime.graph_executor import GraphExecutor, bind_api, check_device
from pipeline.runtime.machine import check_machine
from pipeline.runtime.params import load_params
from pipeline.runtime.threads import limit_idle_spin

__all__ = ["Module", "load_module"]

SUFFIXES = (".so", ".tar", ".o")

# glibc's dlopen returns the already-loaded library when the *path* matches,
# even if the file was rebuilt since. Remember what each path was when we
# loaded it, and reach a changed file through a fresh symlink name instead.
_loaded_ids: dict[str, tuple[int, int, int]] = {}


def _file_id(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_mtime_ns


class Module:
    """A loaded library: its kernels, graph JSON, params and the "default" factory."""

    def __init__(self, path: str, lib: ctypes.CDLL, blob: Blob, keep: Sequence[Any] = ()):
        self.path = path
        self.lib = lib
        self.blob = blob
        try:
            self._api = bind_api(lib)
        except AttributeError as err:  # ctypes: "<path>: undefined symbol: pl_..."
            missing = str(err).rsplit(" ", 1)[-1]
            raise BlobError(f"{path}: the library's graph executor has no {missing} (none, "
                            "or one from an older pipeline); export it again with this "
                            "version of pipeline") from None
        self._keep = list(keep)  # temp dirs that must outlive the dlopen'ed file
        self._params: dict[str, np.ndarray] | None = None

    @property
    def kernels(self) -> tuple[str, ...]:
        """Kernel symbol names recorded in the blob."""
        return self.blob.kernels

    @property
    def graph_json(self) -> str:
        """The graph executor JSON text."""
        return self.blob.graph_json

    @property
    def target(self) -> str:
        """The target string the library was built for."""
        return self.blob.target

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The params stored in the library (parsed once, on first use)."""
        if self._params is None:
            self._params = load_params(self.blob.params)
        return self._params

    def get_function(self, symbol: str) -> Callable[..., int]:
        """The ctypes function `int32_t symbol(void **args)`; AttributeError if absent."""
        try:
            # lib[name], unlike getattr, also finds names shaped like "__x__".
            func = self.lib[symbol]
        except AttributeError:
            raise AttributeError(f"{self.path}: kernel symbol {symbol!r} not found in the "
                                 "library") from None
        func.restype = ctypes.c_int32
        return func

    def __getitem__(self, name: str) -> Callable[..., GraphExecutor]:
        """`lib["default"]` is the executor factory: `lib["default"](dev)` (TVM style)."""
        if name != "default":
            raise KeyError(f"{self.path}: no module {name!r}; available: ['default']")
        return self._factory

    def _factory(self, device: Any = None) -> GraphExecutor:
        check_device(device)
        # Each executor gets its own copy of the params (the C executor copies
        # them from the blob), so two executors from one library never see each
        # other's load_params/set_input.
        return GraphExecutor(self._api, self.graph_json, owner=self)

    def __repr__(self) -> str:
        return f"Module({self.path!r}, {len(self.kernels)} kernels, target={self.target!r})"


def load_module(path: str | os.PathLike, link_options: Sequence[str] | None = None,
                verify: bool = True) -> Module:
    """Load a library exported as `.so`, as one relocatable `.o`, or as a `.tar`
    of object files.

    A `.o` or `.tar` is linked (a `.tar` extracted first) in a private temporary
    folder with the host's cc through create_shared (link_options are passed
    on, e.g. ["-lgomp"]). With `verify`, the library's code sections are hashed
    and compared with the digest its blob records before it is loaded
    (pipeline/link/integrity.py; a few ms per MB of code). Raises
    FileNotFoundError, ValueError for other suffixes, ForeignLibraryError for a
    library built for another architecture (saying how to run it), BlobError
    when the blob is missing or corrupted or the code does not match its digest.
    """
    path = os.path.abspath(os.fspath(path))
    if not path.endswith(SUFFIXES):
        raise ValueError(f"cannot load {path}: supported library suffixes are "
                         f"{', '.join(SUFFIXES)}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"library not found: {path}")
    if path.endswith(".so"):
        check_machine(path, path)
        return _load_so(path, path, verify=verify)
    tmp = tempfile.TemporaryDirectory(prefix="pipeline-lib-")
    try:
        objects = [path] if path.endswith(".o") else _extract_objects(path, tmp.name)
        for obj in objects:
            check_machine(obj, path)
        so_path = os.path.join(tmp.name, "lib.so")
        create_shared(so_path, objects, options=link_options)
        # create_shared has just stamped the digest of these very bytes: nothing to verify.
        return _load_so(so_path, path, keep=[tmp], verify=False)
    except BaseException:
        tmp.cleanup()
        raise


def _extract_objects(tar_path: str, dest: str) -> list[str]:
    """Extract a flat tar's regular files into dest; return the .o paths, sorted."""
    objects = []
    try:
        tar = tarfile.open(tar_path)
    except tarfile.TarError as err:
        raise FormatError(f"{tar_path}: not a readable tar archive ({err})") from None
    with tar:
        for member in tar.getmembers():
            name = member.name
            # Our tars are flat; refuse anything that could land outside dest.
            if (not member.isfile() or os.path.isabs(name) or os.path.dirname(name)
                    or name in ("", ".", "..")):
                raise FormatError(f"{tar_path}: refusing tar member {name!r} (expected plain "
                                  "files without folders)")
            src = tar.extractfile(member)
            out = os.path.join(dest, name)
            with src, open(out, "wb") as f:
                while chunk := src.read(1 << 20):
                    f.write(chunk)
            if name.endswith(".o"):
                objects.append(out)
    if not objects:
        raise FormatError(f"{tar_path}: no .o files in the archive")
    return sorted(objects)


def _load_so(so_path: str, source: str, keep: Sequence[Any] = (),
             verify: bool = True) -> Module:
    _check_segments(so_path, source)  # a cut file: say so, before reading its sections
    if verify:  # before dlopen: no byte of damaged code (constructors included) runs
        verify_code_digest(so_path, source)
    keep = list(keep)
    open_path = so_path
    file_id = _file_id(so_path)
    if _loaded_ids.setdefault(so_path, file_id) != file_id:
        alias_dir = tempfile.TemporaryDirectory(prefix="pipeline-reload-")
        keep.append(alias_dir)
        open_path = os.path.join(alias_dir.name, os.path.basename(so_path))
        os.symlink(so_path, open_path)
    limit_idle_spin()  # before the library pulls in libgomp (see runtime/threads.py)
    try:
        lib = ctypes.CDLL(open_path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    except OSError as err:
        raise OSError(f"cannot load {source}: {err}") from None
    data = _read_blob(lib, so_path, source)
    blob = unpack_blob(data, source)
    _give_back_pages(data)
    missing = [k for k in blob.kernels if not _has_symbol(lib, k)]
    if missing:
        raise BlobError(f"{source}: kernel symbols listed in the blob are missing from the "
                        f"library: {missing[:5]}")
    return Module(source, lib, blob, keep)


def _check_segments(so_path: str, source: str) -> None:
    """OSError if a 64-bit little-endian ELF file is shorter than its loadable
    segments: dlopen would map it past its end, and the first touch of a missing
    page kills the process (SIGBUS). Other files are left to dlopen's own checks."""
    with open(so_path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
            return
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    size = os.path.getsize(so_path)
    if len(table) < phentsize * phnum:
        raise OSError(f"cannot load {source}: truncated (program headers missing)")
    for k in range(phnum):
        p_type, = struct.unpack_from("<I", table, k * phentsize)
        offset, = struct.unpack_from("<Q", table, k * phentsize + 8)
        filesz, = struct.unpack_from("<Q", table, k * phentsize + 32)
        if p_type == 1 and offset + filesz > size:  # PT_LOAD
            raise OSError(f"cannot load {source}: truncated ({size} bytes, a segment ends at "
                          f"{offset + filesz}); copy or export it again")


def _has_symbol(lib: ctypes.CDLL, name: str) -> bool:
    try:
        lib[name]
    except AttributeError:
        return False
    return True


def _read_blob(lib: ctypes.CDLL, so_path: str, source: str) -> memoryview:
    """The blob in the loaded library's BLOB_SYMBOL, in place (read-only data of the
    mapped file: the params are not copied into this process a second time)."""
    try:
        addr = ctypes.addressof(ctypes.c_char.in_dll(lib, BLOB_SYMBOL))
    except ValueError:
        raise BlobError(f"{source}: no {BLOB_SYMBOL} symbol; not a library exported by "
                        "pipeline, or devc.o was not linked in") from None
    total = read_blob_header_length(ctypes.string_at(addr, BLOB_PREFIX_SIZE), source)
    # A corrupted length must not make us read past the mapping: the blob
    # lives inside the file, so it cannot be longer than the file.
    size = os.path.getsize(so_path)
    if total > size:
        raise BlobError(f"{source}: blob truncated: header says {total} bytes but the library "
                        f"file has only {size}")
    return memoryview((ctypes.c_char * total).from_address(addr)).cast("B")


_MADV_DONTNEED = 4  # Linux, every architecture


def _give_back_pages(data: memoryview) -> None:
    """Drop the whole pages of the mapped blob from this process's memory. They are
    read-only data of the library file, so a later read faults them in again from it;
    without this the checksum pass keeps every param resident beside the executor's
    own copy (vgg19: 700 MB twice)."""
    addr = ctypes.addressof(ctypes.c_char.from_buffer(data))
    page = os.sysconf("SC_PAGE_SIZE")
    lo, hi = -(-addr // page) * page, (addr + len(data)) // page * page
    if hi > lo:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED)
