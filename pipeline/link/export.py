"""From compiled kernels to a model library: the one export path.

GraphExecutorFactory.export_library (pipeline/driver/factory.py) and the doit
tasks lib0, devc and export (pipeline/tasks/stages.py) both run these steps,
so the Python API and `doit build` give the same bytes for the same model:

  1. kernel objects -> lib0.o   cc.link_relocatable (cc -r, objects in symbol order)
  2. graph JSON + params + kernel symbols + target -> devc.o   pack_devc
  3. lib0.o + devc.o + executor.o -> .so (deterministic build id), .tar or one .o
     link_library (executor.o: the C graph executor, pipeline/runtime/c/, compiled
     once per target compiler by pipeline/link/runtime_c.py)

Every step runs the target's compiler `cc` (None: the host's, allowed only for a
target this machine runs; resolve_cc). Every output is written atomically and
left untouched when its bytes did not change (pipeline/files.py), which is
what keeps doit's later tasks up to date.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.ir.target import Target, host_triple, parse_target, triple_arch
from pipeline.link.blob import (
    BLOB_CODE_DIGEST_SIZE,
    BLOB_SYMBOL,
    blob_chunks,
    devc_checksum,
    write_devc,
    write_devc_c,
)
from pipeline.link.cc import (
    ToolchainError,
    cc_package,
    compile_c,
    create_shared,
    create_tar,
    link_relocatable,
)
from pipeline.link.elf import MACHINES
from pipeline.link.runtime_c import executor_object, vm_object
from pipeline.vm.format import RO_SYMBOL

__all__ = ["LIBRARY_SUFFIXES", "PACKS", "RO_SYMBOL", "choose_pack", "link_library",
           "pack_devc", "pack_ro", "resolve_cc"]

PathLike = str | os.PathLike
PACKS = ("elf", "c")  # devc.o written by pipeline/link/elf.py, or compiled from C
LIBRARY_SUFFIXES = (".so", ".tar", ".o")


def resolve_cc(target: Target, cc: str | None, key: str = "cc") -> str | None:
    """The compiler for `target`: `cc` if given; None (the host's) for a target
    this machine runs. ToolchainError naming `key` and the Debian package of the
    cross compiler for any other target without one."""
    if cc is not None or target.is_host:
        return cc
    raise ToolchainError(
        f"{key}: required for target {target.triple}, which is not this machine "
        f"({triple_arch(host_triple())}): its compiler, e.g. {target.arch}-linux-gnu-gcc "
        f"from the Debian package {cc_package(target.arch)}")


def choose_pack(target: Target, pack: str | None) -> str:
    """How devc.o is written: `pack` if given ("elf" or "c"), else "elf" where our
    ELF writer serves the target and "c" (its compiler's object) elsewhere."""
    if pack is None:
        return "elf" if target.object_format == "elf" and target.arch in MACHINES else "c"
    if pack not in PACKS:
        raise ValueError(f"pack {pack!r}: allowed {', '.join(PACKS)}")
    return pack


def pack_devc(graph_json: str, params, kernels: list[str], target: str, devc: PathLike,
              pack: str | None = None, cc: str | None = None) -> None:
    """Write devc.o, the object holding the packed blob (pipeline/link/blob.py).

    graph_json: the executor's graph JSON text; params: the param-dict bytes as
    one bytes-like object (a memory-mapped .params file) or a list of bytes-like
    chunks (runtime.params.param_chunks), streamed to the file, never joined;
    kernels: the kernel symbols in link order; target: the target string stored
    in the blob, which picks the object's machine and flags; pack: choose_pack's
    choice; cc: the target's compiler, used by the "c" pack. The blob ends with
    its sha256, which link_library reads back.
    """
    _write_object(blob_chunks(graph_json, params, kernels, target), target, devc, pack, cc,
                  BLOB_SYMBOL)


def pack_ro(ro: bytes, target: str, devc: PathLike, pack: str | None = None,
            cc: str | None = None) -> None:
    """Write devc.o of a VM library: the .ro bytes (pipeline/vm/format.py) under
    RO_SYMBOL, then 32 zero bytes where the link stamps the library's code digest
    (pipeline/link/integrity.py), written as pack_devc writes the blob (pack, cc: as
    there)."""
    _write_object([ro, bytes(BLOB_CODE_DIGEST_SIZE)], target, devc, pack, cc, RO_SYMBOL)


def _write_object(chunks: list, target: str, devc: PathLike, pack: str | None,
                  cc: str | None, symbol: str) -> None:
    resolved = parse_target(target)
    if choose_pack(resolved, pack) == "elf":
        write_devc(chunks, resolved.triple, devc, resolved.elf_flags(), symbol)
        return
    cc = resolve_cc(resolved, cc)
    # x86-64: the blob in a large-data section, as the ELF writer does (see elf.py).
    options = ["-mcmodel=medium", "-mlarge-data-threshold=0"] if resolved.arch == "x86_64" \
        else []
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(devc))) as tmp:
        source = os.path.join(tmp, "devc.c")
        write_devc_c(chunks, source, symbol)
        compile_c(devc, source, cc, options)


def link_library(lib0: PathLike | None, devc: PathLike, out: PathLike, cc: str | None = None,
                 options: Sequence[str] = (),
                 fcompile: Callable[[str, list[str], list[str]], object] | None = None,
                 executor: PathLike | None = None, vm: bool = False) -> None:
    """Link lib0.o + devc.o + the executor object into `out`: a shared library
    (.so), one relocatable object (.o) or a deterministic flat tar of the three
    (.tar). lib0 is None for a graph without kernels (every output a build-time
    constant).

    cc: the target's compiler (None: the host's); options: extra arguments for
    it; fcompile: a callable (output, objects, options) that links .so/.o
    outputs instead of cc, as TVM's export_library takes; executor: executor.o
    compiled by the target's cc (None: runtime_c.executor_object(cc), cached).
    The .so gets a build id made from lib0.o's and executor.o's bytes and the
    blob checksum stored in devc.o: the linker's own (--build-id=sha1) hashes its
    whole output, 100 MB for ResNet-50, at a third of a second, while these inputs
    decide the output and cost nothing to hash. create_shared then stamps the code
    digest of the whole .so, executor included. vm: devc.o holds a .ro (pack_ro)
    and the executor is the VM interpreter (default runtime_c.vm_object(cc)); the
    build id then hashes devc.o whole. ValueError for another suffix; LinkError if
    cc fails.
    """
    out = os.fspath(out)
    if not out.endswith(LIBRARY_SUFFIXES):
        raise ValueError(f"{out}: a model library is a {', '.join(LIBRARY_SUFFIXES)} file")
    if executor is None:
        executor = vm_object(cc) if vm else executor_object(cc)
    objects = [os.fspath(o) for o in ([devc, executor] if lib0 is None
                                      else [lib0, devc, executor])]
    if out.endswith(".tar"):
        create_tar(out, objects)
    elif fcompile is not None:
        fcompile(out, objects, list(options))
    elif out.endswith(".o"):
        link_relocatable(out, objects, cc, options)
    else:
        build_id = hashlib.sha1(b"" if lib0 is None else Path(lib0).read_bytes())
        build_id.update(Path(executor).read_bytes())
        build_id.update(hashlib.sha256(Path(devc).read_bytes()).digest() if vm
                        else devc_checksum(devc))
        create_shared(out, objects, [f"-Wl,--build-id=0x{build_id.hexdigest()}", *options],
                      cc)
