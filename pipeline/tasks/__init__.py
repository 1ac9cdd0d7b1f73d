"""Layer 8, the build system on doit: `make_tasks` (dodo.py's tasks) from the task
creators (`creators`, one module per stage family, each cached stage declared
once: `selection`), `run` (the action every stage runs in), `stages` (the work),
`checker`, `reporter`, `explain`, `config`, `deps` (the sources each task runs),
`paths` (the output folder and every artifact's path), and the cache stack:
`cache` (kernels), `compile_job`, `cluster`, `action_cache`, `tiered`, `lazy`,
`remote`, `gc`. Imports every package below; tools' validate/bench/conformance
run only by name (run_stage).

The task creators only describe tasks; the work is in pipeline.tasks.stages.

Task names (model m, target entry t):
  model:m        generate an ONNX file with models/ (generated models only)
  import:m       ONNX -> graph IR + weights          (out/m/m.ir.json, m.weights.params)
  optimize:m@t   passes + lowering -> graph JSON, params, kernels.json, kernel specs
                 and their LLVM IR (out/specs/<hash>.json, .ll)
  kernel:<hash>  one kernel's IR -> <cache>/<hash>.ll, .o, .sha256 (created after optimize;
                 the cache is shared by all entries, see pipeline/tasks/cache.py)
  lib0:m@t       the entry's kernel objects -> lib0.o (the target's cc -r)
  devc:m@t       graph JSON + params -> devc.o (the packed blob)
  runtime:t      the C executor and pipeline-run for target t, by its cc ->
                 out/runtime/t/executor.o, pipeline-run (sources pipeline/runtime/c/)
  export:m@t     lib0.o + devc.o + executor.o -> m.so (linked by the target's cc)
  aot:m@t        executor aot, instead of devc and export: lib0.o + graph JSON + params
                 -> libm.a, m.h, the Model Library Format m.tar, metadata.json and m.elf
                 (the program running the model on files; a board's firmware)
  budget:m@t     an aot model's flash and RAM against the target's ram_kib, flash_kib
  validate:m@t   run m.so (or m.elf) against the reference -> validation.json and
                 the inputs and outputs in validation/
  explain        print why each task of the last build ran (out/build-report.json)
  report         out/report.html from what the other tasks left (pipeline.tools.report)
  gc             remove cache entries no entry of the matrix uses
Every task declares its inputs, including the compiler sources it runs (doit
does not see code edits otherwise; derived from the stage's code by `code_of`);
option dicts go into one options_changed (a config_changed that keeps the
options, so pipeline.tasks.explain can say which one changed). A task that runs
the target's compiler also hashes its identity (path and --version;
TargetEntry.toolchain), so changing a target's cc rebuilds that target's lib0.o
and .so, and no other target's.
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.tasks.config import BuildConfig, ModelEntry, TargetEntry
from pipeline.tasks.creators import check, housekeeping, link, model, optimize
from pipeline.tasks.selection import Selection, select
from pipeline.tasks.tiered import CacheSettings

FAMILIES = (model, optimize, link, check, housekeeping)  # pipeline order


def make_tasks(config: BuildConfig | None, models: list[ModelEntry],
               targets: list[TargetEntry], settings: CacheSettings | None = None,
               shard: str | None = None) -> dict:
    """The task creators for a selection of the matrix, {"task_<name>": creator}
    (dodo.py exposes them to doit).

    settings: the cache tiers (None: the kernel cache $PIPELINE_KERNEL_CACHE or
    out/kernels, action cache on, no remote tier); shard: "I/N", this run's slice
    of the model x target entries (pipeline.tasks.shard). ConfigError if a
    selected target's compiler is missing.
    """
    sel = select(config, models, targets, settings, shard)
    return {fn.__name__: _bound(fn, sel) for family in FAMILIES for fn in family.CREATORS}


def _bound(creator: Callable[[Selection], object], sel: Selection) -> Callable[[], object]:
    """`creator` of `sel` as doit calls it (no arguments), with its docstring (doit's
    task doc) and its create_after mark."""
    # doit orders creators by the source line they are defined on (a stable sort):
    # every bound creator is defined on the next line, so they keep FAMILIES' order.
    def bound():
        return creator(sel)

    bound.__doc__ = creator.__doc__
    if hasattr(creator, "doit_create_after"):
        bound.doit_create_after = creator.doit_create_after
    return bound
