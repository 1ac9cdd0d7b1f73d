"""The build stages as plain functions on files, one per doit task.

Each reads its input files, calls into the compiler packages and writes its
outputs atomically, so an interrupted or failed stage never leaves a file a
later build would trust. They take and return plain values (paths, dicts),
which keeps them picklable for `doit -n`.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.codegen.c_source import c_source
from pipeline.driver.build import lower_graph, lower_program, refuse_vm_only_nodes
from pipeline.driver.factory import LoweredGraph, unique_specs
from pipeline.errors import GraphError
from pipeline.files import atomic_write
from pipeline.frontend import from_onnx
from pipeline.ir.graph import Graph
from pipeline.ir.target import parse_target
from pipeline.link import export, runtime_c
from pipeline.link.cc import link_relocatable
from pipeline.link.firmware import link_aot_program
from pipeline.link.mlf import build_aot, check_budgets
from pipeline.link.mlf import size_line as aot_size_line
from pipeline.lower.kernel import KernelSpec
from pipeline.runtime.metadata import kernel_metadata, library_sizes, size_line
from pipeline.runtime.params import load_params, param_chunks
from pipeline.tasks.cache import entry_ir, object_for_link, read_ir
from pipeline.tasks.paths import SPECS, ir_path, listed_kernels, spec_path
from pipeline.tasks.tiered import materialize
from pipeline.transform import PassContext, PassTimingInstrument
from pipeline.vm.compile import PROGRAM_KEY, compile_plan, program_from_json, program_json
from pipeline.vm.format import write_ro
from pipeline.vm.program import has_control_flow


def generate_model(name: str, path: str, args: dict | None = None) -> None:
    """models/ generator `name`, called with keyword arguments `args` -> ONNX file."""
    from models import generate

    generate(name, path, args)


def reweight_model(src: str, dst: str, seed: int) -> None:
    """ONNX file `src` -> `dst` with seeded random weights (models/reweight.py)."""
    from models.reweight import random_weights

    random_weights(src, dst, seed)


def import_model(onnx_path: str, shapes: dict, graph_path: str, weights_path: str,
                 control_flow: bool = False, dims: dict | None = None) -> None:
    """ONNX file -> graph IR JSON + weights (.params); control_flow: If, Loop and Scan
    become nodes holding their subgraphs (a model with a VM entry, docs/vm.md); with
    `dims` (the model's bounds, executor vm) its symbolic dimensions stay symbolic."""
    graph, params = from_onnx(onnx_path, {k: tuple(v) for k, v in shapes.items()},
                              control_flow=control_flow, symbolic=bool(dims))
    atomic_write(graph_path, graph.to_json().encode())
    atomic_write(weights_path, param_chunks(params))


def optimize_model(graph_path: str, weights_path: str, target: dict, spec_dir: str,
                   graph_json_path: str, params_path: str, kernels_path: str,
                   cache: str | None = None) -> dict:
    """Graph IR -> optimised graph JSON, params, and per kernel its spec and LLVM IR
    (spec_dir/<hash>.json, .ll: content-addressed, written when absent).

    target: TargetEntry.to_dict() (target string, opt_level, passes, config), with
    "executor": "vm" for an entry the VM runs.
    Each distinct kernel is rendered once, here: its stack scratch is metadata, and
    the kernel task compiles the .ll (pipeline.tasks.cache.compile_entry). IR
    rendered before is read instead: the .ll in spec_dir, or a valid entry's of
    the kernel cache `cache`.
    A graph with If, Loop or Scan is lowered, for a VM entry, as a VM program
    (pipeline.driver.build.lower_program): the graph JSON file holds its functions
    (pipeline.vm.compile.program_json), the params file its constants; for another
    entry it is an UnsupportedOperatorError naming the nodes. target["dims"], if
    present: the bounds of a symbolic model's dimensions (its `dims:`).
    kernels.json lists, per kernel, its hash and symbol (the manifest the per-kernel
    tasks are created from) and its metadata (pipeline.runtime.metadata.kernel_metadata:
    calls, flops, bytes_moved, stack_bytes, constant_bytes). Returns {"passes":
    [{"pass", "seconds"}]}, the time of each pass (the build report keeps it).
    """
    graph = Graph.from_json(Path(graph_path).read_text())
    params = load_params(Path(weights_path).read_bytes())
    timing = PassTimingInstrument()
    ctx = PassContext(target["opt_level"], target["required_pass"], target["disabled_pass"],
                      target["config"], instruments=[timing])
    resolved = parse_target(target["target"], target.get("cc"))  # a c target: its cc
    dims = {k: tuple(v) for k, v in (target.get("dims") or {}).items()}
    with ctx:
        if has_control_flow(graph):
            if target.get("executor") != "vm":
                refuse_vm_only_nodes(graph)
            if dims:
                raise GraphError("symbolic dimensions together with If/Loop/Scan are not "
                                 "supported yet, nor with data-dependent shapes")
            program = lower_program(graph, params, resolved, target["opt_level"],
                                    lambda s: _rendered(s, spec_dir, cache))
            text, out_params = program_json(program.program), program.program.constants
            parts, specs, ir = program.parts, program.specs, program.ir
        else:
            lowered = lower_graph(graph, params, resolved, target["opt_level"],
                                  lambda s: _rendered(s, spec_dir, cache), dims)
            text, out_params, parts = lowered.graph_json, lowered.params, (lowered,)
            specs, ir = unique_specs(lowered.specs.values()), lowered.ir
    Path(spec_dir).mkdir(parents=True, exist_ok=True)
    for spec in specs:
        spec_file = spec_path(spec_dir, spec.hash)
        # Content-addressed: an existing file is this spec, or this spec's IR.
        if not os.path.exists(spec_file):
            atomic_write(spec_file, spec.to_json().encode())
        if not os.path.exists(ir_path(spec_file)):
            atomic_write(ir_path(spec_file), ir[spec.hash].encode())
    atomic_write(kernels_path, json.dumps(_manifest(target["target"], specs, parts),
                                          indent=1).encode())
    atomic_write(graph_json_path, text.encode())
    atomic_write(params_path, param_chunks(out_params))
    return {"passes": timing.timings}


def _manifest(target: str, specs: list[KernelSpec], parts: Sequence[LoweredGraph]) -> dict:
    """kernels.json of the kernels `specs` of the lowered graphs `parts` (one, or a
    VM program's): each kernel's metadata summed over the parts, their memory too."""
    metadata: dict[str, dict] = {}
    for part in parts:
        for k in kernel_metadata(part.graph_json):
            have = metadata.setdefault(k["symbol"], {**k, "calls": 0, "constant_bytes": (
                None if k["constant_bytes"] is None else 0)})
            have["calls"] += k["calls"]
            if have["constant_bytes"] is not None:
                have["constant_bytes"] += k["constant_bytes"]
    return {
        "target": target,
        "kernels": [{"hash": s.hash, **metadata[s.symbol]} for s in specs],
        "memory": {key: sum(getattr(p.memory, key) for p in parts)
                   for key in ("planned_bytes", "intermediate_bytes")},
    }


def _rendered(spec: KernelSpec, spec_dir: str, cache: str | None) -> str | None:
    """The kernel's IR as rendered before: beside its spec, else in a valid entry of
    the kernel cache (a warm rebuild renders nothing); None if neither has it."""
    text = read_ir(ir_path(spec_path(spec_dir, spec.hash)), spec.symbol)
    if text is None and cache is not None:
        text = entry_ir(cache, spec.hash, spec.symbol)
    return text


def link_lib0(kernels_path: str, cache: str, lib0_path: str, cc: str | None = None,
              specs: str = SPECS) -> dict:
    """All of a model's kernel objects -> one relocatable lib0.o (`cc -r`, cc the
    target's compiler, None for the host's), in the manifest's order (symbol
    order, as export_library links them).

    Objects come from the kernel cache, checked against their checksums; a
    corrupted or missing entry is recompiled from its spec in `specs`, never linked.
    Returns {"recompiled": [hash, ...]}, which the build report counts as compiled.
    """
    kernels = listed_kernels(kernels_path)
    found = [object_for_link(cache, k["hash"], spec_path(specs, k["hash"])) for k in kernels]
    link_relocatable(lib0_path, [obj for obj, _ in found], cc)
    return {"recompiled": [k["hash"] for k, (_, compiled) in zip(kernels, found, strict=True)
                           if compiled]}


def pack_devc(graph_json_path: str, params_path: str, kernels_path: str,
              devc_path: str, pack: str | None = None, cc: str | None = None) -> None:
    """Graph JSON + params + kernel list -> devc.o holding the packed blob
    (pack "elf" or "c", None to choose by target; cc for the "c" pack)."""
    manifest = json.loads(Path(kernels_path).read_text())
    target = manifest["target"]
    # Mapped, not read: the params go from the page cache to devc.o in one copy.
    with open(params_path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            export.pack_devc(Path(graph_json_path).read_text(), m,
                             [k["symbol"] for k in manifest["kernels"]], target, devc_path,
                             pack, cc)
        finally:
            # After a failed write (a full disk) the error's traceback still holds
            # views of the mapping: closing would raise BufferError over the real
            # error, so the mapping is left to go with the traceback.
            with contextlib.suppress(BufferError):
                m.close()


def pack_vm(graph_json_path: str, params_path: str, kernels_path: str, ro_path: str,
            devc_path: str, pack: str | None = None, cc: str | None = None) -> None:
    """A VM entry's devc stage: graph JSON + params + kernel list -> the VM executable
    <m>.ro (pipeline/vm/) and devc.o holding it (pack, cc: as pack_devc's)."""
    manifest = json.loads(Path(kernels_path).read_text())
    text, params = Path(graph_json_path).read_text(), load_params(Path(params_path).read_bytes())
    # A graph with control flow: optimize wrote the VM program (optimize_model).
    exe = (program_from_json(text, params) if PROGRAM_KEY in json.loads(text)
           else compile_plan(text, params, [k["symbol"] for k in manifest["kernels"]]))
    ro = write_ro(exe)
    atomic_write(ro_path, ro)
    export.pack_ro(ro, manifest["target"], devc_path, pack, cc)


def build_runtime(executor_path: str, run_path: str, cc: str | None = None,
                  vm_path: str | None = None) -> None:
    """The target's C runtime, compiled by cc (the target's compiler; None for the
    host's): executor.o (linked into every library), the pipeline-run program and,
    given vm_path, vm.o (the VM interpreter of `executor: vm` libraries)."""
    # Two compiler processes at once: this task is alone on a serial build's path.
    with ThreadPoolExecutor(2) as pool:
        done = [pool.submit(runtime_c.compile_executor, executor_path, cc),
                pool.submit(runtime_c.build_pipeline_run, run_path, cc)]
        if vm_path is not None:
            done.append(pool.submit(runtime_c.compile_vm, vm_path, cc))
    for future in done:
        future.result()  # the first error (LinkError with the command), if any


def export_library(lib0_path: str, devc_path: str, executor_path: str, out_path: str,
                   cc: str | None = None, vm: bool = False, graph_json_path: str | None = None,
                   params_path: str | None = None, sizes_path: str | None = None) -> dict:
    """lib0.o + devc.o + executor.o -> the deliverable shared library (or .tar),
    linked by cc (the target's compiler; None for the host's); vm: devc.o holds a
    .ro and executor_path is vm.o. Given the graph JSON and params a graph executor's
    .so was built from, returns {"note": its flash and RAM}
    (runtime.metadata.library_sizes), what the build prints, and writes them to
    sizes_path (if given) as JSON; else {} and sizes.json holds {} (a VM library's
    memory is its program's, not a graph's plan; a file not ELF is not measured)."""
    export.link_library(lib0_path, devc_path, out_path, cc, executor=executor_path, vm=vm)
    sizes = None
    if not (vm or graph_json_path is None or params_path is None
            or not out_path.endswith(".so")):
        names = set(load_params(Path(params_path).read_bytes()))
        try:
            sizes = library_sizes(out_path, Path(graph_json_path).read_text(), names)
        except ValueError:  # not little-endian ELF: nothing measured
            pass
    if sizes_path is not None:
        atomic_write(sizes_path, json.dumps(sizes or {}, indent=1).encode())
    return {"note": size_line(Path(out_path).stem, sizes)} if sizes else {}


def build_aot_library(model: str, graph_json_path: str, params_path: str, kernels_path: str,
                      lib0_path: str, out: dict[str, str], cc: str | None = None) -> None:
    """Executor aot: graph JSON + params + lib0.o -> lib<m>.a, <m>.h, the Model Library
    Format tar and its metadata.json (pipeline.link.mlf), and the program running
    the model on files (the firmware of a bare-metal target; pipeline.link.firmware),
    and sizes.json (metadata.json's sizes: flash and RAM measured from the objects).
    out: {"archive", "header", "mlf", "metadata", "program", "sizes"} -> path."""
    manifest = json.loads(Path(kernels_path).read_text())
    target = manifest["target"]
    metadata = build_aot(model, Path(graph_json_path).read_text(),
                         load_params(Path(params_path).read_bytes()), lib0_path, target, out,
                         cc, params_path, manifest["kernels"],
                         _kernel_sources(manifest) if parse_target(target).kind == "c" else None)
    atomic_write(out["metadata"], json.dumps(metadata, indent=1).encode())
    (module,) = metadata["modules"].values()
    atomic_write(out["sizes"], json.dumps(module["sizes"], indent=1).encode())
    link_aot_program(out["program"], out["archive"], out["header"], metadata,
                     parse_target(target), cc)


def _kernel_sources(manifest: dict, specs: str = SPECS) -> dict[str, str]:
    """A c target's kernels as C (<symbol>.c -> text), translated again from the IR
    optimize wrote beside their specs (the translation is deterministic; a cache hit
    may have left the IR in the cache: materialize brings it)."""
    sources = {}
    for k in manifest["kernels"]:
        ir = ir_path(spec_path(specs, k["hash"]))
        materialize(ir)
        sources[f"{k['symbol']}.c"] = c_source(Path(ir).read_text())
    return sources


def check_sizes(metadata_path: str, budgets: dict) -> dict:
    """An AOT model's flash and RAM (metadata.json's sizes) against the target's
    budgets {"ram_kib", "flash_kib"}: BudgetError past one, naming the biggest
    consumers. Returns {"note": the sizes line the build prints}."""
    metadata = json.loads(Path(metadata_path).read_text())
    check_budgets(metadata, budgets)
    return {"note": aot_size_line(metadata)}
