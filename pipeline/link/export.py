"""From compiled kernels to a model library: the one export path.

GraphExecutorFactory.export_library (pipeline/driver/factory.py) and the doit
tasks lib0, devc and export (pipeline/tasks/stages.py) both run these steps,
so the Python API and `doit build` give the same bytes for the same model:

  1. kernel objects -> lib0.o   cc.link_relocatable (ld -r, objects in symbol order)
  2. graph JSON + params + kernel symbols + target -> devc.o   pack_devc
  3. lib0.o + devc.o + executor.o -> .so (deterministic build id) or .tar   link_library
     (executor.o: the C graph executor, pipeline/runtime/c/, compiled once per target
     by pipeline/link/runtime_c.py)

Every output is written atomically and left untouched when its bytes did not
change (pipeline/link/files.py), which is what keeps doit's later tasks up to date.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pipeline.link.blob import blob_chunks, devc_checksum, write_devc
from pipeline.link.cc import create_shared, create_tar
from pipeline.link.runtime_c import executor_object

__all__ = ["link_library", "pack_devc"]

PathLike = str | os.PathLike


def pack_devc(graph_json: str, params, kernels: list[str], target: str, triple: str,
              devc: PathLike) -> None:
    """Write devc.o, the object holding the packed blob (pipeline/link/blob.py).

    graph_json: the executor's graph JSON text; params: the param-dict bytes as
    one bytes-like object (a memory-mapped .params file) or a list of bytes-like
    chunks (runtime.params.param_chunks), streamed to the file, never joined;
    kernels: the kernel symbols in link order; target: the target string stored
    in the blob; triple: its LLVM triple (Target.triple), which picks the ELF
    machine. The blob ends with its sha256, which link_library reads back.
    """
    write_devc(blob_chunks(graph_json, params, kernels, target), triple, devc)


def link_library(lib0: PathLike | None, devc: PathLike, out: PathLike,
                 executor: PathLike | None = None) -> None:
    """Link lib0.o + devc.o + the executor object into the shared library `out`
    (.so), or pack them into a deterministic flat tar (.tar). lib0 is None for a
    graph without kernels (every output a build-time constant); executor is
    executor.o (None: runtime_c.executor_object() for the host compiler).

    The .so gets a build id made from lib0.o's and executor.o's bytes and the blob
    checksum stored in devc.o: the linker's own (--build-id=sha1) hashes its whole
    output, 100 MB for ResNet-50, at a third of a second, while these inputs decide
    the output and cost nothing to hash. ValueError for another suffix; LinkError
    if cc fails.
    """
    out = os.fspath(out)
    if not out.endswith((".so", ".tar")):
        raise ValueError(f"{out}: a model library is a .so or .tar file")
    executor = executor_object() if executor is None else executor
    objects = [devc, executor] if lib0 is None else [lib0, devc, executor]
    if out.endswith(".tar"):
        create_tar(out, objects)
        return
    build_id = hashlib.sha1(b"" if lib0 is None else Path(lib0).read_bytes())
    build_id.update(Path(executor).read_bytes())
    build_id.update(devc_checksum(devc))
    create_shared(out, objects, [f"-Wl,--build-id=0x{build_id.hexdigest()}"])
