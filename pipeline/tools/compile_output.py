"""What `pipeline compile` (pipeline/tools/cli.py) writes once a model is lowered:
its kernels' objects, taken from the kernel cache doit uses, and the AOT executor's
deliverables."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from pipeline.codegen.c_source import c_source
from pipeline.driver.factory import LoweredGraph, unique_specs
from pipeline.files import atomic_write
from pipeline.ir.target import parse_target
from pipeline.link.cc import link_relocatable
from pipeline.link.mlf import build_aot
from pipeline.lower.kernel import KernelSpec
from pipeline.runtime.metadata import kernel_metadata
from pipeline.runtime.params import param_chunks
from pipeline.tasks.cache import entry_path, is_valid, object_for_link


def cached_objects(root: str, specs: Iterable[KernelSpec],
                   ir: dict[str, str]) -> tuple[dict[str, bytes], int]:
    """(symbol -> object bytes, how many were compiled) of the kernels `specs` (their
    LLVM IR by hash in `ir`), from the kernel cache `root`: a kernel missing or
    damaged there is compiled into it, as the doit build's kernel task does."""
    os.makedirs(root, exist_ok=True)
    objects, compiled = {}, 0
    for spec in specs:
        spec_path = entry_path(root, spec.hash, ".json")
        if not os.path.exists(spec_path):  # content-addressed: an existing one is this spec
            atomic_write(spec_path, spec.to_json().encode())
        if not is_valid(root, spec.hash):  # compile_entry compiles the IR beside the spec
            atomic_write(entry_path(root, spec.hash, ".ll"), ir[spec.hash].encode())
        obj, fresh = object_for_link(root, spec.hash)
        objects[spec.symbol] = Path(obj).read_bytes()
        compiled += fresh
    return objects, compiled


def export_aot(lowered: LoweredGraph, objects: dict[str, bytes], target: str, output: str,
               cc: str | None) -> None:
    """The AOT executor's deliverables of `lowered` (kernel objects by symbol): the MLF
    tar `output`, lib<name>.a and <name>.h beside it."""
    folder = os.path.dirname(os.path.abspath(output))
    name = os.path.splitext(os.path.basename(output))[0]
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        paths = []
        for spec in unique_specs(lowered.specs.values()):
            paths.append(os.path.join(tmp, f"{spec.hash}.o"))
            Path(paths[-1]).write_bytes(objects[spec.symbol])
        lib0 = os.path.join(tmp, "lib0.o") if paths else None
        if lib0:
            link_relocatable(lib0, paths, cc)
        params_file = os.path.join(tmp, f"{name}.params")
        with open(params_file, "wb") as f:
            f.writelines(param_chunks(lowered.params))
        specs = unique_specs(lowered.specs.values())
        sources = {f"{s.symbol}.c": c_source(lowered.ir[s.hash]) for s in specs} \
            if parse_target(target).kind == "c" else None  # a c target's kernels as C
        build_aot(name, lowered.graph_json, lowered.params, lib0, target,
                  {"mlf": output, "archive": os.path.join(folder, f"lib{name}.a"),
                   "header": os.path.join(folder, f"{name}.h")}, cc, params_file,
                  kernel_metadata(lowered.graph_json), sources)
