"""The AOT executor (TVM's microTVM AOT): the model as one C entry function that
calls the kernels directly, with one static workspace and the params as constants.

    render_aot(model, graph_json, params) -> AotModel
        .header    <model>.h: the input/output structs, sizes, names and the entry
                   points `tvmgen_<model>_run(inputs, outputs)` and `_run_arrays`
        .source    <model>_aot.c: the entry points; the workspace is a static array
                   (.bss) laid out by pipeline/plan/workspace.py
        .constants the params, each on a 16-byte boundary, one blob the assembler
                   puts in .rodata (flash on a microcontroller) with `.incbin`
        .memory    workspace / constants / io bytes (TVM's Model Library Format names)

No heap, no files, no threads, no JSON at run time: the entry function is a list of
kernel calls (`int32_t f(void **args)`, inputs then output) whose arguments are
the caller's input and output buffers, offsets in the workspace and in the
constants. A kernel returning non-zero stops the run with its code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from pipeline.ir.nibbles import PACKED, pack_nibbles
from pipeline.plan.workspace import ALIGN, entry_bytes, plan_workspace

__all__ = ["AotModel", "c_name", "render_aot"]


@dataclass(frozen=True)
class AotModel:
    name: str           # the model's C name: symbols are tvmgen_<name>_...
    header: str
    source: str
    constants: bytes
    constants_asm: str  # assembles `constants.bin` (beside it) into .rodata
    memory: dict        # workspace_size_bytes, constants_size_bytes, io_size_bytes, ...
    inputs: list[dict]  # [{"name", "field", "shape", "dtype", "bytes"}]
    outputs: list[dict]


def c_name(text: str) -> str:
    """`text` as a C identifier: every other character becomes `_`."""
    name = re.sub(r"\W", "_", text, flags=re.ASCII)
    return name if name and not name[0].isdigit() else f"_{name}"


def _fields(names: list[str]) -> list[str]:
    """Distinct C field names for `names` (a clash gets its position appended)."""
    seen: set[str] = set()
    out = []
    for i, name in enumerate(names):
        field = c_name(name)
        if field in seen:
            field = f"{field}_{i}"
        seen.add(field)
        out.append(field)
    return out


def _layout_constants(names: list[str], params: dict[str, np.ndarray]
                      ) -> tuple[bytes, dict[str, int]]:
    """The params one after another, each at an ALIGN boundary: (bytes, name -> offset)."""
    chunks, offset, at = [], {}, 0
    for name in names:
        value = np.asarray(params[name])  # int4 / uint4: two a byte, as the kernels read
        raw = (pack_nibbles(value) if value.dtype in PACKED else
               np.ascontiguousarray(value)).tobytes()
        offset[name] = at
        pad = -len(raw) % ALIGN
        chunks.append(raw + b"\0" * pad)
        at += len(raw) + pad
    return b"".join(chunks), offset


def _io(graph: dict, params: dict) -> tuple[list[dict], list[dict]]:
    """The inputs (arg nodes that are not params) and outputs (heads), described."""
    attrs, row_ptr, nodes = graph["attrs"], graph["node_row_ptr"], graph["nodes"]
    shapes, dtypes = attrs["shape"][1], attrs["dltype"][1]

    def describe(name: str, entry: int) -> dict:
        return {"name": name, "entry": entry, "shape": list(shapes[entry]),
                "dtype": dtypes[entry], "bytes": entry_bytes(shapes[entry], dtypes[entry])}

    inputs = [describe(nodes[n]["name"], row_ptr[n]) for n in graph["arg_nodes"]
              if nodes[n]["name"] not in params]
    outputs = [describe(f"output{i}", row_ptr[n] + idx)
               for i, (n, idx, *_) in enumerate(graph["heads"])]
    for group in (inputs, outputs):
        for item, field in zip(group, _fields([g["name"] for g in group]), strict=True):
            item["field"] = field
    return inputs, outputs


# C libraries for microcontrollers may lack C23's roundevenf (picolibc 1.8 does),
# which LLVM calls for llvm.roundeven where the FPU has no rounding instruction (the
# int8 kernels' requantization). A weak definition: a libm that has it wins. It rounds
# half to even by itself, whatever the FPU's rounding mode.
ROUNDEVEN_C = """
#include <math.h>
__attribute__((weak)) float roundevenf(float x) {
    float r = floorf(x), d = x - r;
    if (d > 0.5f || (d == 0.5f && fmodf(r, 2.0f) != 0.0f)) r += 1.0f;
    return r;
}
"""


def render_aot(model: str, graph_json: str, params: dict[str, np.ndarray],
               bare_metal: bool = False) -> AotModel:
    """The AOT entry point, header and constants of an optimised graph (the graph
    JSON text optimize writes, and its params by name); bare_metal: the target has
    no operating system (its C library may lack roundevenf: ROUNDEVEN_C)."""
    graph = json.loads(graph_json)
    name = c_name(model)
    nodes, row_ptr = graph["nodes"], graph["node_row_ptr"]
    param_names = [nodes[n]["name"] for n in graph["arg_nodes"] if nodes[n]["name"] in params]
    constants, const_at = _layout_constants(param_names, params)
    inputs, outputs = _io(graph, params)
    plan = plan_workspace(graph)
    where: dict[int, str] = {}  # entry -> C expression of its address
    for k, item in enumerate(inputs):
        where[item["entry"]] = f"in[{k}]"
    for pname in param_names:
        entry = row_ptr[next(n for n in graph["arg_nodes"] if nodes[n]["name"] == pname)]
        where[entry] = f"(void *)(c + {const_at[pname]})"
    copies = []  # an output that is an input, a param or another output's tensor
    for k, item in enumerate(outputs):
        if item["entry"] in where:
            copies.append(f"    memcpy(out[{k}], {where[item['entry']]}, {item['bytes']});")
        else:
            where[item["entry"]] = f"out[{k}]"
    for entry, at in plan.offset.items():
        where[entry] = f"(void *)(ws + {at})"
    memory = {"workspace_size_bytes": plan.size, "constants_size_bytes": len(constants),
              "io_size_bytes": sum(i["bytes"] for i in (*inputs, *outputs)),
              "workspace_lower_bound_bytes": plan.lower_bound}
    source = _source(name, graph, where, copies, plan.size, bool(constants), inputs, outputs)
    if bare_metal:
        source += ROUNDEVEN_C
    return AotModel(name, _header(name, inputs, outputs, memory), source, constants,
                    _constants_asm(name, len(constants)), memory, inputs, outputs)


def _calls(graph: dict, where: dict[int, str]) -> tuple[list[str], list[str]]:
    """(the kernels' declarations, the statements running the nodes in order)."""
    nodes, row_ptr = graph["nodes"], graph["node_row_ptr"]
    shapes, dtypes = graph["attrs"]["shape"][1], graph["attrs"]["dltype"][1]
    declared, body = {}, []
    for nid, node in enumerate(nodes):
        func = node.get("attrs", {}).get("func_name")
        if node["op"] == "null" or func == "__nop":
            continue
        args = [where[row_ptr[s] + i] for s, i, *_ in node["inputs"]]
        args += [where[e] for e in range(row_ptr[nid], row_ptr[nid + 1])]
        if func == "__copy":
            out = row_ptr[nid]
            body.append(f"    memmove({args[1]}, {args[0]}, "
                        f"{entry_bytes(shapes[out], dtypes[out])});  /* {node['name']} */")
            continue
        declared[func] = f"extern int32_t {func}(void **args);"
        body.append(f"    {{ /* {node['name']} */\n        void *a[] = {{{', '.join(args)}}};\n"
                    f"        if ((rc = {func}(a)) != 0) return rc;\n    }}")
    return [declared[f] for f in sorted(declared)], body


def _source(name: str, graph: dict, where: dict[int, str], copies: list[str],
            workspace: int, has_constants: bool, inputs: list[dict],
            outputs: list[dict]) -> str:
    declarations, body = _calls(graph, where)
    p = f"tvmgen_{name}"
    ins = ", ".join(f"inputs->{i['field']}" for i in inputs) or "0"
    outs = ", ".join(f"outputs->{o['field']}" for o in outputs)
    lines = [f"/* The AOT entry points of model {name}: generated by pipeline, do not edit. */",
             f'#include "{name}.h"', "#include <string.h>", "", *declarations, ""]
    if has_constants:
        lines.append(f"extern const uint8_t {p}_constants[];  /* the params, in .rodata */")
    lines += [f"static uint8_t {p}_workspace[{max(workspace, 1)}] "
              f"__attribute__((aligned({ALIGN})));", "",
              *_tables(p, inputs, outputs), "",
              f"int32_t {p}_run_arrays(void *const *in, void *const *out) {{",
              f"    uint8_t *ws = {p}_workspace;",
              f"    const uint8_t *c = {p}_constants;" if has_constants else "",
              "    int32_t rc = 0;", *body, *copies,
              "    (void)ws; (void)in; (void)out;", "    return rc;", "}", "",
              f"int32_t {p}_run(struct {p}_inputs *inputs, struct {p}_outputs *outputs) {{",
              f"    void *in[] = {{{ins}}};", f"    void *out[] = {{{outs}}};",
              f"    return {p}_run_arrays(in, out);", "}", ""]
    return "\n".join(lines)


def _tables(p: str, inputs: list[dict], outputs: list[dict]) -> list[str]:
    """The name and size tables a generic harness (the test firmware) reads."""
    lines = []
    for kind, items in (("input", inputs), ("output", outputs)):
        names = ", ".join(json.dumps(i["name"]) for i in items) or "0"
        sizes = ", ".join(str(i["bytes"]) for i in items) or "0"
        lines += [f"const char *const {p}_{kind}_names[] = {{{names}}};",
                  f"const uint32_t {p}_{kind}_bytes[] = {{{sizes}}};"]
    return lines


def _header(name: str, inputs: list[dict], outputs: list[dict], memory: dict) -> str:
    p, up = f"tvmgen_{name}", f"TVMGEN_{name.upper()}"
    lines = [f"/* Model {name}, AOT executor: generated by pipeline, do not edit.",
             " * Fill the inputs, call the run function, read the outputs; it returns 0,",
             " * or the non-zero code of the kernel that failed. Buffers are dense,",
             " * row-major; no heap, no threads, not re-entrant (one static workspace). */",
             f"#ifndef {up}_H_", f"#define {up}_H_", "", "#include <stdint.h>", "",
             "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
             f"#define {up}_WORKSPACE_SIZE {memory['workspace_size_bytes']}",
             f"#define {up}_CONSTANTS_SIZE {memory['constants_size_bytes']}",
             f"#define {up}_IO_SIZE {memory['io_size_bytes']}",
             f"#define {up}_NUM_INPUTS {len(inputs)}",
             f"#define {up}_NUM_OUTPUTS {len(outputs)}"]
    for kind, items in (("INPUT", inputs), ("OUTPUT", outputs)):
        for item in items:
            lines.append(f"#define {up}_{kind}_{item['field'].upper()}_SIZE {item['bytes']}"
                         f"  /* {item['dtype']}{item['shape']} {json.dumps(item['name'])} */")
    for kind, items in (("inputs", inputs), ("outputs", outputs)):
        fields = [f"    void *{i['field']};  /* {i['dtype']}{i['shape']} */" for i in items]
        lines += ["", f"struct {p}_{kind} {{", *(fields or ["    void *unused;"]), "};"]
        lines += [f"extern const char *const {p}_{kind[:-1]}_names[];",
                  f"extern const uint32_t {p}_{kind[:-1]}_bytes[];"]
    lines += ["", f"int32_t {p}_run(struct {p}_inputs *inputs, struct {p}_outputs *outputs);",
              "/* The same, the buffers in arrays (inputs, outputs in the tables' order). */",
              f"int32_t {p}_run_arrays(void *const *inputs, void *const *outputs);", "",
              "#ifdef __cplusplus", "}", "#endif", "", f"#endif  /* {up}_H_ */", ""]
    return "\n".join(lines)


def _constants_asm(name: str, size: int) -> str:
    """GNU assembler source putting constants.bin in .rodata as tvmgen_<name>_constants
    (ELF targets; `%` is the section-type prefix every ELF assembler reads)."""
    if not size:
        return ""
    sym = f"tvmgen_{name}_constants"
    return (f'\t.section .rodata.{sym},"a",%progbits\n\t.balign {ALIGN}\n\t.globl {sym}\n'
            f"\t.type {sym}, %object\n{sym}:\n\t.incbin \"constants.bin\"\n"
            f"\t.size {sym}, {size}\n")
