"""What a model library holds, read from the file without loading it (so a library
for another machine can be described too): `pipeline info`.

    describe_library("m.so") -> {"path", "format", "target", "blob_version",
        "blob_sha256", "build_id", "inputs", "outputs", "params", "kernels", "memory",
        "sizes"}   # sizes: a .so's flash and RAM (runtime.metadata.library_sizes)

A VM library (`executor: vm`, docs/vm.md) is described from its .ro instead
(describe_vm_library): its functions, instruction and constant counts, kernels.

The blob (pipeline/link/blob.py) is found through the ELF symbol table of the
.so or the relocatable .o, or in the devc.o member of a .tar, and verified by
its sha256 before anything in it is read (pipeline/runtime/blob.py). The build
id is the .so's GNU build-id note (pipeline/link/export.py derives it from
lib0.o, executor.o and the blob's checksum); a .o or .tar has none until linked.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import tarfile
from typing import Any

import numpy as np

from pipeline.errors import FormatError
from pipeline.link.blob import BLOB_CODE_DIGEST_SIZE, BLOB_DIGEST_SIZE, BLOB_PREFIX_SIZE
from pipeline.link.elf import MACHINES
from pipeline.link.integrity import blob_offset, elf_sections, symbol_offset
from pipeline.runtime.blob import Blob, BlobError, read_blob_header_length, unpack_blob
from pipeline.runtime.metadata import kernel_metadata, library_sizes, memory_plan
from pipeline.runtime.params import load_params
from pipeline.tools.bench import vm_memory_plan
from pipeline.vm import bytecode
from pipeline.vm.format import RO_SYMBOL, RO_VERSION, read_ro

__all__ = ["describe_library", "describe_vm_library", "format_info", "graph_tensors",
           "kernel_rows", "read_blob", "read_vm_ro"]

_NT_GNU_BUILD_ID = 3


def read_blob(path: str) -> tuple[Blob, int, str, str | None]:
    """(the verified blob, its format version, its sha256 hex, the build id hex or
    None) of the library at `path` (.so, .o or .tar). FileNotFoundError;
    BlobError/FormatError naming `path` for a file that is no pipeline library."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    if path.endswith(".tar"):
        return _blob_of_object(_tar_member(path, "devc.o"), path) + (None,)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 64:
            raise BlobError(f"{path}: not an ELF64 little-endian library")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            sections = elf_sections(data, path)
            blob, version, digest = _blob_of_object(data, path, sections)
            return blob, version, digest, _build_id(data, sections)


def _tar_member(path: str, name: str) -> bytes:
    try:
        with tarfile.open(path) as tar:
            member = tar.extractfile(name)
            return member.read() if member is not None else b""
    except KeyError:
        raise FormatError(f"{path}: no {name} in the archive; not a library exported by "
                          "pipeline") from None
    except tarfile.TarError as err:
        raise FormatError(f"{path}: not a readable tar archive ({err})") from None


def _blob_of_object(data, path: str, sections: list | None = None) -> tuple[Blob, int, str]:
    sections = elf_sections(data, path) if sections is None else sections
    start = blob_offset(data, sections)
    if start is None:
        raise BlobError(f"{path}: no pipeline blob (symbol __pipeline_dev_mblob); not a "
                        "library exported by pipeline")
    total = read_blob_header_length(bytes(data[start:start + BLOB_PREFIX_SIZE]), path)
    raw = bytes(data[start:start + total])
    blob = unpack_blob(raw, path)
    version, = struct.unpack_from("<I", raw, 8)
    end = total - BLOB_CODE_DIGEST_SIZE
    return blob, version, raw[end - BLOB_DIGEST_SIZE:end].hex()


def _build_id(data, sections: list) -> str | None:
    """The GNU build-id note's bytes as hex, or None."""
    for name, _, _, _, offset, size, _ in sections:
        if name != ".note.gnu.build-id" or size < 16:
            continue
        namesz, descsz, kind = struct.unpack_from("<III", data, offset)
        if kind == _NT_GNU_BUILD_ID:
            at = offset + 12 + (namesz + 3) // 4 * 4
            return bytes(data[at:at + descsz]).hex()
    return None


def graph_tensors(graph_json: str, param_names: set[str]
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(inputs, outputs) of a library's graph JSON as {"name", "shape", "dtype"} rows
    (an output's "name" is the node computing it: the graph JSON keeps no tensor
    names); params (named in `param_names`) are not inputs."""
    doc = json.loads(graph_json)
    nodes, row_ptr = doc["nodes"], doc["node_row_ptr"]
    shapes, dtypes = doc["attrs"]["shape"][1], doc["attrs"]["dltype"][1]

    def row(nid: int, index: int = 0) -> dict[str, Any]:
        eid = row_ptr[nid] + index
        return {"name": nodes[nid]["name"], "shape": list(shapes[eid]), "dtype": dtypes[eid]}

    inputs = [row(nid) for nid in doc["arg_nodes"] if nodes[nid]["name"] not in param_names]
    return inputs, [row(nid, index) for nid, index, *_ in doc["heads"]]


def kernel_rows(blob: Blob) -> list[dict[str, Any]]:
    """One row per kernel of the library, in link order: {"symbol", "calls" (graph
    nodes calling it), "flops", "bytes_moved" and "stack_bytes" per call,
    "constant_bytes" of all calls} (pipeline.runtime.metadata; None where the
    library records none)."""
    found = {k["symbol"]: k for k in kernel_metadata(blob.graph_json)}
    empty = {"calls": 0, "flops": None, "bytes_moved": None, "stack_bytes": None,
             "constant_bytes": None}
    return [{**empty, **found.get(symbol, {}), "symbol": symbol} for symbol in blob.kernels]


def _mlf_metadata(path: str) -> dict | None:
    """metadata.json of a Model Library Format tar (executor aot), else None."""
    if not path.endswith(".tar") or not tarfile.is_tarfile(path):
        return None
    with tarfile.open(path) as tar:
        try:
            return json.load(tar.extractfile("metadata.json"))
        except KeyError:
            return None


def describe_mlf(path: str, metadata: dict) -> dict[str, Any]:
    """What `pipeline info` shows of a Model Library Format tar: its model's target,
    inputs, outputs, memory (workspace, constants, io) and flash and RAM."""
    (name, module), = metadata["modules"].items()
    main = module["memory"]["functions"]["main"][0]
    return {"path": path, "format": "mlf", "file_bytes": os.path.getsize(path),
            "model": name, "target": module["target"][0], "executor": module["executors"][0],
            "inputs": [{"name": k, **v} for k, v in module["inputs"].items()],
            "outputs": [{"name": k, **v} for k, v in module["outputs"].items()],
            "memory": {**{k: main[k] for k in ("workspace_size_bytes", "constants_size_bytes",
                                               "io_size_bytes")},
                       "workspace_lower_bound_bytes": module.get("workspace_lower_bound_bytes")},
            "sizes": module.get("sizes"),
            "kernels": [{"symbol": f["function_name"],
                         "stack_bytes": f["workspace"][0]["workspace_size_bytes"]}
                        for f in module["memory"]["functions"]["operator_functions"]]}


def format_mlf(info: dict[str, Any]) -> str:
    """describe_mlf's dict as text."""
    m, sizes = info["memory"], info["sizes"] or {}
    lines = [f"library   {info['path']} (Model Library Format, {info['file_bytes']:,} bytes)",
             f"model     {info['model']}, executor {info['executor']}",
             f"target    {info['target']}"]
    lines += [f"input     {r['name']}  {r['shape']}  {r['dtype']}" for r in info["inputs"]]
    lines += [f"output    {r['name']}  {r['shape']}  {r['dtype']}" for r in info["outputs"]]
    bound = m.get("workspace_lower_bound_bytes")
    lines.append(f"memory    workspace {m['workspace_size_bytes']:,} bytes"
                 + (f" (lower bound {bound:,})" if bound is not None else "")
                 + f", constants {m['constants_size_bytes']:,}, io {m['io_size_bytes']:,}")
    lines += [*_size_lines(sizes), f"kernels   {len(info['kernels'])}"]
    return "\n".join(lines)


def read_vm_ro(path: str) -> tuple[bytes, str, str | None] | None:
    """(the .ro bytes, the ELF machine, the build id hex or None) of a VM library at
    `path` (.so, .o, or a .tar's devc.o), without loading it; None for a library
    without a .ro. The .ro is not verified here (read_ro does that)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    if path.endswith(".tar"):
        data = _tar_member(path, "devc.o")
        found = _ro_of_object(data, path)
        return None if found is None else (found[0], found[1], None)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 64:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found = _ro_of_object(data, path)
            if found is None:
                return None
            return found[0], found[1], _build_id(data, elf_sections(data, path))


def _ro_of_object(data, path: str) -> tuple[bytes, str] | None:
    sections = elf_sections(data, path)
    start = symbol_offset(data, sections, RO_SYMBOL)
    if start is None:
        return None
    total = int.from_bytes(data[start + 16:start + 24], "little")
    machine = int.from_bytes(data[18:20], "little")
    arch = next((a for a, m in MACHINES.items() if m == machine), f"machine {machine}")
    return bytes(data[start:start + total]), arch


def describe_vm_library(path: str, ro: bytes, arch: str, build_id: str | None
                        ) -> dict[str, Any]:
    """What `pipeline info` shows of a VM library: its machine, the .ro's version and
    checksum, inputs and outputs (main's), its symbolic dimensions with their bounds
    (the .ro's dims table), its functions (parameters, results,
    registers, instructions), constants, kernels (with the InvokePacked instructions
    naming each) and its memory (bench.vm_memory_plan)."""
    exe = read_ro(ro, path)
    main = exe.functions[0]
    calls = [ins.kernel for fn in exe.functions for ins in fn.code
             if isinstance(ins, (bytecode.InvokePacked, bytecode.InvokePackedDims))]

    def rows(types):
        return [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype,
                 **({"kind": bytecode.KINDS[t.kind]} if t.kind else {})} for t in types]

    return {
        "path": path, "format": os.path.splitext(path)[1].lstrip("."), "executor": "vm",
        "file_bytes": os.path.getsize(path), "machine": arch, "ro_version": RO_VERSION,
        "ro_sha256": ro[-32:].hex(), "ro_bytes": len(ro), "build_id": build_id,
        "inputs": rows(main.params), "outputs": rows(main.results),
        "dims": [{"name": d, "low": low, "high": high} for d, (low, high) in exe.dims.items()],
        "functions": [{"name": fn.name, "params": len(fn.params), "results": len(fn.results),
                       "registers": fn.num_regs, "instructions": len(fn.code)}
                      for fn in exe.functions],
        "constants": {"count": len(exe.constants),
                      "bytes": int(sum(a.nbytes for a in exe.constants.values()))},
        "kernels": [{"symbol": k, "calls": calls.count(i)} for i, k in enumerate(exe.kernels)],
        "memory": vm_memory_plan(exe),
    }


def format_vm_info(info: dict[str, Any]) -> str:
    """describe_vm_library's dict as text."""
    lines = [f"library   {info['path']} ({info['format']}, "
             f"{info['file_bytes'] / 2 ** 20:.2f} MiB)",
             f"executor  vm (machine {info['machine']})",
             f"format    .ro version {info['ro_version']}, {info['ro_bytes']:,} bytes, "
             f"sha256 {info['ro_sha256']}",
             f"build id  {info['build_id'] or '(none: a .o or .tar gets one when linked)'}"]
    lines += [f"input     {_tensor(r)}" for r in info["inputs"]]
    lines += [f"output {i:<2} {_tensor(r)}" for i, r in enumerate(info["outputs"])]
    if info["dims"]:  # symbolic dimensions (.ro version 2's table), with their bounds
        lines.append("dims      " + ", ".join(f"{d['name']} {d['low']}..{d['high']}"
                                              for d in info["dims"]))
    c = info["constants"]
    m = info["memory"]
    lines += [f"constants {c['count']} tensors, {c['bytes']:,} bytes",
              f"memory    {m['planned_activation_bytes']:,} bytes of pooled storage for "
              f"{m['intermediate_bytes']:,} bytes of tensors",
              f"functions {len(info['functions'])}, "
              f"{sum(f['instructions'] for f in info['functions'])} instructions"]
    width = max(len(f["name"]) for f in info["functions"])
    lines.append(f"  {'name':<{width}}  params  results  registers  instructions")
    lines += [f"  {f['name']:<{width}}  {f['params']:>6}  {f['results']:>7}  "
              f"{f['registers']:>9}  {f['instructions']:>12}" for f in info["functions"]]
    lines.append(f"kernels   {len(info['kernels'])}")
    lines += [f"  {k['symbol']}  ({k['calls']} call{'s' if k['calls'] != 1 else ''})"
              for k in info["kernels"]]
    return "\n".join(lines)


def _size_lines(sizes: dict | None) -> list[str]:
    """The flash and RAM lines of `pipeline info` (none without sizes)."""
    if not sizes:
        return []
    return [f"flash     {sizes['flash_bytes']:,} bytes ("
            + ", ".join(f"{k} {v:,}" for k, v in sizes["flash"].items()) + ")",
            f"RAM       {sizes['ram_bytes']:,} bytes ("
            + ", ".join(f"{k} {v:,}" for k, v in sizes["ram"].items()) + ")"]


def describe_library(path: str) -> dict[str, Any]:
    """Everything `pipeline info` shows about the library at `path` (module doc); a
    Model Library Format tar (executor aot) is described by describe_mlf, a VM
    library by describe_vm_library."""
    metadata = _mlf_metadata(path)
    if metadata is not None:
        return describe_mlf(path, metadata)
    vm = read_vm_ro(path)
    if vm is not None:
        return describe_vm_library(path, *vm)
    blob, version, digest, build_id = read_blob(path)
    params = load_params(blob.params)
    inputs, outputs = graph_tensors(blob.graph_json, set(params))
    return {
        "path": path, "format": os.path.splitext(path)[1].lstrip("."),
        "file_bytes": os.path.getsize(path), "target": blob.target,
        "blob_version": version, "blob_sha256": digest, "build_id": build_id,
        "inputs": inputs, "outputs": outputs,
        "params": {"count": len(params),
                   "bytes": int(sum(np.asarray(v).nbytes for v in params.values())),
                   "section_bytes": len(blob.params)},
        "kernels": kernel_rows(blob),
        "memory": memory_plan(blob.graph_json),
        "sizes": _so_sizes(path, blob.graph_json, set(params)),
    }


def _so_sizes(path: str, graph_json: str, param_names: set[str]) -> dict | None:
    """A shared library's flash and RAM (runtime.metadata.library_sizes); None for a
    .o or .tar (not linked yet) or a file that is no little-endian ELF."""
    if not path.endswith(".so"):
        return None
    try:
        return library_sizes(path, graph_json, param_names)
    except ValueError:
        return None


def _tensor(row: dict) -> str:
    kind = f"  ({row['kind']})" if "kind" in row else ""  # a VM sequence or optional
    return f"{row['name']}  {row['shape']}  {row['dtype']}{kind}"


def format_info(info: dict[str, Any]) -> str:
    """describe_library's dict as the text `pipeline info` prints."""
    if info["format"] == "mlf":
        return format_mlf(info)
    if info.get("executor") == "vm":
        return format_vm_info(info)
    mib = 2 ** 20
    lines = [f"library   {info['path']} ({info['format']}, {info['file_bytes'] / mib:.2f} MiB)",
             f"target    {info['target']}",
             f"format    blob version {info['blob_version']}, sha256 {info['blob_sha256']}",
             f"build id  {info['build_id'] or '(none: a .o or .tar gets one when linked)'}"]
    lines += [f"input     {_tensor(r)}" for r in info["inputs"]]
    lines += [f"output {i:<2} {r['shape']}  {r['dtype']}  (node {r['name']})"
              for i, r in enumerate(info["outputs"])]
    p, m = info["params"], info["memory"]
    lines += [f"params    {p['count']} tensors, {p['bytes']:,} bytes",
              f"memory    {m['planned_activation_bytes']:,} bytes planned for "
              f"{m['intermediate_bytes']:,} bytes of intermediates",
              *_size_lines(info.get("sizes")),
              f"kernels   {len(info['kernels'])}"]
    width = max((len(k["symbol"]) for k in info["kernels"]), default=6)
    lines.append(f"  {'symbol':<{width}}  calls  {'FLOPs/call':>14}  {'bytes moved/call':>16}  "
                 f"{'stack bytes':>11}  {'constant bytes':>14}")
    lines += [f"  {k['symbol']:<{width}}  {k['calls']:>5}  {_count(k['flops']):>14}  "
              f"{_count(k['bytes_moved']):>16}  {_count(k['stack_bytes']):>11}  "
              f"{_count(k['constant_bytes']):>14}"
              for k in info["kernels"]]
    return "\n".join(lines)


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"
