"""The optimize family: the passes and lowering per model x target (optimize), and
one compile per distinct kernel (kernel), created once optimize has listed them."""

from __future__ import annotations

import os
from pathlib import Path

from doit import create_after

from pipeline.lower.sources import CODEGEN_ROOTS
from pipeline.tasks import cache, lazy, tiered
from pipeline.tasks.cluster import prefetch
from pipeline.tasks.config import executor_of
from pipeline.tasks.explain import options_changed
from pipeline.tasks.paths import (
    SPECS,
    artifacts,
    imported,
    ir_path,
    listed_kernels,
    path,
    spec_path,
)
from pipeline.tasks.selection import Selection, code_of
from pipeline.tasks.tiered import CachedRun


def task_optimize(sel: Selection):
    """Run the passes for each model x target and list the kernels it needs."""
    # The kernel versions optimize writes into the specs hash the code generator's
    # files without importing them: listed as roots of their own.
    opt_src = code_of("tasks.stages:optimize_model",
                      *(r.removeprefix("pipeline.") for r in CODEGEN_ROOTS))
    for m, t in sel.entries:
        a = artifacts(m, t)
        outs = [a["graph_json"], a["params"], a["kernels"]]
        # A VM entry says so in its options (a graph with control flow becomes a VM
        # program; a switch to graph reruns it, to refuse the control flow), a model
        # with dims: gives their bounds; a graph entry's are as before.
        opts = {**t.to_dict(), **({"executor": "vm"} if executor_of(m, t) == "vm" else {}),
                **({"dims": {k: list(v) for k, v in m.dims.items()}} if m.dims else {})}
        yield sel.cached_stage(
            f"{m.name}@{t.name}", "tasks.stages:optimize_model",
            [*imported(m), opts, SPECS, *outs, sel.settings.root], [*imported(m), *opt_src],
            outs,
            # The specs and IR it wrote are outputs too (shared by entries, so not
            # doit targets): a missing one reruns it.
            [options_changed(opts), SpecsPresent(a["kernels"]), sel.fetched],
            specs_of=a["kernels"],
            # read to create the kernel tasks; graph JSON is a deliverable
            fetch=(a["kernels"], a["graph_json"]))


@create_after(executed="optimize", target_regex=r".*\.o$")
def task_kernel(sel: Selection):
    """Compile each distinct kernel once, shared by every model and target."""
    root, seen, tasks = sel.settings.root, set(), []
    for m, t in sel.entries:
        manifest = artifacts(m, t)["kernels"]
        if not os.path.exists(manifest):
            continue
        for k in listed_kernels(manifest):
            if k["hash"] in seen:
                continue
            seen.add(k["hash"])
            entry = {s[1:]: path(root, k["hash"] + s) for s in cache.SUFFIXES}
            spec = spec_path(SPECS, k["hash"])
            # The spec is read from out/specs (declared), never from the cache
            # folder, which may have moved or been emptied since optimize ran;
            # so is the IR optimize rendered from it (the spec decides it: not
            # an input of its own; rendered again if gone).
            tasks.append(sel.cached_stage(
                k["hash"], "tasks.cache:compile_entry", [root, k["hash"], spec, sel.settings.dask],
                [spec], entry, [sel.fetched], clean=False, doc=k["symbol"]))
    if sel.settings.dask:  # the cluster starts on every kernel not cached yet
        prefetch(sel.settings.dask, [_read_spec(t["file_dep"][0]) for t in tasks
                                     if not cache.is_valid(root, t["name"])
                                     and not _in_action_cache(t["meta"]["cached"])])
    yield from tasks


def _read_spec(spec: str) -> str:
    tiered.materialize(spec)  # a cache hit may have left it in the cache
    return Path(spec).read_text()


def _in_action_cache(run: CachedRun) -> bool:
    """Whether the local tier holds the outputs of a cached stage."""
    return run.settings.actions and os.path.exists(path(run.settings.root, "ac",
                                                        run.action.key()))


class SpecsPresent:
    """doit uptodate check: True while every spec kernels_json lists, and its IR, is
    in out/specs."""

    def __init__(self, kernels_json: str):
        self.kernels_json = kernels_json

    def missing(self) -> list[str]:
        try:
            listed = listed_kernels(self.kernels_json)
        except (FileNotFoundError, ValueError, KeyError):
            return []  # no manifest: the missing target reruns the task anyway
        return [p for k in listed for spec in [spec_path(SPECS, k["hash"])]
                for p in (spec, ir_path(spec)) if not lazy.exists(p)]

    def __call__(self, task, values) -> bool:
        return not self.missing()

    def describe(self) -> list[str]:
        gone = self.missing()
        return [f"missing output {gone[0]}" + (f" (+{len(gone) - 1} more)" if gone[1:] else "")]


CREATORS = (task_optimize, task_kernel)
