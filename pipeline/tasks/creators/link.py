"""The link family: an entry's kernel objects into lib0.o (lib0), its graph and
params into devc.o (devc; a VM entry's devc.o holds its .ro), each target's C
runtime (runtime), the shared library (export; a VM entry links vm.o); for an
entry of executor aot instead of devc and export, the static library, header and
Model Library Format (aot) and its sizes against the board's budgets (budget); and
`build`, every selected entry's library."""

from __future__ import annotations

import os

from pipeline.link.firmware import AOT_MAIN_C
from pipeline.link.runtime_c import C_SOURCES, VM_SOURCES
from pipeline.tasks.config import executor_of
from pipeline.tasks.explain import options_changed
from pipeline.tasks.paths import SPECS, artifacts, runtime_artifacts
from pipeline.tasks.run import run_stage
from pipeline.tasks.selection import Selection, code_of


def task_lib0(sel: Selection):
    """Combine an entry's kernel objects into lib0.o."""
    # A corrupted cache entry is recompiled while linking (cache.compile_entry),
    # but what that compiles is named by the kernel's hash in kernels.json; an
    # object a cache hit left in the cache comes down verified by its digest.
    lib0_src = code_of("tasks.stages:link_lib0", stop=("tasks.cache:compile_entry",
                                                       "tasks.tiered:materialize"))
    for m, t in sel.entries:
        a, toolchain = artifacts(m, t), sel.toolchain[t.name]
        # Objects are content-addressed by the hashes kernels.json lists, so
        # the manifest decides lib0.o; "kernel" orders us after compilation.
        yield sel.cached_stage(
            f"{m.name}@{t.name}", "tasks.stages:link_lib0",
            [a["kernels"], sel.settings.root, a["lib0"], t.cc, SPECS],
            [a["kernels"], *lib0_src], [a["lib0"]],
            [options_changed(toolchain, "toolchain"), sel.fetched],
            extra=toolchain, task_dep=["kernel"])


def task_devc(sel: Selection):
    """Pack graph JSON, params and the kernel list into devc.o (a VM entry: into the
    executable <m>.ro, and devc.o holding it)."""
    for m, t in _library_entries(sel):
        a, packing = artifacts(m, t), sel.packing[t.name]
        if executor_of(m, t) == "vm":
            yield sel.cached_stage(
                f"{m.name}@{t.name}", "tasks.stages:pack_vm",
                [a["graph_json"], a["params"], a["kernels"], a["ro"], a["devc"],
                 packing["pack"], t.cc],
                [a["graph_json"], a["params"], a["kernels"], *code_of("tasks.stages:pack_vm")],
                [a["ro"], a["devc"]], [options_changed(packing, "packing"), sel.fetched],
                extra=packing)
            continue
        yield sel.cached_stage(
            f"{m.name}@{t.name}", "tasks.stages:pack_devc",
            [a["graph_json"], a["params"], a["kernels"], a["devc"], packing["pack"], t.cc],
            [a["graph_json"], a["params"], a["kernels"], *code_of("tasks.stages:pack_devc")],
            [a["devc"]], [options_changed(packing, "packing"), sel.fetched], extra=packing)


def task_runtime(sel: Selection):
    """Compile the C executor (linked into every library) and pipeline-run, per
    target, with the target's cc."""
    # The C sources are no Python for code_of to follow: listed by hand.
    runtime_src = [*(os.path.relpath(p) for p in C_SOURCES),
                   *code_of("tasks.stages:build_runtime")]
    linked = {t.name for _, t in _library_entries(sel)}
    vm_src = sorted({os.path.relpath(p) for p in VM_SOURCES} - set(runtime_src))
    vm_targets = {t.name for m, t in sel.entries if executor_of(m, t) == "vm"}
    for t in sel.targets:
        if t.name not in linked:  # no shared library: nothing links an executor
            continue
        r = runtime_artifacts(t)
        # vm.o only where an entry uses the VM: a graph-only target's task is unchanged.
        vm = [r["vm"]] if t.name in vm_targets else []
        yield sel.cached_stage(
            t.name, "tasks.stages:build_runtime", [r["executor"], r["run"], t.cc, *vm],
            runtime_src + (vm_src if vm else []), [r["executor"], r["run"], *vm],
            [options_changed(sel.toolchain[t.name], "toolchain"), sel.fetched],
            extra=sel.toolchain[t.name])


def task_export(sel: Selection):
    """Link lib0.o, devc.o and the target's executor.o (vm.o for a VM entry) into the
    model's shared library."""
    for m, t in _library_entries(sel):
        a, r = artifacts(m, t), runtime_artifacts(t)
        # A VM entry links vm.o instead (and says so: the stage's `vm` argument).
        vm = executor_of(m, t) == "vm"
        runtime = r["vm"] if vm else r["executor"]
        # The graph JSON and params: what the library's sizes (the build prints and
        # writes to sizes.json) need.
        yield sel.cached_stage(
            f"{m.name}@{t.name}", "tasks.stages:export_library",
            [a["lib0"], a["devc"], runtime, a["so"], t.cc, vm, a["graph_json"], a["params"],
             a["sizes"]],
            [a["lib0"], a["devc"], runtime, a["graph_json"], a["params"],
             *code_of("tasks.stages:export_library")],
            [a["so"], a["sizes"]],
            [options_changed(sel.toolchain[t.name], "toolchain"), sel.fetched],
            extra=sel.toolchain[t.name], fetch=(a["so"],))


def _library_entries(sel: Selection) -> list:
    """The entries built as a shared library: for the graph executor or the VM."""
    return [(m, t) for m, t in sel.entries if executor_of(m, t) in ("graph", "vm")]


def _aot_entries(sel: Selection) -> list:
    """The entries built for the AOT executor (lib<m>.a, docs/microcontrollers.md)."""
    return [(m, t) for m, t in sel.entries if executor_of(m, t) == "aot"]


AOT_OUTPUTS = ("archive", "header", "mlf", "metadata", "program", "sizes")


def task_aot(sel: Selection):
    """Executor aot: lib<m>.a, <m>.h, the Model Library Format <m>.tar, the program
    running the model on files (a bare-metal target's test firmware) and sizes.json."""
    src = [os.path.relpath(AOT_MAIN_C), *code_of("tasks.stages:build_aot_library")]
    for m, t in _aot_entries(sel):
        a = artifacts(m, t)
        inputs = [a["graph_json"], a["params"], a["kernels"], a["lib0"]]
        out = {k: a[k] for k in AOT_OUTPUTS}
        yield sel.cached_stage(
            f"{m.name}@{t.name}", "tasks.stages:build_aot_library",
            [m.name, *inputs, out, t.cc], [*inputs, *src], out,
            [options_changed(sel.toolchain[t.name], "toolchain"), sel.fetched],
            extra=sel.toolchain[t.name], fetch=(a["archive"], a["program"]))


def task_budget(sel: Selection):
    """An AOT model's flash and RAM against its target's ram_kib / flash_kib: the
    build fails past one; prints the sizes. Compiles nothing, so a changed budget
    reruns this alone."""
    src = code_of("tasks.stages:check_sizes")
    for m, t in _aot_entries(sel):
        budgets = {k: v for k, v in (("ram_kib", t.ram_kib), ("flash_kib", t.flash_kib))
                   if v is not None}
        metadata = artifacts(m, t)["metadata"]
        yield {"name": f"{m.name}@{t.name}", "file_dep": [metadata, *src],
               "uptodate": [options_changed(budgets, "budgets")],
               "actions": [(run_stage, ["tasks.stages:check_sizes", metadata, budgets])]}


def task_build(sel: Selection):
    """Build every selected model x target (model=, target=, config= narrow it)."""
    # The generated models first: doit -n starts tasks in the order it reaches
    # them, so a big model's generation would otherwise wait behind the runtime
    # compile, its import behind other models' optimize, and the kernels (created
    # after the last optimize) for it, one worker idle meanwhile.
    return {"actions": None,
            "task_dep": [*(f"model:{m.name}" for m in sel.models if m.written),
                         *(f"export:{m.name}@{t.name}" for m, t in _library_entries(sel)),
                         *(f"budget:{m.name}@{t.name}" for m, t in _aot_entries(sel))]}


CREATORS = (task_lib0, task_devc, task_runtime, task_export, task_aot, task_budget,
            task_build)
