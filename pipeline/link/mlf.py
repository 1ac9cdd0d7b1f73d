"""An AOT model's deliverables: the static library lib<m>.a with its header, and
the Model Library Format tar (TVM's MLF) holding everything a firmware project
needs.

    build_aot(model, graph_json, params, lib0, target, out, cc=None, params_file=None)

writes, for out = {"header", "archive", "mlf"}:
    <m>.h       the header (pipeline/link/aot.py)
    lib<m>.a    lib0.o (the kernels), <m>_aot.o (the entry points, compiled by the
                target's cc), <m>_constants.o (the params in .rodata)
    <m>.tar     the Model Library Format:
                  metadata.json                   sizes, target, executor (below)
                  codegen/host/include/<m>.h
                  codegen/host/src/<m>_aot.c      the generated entry points
                  codegen/host/src/<m>_constants.s, constants.bin
                  codegen/host/src/<kernel>.c     a c target's kernels, as C
                  codegen/host/lib/lib0.o, <m>_aot.o, <m>_constants.o, lib<m>.a
                  parameters/<m>.params           the params (pipeline's param dict)
                  src/<m>.graph.json              the optimised graph
metadata.json follows TVM's MLF (version 7): per module, the executors, the
target, and memory.functions.main[0] with workspace_size_bytes,
constants_size_bytes and io_size_bytes; operator_functions give each kernel's
stack bytes. Every file is written deterministically (tar members sorted, mtime 0).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from pipeline.errors import PipelineError
from pipeline.files import temp_output
from pipeline.ir.target import parse_target
from pipeline.link.aot import AotModel, render_aot
from pipeline.link.cc import compile_c, create_archive, machine_flags
from pipeline.link.elf import section_sizes

__all__ = ["MLF_VERSION", "BudgetError", "build_aot", "check_budgets", "mlf_metadata",
           "model_sizes", "size_line"]

PathLike = str | os.PathLike
MLF_VERSION = 7


class BudgetError(PipelineError):
    """A model needs more flash or RAM than its target's board declares."""


def mlf_metadata(aot: AotModel, target: str, kernels: list[dict]) -> dict:
    """metadata.json of the MLF (module doc); kernels: kernels.json's entries
    ({"symbol", "stack_bytes", ...})."""
    def tensors(items: list[dict]) -> dict:
        return {i["name"]: {"size": i["bytes"], "dtype": i["dtype"], "shape": i["shape"],
                            "field": i["field"]} for i in items}

    memory = aot.memory
    main = {"device": 1, **{k: memory[k] for k in ("workspace_size_bytes",
                                                   "constants_size_bytes", "io_size_bytes")}}
    operators = [{"function_name": k["symbol"],
                  "workspace": [{"device": 1, "workspace_size_bytes": k.get("stack_bytes", 0)}]}
                 for k in kernels]
    module = {"model_name": aot.name, "executors": ["aot"], "style": "full-model",
              "target": [target], "memory": {"functions": {"main": [main],
                                                           "operator_functions": operators}},
              "workspace_lower_bound_bytes": memory["workspace_lower_bound_bytes"],
              "inputs": tensors(aot.inputs), "outputs": tensors(aot.outputs)}
    return {"version": MLF_VERSION, "modules": {aot.name: module}}


def _compile(aot: AotModel, work: str, target: str, cc: str | None) -> list[str]:
    """The entry points' and the constants' objects, compiled by cc into `work`."""
    resolved = parse_target(target)
    flags = machine_flags(resolved.triple, resolved.cpu, resolved.features)
    base = os.path.join(work, aot.name)
    Path(work, f"{aot.name}.h").write_text(aot.header)
    Path(f"{base}_aot.c").write_text(aot.source)
    # -O2: the entry function is a list of calls; -ffunction-sections lets a firmware
    # link drop what it does not call.
    compile_c(f"{base}_aot.o", f"{base}_aot.c", cc,
              [*flags, "-O2", "-ffunction-sections", "-fdata-sections", f"-I{work}"])
    objects = [f"{base}_aot.o"]
    if aot.constants:
        Path(work, "constants.bin").write_bytes(aot.constants)
        Path(f"{base}_constants.s").write_text(aot.constants_asm)
        compile_c(f"{base}_constants.o", f"{base}_constants.s", cc, [*flags, f"-Wa,-I{work}"])
        objects.append(f"{base}_constants.o")
    return objects


def build_aot(model: str, graph_json: str, params: dict[str, np.ndarray], lib0: PathLike | None,
              target: str, out: dict[str, PathLike], cc: str | None = None,
              params_file: PathLike | None = None, kernels: list[dict] = (),
              c_sources: dict[str, str] | None = None) -> dict:
    """Write the header, lib<m>.a and the MLF tar of `model` (module doc) to
    out["header"], out["archive"], out["mlf"]; returns metadata.json's content.

    graph_json: the optimised graph JSON text; params: its params by name; lib0: the
    kernels' relocatable object (None: a graph without kernels); target: the target
    string; cc: the target's compiler (None: the host's); params_file: the .params
    file put in the MLF; kernels: kernels.json's entries (stack bytes per kernel);
    c_sources: a c target's kernels as C, file name -> text (codegen/host/src/).
    LinkError if the compiler or the archiver fails."""
    aot = render_aot(model, graph_json, params, parse_target(target).bare_metal)
    metadata = mlf_metadata(aot, target, list(kernels))
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out["archive"]))
                                     ) as work:
        objects = _compile(aot, work, target, cc)
        members = ([os.fspath(lib0)] if lib0 is not None else []) + objects
        module = metadata["modules"][aot.name]
        module["sizes"] = model_sizes(members, module)
        create_archive(out["archive"], members, cc)
        with temp_output(out["header"]) as tmp:
            Path(tmp).write_text(aot.header)
        files = {"metadata.json": json.dumps(metadata, indent=1).encode(),
                 f"codegen/host/include/{aot.name}.h": aot.header.encode(),
                 f"codegen/host/src/{aot.name}_aot.c": aot.source.encode(),
                 f"src/{aot.name}.graph.json": graph_json.encode(),
                 f"codegen/host/lib/lib{aot.name}.a": Path(out["archive"]).read_bytes()}
        for obj in members:
            files[f"codegen/host/lib/{os.path.basename(obj)}"] = Path(obj).read_bytes()
        if aot.constants:
            files[f"codegen/host/src/{aot.name}_constants.s"] = aot.constants_asm.encode()
            files["codegen/host/src/constants.bin"] = aot.constants
        if params_file is not None:
            files[f"parameters/{aot.name}.params"] = Path(params_file).read_bytes()
        for name, text in (c_sources or {}).items():
            files[f"codegen/host/src/{name}"] = text.encode()
        write_tar(out["mlf"], files)
    return metadata


def model_sizes(objects: list[str], module: dict) -> dict:
    """Flash and RAM of the model's objects and its run, in bytes: flash = code +
    read-only data (the constants) + initialised data; RAM = writable data (the
    workspace among it) + the caller's inputs and outputs + the stack the largest
    kernel uses (its estimate, kernels.json's stack_bytes)."""
    parts = {"kernels": {"text": 0, "rodata": 0, "data": 0, "bss": 0}}
    for obj in objects:
        name = os.path.basename(obj)
        sizes = section_sizes(Path(obj).read_bytes())
        key = "kernels" if name == "lib0.o" else "constants" if "_constants" in name \
            else "entry"
        parts.setdefault(key, {"text": 0, "rodata": 0, "data": 0, "bss": 0})
        for k, v in sizes.items():
            parts[key][k] += v
    functions = module["memory"]["functions"]
    stacks = {f["function_name"]: f["workspace"][0]["workspace_size_bytes"]
              for f in functions["operator_functions"]}
    deepest = max(stacks, key=stacks.get, default=None)
    flash = {k: p["text"] + p["rodata"] + p["data"] for k, p in parts.items()}
    ram = {"workspace": functions["main"][0]["workspace_size_bytes"],
           "io": functions["main"][0]["io_size_bytes"],
           "stack": stacks.get(deepest, 0),
           "other": sum(p["data"] + p["bss"] for p in parts.values())
           - functions["main"][0]["workspace_size_bytes"]}
    return {"flash_bytes": sum(flash.values()), "ram_bytes": sum(ram.values()),
            "flash": flash, "ram": ram, "deepest_kernel": deepest}


def _kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB"


def size_line(metadata: dict) -> str:
    """One line: the model's flash and RAM and what they are made of."""
    (name, module), = metadata["modules"].items()
    sizes = module["sizes"]
    flash = ", ".join(f"{k} {_kib(v)}" for k, v in sizes["flash"].items())
    ram = ", ".join(f"{k} {_kib(v)}" for k, v in sizes["ram"].items())
    return (f"{name}: flash {_kib(sizes['flash_bytes'])} ({flash}); "
            f"RAM {_kib(sizes['ram_bytes'])} ({ram})")


def check_budgets(metadata: dict, budgets: dict) -> None:
    """BudgetError, one line naming the biggest consumers, when the model needs more
    flash or RAM than budgets {"flash_kib", "ram_kib"} (either may be absent)."""
    (name, module), = metadata["modules"].items()
    sizes = module["sizes"]
    for memory in ("flash", "ram"):
        budget = budgets.get(f"{memory}_kib")
        need = sizes[f"{memory}_bytes"]
        if budget is None or need <= budget * 1024:
            continue
        parts = sorted(sizes[memory].items(), key=lambda kv: -kv[1])[:3]
        named = ", ".join(f"{k} {_kib(v)}" + (f" ({sizes['deepest_kernel']})"
                                              if k == "stack" else "") for k, v in parts)
        raise BudgetError(f"model {name} needs {_kib(need)} of {memory.upper()}, the "
                          f"target's {memory}_kib allows {budget:g} KiB; biggest: {named}")


def write_tar(output: PathLike, files: dict[str, bytes]) -> None:
    """A deterministic tar of {member path: bytes}: members sorted, mtime 0, owner 0,
    mode 0644, plain ustar."""
    with temp_output(output) as tmp, tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(files[name]), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[name]))
